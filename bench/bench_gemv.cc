// The GEMV path of matmul() (allow_blas = false: what batch-invariant decode runs) on one
// thread, for the llama-125m shapes, against the number of rows M. Items are multiply-adds,
// so items_per_second compares M = 1 (bound by reading W) with M = 16 (bound by arithmetic
// and by streaming the activations): the batched-decode speedup of the linears is
// 16 * time(M=1) / time(M=16).
//
//   build/bench/bench_gemv --benchmark_filter='f16'
// f16/1/65536/1024 streams 128 MiB of W from memory: its bytes_per_second against
// `KVCACHE_THREADS=1 bench_attention --benchmark_filter=BM_ReadBandwidth/` says whether the
// one-row GEMV is memory-bound on this host. BM_ReadRows/{1,8}: the cost of reading W's rows
// side by side rather than one after another (see below).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "core/machine_limits.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace kvcache {
namespace {

// args: M, N, K; W in dtype t.
void BM_Gemv(benchmark::State& state, DType t) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  // x and W in Tensor-aligned buffers (64 bytes), as the model keeps them: from a std::vector
  // (16-byte aligned) a 64-byte load of x can straddle two cache lines, two loads' cost.
  std::vector<float> wf(static_cast<size_t>(n * k)), y(static_cast<size_t>(m * n));
  Tensor xt = Tensor::empty(DType::kF32, Shape{m, k});
  float* x = xt.data_as<float>();
  for (int64_t i = 0; i < m * k; ++i) x[i] = d(rng);
  for (float& v : wf) v = d(rng);
  ByteBuffer w(dtype_bytes(t, n * k));
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
  p.x = x;
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

// One decode step's linears of the 125M llama (dim 768, 12 layers, 4 of 12 heads for K/V,
// ffn 2048, vocab 32000; f16, 238 MiB of W): Q/K/V and gate/up as matmul_group's grouped loops,
// as the model runs them, on all the pool's threads, every matrix its own buffer (ByteBuffer:
// allocate_large, huge pages advised for the large ones, as the model's tensors), so W streams
// from memory as in `kvcache bench`. bytes_per_second is W read; BM_GemvStepReadBandwidth's
// read_bytes_per_second is `kvcache bench`'s read probe over as many bytes, same threads, so
// the ratio of the two is the GEMV's fraction of the read bandwidth inside a model step.
// The argument is the rows of x: 1 (one sequence) or 16 (a batched step, compute-bound:
// items_per_second is its multiply-adds, to hold against the FMA peak, BM_FmaPeak's 16 lanes x 2
// flops per FMA).
struct StepWeights {
  struct Layer {
    ByteBuffer q, k, v, o, gate, up, down;
  };
  std::vector<Layer> layers;
  ByteBuffer head;
  size_t bytes = 0;
};
constexpr int64_t kDim = 768, kKv = 256, kFfn = 2048, kVocab = 32000, kLayers = 12;

const StepWeights& step_weights() {
  static const StepWeights w = [] {
    StepWeights s;
    std::mt19937 rng(11);
    auto make = [&](int64_t n, int64_t k) {
      ByteBuffer b(dtype_bytes(DType::kF16, n * k));
      auto* h = reinterpret_cast<f16_t*>(b.data());
      for (int64_t i = 0; i < n * k; ++i)
        h[i] = f32_to_f16(static_cast<float>(rng() % 64) / 64 - 0.5f);
      s.bytes += b.size();
      return b;
    };
    for (int64_t l = 0; l < kLayers; ++l)
      s.layers.push_back({make(kDim, kDim), make(kKv, kDim), make(kKv, kDim), make(kDim, kDim),
                          make(kFfn, kDim), make(kFfn, kDim), make(kDim, kFfn)});
    s.head = make(kVocab, kDim);
    return s;
  }();
  return w;
}

void BM_GemvStep(benchmark::State& state) {
  const StepWeights& w = step_weights();
  const int64_t m = state.range(0);  // rows of x: sequences decoded together
  // Activations as the model keeps them: Tensor buffers, 64-byte aligned.
  auto buf = [m](int64_t n) {
    Tensor t = Tensor::empty(DType::kF32, Shape{m, n});
    std::fill_n(t.data_as<float>(), m * n, 0.25f);
    return t;
  };
  Tensor x = buf(kFfn), q = buf(kDim), k = buf(kKv), v = buf(kKv), o = buf(kDim), g = buf(kFfn),
         u = buf(kFfn), logits = buf(kVocab);
  auto params = [m](const ByteBuffer& wb, int64_t n, int64_t kk, Tensor& xs, Tensor& y) {
    MatmulParams p;
    p.x = xs.data_as<float>();
    p.ldx = kk;
    p.w = wb.data();
    p.w_dtype = DType::kF16;
    p.y = y.data_as<float>();
    p.ldy = n;
    p.m = m;
    p.n = n;
    p.k = kk;
    p.allow_blas = false;
    return p;
  };
  for (auto _ : state) {
    for (const StepWeights::Layer& l : w.layers) {
      const MatmulParams qkv[3] = {params(l.q, kDim, kDim, x, q), params(l.k, kKv, kDim, x, k),
                                   params(l.v, kKv, kDim, x, v)};
      matmul_group(qkv);
      matmul(params(l.o, kDim, kDim, q, o));
      const MatmulParams gu[2] = {params(l.gate, kFfn, kDim, o, g), params(l.up, kFfn, kDim, o, u)};
      matmul_group(gu);
      matmul(params(l.down, kDim, kFfn, g, o));
    }
    matmul(params(w.head, kVocab, kDim, o, logits));
    benchmark::DoNotOptimize(logits.data_as<float>());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.bytes));
  // Multiply-adds: W's elements (f16, 2 bytes) times the rows of x.
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(w.bytes) / 2 * m);
  state.counters["threads"] = default_pool().n_threads();
}

// The read probe of `kvcache bench` itself (probe_machine_limits: best of 5 passes, 4 MiB chunks
// handed out dynamically) over as many bytes as one step's W; its result is the counter
// read_bytes_per_second (the iteration's own time includes the probe's setup and a token FMA
// run, so it is not a bandwidth).
void BM_GemvStepReadBandwidth(benchmark::State& state) {
  MachineProbeOptions o;
  o.read_bytes = static_cast<int64_t>(step_weights().bytes);
  o.fma_iterations = 1000;
  o.fma_repetitions = 1;
  double best = 0;
  for (auto _ : state)
    best = std::max(best, probe_machine_limits(default_pool(), o).read_bytes_per_s);
  state.counters["read_bytes_per_second"] =
      benchmark::Counter(best, benchmark::Counter::kDefaults, benchmark::Counter::OneK::kIs1024);
  state.counters["threads"] = default_pool().n_threads();
}

// Why the one-row GEMV reads W one row after another (matmul.cc, gemv_rows): 256 MiB of rows of
// 1536 bytes (the 125M model's K = 768 in f16), every thread summing its share with no other
// arithmetic, 32 bytes a load, either row after row (arg 1: one sequential stream) or 8 rows
// side by side (arg 8: a load from each of 8 rows in turn, the pattern of 8-row GEMV tiles).
// The same bytes, the same loads; the ratio of the two is what the order alone costs.
#if defined(__AVX2__)
template <int kSide>
void BM_ReadRows(benchmark::State& state) {
  constexpr int64_t kRowBytes = 1536, kRows = (int64_t{256} << 20) / kRowBytes / 64 * 64;
  static const auto buf = [] {
    auto b = allocate_large(static_cast<size_t>(kRows * kRowBytes));
    std::fill_n(b.get(), kRows * kRowBytes, std::byte{1});
    return b;
  }();
  ThreadPool& pool = default_pool();
  const int nt = pool.n_threads();
  std::vector<float> sums(static_cast<size_t>(nt));
  for (auto _ : state) {
    pool.parallel_for(nt, [&](int64_t t) {
      const int64_t r0 = kRows * t / nt / 8 * 8, r1 = kRows * (t + 1) / nt / 8 * 8;
      // Every step 8 loads into 8 accumulators: load v from row r + v % kSide, 32 (v / kSide)
      // bytes on, so both orders run the same 8 add chains.
      __m256 acc[8];
      for (__m256& a : acc) a = _mm256_setzero_ps();
      for (int64_t r = r0; r < r1; r += kSide)
        for (int64_t j = 0; j < kRowBytes; j += 32 * (8 / kSide))
#pragma GCC unroll 8
          for (int v = 0; v < 8; ++v) {
            const auto* p = buf.get() + (r + v % kSide) * kRowBytes + j + 32 * (v / kSide);
            acc[v] = _mm256_add_ps(acc[v], _mm256_loadu_ps(reinterpret_cast<const float*>(p)));
          }
      for (int v = 1; v < 8; ++v) acc[0] = _mm256_add_ps(acc[0], acc[v]);
      alignas(32) float o[8];
      _mm256_store_ps(o, acc[0]);
      sums[static_cast<size_t>(t)] = o[0];
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(state.iterations() * (kRows / nt / 8 * 8 * nt) * kRowBytes);
  state.counters["threads"] = nt;
}
BENCHMARK_TEMPLATE(BM_ReadRows, 1)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(BM_ReadRows, 8)->UseRealTime()->Unit(benchmark::kMillisecond);
#endif

BENCHMARK(BM_GemvStep)->Arg(1)->Arg(16)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_GemvStepReadBandwidth)->UseRealTime()->Unit(benchmark::kMillisecond)->Iterations(3);

}  // namespace
}  // namespace kvcache

BENCHMARK_MAIN();
