// The HTTP layer through the server's handler entry point: the input is the raw bytes of one
// HTTP/1.1 request, handed to HttpServer::handle_raw — cpp-httplib's request parsing (line,
// headers, chunked or sized bodies, ranges) and kvcache's routes (/v1/completions,
// /v1/chat/completions streamed or not, /v1/models, /health, /metrics, errors) — served by a
// real Engine on a tiny model (1 layer, dim 8, the tiny SentencePiece vocabulary, context 32)
// whose driver thread steps as the server's does. Every request gets an answer: a hang is a
// timeout finding, an exception escaping a handler is a JSON 500 the target reports, and after
// the request the engine must be consistent with no block held.
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/tensor.h"
#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "model/forward.h"
#include "model/gguf.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "server/chat_template.h"
#include "server/http_server.h"

namespace kvcache::fuzz {

namespace {

// The tiny llama with the tiny SentencePiece vocabulary, written once to a temporary GGUF and
// loaded as `kvcache serve` loads a model.
LoadedModel tiny_served_model() {
  const Vocabulary v = tiny_spm_vocabulary();
  ModelConfig c = tiny_llama_config();
  c.rope_interleaved = true;  // a `llama` GGUF's layout
  c.vocab_size = v.size();
  GgufWriter w;
  gguf_write_llama_config(w, c);
  put_vocabulary(w, v, "llama");
  Weights ws;
  put_llama_tensors(w, ws, c, DType::kF32);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("kvcache_fuzz_http_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  w.write(path);
  LoadedModel m = load_model(path, {});
  std::filesystem::remove(path);  // the mapping stays valid
  return m;
}

// Built once and never destroyed: the driver thread outlives every input (and the process exit
// must not tear the engine down under it).
struct Served {
  LoadedModel model = tiny_served_model();
  std::unique_ptr<SpecialTokens> specials = std::make_unique<SpecialTokens>(*model.tokenizer);
  std::unique_ptr<Engine> engine;
  std::unique_ptr<HttpServer> server;

  Served() {
    EngineConfig ec;
    ec.cache.max_cache_len = 128;
    ec.max_tokens_per_step = 32;
    ec.max_running = 4;
    ec.max_waiting = 8;
    engine = std::make_unique<Engine>(*model.model, model.tokenizer.get(), ec);
    ServedModel sm;
    sm.name = "fuzz-model";
    sm.tokenizer = model.tokenizer.get();
    sm.add_bos = model.add_bos;
    sm.stop_ids = model.stop_ids;
    sm.specials = specials.get();
    sm.chat_template = ChatTemplate::kChatML;
    sm.limits.max_n = 4;
    HttpServerConfig hc;
    hc.transport.max_body_bytes = 1 << 16;
    server = std::make_unique<HttpServer>(*engine, sm, hc);
    std::thread([this] {  // the server's driver loop (HttpServer::run without sockets)
      for (;;) {
        if (!engine->has_work()) {
          engine->wait_for_work(0.05);
          continue;
        }
        engine->step();
      }
    })
        .detach();
  }
};

Served& served() {
  static Served* s = new Served();  // never destroyed (see Served)
  return *s;
}

}  // namespace

int fuzz_http(const uint8_t* data, size_t size) {
  Served& s = served();
  const int64_t threw = s.server->handler_exceptions();
  const std::string reply = s.server->handle_raw(as_text(data, size));
  // A handler that threw answered a JSON 500 (the exception handler counts it).
  if (s.server->handler_exceptions() != threw)
    throw std::logic_error("a handler threw: " + reply.substr(0, 400));
  // handle_raw returns once the response is written; the request's end reaches the engine at
  // its next step. Wait for it, then every block must be free again.
  for (int i = 0; i < 2000; ++i) {
    const EngineMetrics m = s.engine->metrics();
    if (m.running == 0 && m.waiting == 0) {
      if (m.blocks_used != 0)
        throw std::logic_error("blocks still held after the request: " +
                               std::to_string(m.blocks_used));
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  throw std::logic_error("the engine still runs a request 0.2 s after its reply was written");
}

}  // namespace kvcache::fuzz
