// Load without loss, at scale: tests/server/load_test.cc's chaotic clients (random prompts, n,
// stop strings, temperatures, streams dropped mid-reply) against an in-process server whose
// block pool forces preemption, with the engine's invariants checked after every step. Prints
// what happened and exits 2 when anything was lost: a reply that broke, a block still held
// afterwards, or a deterministic request whose text changed across the load.
// Not a Google Benchmark; it shares bench/'s build rule.
//
//   build/bench/bench_chaos --model dummy:tiny --clients 256 --requests 20 --blocks 160
//   build/bench/bench_chaos --model dummy:llama-125m --clients 64 --requests 4 --blocks 400
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "../tests/server/chaos_load.h"
#include "bench_main.h"
#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "server/chat_template.h"
#include "server/http_server.h"

namespace {

struct Args {
  std::string model = "dummy:tiny";
  int clients = 256;
  int requests = 20;
  int blocks = 160;
  int max_tokens = 48;
  int threads = 0;
  uint32_t seed = 1;
};

// One non-streamed greedy completion's text (the determinism probe), through the tests' plain
// HTTP client, which de-chunks the body (the server may send a reply chunked; a probe reading
// the raw bytes after the headers as JSON saw "<bad reply>" both times and compared equal).
std::string probe_text(int port) {
  const std::string body =
      R"({"prompt": "Once upon a time there was", "max_tokens": 24, "temperature": 0,
                               "ignore_eos": true})";
  const kvcache::testing_util::HttpReply r =
      kvcache::testing_util::http(port, "POST", "/v1/completions", body, "", 120);
  if (r.status != 200)
    return "<status " + std::to_string(r.status) + ": " + r.body.substr(0, 300) + ">";
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  return j.is_object() && j.contains("choices") && j["choices"][0].contains("text")
             ? j["choices"][0]["text"].get<std::string>()
             : "<bad reply: " + r.body.substr(0, 300) + ">";
}

int run(const Args& a) {
  std::signal(SIGPIPE, SIG_IGN);
  if (a.threads > 0) kvcache::set_default_threads(a.threads);
  kvcache::LoadOptions lo;
  const std::string vocab = std::string(KVCACHE_SHARED_DIR) + "/vocab/ggml-vocab-llama-spm.gguf";
  if (access(vocab.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "bench_chaos: needs %s (text prompts)\n", vocab.c_str());
    return 2;
  }
  lo.dummy_vocab = vocab;
  const kvcache::LoadedModel lm = kvcache::load_model(a.model, lo);
  if (!lm.tokenizer) {
    std::fprintf(stderr, "bench_chaos: %s has no tokenizer\n", a.model.c_str());
    return 2;
  }
  kvcache::EngineConfig ec;
  ec.cache.kv_dtype = kvcache::DType::kF16;
  ec.num_blocks = a.blocks;
  ec.max_tokens_per_step = 128;
  ec.check_invariants_every_step = true;
  kvcache::Engine engine(*lm.model, lm.tokenizer.get(), ec);
  const kvcache::SpecialTokens specials(*lm.tokenizer);
  kvcache::ServedModel sm;
  sm.name = a.model;
  sm.tokenizer = lm.tokenizer.get();
  sm.add_bos = lm.add_bos;
  sm.stop_ids = lm.stop_ids;
  sm.specials = &specials;
  kvcache::HttpServerConfig hc;
  hc.port = 0;
  hc.transport.max_connections = a.clients + 64;
  kvcache::HttpServer server(engine, sm, hc);
  server.bind();
  std::thread server_thread([&] { server.run(); });
  const int port = server.port();

  const std::string before = probe_text(port);
  if (before.starts_with("<")) {  // no text to compare against: the probe itself failed
    std::fprintf(stderr, "bench_chaos: the probe before the load failed: %s\n", before.c_str());
    server.stop();
    server_thread.join();
    return 2;
  }
  kvcache::testing_util::ChaosOptions co;
  co.clients = a.clients;
  co.requests_per_client = a.requests;
  co.max_tokens = a.max_tokens;
  co.seed = a.seed;
  const kvcache::testing_util::ChaosResult r = kvcache::testing_util::run_chaos(port, co);
  kvcache::EngineMetrics m = engine.metrics();
  for (int i = 0; i < 500 && (m.running > 0 || m.waiting > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    m = engine.metrics();
  }
  const std::string after = probe_text(port);
  server.stop();
  server_thread.join();

  std::printf("model %s, %d clients x %d requests, %d blocks of %lld tokens\n", a.model.c_str(),
              a.clients, a.requests, a.blocks, static_cast<long long>(ec.cache.paged.block_tokens));
  std::printf(
      "requests %lld in %.1f s (%.1f/s): completed %lld, dropped mid-stream %lld, refused %lld, "
      "problems %zu\n",
      static_cast<long long>(r.requests), r.seconds, static_cast<double>(r.requests) / r.seconds,
      static_cast<long long>(r.completed), static_cast<long long>(r.disconnected),
      static_cast<long long>(r.refused), r.problems.size());
  std::printf(
      "engine: steps %lld, preemptions %lld, cancelled %lld, failed %lld, tokens generated %lld\n",
      static_cast<long long>(m.steps), static_cast<long long>(m.preemptions),
      static_cast<long long>(m.requests_cancelled), static_cast<long long>(m.requests_failed),
      static_cast<long long>(m.generation_tokens));
  std::printf(
      "blocks after: used %lld, free %lld, cached %lld of %lld; invariants checked every step\n",
      static_cast<long long>(m.blocks_used), static_cast<long long>(m.blocks_free),
      static_cast<long long>(m.blocks_cached), static_cast<long long>(m.blocks_total));
  std::printf("deterministic probe: %s\n",
              before == after ? "same text before and after" : "CHANGED");
  if (before != after) std::printf("  before: %s\n  after:  %s\n", before.c_str(), after.c_str());
  for (const std::string& p : r.problems) std::printf("problem: %s\n", p.c_str());
  const bool lost = !r.problems.empty() || m.blocks_used != 0 || m.running != 0 || m.waiting != 0 ||
                    before != after || m.requests_failed != 0;
  return lost ? 2 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{
      "bench_chaos: chaotic concurrent clients against kvcache serve; exits 2 when anything was "
      "lost"};
  app.add_option("--model", a.model, "model to serve in-process (path or dummy:PRESET)")
      ->capture_default_str();
  app.add_option("--clients", a.clients, "concurrent clients")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--requests", a.requests, "requests per client")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--blocks", a.blocks, "KV blocks in the pool (small: preemption)")
      ->check(CLI::Range(8, 1 << 24))
      ->capture_default_str();
  app.add_option("--max-tokens", a.max_tokens, "largest max_tokens a request asks for")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("-t,--threads", a.threads, "threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--seed", a.seed, "clients' random seed")->capture_default_str();
  return kvcache::bench::parse_and_run(app, argc, argv, "bench_chaos", [&] { return run(a); });
}
