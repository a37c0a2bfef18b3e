// Attention benchmarks: the machine's read bandwidth (STREAM-like sum over 1 GiB) and FMA rate
// (BM_FmaPeak), decode attention as GB/s of K/V read (its limits: that bandwidth, and its FMA
// count `fma_M` over that rate), and prefill attention in GFLOP/s.
// Threads: KVCACHE_THREADS if set, else 2 (the setting). Times are wall-clock
// (UseRealTime), so bytes_per_second in --benchmark_format=json is K/V bytes per second.
//
//   build/bench/bench_attention --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//   BM_ReadBandwidthPrefetch: the same sum with a software prefetch 16 lines ahead, the reader
//   the decode kernel is (how far a ratio to BM_ReadBandwidth is from this host's ceiling).
//   BM_DecodeAttentionHot/<dtype>/<keys>: one copy of K/V read again and again (cache-resident):
//   the decode kernel's compute ceiling. Below BM_ReadBandwidth, decode cannot be memory-bound.
//   BM_DecodeAttention125MHot/<q8|q4>/2048: the same for the KIVI kernels at the 125M shape
//   (KVCACHE_THREADS=1: time per key and KV head on one core).
//   BM_FlexPrefill/{fn,block_mask,block_mask_build}: a user mask called per pair vs read as bits.
//   BM_PrefixSuffixAttention/<S_q>/<S_kv>: prefill rows against a long f16 cache (TTFT shapes).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "core/error.h"
#include "core/machine_limits.h"
#include "core/prefetch.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/attention_quant.h"
#include "kernels/attention_workspace.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace kvcache {
namespace {

// ---- read bandwidth: every thread sums its share of a 1 GiB buffer ----
// BM_ReadBandwidth runs read_sum (core/machine_limits.h), the loop `kvcache bench`'s probe
// times too, so the two report the same limit: the plain STREAM-like reference.
// BM_ReadBandwidthPrefetch: each 2-line step also prefetches (T0) the lines kReadAheadLines
// ahead, the reader the decode kernel is; it says how far from this host's ceiling a ratio to
// BM_ReadBandwidth is. n must be a multiple of 32 and p 32-byte aligned (the caller's chunks are).
constexpr int64_t kReadAheadLines = 16;
float sum_floats_prefetch(const float* p, int64_t n) {
#if defined(__AVX2__)
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n; i += 32) {
    const float* ahead = p + i + kReadAheadLines * 16;  // 16 floats per 64-byte line
    prefetch_l1(ahead);
    prefetch_l1(ahead + 16);
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
#else
  return read_sum(p, n);
#endif
}

// ---- compute ceiling: every thread runs fma_chains (core/machine_limits.h) ----
// kFmaChains independent chains of the widest FMAs the build has, the loop `kvcache bench`'s
// probe times too. The other half of decode's roofline. items_per_second = 8-lane FMA
// instructions per second over all threads (a 16-lane AVX-512 FMA counts as two: Zen 4/5 run
// one at the 8-lane rate): decode of S keys needs 2 * H_q * D * S / 8 of them (scores and
// P.V), so that count divided by this rate is the kernel's compute floor on this machine.
void BM_FmaPeak(benchmark::State& state) {
  constexpr int64_t kIters = 2'000'000;  // x kFmaChains FMAs per task
  ThreadPool& pool = default_pool();
  const int64_t tasks = pool.n_threads();
  std::vector<float> sink(static_cast<size_t>(tasks));
  for (auto _ : state) {
    pool.parallel_for(tasks, [&](int64_t t) { sink[static_cast<size_t>(t)] = fma_chains(kIters); });
    benchmark::DoNotOptimize(sink.data());
  }
  state.SetItemsProcessed(state.iterations() * tasks * kIters * kFmaChains * kFmaLanes / 8);
  state.counters["threads"] = static_cast<double>(tasks);
  state.counters["lanes"] = static_cast<double>(kFmaLanes);
}

// ---- the decode score loop's ceiling per K format, in L1 ----
// The inner loops of decode scores over keys that stay in L1, so only the instruction mix
// counts, each with its kernel's register block (4 query rows of a GQA group, D = 128): f16
// keys as the fused kernel reads them (4 rows x 3 keys, 12 accumulators; one F16C conversion
// per 8 elements, then 4 FMAs) against 4-bit codes as the quantized kernel reads them (4 rows x
// 2 keys; a zero-extending load per 16 codes, a mask or a shift per 8, an int->float
// conversion, then 4 FMAs). Items are FMAs; compare with BM_FmaPeak in the same run. It bounds
// what a 4-bit cache can gain over f16 once f16 no longer waits on memory.
template <bool kU4>
float score_loop(int64_t reps) {
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
  constexpr int kD = 128, kRows = 4, kKeys = kU4 ? 2 : 3, kStep = kU4 ? 16 : 8;
  alignas(64) static f16_t kf16[3][kD];
  alignas(64) static uint8_t ku4[2][kD / 2];
  alignas(64) float q[kRows][kD];
  for (int r = 0; r < kRows; ++r)
    for (int d = 0; d < kD; ++d) q[r][d] = 1e-3f * static_cast<float>((r * 7 + d) % 13);
  __m256 acc[kRows * kKeys];
  for (__m256& a : acc) a = _mm256_setzero_ps();
  for (int64_t it = 0; it < reps; ++it) {
#pragma GCC unroll 16
    for (int d = 0; d < kD; d += kStep) {
      if constexpr (kU4) {
        __m256i w[kKeys];
        for (int c = 0; c < kKeys; ++c)
          w[c] = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&ku4[c][d / 2])));
        for (int h = 0; h < 2; ++h) {
          __m256 kv[kKeys];
          for (int c = 0; c < kKeys; ++c)
            kv[c] = _mm256_cvtepi32_ps(h == 0 ? _mm256_and_si256(w[c], _mm256_set1_epi32(15))
                                              : _mm256_srli_epi32(w[c], 4));
          for (int r = 0; r < kRows; ++r) {
            __m256 qv = _mm256_load_ps(&q[r][d + 8 * h]);
            asm("" : "+x"(qv));  // one q load per row and vector, as the kernels do
            for (int c = 0; c < kKeys; ++c)
              acc[r * kKeys + c] = _mm256_fmadd_ps(qv, kv[c], acc[r * kKeys + c]);
          }
        }
      } else {
        __m256 kv[kKeys];
        for (int c = 0; c < kKeys; ++c)
          kv[c] = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(&kf16[c][d])));
        for (int r = 0; r < kRows; ++r) {
          __m256 qv = _mm256_load_ps(&q[r][d]);
          asm("" : "+x"(qv));
          for (int c = 0; c < kKeys; ++c)
            acc[r * kKeys + c] = _mm256_fmadd_ps(qv, kv[c], acc[r * kKeys + c]);
        }
      }
    }
    benchmark::ClobberMemory();
  }
  __m256 s = acc[0];
  for (int i = 1; i < kRows * kKeys; ++i) s = _mm256_add_ps(s, acc[i]);
  return _mm256_cvtss_f32(s);
#else
  (void)reps;
  return 0.0f;
#endif
}

template <bool kU4>
void BM_ScoreLoop(benchmark::State& state) {
  constexpr int64_t kReps = 200'000;
  constexpr int64_t kFmasPerRep = 4 * (128 / 8) * (kU4 ? 2 : 3);  // rows x vectors x keys
  ThreadPool& pool = default_pool();
  const int64_t tasks = pool.n_threads();
  std::vector<float> sink(static_cast<size_t>(tasks));
  for (auto _ : state) {
    pool.parallel_for(tasks,
                      [&](int64_t t) { sink[static_cast<size_t>(t)] = score_loop<kU4>(kReps); });
    benchmark::DoNotOptimize(sink.data());
  }
  state.SetItemsProcessed(state.iterations() * tasks * kReps * kFmasPerRep);
  state.counters["threads"] = static_cast<double>(tasks);
}

// The read tests' 1 GiB, allocated and touched once for both.
const Tensor& read_buffer(int64_t n) {
  static Tensor buf;
  if (buf.numel() != n) {
    buf = Tensor::empty(DType::kF32, {n});
    for (int64_t i = 0; i < n; ++i) buf.data_as<float>()[i] = static_cast<float>(i & 7);
  }
  return buf;
}

template <bool kPrefetch>
void BM_ReadBandwidth(benchmark::State& state) {
  constexpr int64_t kBytes = int64_t{1} << 30;
  constexpr int64_t kChunks = 64;  // 16 MiB per task, handed out dynamically
  const int64_t n = kBytes / static_cast<int64_t>(sizeof(float)), per = n / kChunks;
  const Tensor& buf = read_buffer(n);
  const float* p = buf.data_as<float>();
  std::vector<float> partial(kChunks);
  ThreadPool& pool = default_pool();
  for (auto _ : state) {
    pool.parallel_for(kChunks, [&](int64_t t) {
      partial[static_cast<size_t>(t)] =
          kPrefetch ? sum_floats_prefetch(p + t * per, per) : read_sum(p + t * per, per);
    });
    benchmark::DoNotOptimize(partial.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kBytes);
  state.counters["threads"] = pool.n_threads();
}

// Uniform values in [-2, 2) from a 32-bit LCG: setup must be cheap, since Google Benchmark calls
// a benchmark function several times while it sizes the iteration count.
void fill_random(const TensorView& t, uint32_t seed) {
  std::vector<float> row(static_cast<size_t>(t.numel()));
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : row) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) * (4.0f / 16777216.0f) - 2.0f;
  }
  convert_n(row.data(), DType::kF32, t.data(), t.dtype(), row.size());
}

// ---- decode: B = 1, q_len = 1, the heads of a DecodeShape ----
// A decode step reads each layer's K/V once, then every other layer's and the weights before it
// comes back to this one, so the step's K/V arrive from memory. A benchmark that reads one K/V
// set over and over measures whatever cache level holds it instead (a 16K f16 set is 64 MiB:
// in L3 on a host with 480 MiB of it, where decode "beat" the DRAM bandwidth by 1.4x). So each
// benchmark keeps `copies` K/V sets, as many as make up the read-bandwidth test's working set
// (kStreamBytes), and iteration i reads set i % copies: both stream from the same level.
constexpr int64_t kStreamBytes = int64_t{1} << 30;

int64_t stream_copies(int64_t set_bytes) {
  return std::max<int64_t>(1, (kStreamBytes + set_bytes - 1) / set_bytes);
}

// The decode benchmarks' head geometry: the wide default (32 query heads over 8 KV heads,
// D = 128, the issue targets' shape) and the 125M GGUF's (12 over 4, D = 64), the shape of
// `kvcache bench`'s end-to-end rows, where per-key work weighs twice as much against the bytes.
struct DecodeShape {
  int64_t Hq = 32, Hkv = 8, D = 128;
  bool operator==(const DecodeShape&) const = default;
};
constexpr DecodeShape kWide{}, kModel125M{12, 4, 64};

struct DecodeInputs {
  DType dtype = DType::kF32;
  DecodeShape shape;
  int64_t kv_len = -1;
  bool hot = false;
  std::vector<Tensor> k, v;  // [copies] x [1, H_kv, S, D] as a cache keeps them
  Tensor qbuf, obuf;         // q/out [1, 1, H_q, D]
};

// hot: one copy of K/V, read again at every iteration (cache-resident for short caches): the
// kernel's compute ceiling, to tell a compute-bound kernel from a memory-bound one.
void BM_DecodeAttention(benchmark::State& state, DecodeShape shape, DType kv_dtype, int64_t kv_len,
                        bool hot) {
  const int64_t kHq = shape.Hq, kHkv = shape.Hkv, kD = shape.D;
  static DecodeInputs in;  // kept across the calls of one benchmark (rebuilt when it changes)
  if (in.dtype != kv_dtype || in.shape != shape || in.kv_len != kv_len || in.hot != hot) {
    in = DecodeInputs();
    in.dtype = kv_dtype;
    in.shape = shape;
    in.kv_len = kv_len;
    in.hot = hot;
    Tensor k = Tensor::empty(kv_dtype, {1, kHkv, kv_len, kD});
    Tensor v = Tensor::empty(kv_dtype, {1, kHkv, kv_len, kD});
    fill_random(k.view(), 1);
    fill_random(v.view(), 2);
    const int64_t copies =
        hot ? 1 : stream_copies(static_cast<int64_t>(k.size_bytes() + v.size_bytes()));
    for (int64_t c = 1; c < copies; ++c) {  // the same values: every set costs the same
      in.k.push_back(k.clone());
      in.v.push_back(v.clone());
    }
    in.k.push_back(std::move(k));
    in.v.push_back(std::move(v));
    in.qbuf = Tensor::empty(DType::kF32, {1, 1, kHq, kD});
    in.obuf = Tensor::empty(DType::kF32, {1, 1, kHq, kD});
    fill_random(in.qbuf.view(), 3);
  }
  // q/out: [B, S, H, D] buffers seen as [B, H, S, D] views, as the model runtime passes them.
  const TensorView q(in.qbuf.data(), DType::kF32, {1, kHq, 1, kD}, {kHq * kD, kD, kHq * kD, 1});
  const TensorView out(in.obuf.data(), DType::kF32, {1, kHq, 1, kD}, {kHq * kD, kD, kHq * kD, 1});
  AttentionOptions o;     // causal, bottom-right: decode needs no mask
  AttentionWorkspace ws;  // planned once, as a model's forward keeps it
  o.workspace = ws.reserve_for(q, in.k[0].view(), in.v[0].view(), o);
  const AttentionFn fused = get_attention_kernel("fused");
  const size_t copies = in.k.size();
  size_t c = 0;
  for (auto _ : state) {
    fused(q, in.k[c].view(), in.v[c].view(), out, o);
    benchmark::ClobberMemory();
    c = c + 1 == copies ? 0 : c + 1;
  }
  const int64_t kv_bytes = static_cast<int64_t>(in.k[0].size_bytes() + in.v[0].size_bytes());
  state.SetBytesProcessed(state.iterations() * kv_bytes);
  state.counters["kv_MiB"] = static_cast<double>(kv_bytes) / (1 << 20);
  state.counters["copies"] = static_cast<double>(copies);
  state.counters["fma_M"] =
      2.0 * kHq * kD * static_cast<double>(kv_len) / 8 / 1e6;  // see BM_FmaPeak
}

// ---- decode over a KIVI-quantized cache (the same DecodeShapes): the "quantized" container
// filled 64 tokens per update (f16 residual, G = 64, R = 128), read by quantized_attention.
// SetBytesProcessed counts what the kernel reads: packed blocks (codes, scales, zeros) of every
// KV head plus the residual rows. As above, iteration i reads copy i % copies of those bytes
// (the container's packed store and residual copied byte for byte, the span re-pointed).
struct QuantCopy {
  ByteBuffer k_blocks, v_blocks;  // the span's packed bytes from its first block
  Tensor k_res, v_res;            // [1, H_kv, n_res, D] residual rows
  QuantKV span;                   // points into the four above
};

struct QuantDecodeInputs {
  DecodeShape shape;
  int bits = 0;
  KVQuantScheme scheme = KVQuantScheme::kKivi;
  int64_t kv_len = -1;
  bool hot = false;
  std::vector<QuantCopy> copies;
  Tensor qbuf, obuf;
  int64_t read_bytes = 0;
};

// The benchmark's span has one batch row: its bytes run from the first block of head 0.
QuantCopy copy_quant_span(const QuantKV& src) {
  KV_CHECK(src.batch == 1, "copy_quant_span copies a one-row span");
  QuantCopy c;
  auto copy_blocks = [&](const std::byte* from, int64_t head_stride, int64_t block_bytes,
                         ByteBuffer& to) {
    const int64_t n = (src.heads - 1) * head_stride + src.n_blocks * block_bytes;
    to = ByteBuffer(static_cast<size_t>(n));
    std::memcpy(to.data(), from, static_cast<size_t>(n));
  };
  copy_blocks(src.k_blocks, src.k_head_stride, src.k_block_bytes, c.k_blocks);
  copy_blocks(src.v_blocks, src.v_head_stride, src.v_block_bytes, c.v_blocks);
  c.span = src;
  c.span.k_blocks = c.k_blocks.data();
  c.span.v_blocks = c.v_blocks.data();
  if (src.residual_len() > 0) {
    c.k_res = Tensor::empty(src.k_residual.dtype(), src.k_residual.shape());
    c.v_res = Tensor::empty(src.v_residual.dtype(), src.v_residual.shape());
    copy_view(src.k_residual, c.k_res.view());
    copy_view(src.v_residual, c.v_res.view());
    c.span.k_residual = c.k_res.view();
    c.span.v_residual = c.v_res.view();
  }
  return c;
}

void BM_DecodeAttentionQuant(benchmark::State& state, DecodeShape shape, KVQuantScheme scheme,
                             int bits, int64_t kv_len, bool hot) {
  const int64_t kHq = shape.Hq, kHkv = shape.Hkv, kD = shape.D;
  constexpr int64_t kChunk = 64;
  static QuantDecodeInputs in;
  if (in.shape != shape || in.bits != bits || in.scheme != scheme || in.kv_len != kv_len ||
      in.hot != hot) {
    in = QuantDecodeInputs();
    in.hot = hot;
    in.shape = shape;
    in.bits = bits;
    in.scheme = scheme;
    in.kv_len = kv_len;
    CacheConfig cc;
    cc.options.implementation = "quantized";
    cc.layer_types = {"full_attention"};
    cc.options.kv_dtype = DType::kF16;
    cc.options.quantized.bits = bits;
    cc.options.quantized.scheme = scheme;
    Cache cache(cc);
    Tensor k = Tensor::empty(DType::kF32, {1, kHkv, kChunk, kD});
    Tensor v = Tensor::empty(DType::kF32, {1, kHkv, kChunk, kD});
    KVSpan span;
    for (int64_t t = 0; t < kv_len; t += kChunk) {
      fill_random(k.view(), static_cast<uint32_t>(2 * t + 1));
      fill_random(v.view(), static_cast<uint32_t>(2 * t + 2));
      span = cache.update(0, k.view(), v.view());
    }
    in.qbuf = Tensor::empty(DType::kF32, {1, 1, kHq, kD});
    in.obuf = Tensor::empty(DType::kF32, {1, 1, kHq, kD});
    fill_random(in.qbuf.view(), 3);
    const QuantKV& qk = span.quant;
    in.read_bytes = qk.n_blocks * qk.heads * (qk.k_block_bytes + qk.v_block_bytes) +
                    2 * qk.heads * qk.residual_len() * kD * 2;
    const int64_t copies = hot ? 1 : stream_copies(in.read_bytes);
    for (int64_t c = 0; c < copies; ++c) in.copies.push_back(copy_quant_span(qk));
  }
  const TensorView q(in.qbuf.data(), DType::kF32, {1, kHq, 1, kD}, {kHq * kD, kD, kHq * kD, 1});
  const TensorView out(in.obuf.data(), DType::kF32, {1, kHq, 1, kD}, {kHq * kD, kD, kHq * kD, 1});
  AttentionOptions o;
  KVSpan span;
  span.kind = KVSpanKind::kQuantized;
  span.quant = in.copies[0].span;
  AttentionWorkspace ws;
  o.workspace = ws.reserve_for(q, span, o);
  const size_t copies = in.copies.size();
  size_t c = 0;
  for (auto _ : state) {
    quantized_attention(q, in.copies[c].span, out, o);
    benchmark::ClobberMemory();
    c = c + 1 == copies ? 0 : c + 1;
  }
  state.SetBytesProcessed(state.iterations() * in.read_bytes);
  state.counters["kv_MiB"] = static_cast<double>(in.read_bytes) / (1 << 20);
  state.counters["copies"] = static_cast<double>(copies);
  state.counters["fma_M"] = 2.0 * kHq * kD * static_cast<double>(kv_len) / 8 / 1e6;
}

// q8 / q4 / q2: KIVI; q8_0 / q4_0: llama.cpp's per-token types through the same container.
void register_quantized() {
  struct Format {
    const char* name;
    KVQuantScheme scheme;
    int bits;
  };
  for (const Format& f :
       {Format{"q8", KVQuantScheme::kKivi, 8}, Format{"q4", KVQuantScheme::kKivi, 4},
        Format{"q2", KVQuantScheme::kKivi, 2}, Format{"q8_0", KVQuantScheme::kQ8_0, 8},
        Format{"q4_0", KVQuantScheme::kQ4_0, 4}})
    for (int64_t len : {1024, 4096, 16384, 65536}) {
      const std::string name =
          std::string("BM_DecodeAttention/") + f.name + "/" + std::to_string(len);
      benchmark::RegisterBenchmark(name.c_str(), BM_DecodeAttentionQuant, kWide, f.scheme, f.bits,
                                   len, false)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.5);
    }
  // The 125M GGUF's shape at row 23's depth: f16 (registered beside the others) against KIVI;
  // and cache-resident at 2,048 keys (one copy read again and again): the kernels' compute time.
  for (const Format& f :
       {Format{"q8", KVQuantScheme::kKivi, 8}, Format{"q4", KVQuantScheme::kKivi, 4}})
    for (const bool hot : {false, true}) {
      const int64_t len = hot ? 2048 : 16384;
      benchmark::RegisterBenchmark(
          (std::string(hot ? "BM_DecodeAttention125MHot/" : "BM_DecodeAttention125M/") + f.name +
           "/" + std::to_string(len))
              .c_str(),
          BM_DecodeAttentionQuant, kModel125M, f.scheme, f.bits, len, hot)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.5);
    }
}

// ---- prefill: q_len = kv_len = 2048, causal, 8 query heads over 2 KV heads, D = 128 ----
// The operands of BM_PrefillAttention and BM_FlexPrefill, f32 and seeded. Q and the output are
// views of [1, S, H_q, D] buffers (the model's projection layout), K/V contiguous.
struct PrefillInputs {
  static constexpr int64_t kS = 2048, kHq = 8, kHkv = 2, kD = 128;
  Tensor qbuf = Tensor::empty(DType::kF32, {1, kS, kHq, kD});
  Tensor obuf = Tensor::empty(DType::kF32, {1, kS, kHq, kD});
  Tensor k = Tensor::empty(DType::kF32, {1, kHkv, kS, kD});  // [1, H_kv, S, D]
  Tensor v = Tensor::empty(DType::kF32, {1, kHkv, kS, kD});  // [1, H_kv, S, D]
  TensorView q, out;                                         // [1, H_q, S, D], strided
  PrefillInputs() {
    fill_random(qbuf.view(), 1);
    fill_random(k.view(), 2);
    fill_random(v.view(), 3);
    const Dims st{kS * kHq * kD, kD, kHq * kD, 1};
    q = TensorView(qbuf.data(), DType::kF32, {1, kHq, kS, kD}, st);
    out = TensorView(obuf.data(), DType::kF32, {1, kHq, kS, kD}, st);
  }
};

// FLOPs counted for the visible (causal) pairs only: 4 * H_q * D * S (S + 1) / 2.
void BM_PrefillAttention(benchmark::State& state, const char* kernel) {
  constexpr int64_t kS = PrefillInputs::kS, kHq = PrefillInputs::kHq, kD = PrefillInputs::kD;
  const PrefillInputs in;
  const TensorView &q = in.q, &out = in.out;
  const Tensor &k = in.k, &v = in.v;
  AttentionOptions o;
  AttentionWorkspace ws;
  o.workspace = ws.reserve_for(q, k.view(), v.view(), o);
  const AttentionFn fn = get_attention_kernel(kernel);
  for (auto _ : state) {
    fn(q, k.view(), v.view(), out, o);
    benchmark::ClobberMemory();
  }
  const double flops = 4.0 * kHq * kD * (static_cast<double>(kS) * (kS + 1) / 2);
  state.counters["GFLOP"] = benchmark::Counter(
      flops * static_cast<double>(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

// ---- prefill against a long cache, llama-125m's attention: 12 query heads over 4 KV heads,
// D = 64, f16 K/V, causal, bottom-right aligned (query i at S_kv - S_q + i) ----
// The shapes of `kvcache bench --prefix-reuse 2000:0.9`: 208 x 2000 is the cached request's
// suffix (one call per layer), 464 x 2000 the cold prompt's last 512-token chunk. FLOPs
// counted for the visible pairs: 4 * H_q * D * sum_i (S_kv - S_q + i + 1).
void BM_PrefixSuffixAttention(benchmark::State& state) {
  constexpr int64_t kHq = 12, kHkv = 4, kD = 64;
  const int64_t sq = state.range(0), skv = state.range(1);
  Tensor q = Tensor::empty(DType::kF32, {1, kHq, sq, kD});
  Tensor out = Tensor::empty(DType::kF32, {1, kHq, sq, kD});
  Tensor k = Tensor::empty(DType::kF16, {1, kHkv, skv, kD});
  Tensor v = Tensor::empty(DType::kF16, {1, kHkv, skv, kD});
  fill_random(q.view(), 4);
  fill_random(k.view(), 5);
  fill_random(v.view(), 6);
  AttentionOptions o;
  AttentionWorkspace ws;
  o.workspace = ws.reserve_for(q.view(), k.view(), v.view(), o);
  const AttentionFn fn = get_attention_kernel("fused");
  for (auto _ : state) {
    fn(q.view(), k.view(), v.view(), out.view(), o);
    benchmark::ClobberMemory();
  }
  const double pairs = static_cast<double>(sq) * static_cast<double>(skv - sq) +
                       static_cast<double>(sq) * static_cast<double>(sq + 1) / 2;
  state.counters["GFLOP"] =
      benchmark::Counter(4.0 * kHq * kD * pairs * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate);
}

// ---- flex: a user mask_mod (packed documents of 256 tokens, causal) at prefill, 2048 x 2048 ----
// "fn": the kernel calls the function for every pair in tiles the built-ins leave visible;
// "block_mask": the function evaluated once into a BlockMask (outside the timed loop, as a
// model builds it once per forward for all layers); "block_mask_build": the cost of building.
void BM_FlexPrefill(benchmark::State& state, int mode) {
  constexpr int64_t kS = PrefillInputs::kS, kHq = PrefillInputs::kHq, kDoc = 256;
  const PrefillInputs in;
  const TensorView &q = in.q, &out = in.out;
  const Tensor &k = in.k, &v = in.v;
  const MaskFn same_doc = [](int64_t, int64_t, int64_t qp, int64_t kp) {
    return qp / kDoc == kp / kDoc;
  };
  const MaskGeometry geo = make_geometry(1, kHq, kS, kS, -1, 0);
  AttentionOptions o;  // causal built in; the document rule is the user's
  BlockMask bm;
  if (mode == 1) {
    bm = BlockMask::create(same_doc, geo, false);
    o.block_mask = &bm;
  } else {
    o.mask = &same_doc;
  }
  AttentionWorkspace ws;
  o.workspace = ws.reserve_for(q, k.view(), v.view(), o);
  const AttentionFn fn = get_attention_kernel("flex");
  for (auto _ : state) {
    if (mode == 2) {
      BlockMask built = BlockMask::create(same_doc, geo, false);
      benchmark::DoNotOptimize(built.tiles());
    } else {
      fn(q, k.view(), v.view(), out, o);
    }
    benchmark::ClobberMemory();
  }
}

void register_all() {
  benchmark::RegisterBenchmark("BM_ReadBandwidth", BM_ReadBandwidth<false>)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(1.0);
  benchmark::RegisterBenchmark("BM_ReadBandwidthPrefetch", BM_ReadBandwidth<true>)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(1.0);
  benchmark::RegisterBenchmark("BM_FmaPeak", BM_FmaPeak)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.5);
  benchmark::RegisterBenchmark("BM_ScoreLoop/f16", BM_ScoreLoop<false>)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.5);
  benchmark::RegisterBenchmark("BM_ScoreLoop/u4", BM_ScoreLoop<true>)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.5);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t len : {1024, 4096, 16384, 65536}) {
      const std::string name =
          std::string("BM_DecodeAttention/") + dtype_name(t) + "/" + std::to_string(len);
      benchmark::RegisterBenchmark(name.c_str(), BM_DecodeAttention, kWide, t, len, false)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.5);
    }
  for (DType t : {DType::kF16, DType::kBF16})
    for (int64_t len : {1024, 4096}) {
      const std::string name =
          std::string("BM_DecodeAttentionHot/") + dtype_name(t) + "/" + std::to_string(len);
      benchmark::RegisterBenchmark(name.c_str(), BM_DecodeAttention, kWide, t, len, true)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond)
          ->MinTime(0.5);
    }
  benchmark::RegisterBenchmark("BM_DecodeAttention125M/f16/16384", BM_DecodeAttention, kModel125M,
                               DType::kF16, int64_t{16384}, false)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond)
      ->MinTime(0.5);
  register_quantized();
  for (const char* kernel : {"fused", "eager"})
    benchmark::RegisterBenchmark((std::string("BM_PrefillAttention/") + kernel).c_str(),
                                 BM_PrefillAttention, kernel)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(2);
  benchmark::RegisterBenchmark("BM_PrefixSuffixAttention", BM_PrefixSuffixAttention)
      ->Args({208, 2000})
      ->Args({464, 2000})
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.5);
  int mode = 0;
  for (const char* name : {"fn", "block_mask", "block_mask_build"})
    benchmark::RegisterBenchmark((std::string("BM_FlexPrefill/") + name).c_str(), BM_FlexPrefill,
                                 mode++)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  if (!std::getenv("KVCACHE_THREADS")) kvcache::set_default_threads(2);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  kvcache::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
