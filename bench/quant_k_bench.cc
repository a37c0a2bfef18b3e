// Decode GEMV (m = 1, allow_blas = false) over a 4096 x 4096 weight matrix in each weight type
// the k-quant kernels add (kernels/quant_k.cc) and the legacy types (kernels/quant_legacy.cc),
// beside f16 and q8_0, on one and two threads.
// bytes_per_second is weight bytes streamed: decode is bound by reading W.
//
//   build-bench/bench/quant_k_bench --benchmark_filter='q4_K|q6_K|q8_0'
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/quant_types.h"

namespace kvcache {
namespace {

std::vector<std::byte> weights(DType t, int64_t n, int64_t k) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<std::byte> w(dtype_bytes(t, n * k));
  const size_t rb = dtype_bytes(t, k);
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : row) v = d(rng);
    std::byte* dst = w.data() + static_cast<size_t>(r) * rb;
    if (t == DType::kF16) {
      f32_to_f16_n(row.data(), reinterpret_cast<f16_t*>(dst), static_cast<size_t>(k));
    } else if (t == DType::kQ8_0) {
      quantize_row_q8_0(row.data(), reinterpret_cast<BlockQ8_0*>(dst), k);
    } else {
      quant_kernels(t)->quantize_ref(row.data(), dst, k / dtype_info(t).block_elems);
    }
  }
  return w;
}

// args: threads.
void BM_DecodeGemv(benchmark::State& state, DType t) {
  constexpr int64_t n = 4096, k = 4096;
  const std::vector<std::byte> w = weights(t, n, k);
  std::vector<float> x(static_cast<size_t>(k), 0.5f), y(static_cast<size_t>(n));
  ThreadPool pool(static_cast<int>(state.range(0)));
  MatmulParams p;
  p.x = x.data();
  p.ldx = k;
  p.w = w.data();
  p.w_dtype = t;
  p.y = y.data();
  p.ldy = n;
  p.m = 1;
  p.n = n;
  p.k = k;
  p.pool = &pool;
  p.allow_blas = false;
  for (auto _ : state) {
    matmul(p);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size()));
}

BENCHMARK_CAPTURE(BM_DecodeGemv, f16, DType::kF16)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, q8_0, DType::kQ8_0)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, q6_K, DType::kQ6_K)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, q5_K, DType::kQ5_K)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, q4_K, DType::kQ4_K)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, q3_K, DType::kQ3_K)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, q2_K, DType::kQ2_K)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, q5_1, DType::kQ5_1)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, q5_0, DType::kQ5_0)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, q4_1, DType::kQ4_1)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, q4_0, DType::kQ4_0)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_DecodeGemv, iq4_nl, DType::kIQ4_NL)->Arg(1)->Arg(2)->UseRealTime();

// One thread, 256 rows x 4096 (L2-resident): the arithmetic of a row dot, not the memory.
// arg 0: the f32 dot (x as f32), 1: the integer dot (x rounded to int8 once, outside the loop,
// as the GEMV does once per product: per 256 for the k-quants, per 32 for the legacy types of
// kernels/quant_legacy.cc). bytes_per_second is weight bytes.
//
//   build/bench/quant_k_bench --benchmark_filter=RowDot
void BM_RowDot(benchmark::State& state, DType t) {
  constexpr int64_t n = 256, k = 4096;
  const std::vector<std::byte> w = weights(t, n, k);
  const QuantKernels& q = *quant_kernels(t);
  std::vector<float> x(static_cast<size_t>(k));
  std::mt19937 rng(3);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (float& v : x) v = d(rng);
  std::vector<BlockQ8K> xq(static_cast<size_t>(k / 256));
  quantize_act_q8k(x.data(), xq.data(), k / 256);
  std::vector<BlockQ8A32> xq32(static_cast<size_t>(k / 32));
  quantize_act_q8_32(x.data(), xq32.data(), k / 32);
  const bool int8 = state.range(0) == 1;
  if (int8 && q.dot_q8k == nullptr && q.dot_q8_32 == nullptr) {
    state.SkipWithError("no integer dot for this type in this build");
    return;
  }
  const size_t rb = dtype_bytes(t, k);
  const int64_t nb = k / dtype_info(t).block_elems;
  for (auto _ : state) {
    float s = 0.0f;
    for (int64_t r = 0; r < n; ++r) {
      const std::byte* row = w.data() + static_cast<size_t>(r) * rb;
      if (!int8) {
        s += q.dot(row, x.data(), nb);
      } else if (q.dot_q8k != nullptr) {
        s += q.dot_q8k(row, xq.data(), k / 256);
      } else {
        s += q.dot_q8_32(row, xq32.data(), k / 32);
      }
    }
    benchmark::DoNotOptimize(s);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size()));
}

BENCHMARK_CAPTURE(BM_RowDot, q6_K, DType::kQ6_K)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_RowDot, q5_K, DType::kQ5_K)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_RowDot, q4_K, DType::kQ4_K)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_RowDot, q3_K, DType::kQ3_K)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_RowDot, q2_K, DType::kQ2_K)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_RowDot, q5_1, DType::kQ5_1)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_RowDot, q5_0, DType::kQ5_0)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_RowDot, q4_1, DType::kQ4_1)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_RowDot, q4_0, DType::kQ4_0)->Arg(0)->Arg(1);
BENCHMARK_CAPTURE(BM_RowDot, iq4_nl, DType::kIQ4_NL)->Arg(0)->Arg(1);

}  // namespace
}  // namespace kvcache

BENCHMARK_MAIN();
