// The GEMV path of matmul() (allow_blas = false: what batch-invariant decode runs) on one
// thread, for the llama-125m shapes, against the number of rows M. Items are multiply-adds,
// so items_per_second compares M = 1 (bound by reading W) with M = 16 (bound by arithmetic
// and by streaming the activations): the batched-decode speedup of the linears is
// 16 * time(M=1) / time(M=16).
//
//   build/bench/bench_gemv --benchmark_filter='f16'
// f16/1/65536/1024 streams 128 MiB of W from memory: its bytes_per_second against
// `KVCACHE_THREADS=1 bench_attention --benchmark_filter=BM_ReadBandwidth/` says whether the
// one-row GEMV is memory-bound on this host.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"

namespace kvcache {
namespace {

// args: M, N, K; W in dtype t.
void BM_Gemv(benchmark::State& state, DType t) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(m * k)), wf(static_cast<size_t>(n * k)),
      y(static_cast<size_t>(m * n));
  for (float& v : x) v = d(rng);
  for (float& v : wf) v = d(rng);
  std::vector<std::byte> w(dtype_bytes(t, n * k));
  for (int64_t r = 0; r < n; ++r) {
    const float* src = wf.data() + r * k;
    std::byte* dst = w.data() + static_cast<size_t>(r) * dtype_bytes(t, k);
    if (t == DType::kF16)
      f32_to_f16_n(src, reinterpret_cast<f16_t*>(dst), static_cast<size_t>(k));
    else if (t == DType::kBF16)
      f32_to_bf16_n(src, reinterpret_cast<bf16_t*>(dst), static_cast<size_t>(k));
    else if (t == DType::kQ8_0)
      quantize_row_q8_0(src, reinterpret_cast<BlockQ8_0*>(dst), k);
    else
      std::copy(src, src + k, reinterpret_cast<float*>(dst));
  }
  ThreadPool pool(1);
  MatmulParams p;
  p.x = x.data();
  p.ldx = k;
  p.w = w.data();
  p.w_dtype = t;
  p.y = y.data();
  p.ldy = n;
  p.m = m;
  p.n = n;
  p.k = k;
  p.pool = &pool;
  p.allow_blas = false;
  for (auto _ : state) {
    matmul(p);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * m * n * k);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size()));  // W read
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t m : {1, 4, 16})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{2048, 768}, {768, 2048}}) b->Args({m, n, k});
  // W of 128 MiB (f16), beyond any last-level cache: the one-row GEMV streaming W from memory,
  // to hold against BM_ReadBandwidth on one thread (bench_attention, KVCACHE_THREADS=1).
  b->Args({1, 65536, 1024});
}

// A small model's shapes (stories260K: dim 64, ffn 172, vocab 512; f32), where K is a few
// 8-chunks and each output's horizontal sum is a large part of its work, for one row (decode)
// and five (a speculative verification of 4 drafts).
void small_shapes(benchmark::internal::Benchmark* b) {
  for (int64_t m : {1, 5})
    for (auto [n, k] : {std::pair<int64_t, int64_t>{512, 64}, {172, 64}, {64, 172}})
      b->Args({m, n, k});
}

BENCHMARK_CAPTURE(BM_Gemv, f16, DType::kF16)->Apply(shapes);
BENCHMARK_CAPTURE(BM_Gemv, f32, DType::kF32)->Apply(small_shapes);
BENCHMARK_CAPTURE(BM_Gemv, q8_0, DType::kQ8_0)->Apply(shapes);

}  // namespace
}  // namespace kvcache

BENCHMARK_MAIN();
