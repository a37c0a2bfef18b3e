// Decode GEMV (matmul with M = 1, allow_blas = false: the fused dot row by row) of a 4096 x 4096
// weight matrix on one thread, per weight type, against the machine's single-thread read
// bandwidth (BM_ReadBandwidth: a sum over a buffer of the same order of size). Bytes are W's
// bytes, so bytes_per_second of a type over the read bandwidth is how close its decode gets to
// being memory-bound. Several copies of W are cycled so that every iteration reads from
// memory, not from the last-level cache.
//
//   build-bench/bench/bench_quant
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/quant_types.h"

namespace kvcache {
namespace {

constexpr int64_t kN = 4096, kK = 4096;
constexpr size_t kCycleBytes = size_t{256} << 20;  // well above any last-level cache

size_t copies_for(size_t bytes) {
  return std::max<size_t>(2, (kCycleBytes + bytes - 1) / bytes);
}

void BM_Gemv4096(benchmark::State& state, DType t) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(kK), wf(static_cast<size_t>(kN * kK)), y(kN);
  for (float& v : x) v = d(rng);
  for (float& v : wf) v = d(rng);
  const size_t rb = dtype_bytes(t, kK), bytes = rb * kN;
  std::vector<std::byte> w0(bytes);
  for (int64_t r = 0; r < kN; ++r) {
    const float* src = wf.data() + r * kK;
    std::byte* dst = w0.data() + static_cast<size_t>(r) * rb;
    if (t == DType::kF16)
      f32_to_f16_n(src, reinterpret_cast<f16_t*>(dst), kK);
    else if (t == DType::kQ8_0)
      quantize_row_q8_0(src, reinterpret_cast<BlockQ8_0*>(dst), kK);
    else
      quant_kernels(t)->quantize_ref(src, dst, kK / dtype_info(t).block_elems);
  }
  const size_t copies = copies_for(bytes);
  std::vector<std::byte> w(bytes * copies);
  for (size_t c = 0; c < copies; ++c) std::memcpy(w.data() + c * bytes, w0.data(), bytes);
  ThreadPool pool(1);
  MatmulParams p;
  p.x = x.data();
  p.ldx = kK;
  p.w_dtype = t;
  p.y = y.data();
  p.ldy = kN;
  p.m = 1;
  p.n = kN;
  p.k = kK;
  p.pool = &pool;
  p.allow_blas = false;
  size_t c = 0;
  for (auto _ : state) {
    p.w = w.data() + c * bytes;
    c = (c + 1) % copies;
    matmul(p);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * bytes));
}

void BM_ReadBandwidth(benchmark::State& state) {
  std::vector<uint64_t> buf(kCycleBytes / sizeof(uint64_t), 1);
  const size_t chunk = buf.size() / 16;  // 16 MB per iteration, cycling through the buffer
  size_t at = 0;
  for (auto _ : state) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    const uint64_t* p = buf.data() + at;
    for (size_t i = 0; i < chunk; i += 4) {
      s0 += p[i];
      s1 += p[i + 1];
      s2 += p[i + 2];
      s3 += p[i + 3];
    }
    benchmark::DoNotOptimize(s0 + s1 + s2 + s3);
    at = (at + chunk) % buf.size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * chunk * sizeof(uint64_t)));
}

BENCHMARK(BM_ReadBandwidth);
BENCHMARK_CAPTURE(BM_Gemv4096, f16, DType::kF16);
BENCHMARK_CAPTURE(BM_Gemv4096, q8_0, DType::kQ8_0);
BENCHMARK_CAPTURE(BM_Gemv4096, q4_0, DType::kQ4_0);
BENCHMARK_CAPTURE(BM_Gemv4096, q4_1, DType::kQ4_1);
BENCHMARK_CAPTURE(BM_Gemv4096, q5_0, DType::kQ5_0);
BENCHMARK_CAPTURE(BM_Gemv4096, q5_1, DType::kQ5_1);
BENCHMARK_CAPTURE(BM_Gemv4096, iq4_nl, DType::kIQ4_NL);

}  // namespace
}  // namespace kvcache

BENCHMARK_MAIN();
