// Cache append cost: the dynamic container (geometric growth, views) against the cat-every-step
// baseline that transformers' DynamicLayer amounts to (torch.cat allocates S+1 tokens and
// copies all of them at every step: O(S^2) bytes over S steps, KV cache notes "Dynamic").
// Shapes: one sequence, H_kv = 8, D = 128, f16 (a Llama-3-8B layer). Each iteration starts
// from an empty cache and appends `steps` single tokens.
//
//   build/bench/bench_cache --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <cstring>
#include <memory>
#include <tuple>

#include "cache/cache.h"
#include "core/tensor.h"

namespace kvcache {
namespace {

constexpr int64_t kHeads = 8, kHeadDim = 128;

void set_counters(benchmark::State& state, int64_t steps) {
  state.SetItemsProcessed(state.iterations() * steps);
  // Seconds per appended token (shown with an SI prefix, e.g. "8.5us").
  state.counters["per_token"] =
      benchmark::Counter(static_cast<double>(steps), benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}

void BM_DynamicAppend(benchmark::State& state) {
  const int64_t steps = state.range(0);
  CacheConfig config;
  Tensor k = Tensor::zeros(DType::kF16, {1, kHeads, 1, kHeadDim});
  Tensor v = Tensor::zeros(DType::kF16, {1, kHeads, 1, kHeadDim});
  size_t copied = 0;
  for (auto _ : state) {
    auto layer = LayerRegistry::create("dynamic", "full_attention", config, 0);
    for (int64_t i = 0; i < steps; ++i) {
      const KVSpan span = layer->update(k.view(), v.view());
      benchmark::DoNotOptimize(span.k.data());
    }
    copied = layer->stats().bytes_copied;
  }
  set_counters(state, steps);
  state.counters["copied_MB"] = static_cast<double>(copied) / 1e6;
}

// The same appends into a layer that already grew (reset() keeps the memory): what a
// multi-turn conversation or a reused cache pays — no reallocation, no page faults.
void BM_DynamicAppendAfterReset(benchmark::State& state) {
  const int64_t steps = state.range(0);
  CacheConfig config;
  Tensor k = Tensor::zeros(DType::kF16, {1, kHeads, 1, kHeadDim});
  Tensor v = Tensor::zeros(DType::kF16, {1, kHeads, 1, kHeadDim});
  auto layer = LayerRegistry::create("dynamic", "full_attention", config, 0);
  for (int64_t i = 0; i < steps; ++i) layer->update(k.view(), v.view());
  for (auto _ : state) {
    layer->reset();
    for (int64_t i = 0; i < steps; ++i) {
      const KVSpan span = layer->update(k.view(), v.view());
      benchmark::DoNotOptimize(span.k.data());
    }
  }
  set_counters(state, steps);
}

// What torch.cat does each step: a fresh [1, H, S+1, D] buffer, the old S tokens copied in
// (one run per head, since the sequence is the third axis), then the new token.
void BM_CatEveryStep(benchmark::State& state) {
  const int64_t steps = state.range(0);
  Tensor k_new = Tensor::zeros(DType::kF16, {1, kHeads, 1, kHeadDim});
  Tensor v_new = Tensor::zeros(DType::kF16, {1, kHeads, 1, kHeadDim});
  const size_t tok = kHeadDim * sizeof(f16_t);
  double copied = 0;
  for (auto _ : state) {
    Tensor k, v;
    for (int64_t s = 0; s < steps; ++s) {
      Tensor nk = Tensor::empty(DType::kF16, {1, kHeads, s + 1, kHeadDim});
      Tensor nv = Tensor::empty(DType::kF16, {1, kHeads, s + 1, kHeadDim});
      for (const auto& [dst, old, add] :
           {std::tuple{&nk, &k, &k_new}, std::tuple{&nv, &v, &v_new}}) {
        auto* d = dst->data_as<std::byte>();
        for (int64_t h = 0; h < kHeads; ++h) {
          if (s > 0)
            std::memcpy(d + h * (s + 1) * tok, old->data_as<std::byte>() + h * s * tok, s * tok);
          std::memcpy(d + (h * (s + 1) + s) * tok, add->data_as<std::byte>() + h * tok, tok);
        }
      }
      k = std::move(nk);
      v = std::move(nv);
      benchmark::DoNotOptimize(k.data());
    }
    copied = static_cast<double>(steps) * static_cast<double>(steps - 1) / 2 * 2 * kHeads * tok;
  }
  set_counters(state, steps);
  state.counters["copied_MB"] = copied / 1e6;
}

BENCHMARK(BM_DynamicAppend)->Arg(2048)->Arg(8192)->Arg(32768)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DynamicAppendAfterReset)->Arg(32768)->Unit(benchmark::kMillisecond);
// The baseline is quadratic: 32,768 steps would copy ~2.2 TB (minutes per iteration on this
// machine), so it runs at 2,048 and 8,192 steps; compare per_token at equal steps.
BENCHMARK(BM_CatEveryStep)->Arg(2048)->Arg(8192)->Unit(benchmark::kMillisecond)->Iterations(1);

}  // namespace
}  // namespace kvcache

BENCHMARK_MAIN();
