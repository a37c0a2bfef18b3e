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
#include <vector>

#include "cache/cache.h"
#include "core/tensor.h"
#include "kernels/kv_quant.h"

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

// One KIVI block quantized (G = 64 tokens, D channels, v_group 64, 4 bits): the vector quantizer
// against the scalar reference it equals byte for byte. A quantized cache runs it once per G
// tokens per (row, KV head) when its residual flushes, on the caller's thread; the first decode
// step after a prefill flushes the last prefill chunk (512 tokens by default) of every layer.
template <bool kKeys, bool kReference>
void BM_KiviQuantizeBlock(benchmark::State& state) {
  const int64_t G = 64, D = state.range(0);
  KiviBlockParams p;
  p.group = G;
  p.d = D;
  p.v_group = 64;
  p.bits = 4;
  std::vector<float> x(static_cast<size_t>(G * D));
  uint32_t r = 12345;
  for (auto& v : x) {
    r = r * 1664525u + 1013904223u;
    v = static_cast<float>(r >> 8) / 16777216.0f - 0.5f;
  }
  std::vector<std::byte> block(
      static_cast<size_t>(kKeys ? kivi_k_block_bytes(G, D, 4) : kivi_v_block_bytes(G, D, 64, 4)));
  for (auto _ : state) {
    if constexpr (kKeys)
      (kReference ? kivi_quantize_keys_reference : kivi_quantize_keys)(x.data(), D, p,
                                                                       block.data());
    else
      (kReference ? kivi_quantize_values_reference : kivi_quantize_values)(x.data(), D, p,
                                                                           block.data());
    benchmark::DoNotOptimize(block.data());
  }
  state.SetItemsProcessed(state.iterations() * G * D);
}
BENCHMARK(BM_KiviQuantizeBlock<true, true>)
    ->Name("BM_KiviQuantizeBlock/keys/reference")
    ->Arg(64)
    ->Arg(128);
BENCHMARK(BM_KiviQuantizeBlock<true, false>)
    ->Name("BM_KiviQuantizeBlock/keys/vector")
    ->Arg(64)
    ->Arg(128);
BENCHMARK(BM_KiviQuantizeBlock<false, true>)
    ->Name("BM_KiviQuantizeBlock/values/reference")
    ->Arg(64)
    ->Arg(128);
BENCHMARK(BM_KiviQuantizeBlock<false, false>)
    ->Name("BM_KiviQuantizeBlock/values/vector")
    ->Arg(64)
    ->Arg(128);

}  // namespace
}  // namespace kvcache

BENCHMARK_MAIN();
