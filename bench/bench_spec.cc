// The cost of speculative decoding's verification against a one-token decode (issue 45): a
// session of stories260K holds a 380-token context (the spec_speedup.sh prompt's length), and
// each iteration either decodes one token or verifies R tokens in one batch-invariant forward
// (Session::forward_all), then rolls back so every iteration starts from the same state.
// Prompt lookup pays off when accepted tokens per forward exceed BM_Verify/R's time over
// BM_Decode's.
//
//   build/bench/bench_spec                       (KVCACHE_THREADS=1: one thread, as the script)
//   build/bench/bench_spec --benchmark_filter='BM_(Decode|Verify/5)'
//   KVCACHE_SPEC_CONTEXT=130 build/bench/bench_spec   (the context held: 1..500, default 380)
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "runtime/model_loader.h"
#include "runtime/session.h"

namespace {

using namespace kvcache;

// The context held before each iteration: KVCACHE_SPEC_CONTEXT (1..500), else 380.
int64_t context_tokens() {
  const char* e = std::getenv("KVCACHE_SPEC_CONTEXT");
  const int64_t n = e != nullptr ? std::atoll(e) : 380;
  if (n < 1 || n > 500) {
    std::fprintf(stderr, "bench_spec: KVCACHE_SPEC_CONTEXT must be 1..500, got '%s'\n", e);
    std::exit(2);
  }
  return n;
}
const int64_t kContext = context_tokens();

struct Fixture {
  LoadedModel lm;
  std::unique_ptr<Session> session;
  std::vector<int32_t> ids;  // kContext + 8 token ids
};

// Built once; nullptr (and the benchmarks skip) when the checkpoint is absent.
Fixture* fixture() {
  static std::unique_ptr<Fixture> f = [] {
    const std::string path =
        std::string(KVCACHE_SHARED_DIR) + "/models/stories260K/stories260K.bin";
    if (!std::filesystem::exists(path)) return std::unique_ptr<Fixture>();
    auto x = std::make_unique<Fixture>();
    x->lm = load_model(path);
    SessionConfig sc;
    x->session = std::make_unique<Session>(*x->lm.model, sc);
    x->ids.push_back(1);
    for (int64_t i = 1; i < kContext + 8; ++i)
      x->ids.push_back(static_cast<int32_t>(7 + i * 37 % 500));
    x->session->prefill(std::span<const int32_t>(x->ids.data(), kContext));
    return x;
  }();
  return f.get();
}

void BM_Decode(benchmark::State& state) {
  Fixture* f = fixture();
  if (f == nullptr) return state.SkipWithError("needs ../shared/models/stories260K");
  for (auto _ : state) {
    benchmark::DoNotOptimize(f->session->decode(f->ids[kContext]).data());
    f->session->rollback(1);
  }
}

void BM_Verify(benchmark::State& state) {
  Fixture* f = fixture();
  if (f == nullptr) return state.SkipWithError("needs ../shared/models/stories260K");
  const int64_t rows = state.range(0);
  const std::span<const int32_t> batch(f->ids.data() + kContext, static_cast<size_t>(rows));
  for (auto _ : state) {
    benchmark::DoNotOptimize(f->session->forward_all(batch, /*batch_invariant=*/true).data());
    f->session->rollback(rows);
  }
}

BENCHMARK(BM_Decode)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Verify)->Arg(2)->Arg(3)->Arg(5)->Arg(9)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
