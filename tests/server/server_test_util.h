// What the server tests share: dummy:tiny with the shared SentencePiece vocabulary, a server on
// a free loopback port serving on its own thread, and SSE / metrics readers.
#pragma once

#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/model_loader.h"
#include "scratch_dir.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/openai.h"

namespace kvcache::testing_util {

inline const LoadedModel* tiny_with_vocab() {
  static const std::unique_ptr<LoadedModel> m = []() -> std::unique_ptr<LoadedModel> {
    const std::string vocab = std::string(KVCACHE_SHARED_DIR) + "/vocab/ggml-vocab-llama-spm.gguf";
    if (!std::filesystem::exists(vocab)) return nullptr;
    LoadOptions lo;
    lo.dummy_vocab = vocab;
    lo.dummy_cache_dir = process_scratch().file("server");
    return std::make_unique<LoadedModel>(load_model("dummy:tiny", lo));
  }();
  return m.get();
}

struct TestServerOptions {
  std::string api_key;
  EngineConfig engine;
  HttpServerConfig http;  // port and api_key are set from here
  RequestLimits limits;   // max_context: the engine's
  // nullopt: no template (chat requests get 400 with chat_template_error).
  std::optional<ChatTemplate> chat_template = ChatTemplate::kChatML;
  std::string chat_template_error;
};

// A server on a free port, serving on its own thread until destroyed.
struct TestServer {
  explicit TestServer(const LoadedModel& lm, const std::string& api_key = "", EngineConfig ec = {})
      : TestServer(lm, TestServerOptions{api_key, ec, {}, {}, ChatTemplate::kChatML, {}}) {}
  TestServer(const LoadedModel& lm, TestServerOptions o) {
    std::signal(SIGPIPE, SIG_IGN);  // a write to a closed client must fail, not kill the test
    // A small pool unless the test sized one (0: the engine's default).
    if (o.engine.cache.max_cache_len == 0) o.engine.cache.max_cache_len = 1024;
    engine = std::make_unique<Engine>(*lm.model, lm.tokenizer.get(), o.engine);
    // A model without a tokenizer takes prompts as token id arrays only.
    if (lm.tokenizer) specials = std::make_unique<SpecialTokens>(*lm.tokenizer);
    ServedModel sm;
    sm.name = "dummy:tiny";
    sm.tokenizer = lm.tokenizer.get();
    sm.add_bos = lm.add_bos;
    sm.stop_ids = lm.stop_ids;
    sm.specials = specials.get();
    sm.chat_template = o.chat_template;
    sm.chat_template_error = o.chat_template_error;
    sm.limits = o.limits;
    HttpServerConfig hc = o.http;
    hc.port = 0;
    hc.api_key = o.api_key;
    server = std::make_unique<HttpServer>(*engine, sm, hc);
    server->bind();
    port = server->port();
    thread = std::thread([this] { server->run(); });
  }
  ~TestServer() { shutdown(); }
  void shutdown() {
    if (!thread.joinable()) return;
    server->stop();
    thread.join();
  }
  std::unique_ptr<Engine> engine;
  std::unique_ptr<SpecialTokens> specials;
  std::unique_ptr<HttpServer> server;
  std::thread thread;
  int port = 0;
};

// "data: ...\n\n" events of an SSE body; fails the test on any other framing.
inline std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event at " << pos;
    if (end == std::string::npos) break;
    const std::string ev = body.substr(pos, end - pos);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << "event without 'data: ': " << ev;
    EXPECT_EQ(ev.find('\n'), std::string::npos) << "multi-line event: " << ev;
    out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

inline double metric(const std::string& text, const std::string& name) {
  const size_t p = text.find("\n" + name + " ");
  if (p == std::string::npos) return -1;
  return std::stod(text.substr(p + name.size() + 2));
}

}  // namespace kvcache::testing_util
