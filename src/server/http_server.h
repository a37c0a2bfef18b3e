// HttpServer: the OpenAI-compatible HTTP face of an Engine (cpp-httplib, through
// HttpTransport's connection limits). Routes: POST /v1/completions, POST /v1/chat/completions
// (stream: true -> server-sent events ending in `data: [DONE]`), GET /v1/models, GET /health,
// GET /metrics (Prometheus text), POST /reset_prefix_cache (vLLM's: drops the prefix index),
// POST /tokenize and /detokenize (llama-server's; vLLM's request spelling accepted). It
// owns the engine's driver thread; handler threads only submit, wait on a per-request channel and
// write. A streaming client that goes away cancels its request. A request the engine fails gets an
// HTTP error (or, once streaming, an SSE error event and the end of the stream); an exception
// escaping the engine's step is a bug and ends the process. stop() drains: new requests get 503,
// in-flight ones have HttpServerConfig::drain_timeout_s to finish, then are cancelled.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "runtime/engine.h"
#include "server/http_transport.h"
#include "server/kv_events.h"
#include "server/openai.h"

namespace kvcache {

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;            // 0: any free port (see port())
  std::string api_key;        // non-empty: "Authorization: Bearer <key>" on every route but /health
  TransportLimits transport;  // connections, timeouts, body size
  double drain_timeout_s = 5;         // stop(): in-flight requests may finish for this long
  double health_probe_timeout_s = 5;  // /health after a failed forward: the probe's deadline
  double health_stall_s = 60;  // /health: one engine step running longer than this is a stall
  // Non-empty: POST /slots/{id}?action=save|restore (llama.cpp's --slot-save-path) saves a
  // finished request's cached blocks to a session file in this folder and restores them into
  // the prefix cache (runtime/session_file.h). Empty: those routes answer 501.
  std::string slot_save_path;
  // Non-empty kv_events.endpoint: the constructor binds a KvEventPublisher there (Error(kIo)
  // when it cannot) and adds it to the engine's store, which then publishes its prefix index's
  // changes as vLLM KV events (server/kv_events.h).
  KvEventsOptions kv_events;
};

struct LatencyHistograms;  // http_server.cc

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
  // Thread-safe and signal-thread-safe (not async-signal-safe). Drains: refuses new requests
  // (503; /health says "draining"), lets in-flight ones finish for drain_timeout_s, cancels
  // what is left, closes every connection and makes run() return. Blocks until then.
  void stop();
  // Cuts a running stop()'s drain short (a second signal): cancels in-flight requests now.
  void stop_now();
  // The HTTP layer's entry point on bytes in memory (fuzzing, tests): see HttpTransport.
  std::string handle_raw(std::string_view request);
  // Handlers that threw (each answered a JSON 500): bugs, counted for /metrics and the fuzzer.
  int64_t handler_exceptions() const { return handler_exceptions_.load(); }

  // The /metrics body (Prometheus text exposition format 0.0.4).
  std::string metrics_text();
  // The KV events publisher (nullptr without kv_events.endpoint).
  KvEventPublisher* kv_events() { return kv_events_.get(); }

 private:
  struct Channel;
  // install_routes() wires the routes; each install_* below adds one route or route group.
  void install_routes();
  void install_guards();  // the API key, JSON bodies of transport errors, handler exceptions
  void install_health();
  void install_models();
  void install_metrics();
  void install_completions();  // /v1/completions and /v1/chat/completions
  void install_slots();        // /slots/{id}?action=save|restore
  void install_reset_prefix_cache();
  void install_tokenize();  // /tokenize and /detokenize
  // One completions (chat = false) or chat request: parse, submit, then answer it whole or as
  // server-sent events; the answer cancels the request when the client goes away.
  void serve_completion(const httplib::Request& req, httplib::Response& res, bool chat);
  void answer_whole(httplib::Response& res, const ApiRequest& ar,
                    const std::shared_ptr<Channel>& ch, uint64_t id);
  void answer_stream(httplib::Response& res, const ApiRequest& ar,
                     const std::shared_ptr<Channel>& ch, uint64_t id);
  // Ends the server's hold on a request: cancels it unless `success` (its answer went out
  // whole), and forgets it.
  void release(uint64_t id, bool success);
  // A completions batch (several prompts): every request queued, answered whole.
  void answer_batch(httplib::Response& res, const std::vector<ApiRequest>& batch);
  void drive_engine();
  void forget(uint64_t id);
  // After a failed forward: whether a one-token request now goes through (see /health).
  bool probe_engine(std::string& error);

  Engine& engine_;
  ServedModel model_;
  HttpServerConfig config_;
  std::shared_ptr<KvEventPublisher> kv_events_;
  std::unique_ptr<HttpTransport> http_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread driver_;
  std::atomic<double> step_began_s_{0};
  std::atomic<int64_t> handler_exceptions_{0};  // while the driver is inside Engine::step(), else 0
  int64_t created_ = 0;
  std::mutex mu_;
  std::condition_variable drained_;  // in_flight_ shrank, or stop_now()
  std::set<uint64_t> in_flight_;
  bool drain_cut_ = false;
  std::mutex probe_mu_;  // one engine probe at a time
  // /metrics' latency histograms, fed by the engine's callbacks (Channel::push).
  std::shared_ptr<LatencyHistograms> latency_;
};

}  // namespace kvcache
