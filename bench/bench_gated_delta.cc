// Gated DeltaNet kernels (kernels/gated_delta.h, kernels/causal_conv.h) per token, at
// Qwen3-Next's head sizes (d_k = d_v = 128) with a 125M-like head count (H_k = 4, H_v = 8; the
// /32 rows: Qwen3-Next's H_k = 16, H_v = 32). `ns_per_token` is wall-clock time per token of one
// layer; `threads` the pool's size (the value heads are split over it).
//
//   build/bench/bench_gated_delta
//   BM_GatedDeltaDecode/<H_v>/<threads>:          the recurrent form, one token per call
//   BM_GatedDeltaPrefill/<form>/<T>/<threads>:    T tokens in one call, chunked (64) or recurrent
//   BM_CausalConv/<T>/<threads>:                  the conv over 2 H_k d_k + H_v d_v channels, K = 4
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/causal_conv.h"
#include "kernels/gated_delta.h"

namespace kvcache {
namespace {

constexpr int64_t kD = 128;

std::vector<float> normal(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Inputs {
  int64_t T, Hk, Hv;
  std::vector<float> q, k, v, g, beta, state, out;
  Inputs(int64_t t, int64_t hk, int64_t hv)
      : T(t),
        Hk(hk),
        Hv(hv),
        q(normal(size_t(t * hk * kD), 1)),
        k(normal(q.size(), 2)),
        v(normal(size_t(t * hv * kD), 3)),
        g(size_t(t * hv), -0.1f),
        beta(g.size(), 0.5f),
        state(normal(size_t(hv * kD * kD), 4, 0.1f)),
        out(v.size()) {}
  GatedDeltaParams params(ThreadPool* pool) {
    GatedDeltaParams p;
    p.q = TensorView(q.data(), DType::kF32, {T, Hk, kD});
    p.k = TensorView(k.data(), DType::kF32, {T, Hk, kD});
    p.v = TensorView(v.data(), DType::kF32, {T, Hv, kD});
    p.g = TensorView(g.data(), DType::kF32, {T, Hv});
    p.beta = TensorView(beta.data(), DType::kF32, {T, Hv});
    p.state = TensorView(state.data(), DType::kF32, {Hv, kD, kD});
    p.out = TensorView(out.data(), DType::kF32, {T, Hv, kD});
    p.pool = pool;
    return p;
  }
};

void per_token(benchmark::State& state, int64_t tokens, int threads) {
  state.SetItemsProcessed(state.iterations() * tokens);
  state.counters["ns_per_token"] = benchmark::Counter(
      static_cast<double>(tokens) * 1e-9,
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.counters["threads"] = threads;
}

// args: H_v (H_k = H_v / 2), threads.
void BM_GatedDeltaDecode(benchmark::State& state) {
  const int64_t hv = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  ThreadPool pool(threads);
  Inputs in(1, hv / 2, hv);
  const GatedDeltaParams p = in.params(&pool);
  for (auto _ : state) {
    gated_delta_recurrent(p);
    benchmark::DoNotOptimize(in.out.data());
  }
  per_token(state, 1, threads);
}
BENCHMARK(BM_GatedDeltaDecode)->ArgsProduct({{8, 32}, {1, 2}})->UseRealTime();

// args: chunked (1) or recurrent (0), T, threads; H_k = 4, H_v = 8.
void BM_GatedDeltaPrefill(benchmark::State& state) {
  const bool chunked = state.range(0) != 0;
  const int64_t T = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  ThreadPool pool(threads);
  Inputs in(T, 4, 8);
  const GatedDeltaParams p = in.params(&pool);
  for (auto _ : state) {
    if (chunked) {
      gated_delta_chunked(p);
    } else {
      gated_delta_recurrent(p);
    }
    benchmark::DoNotOptimize(in.out.data());
  }
  per_token(state, T, threads);
  state.SetLabel(chunked ? "chunked" : "recurrent");
}
BENCHMARK(BM_GatedDeltaPrefill)->ArgsProduct({{1, 0}, {64, 512}, {1, 2}})->UseRealTime();

// args: T, threads; C = 2 * 4 * 128 + 8 * 128, K = 4, SiLU.
void BM_CausalConv(benchmark::State& state) {
  const int64_t T = state.range(0), C = 2 * 4 * kD + 8 * kD, K = 4;
  const int threads = static_cast<int>(state.range(1));
  ThreadPool pool(threads);
  std::vector<float> x = normal(size_t(T * C), 5), y(x.size()), w = normal(size_t(K * C), 6),
                     st = normal(size_t((K - 1) * C), 7);
  CausalConv1dParams p;
  p.x = TensorView(x.data(), DType::kF32, {T, C});
  p.y = TensorView(y.data(), DType::kF32, {T, C});
  p.weight = TensorView(w.data(), DType::kF32, {K, C});
  p.state = TensorView(st.data(), DType::kF32, {K - 1, C});
  p.pool = &pool;
  for (auto _ : state) {
    causal_conv1d(p);
    benchmark::DoNotOptimize(y.data());
  }
  per_token(state, T, threads);
}
BENCHMARK(BM_CausalConv)->ArgsProduct({{1, 512}, {1, 2}})->UseRealTime();

}  // namespace
}  // namespace kvcache

BENCHMARK_MAIN();
