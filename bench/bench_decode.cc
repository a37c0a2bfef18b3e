// Engine decode throughput against the number of concurrent sequences, without HTTP: B
// requests with distinct random prompts are submitted at once, stepped until every one has
// its first token (prefill done), then the decode-only steps are timed. Each repetition runs
// every batch size back to back, so ratios between sizes are taken side by side (the machine
// is shared; compare within a repetition). Plain main, not a Google Benchmark (one engine run
// per size, not a loop of identical iterations); it shares bench/'s build rule.
//
//   build/bench/bench_decode --model dummy:llama-125m --batches 1,16 --max-tokens 32 --repeat 3
//   build/bench/bench_decode ... --fast       (EngineConfig::batch_invariant off: BLAS linears)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "bench_main.h"
#include "core/thread_pool.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model = "dummy:llama-125m";
  std::vector<int> batches = {1, 16};
  kvcache::bench::LoadArgs load{.max_tokens = 32, .prompt_tokens = 16};
};

struct Result {
  double decode_tps = 0;  // decode tokens / decode seconds
  double step_ms = 0;     // mean decode step
  int64_t decode_tokens = 0;
};

Result run_batch(const kvcache::LoadedModel& lm, const Args& a, int batch, std::mt19937& rng) {
  kvcache::EngineConfig ec;
  ec.cache.kv_dtype = kvcache::DType::kF16;
  ec.cache.max_cache_len =
      static_cast<int64_t>(batch) * (a.load.prompt_tokens + a.load.max_tokens + 16) + 256;
  ec.max_running = std::max(64, batch);
  ec.batch_invariant = !a.load.fast;
  kvcache::Engine engine(*lm.model, nullptr, ec);
  int64_t tokens = 0;
  int first = 0;                                                 // requests with their first token
  std::vector<char> started(static_cast<size_t>(batch) + 1, 0);  // by request id (1..batch)
  for (int b = 0; b < batch; ++b) {
    kvcache::RequestParams rp;
    rp.prompt.push_back(1);
    for (int t = 1; t < a.load.prompt_tokens; ++t)
      rp.prompt.push_back(static_cast<int32_t>(rng() % 30000) + 3);
    rp.max_tokens = a.load.max_tokens;
    rp.sampler.temperature = 0;
    engine.submit(std::move(rp), [&](const kvcache::StreamEvent& ev) {
      if (ev.token < 0) return;
      ++tokens;
      char& st = started.at(static_cast<size_t>(ev.id));
      if (!st) st = 1, ++first;
    });
  }
  while (first < batch && engine.step()) {
  }
  const int64_t at_start = tokens;
  int64_t steps = 0;
  const Clock::time_point t0 = Clock::now();
  while (engine.step()) ++steps;
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  Result r;
  r.decode_tokens = tokens - at_start;
  r.decode_tps = s > 0 ? static_cast<double>(r.decode_tokens) / s : 0;
  r.step_ms = steps > 0 ? 1e3 * s / static_cast<double>(steps) : 0;
  return r;
}

}  // namespace

static int run(const Args& a) {
  if (a.load.threads > 0) kvcache::set_default_threads(a.load.threads);
  const kvcache::LoadedModel lm = kvcache::load_model(a.model);
  std::mt19937 rng(1234);
  std::printf("%6s %6s %10s %12s %10s %8s\n", "run", "batch", "dec_tokens", "decode_tok/s",
              "step_ms", "x_first");
  for (int rep = 0; rep < a.load.repeat; ++rep) {
    double base = 0;
    for (int b : a.batches) {
      const Result r = run_batch(lm, a, b, rng);
      if (base == 0) base = r.decode_tps;
      std::printf("%6d %6d %10lld %12.1f %10.2f %8.2f\n", rep, b,
                  static_cast<long long>(r.decode_tokens), r.decode_tps, r.step_ms,
                  base > 0 ? r.decode_tps / base : 0);
      std::fflush(stdout);
    }
  }
  return 0;
}

// Exit codes: see bench_main.h (a bad value or a failed run: a message and exit 2).
int main(int argc, char** argv) {
  Args a;
  CLI::App app{"bench_decode: engine decode tok/s, 1 vs N sequences"};
  app.add_option("--model", a.model, "model path or dummy:PRESET")->capture_default_str();
  app.add_option("--batches", a.batches, "batch sizes, comma-separated")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  kvcache::bench::add_load_options(app, a.load, "sequence");
  return kvcache::bench::parse_and_run(app, argc, argv, "bench_decode", [&] { return run(a); });
}
