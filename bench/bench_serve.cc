// Load generator for the OpenAI-compatible server: N concurrent streaming completions, each
// over its own plain socket, timed on arrival of every server-sent event. Reports per
// concurrency level: output tokens/s (all streams), decode tokens/s (tokens after the first over
// the decode window), time to first token p50/p99 and inter-token latency p50/p99.
// Not a Google Benchmark (a serving load is not a loop of identical iterations); it shares
// bench/'s build rule and links Google Benchmark unused.
//
//   build/bench/bench_serve --model dummy:llama-125m --streams 1,16 --max-tokens 64
//       (starts an in-process server on a free loopback port)
//   build/bench/bench_serve --model dummy:llama-125m --fast ...
//       (BLAS linears: batch_invariant off)
//   build/bench/bench_serve --port 8080 --streams 1,4,16   (an already running `kvcache serve`)
//   build/bench/bench_serve --model dummy:llama-125m --streams 16 --prompt-tokens 8192
//       --kv-budget 1GiB --kv-bits 4 --block-tokens 64   (quantized pages in a byte budget: the
//       pool line says how many requests of prompt + max_tokens tokens the pool holds at once,
//       the last line how many ran at once)
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../tests/server/raw_http.h"
#include "bench_main.h"
#include "core/thread_pool.h"
#include "kernels/kv_quant.h"
#include "model/kv_plan.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "server/http_server.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

struct StreamTiming {
  bool ok = false;
  double t_first = 0, t_last = 0;  // seconds since the level's start
  int64_t tokens = 0;              // completion_tokens from the usage chunk
  std::vector<double> gaps;        // between successive token events
};

// One streaming request; times every "data: {" event as its bytes arrive.
StreamTiming run_stream(int port, const std::string& body, Clock::time_point t0) {
  StreamTiming st;
  const int fd = kvcache::testing_util::connect_loopback(port);
  if (fd < 0) return st;
  if (!kvcache::testing_util::send_all(
          fd, kvcache::testing_util::request_text("POST", "/v1/completions", body, ""))) {
    ::close(fd);
    return st;
  }
  std::string all;
  size_t scanned = 0;
  double prev = -1;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
    const double t = std::chrono::duration<double>(Clock::now() - t0).count();
    all.append(buf, static_cast<size_t>(n));
    for (;;) {  // each event is one write, hence one HTTP chunk: never split by chunk framing
      const size_t p = all.find("data: ", scanned);
      if (p == std::string::npos) break;
      const size_t end = all.find("\n\n", p);
      if (end == std::string::npos) break;
      scanned = end + 2;
      const json ev = json::parse(all.substr(p + 6, end - p - 6), nullptr, false);
      if (!ev.is_object()) continue;  // [DONE]
      if (ev.contains("usage") && ev["choices"].empty()) {
        st.tokens = ev["usage"]["completion_tokens"];
        continue;
      }
      const json& c0 = ev["choices"][0];
      if (!c0["finish_reason"].is_null() && c0.value("text", "").empty())
        continue;  // the closing chunk
      if (prev < 0) {
        st.t_first = t;
      } else {
        st.gaps.push_back(t - prev);
      }
      prev = t;
      st.t_last = t;
    }
  }
  ::close(fd);
  st.ok = all.find("data: [DONE]") != std::string::npos;
  return st;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i =
      std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

struct Args {
  std::string model;
  int port = 0;
  std::vector<int> streams = {1, 16};
  kvcache::bench::LoadArgs load{.max_tokens = 64, .prompt_tokens = 32};
  // The pool (--model only): a byte budget (planner: blocks + activations), quantized pages.
  std::string kv_budget;
  int kv_bits = 0;  // > 0: KIVI pages of this many bits (or --kv-quant's)
  std::string kv_quant;
  int64_t block_tokens = 16;
  int max_running = 0;  // 0: max(64, streams)
};

}  // namespace

static int run(const Args& a) {
  std::signal(SIGPIPE, SIG_IGN);
  if (a.load.threads > 0) kvcache::set_default_threads(a.load.threads);

  std::unique_ptr<kvcache::LoadedModel> lm;
  std::unique_ptr<kvcache::Engine> engine;
  std::unique_ptr<kvcache::HttpServer> server;
  std::thread server_thread;
  int port = a.port;
  int max_streams = 1;
  for (int n : a.streams) max_streams = std::max(max_streams, n);
  if (!a.model.empty()) {
    kvcache::LoadOptions lo;  // the shared SentencePiece vocabulary gives dummy models text
    const std::string vocab = std::string(KVCACHE_SHARED_DIR) + "/vocab/ggml-vocab-llama-spm.gguf";
    if (access(vocab.c_str(), R_OK) == 0) lo.dummy_vocab = vocab;
    lm = std::make_unique<kvcache::LoadedModel>(kvcache::load_model(a.model, lo));
    kvcache::EngineConfig ec;
    ec.cache.kv_dtype = kvcache::DType::kF16;
    ec.cache.max_cache_len =
        static_cast<int64_t>(max_streams) * (a.load.prompt_tokens + a.load.max_tokens + 16) + 256;
    ec.max_running = a.max_running > 0 ? a.max_running : std::max(64, max_streams);
    ec.batch_invariant = !a.load.fast;
    ec.cache.paged.block_tokens = a.block_tokens;
    if (!a.kv_budget.empty()) ec.kv_budget_bytes = kvcache::parse_byte_size(a.kv_budget);
    if (a.kv_bits > 0 || !a.kv_quant.empty()) {
      kvcache::PagedQuantFormat f;
      if (!a.kv_quant.empty()) {
        const auto s = kvcache::parse_kv_quant_scheme(a.kv_quant);
        if (!s) throw std::runtime_error("--kv-quant must be kivi, q8_0 or q4_0");
        f.scheme = *s;
      }
      f.bits = f.scheme == kvcache::KVQuantScheme::kQ8_0   ? 8
               : f.scheme == kvcache::KVQuantScheme::kQ4_0 ? 4
               : a.kv_bits > 0                             ? a.kv_bits
                                                           : 4;
      ec.cache.paged.quant = f;
    }
    engine = std::make_unique<kvcache::Engine>(*lm->model, lm->tokenizer.get(), ec);
    const kvcache::EngineMetrics m0 = engine->metrics();
    const int64_t per_request = a.load.prompt_tokens + a.load.max_tokens;
    const int64_t blocks_per_request = (per_request + a.block_tokens - 1) / a.block_tokens;
    std::printf(
        "pool: pages %s, block %lld tokens, %lld blocks (%lld tokens); requests of %lld "
        "tokens it holds at once: %lld; budget %s\n",
        engine->kv_pages_label().c_str(), static_cast<long long>(a.block_tokens),
        static_cast<long long>(m0.blocks_total),
        static_cast<long long>(m0.blocks_total * a.block_tokens),
        static_cast<long long>(per_request),
        static_cast<long long>(m0.blocks_total / blocks_per_request),
        a.kv_budget.empty() ? "none (sized for the streams)" : a.kv_budget.c_str());
    kvcache::ServedModel sm;
    sm.name = a.model;
    sm.tokenizer = lm->tokenizer.get();
    kvcache::HttpServerConfig hc;
    hc.port = 0;
    server = std::make_unique<kvcache::HttpServer>(*engine, sm, hc);
    server->bind();
    port = server->port();
    server_thread = std::thread([&] { server->run(); });
  }
  if (port <= 0) {
    std::fprintf(stderr, "bench_serve: give --model or --port\n");
    return 2;
  }

  std::printf("%8s %6s %10s %12s %12s %10s %10s %10s %10s\n", "streams", "run", "tokens",
              "out_tok/s", "decode_tok/s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99");
  std::mt19937 rng(1234);
  for (int rep = 0; rep < a.load.repeat; ++rep) {
    for (int n : a.streams) {
      // Distinct random prompts: no prefix hits, every stream prefills its own prompt.
      std::vector<std::string> bodies;
      for (int s = 0; s < n; ++s) {
        json ids = json::array({1});
        for (int t = 1; t < a.load.prompt_tokens; ++t)
          ids.push_back(static_cast<int>(rng() % 30000) + 3);
        bodies.push_back(json{{"prompt", ids},
                              {"max_tokens", a.load.max_tokens},
                              {"temperature", 0},
                              {"ignore_eos", true},
                              {"stream", true},
                              {"stream_options", {{"include_usage", true}}}}
                             .dump());
      }
      std::vector<StreamTiming> res(static_cast<size_t>(n));
      const Clock::time_point t0 = Clock::now();
      std::vector<std::thread> clients;
      for (int s = 0; s < n; ++s)
        clients.emplace_back([&, s] {
          res[static_cast<size_t>(s)] = run_stream(port, bodies[static_cast<size_t>(s)], t0);
        });
      for (std::thread& t : clients) t.join();
      const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
      int64_t tokens = 0, decode_tokens = 0;
      double first_end = 1e30, last_end = 0;
      std::vector<double> ttft, itl;
      bool ok = true;
      for (const StreamTiming& st : res) {
        ok &= st.ok;
        tokens += st.tokens;
        decode_tokens += std::max<int64_t>(0, st.tokens - 1);
        ttft.push_back(st.t_first);
        itl.insert(itl.end(), st.gaps.begin(), st.gaps.end());
        first_end = std::min(first_end, st.t_first);
        last_end = std::max(last_end, st.t_last);
      }
      // Decode window: from the first stream's first token to the last stream's last token.
      const double decode_tps =
          last_end > first_end ? static_cast<double>(decode_tokens) / (last_end - first_end) : 0;
      std::printf("%8d %6d %10lld %12.1f %12.1f %9.1fms %9.1fms %9.1fms %9.1fms%s\n", n, rep,
                  static_cast<long long>(tokens), static_cast<double>(tokens) / wall, decode_tps,
                  1e3 * percentile(ttft, 0.5), 1e3 * percentile(ttft, 0.99),
                  1e3 * percentile(itl, 0.5), 1e3 * percentile(itl, 0.99),
                  ok ? "" : "  (some streams failed)");
      std::fflush(stdout);
    }
  }
  if (engine)
    std::printf("peak sequences resident at once: %lld, preemptions: %lld\n",
                static_cast<long long>(engine->metrics().running_peak),
                static_cast<long long>(engine->metrics().preemptions));
  if (server) {
    server->stop();
    server_thread.join();
  }
  return 0;
}

// Exit codes: see bench_main.h (a bad value or a failed run: a message and exit 2).
int main(int argc, char** argv) {
  Args a;
  CLI::App app{"bench_serve: N concurrent streams through kvcache serve"};
  app.add_option("--model", a.model, "model to serve in-process (path or dummy:PRESET)");
  app.add_option("--port", a.port, "drive a running server on 127.0.0.1:PORT instead")
      ->check(CLI::Range(1, 65535));
  app.add_option("--streams", a.streams, "concurrent streams, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  kvcache::bench::add_load_options(app, a.load, "stream");
  app.add_option("--kv-budget", a.kv_budget,
                 "with --model: bytes for the pool plus activations, e.g. 1GiB (default: sized "
                 "for the streams)");
  app.add_option("--kv-bits", a.kv_bits, "with --model: KIVI pages of 2, 4 or 8 bits")
      ->check(CLI::IsMember({2, 4, 8}));
  app.add_option("--kv-quant", a.kv_quant, "with --model: quantized pages, kivi, q8_0 or q4_0");
  app.add_option("--block-tokens", a.block_tokens, "with --model: tokens per block")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--max-running", a.max_running,
                 "with --model: sequences resident at once (default: max(64, streams))")
      ->check(CLI::Range(1, 4096));
  return kvcache::bench::parse_and_run(app, argc, argv, "bench_serve", [&] { return run(a); });
}
