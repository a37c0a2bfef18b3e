// HttpServer: the OpenAI-compatible HTTP face of an Engine (cpp-httplib). Routes:
// POST /v1/completions, POST /v1/chat/completions (stream: true -> server-sent events ending in
// `data: [DONE]`), GET /v1/models, GET /health, GET /metrics (Prometheus text). It owns the
// engine's driver thread; handler threads only submit, wait on a per-request channel and
// write. A streaming client that goes away cancels its request.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "runtime/engine.h"
#include "server/openai.h"

namespace httplib {
class Server;
}

namespace kvcache {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port (see port())
  std::string api_key;           // non-empty: "Authorization: Bearer <key>" on every route but /health
  int http_threads = 128;        // concurrent connections (a stream holds one)
};

class HttpServer {
 public:
  HttpServer(Engine& engine, const ServedModel& model, const HttpServerConfig& config);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds (throws Error(kIo) when the address is taken); port() is then the bound port.
  void bind();
  int port() const { return port_; }
  // Serves until stop(); starts and joins the engine's driver thread.
  void run();
  // Thread-safe and signal-thread-safe (not async-signal-safe): refuses new requests (503),
  // cancels the in-flight ones, and makes run() return once their handlers finished.
  void stop();

  // The /metrics body (Prometheus text exposition format 0.0.4).
  std::string metrics_text();

 private:
  struct Channel;
  void install_routes();
  void drive_engine();

  Engine& engine_;
  ServedModel model_;
  HttpServerConfig config_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread driver_;
  int64_t created_ = 0;
  std::mutex mu_;
  std::set<uint64_t> in_flight_;
  // Token rates between two scrapes of /metrics.
  double last_scrape_s_ = 0;
  int64_t last_prompt_ = 0, last_gen_ = 0;
};

}  // namespace kvcache
