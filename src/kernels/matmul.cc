#include "kernels/matmul.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/prefetch.h"
#include "core/thread_pool.h"
#include "kernels/gemm_packed.h"
#include "kernels/int8_dot.h"
#include "kernels/quant_types.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVCACHE_MATMUL_AVX2 1
#if defined(__AVX512F__)
#define KVCACHE_MATMUL_AVX512 1
#endif
#endif

namespace kvcache {

namespace {

// Below this many multiply-adds a parallel_for costs more (wake-up, join) than it saves.
constexpr int64_t kMinParallelMacs = 1 << 15;

// How a weight type's products take x. block 256: rounded to int8 per 256 (BlockQ8K) and the
// integer dot k256; block 32: per 32 (BlockQ8A32) and a32; block 0: x as f32 (f32, f16, bf16,
// and types without an integer dot in this build). Rounding is per row of x, so a row's result
// does not depend on M (batch invariance), and every path of a product (GEMV, GEMM) rounds
// the same way.
struct ActDot {
  int block = 0;
  float (*k256)(const void*, const BlockQ8K*, int64_t) = nullptr;
  float (*a32)(const void*, const BlockQ8A32*, int64_t) = nullptr;
};
ActDot act_dot(DType t);

// Bytes of one row of k values of x in the rounded form.
size_t act_row_bytes(const ActDot& a, int64_t k) {
  return a.block == 256 ? static_cast<size_t>(k / 256) * sizeof(BlockQ8K)
                        : static_cast<size_t>(k / 32) * sizeof(BlockQ8A32);
}
void quantize_act_row(const ActDot& a, const float* x, std::byte* dst, int64_t k) {
  if (a.block == 256) {
    quantize_act_q8k(x, reinterpret_cast<BlockQ8K*>(dst), k / 256);
  } else {
    quantize_act_q8_32(x, reinterpret_cast<BlockQ8A32*>(dst), k / 32);
  }
}
void round_act_row(const ActDot& a, const float* x, float* dst, int64_t k) {
  if (a.block == 256) {
    round_act_q8k(x, dst, k);
  } else {
    round_act_q8_32(x, dst, k);
  }
}
float act_dot_row(const ActDot& a, const void* w, const std::byte* xq, int64_t k) {
  return a.block == 256 ? a.k256(w, reinterpret_cast<const BlockQ8K*>(xq), k / 256)
                        : a.a32(w, reinterpret_cast<const BlockQ8A32*>(xq), k / 32);
}

#ifdef KVCACHE_MATMUL_AVX2
inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, lo);
  lo = _mm_add_ss(lo, sh);
  return _mm_cvtss_f32(lo);
}

// hsum of several accumulators at once, with hsum's tree ((x0+x4)+(x1+x5))+((x2+x6)+(x3+x7)),
// so the same bits: out[i] = hsum(a[i]) for i < N (N = 4 or 8). The halves of two accumulators
// are added in one vector (two 128-bit permutes and an add per pair), then hadd's pairwise sums
// give hsum's second and third levels (hadd adds the same two operands as hsum's movehdup and
// movehl steps; addition is commutative, bit for bit). 4 sums: 8 instructions instead of 24;
// at k = 64 the tail of a 4 x 3 tile's walk of K is otherwise a third of its instructions.
template <int N>
inline void hsum_n(const __m256* a, float* out) {
  static_assert(N == 4 || N == 8);
  __m256 y[N / 2];  // y[p] = [lo + hi of a[2p] | lo + hi of a[2p + 1]]
  for (int p = 0; p < N / 2; ++p)
    y[p] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * p], a[2 * p + 1], 0x20),
                         _mm256_permute2f128_ps(a[2 * p], a[2 * p + 1], 0x31));
  if constexpr (N == 4) {
    // h = [y0 01, y0 23, y1 01, y1 23 | ...]: lanes 0, 1 of each half hold a[0 | 1]'s and a[2
    // | 3]'s pair sums; t's lane 0 / 1 of each half: their totals.
    const __m256 h = _mm256_hadd_ps(y[0], y[1]);
    const __m256 t = _mm256_hadd_ps(h, h);
    out[0] = _mm256_cvtss_f32(t);
    out[2] = _mm_cvtss_f32(_mm_shuffle_ps(_mm256_castps256_ps128(t), _mm256_castps256_ps128(t), 1));
    const __m128 u = _mm256_extractf128_ps(t, 1);
    out[1] = _mm_cvtss_f32(u);
    out[3] = _mm_cvtss_f32(_mm_shuffle_ps(u, u, 1));
  } else {
    // t = [a0, a2, a4, a6 | a1, a3, a5, a7]'s totals.
    const __m256 t = _mm256_hadd_ps(_mm256_hadd_ps(y[0], y[1]), _mm256_hadd_ps(y[2], y[3]));
    alignas(32) float r[8];
    _mm256_store_ps(r, t);
    for (int i = 0; i < 4; ++i) out[2 * i] = r[i], out[2 * i + 1] = r[4 + i];
  }
}

// out[i] = hsum(a[i]) for i < N: 8, then 4 at a time (hsum_n), the rest one by one.
template <int N>
inline void hsum_all(const __m256* a, float* out) {
  int n = 0;
  for (; n + 8 <= N; n += 8) hsum_n<8>(a + n, out + n);
  if constexpr (N % 8 >= 4) {
    hsum_n<4>(a + n, out + n);
    n += 4;
  }
  for (; n < N; ++n) out[n] = hsum(a[n]);
}

inline __m256 load_bf16x8(const bf16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 load_f16x8(const f16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

#ifdef KVCACHE_MATMUL_AVX512
// AVX-512 builds: the arithmetic of every f32 / f16 / bf16 dot on the GEMV path (dot_row, the
// one-row GEMV, the batched tiles). Two 16-lane accumulators: a0 takes elements [32 i, 32 i + 16)
// and a1 [32 i + 16, 32 i + 32), FMAs in ascending i; then a last 16 into a0, a last 8 into a1's
// low lanes (the high ones add 0 * 0); then fold16 (a0 + a1, the halves added), hsum's 8-lane
// tree and the last k % 8 products added one by one. Two chains, not one: a lone row then
// streams at the memory's rate (32 multiply-adds per FMA latency), so the one-row GEMV reads
// W one row after another, a single sequential stream, instead of 8 rows side by side (see
// gemv_rows). Builds without AVX-512 keep the one 8-lane chain (dot_simd, dot_tile).
template <DType D>
struct Lanes16;  // W's element type as 16 (or 8) f32 lanes
template <>
struct Lanes16<DType::kF32> {
  using T = float;
  static __m512 load16(const T* p) { return _mm512_loadu_ps(p); }
  static __m256 load8(const T* p) { return _mm256_loadu_ps(p); }
  static float widen(T v) { return v; }
};
template <>
struct Lanes16<DType::kF16> {
  using T = f16_t;
  static __m512 load16(const T* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m256 load8(const T* p) { return load_f16x8(p); }
  static float widen(T v) { return f16_to_f32(v); }
};
template <>
struct Lanes16<DType::kBF16> {
  using T = bf16_t;
  static __m512 load16(const T* p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static __m256 load8(const T* p) { return load_bf16x8(p); }
  static float widen(T v) { return bf16_to_f32(v); }
};
// a0 + a1 with its 512-bit halves added: the 8 lanes that hsum (or hsum_n, same bits) finishes.
inline __m256 fold16(__m512 a0, __m512 a1) {
  const __m512 s = _mm512_add_ps(a0, a1);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
  return _mm256_add_ps(_mm512_castps512_ps256(s), hi);
}
// out[o] = hsum(fold16(a0[o], a1[o])) for the 8 outputs o = v * R + i of a tile, bit for bit,
// in 34 vector instructions and no scalar work: each level adds the same pairs of lanes as
// fold16 and hsum, for 2, 4 and then 8 outputs side by side. s_o = a0 + a1; level A adds lanes
// l and l + 8 of two outputs at once ([f_o | f_o'], fold16's halves); level B lanes l and l + 4
// of four outputs (hsum's lo + hi); levels C and D hsum's pairwise sums (y0 + y1) + (y2 + y3).
// After D, lane 4 b holds output b's total and lane 4 b + 1 output 4 + b's. Against 8 fold16s,
// hsum_n's stores and scalar moves: a 16-row decode step's linears (bench_gemv BM_GemvStep/16,
// 4 alternated runs on a Zen 5 VM) 1.06x, where a tile at K = 768 spends ~24 FMA steps per
// epilogue and the epilogue was a quarter of the tile's time.
template <int NW, int R>
inline void fold8(const __m512 (&a0)[NW][R], const __m512 (&a1)[NW][R], float* out) {
  static_assert(NW * R == 8);
  __m512 sv[8];
  for (int v = 0; v < NW; ++v)
    for (int i = 0; i < R; ++i) sv[v * R + i] = _mm512_add_ps(a0[v][i], a1[v][i]);
  __m512 f[4], y[2];
  for (int p = 0; p < 4; ++p)
    f[p] = _mm512_add_ps(_mm512_shuffle_f32x4(sv[2 * p], sv[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(sv[2 * p], sv[2 * p + 1], 0xEE));
  for (int p = 0; p < 2; ++p)
    y[p] = _mm512_add_ps(_mm512_shuffle_f32x4(f[2 * p], f[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(f[2 * p], f[2 * p + 1], 0xDD));
  const __m512 z =
      _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
  const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(z, z, 0x88), _mm512_shuffle_ps(z, z, 0xDD));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
  _mm256_storeu_ps(out, _mm512_castps512_ps256(_mm512_permutexvar_ps(idx, t)));
}

// The outputs of R x rows times NW W rows (row stride ldw), each with the arithmetic above, so
// a result has the same bits whatever the tile. pf: prefetch while walking K, linear (the W
// bytes from pf on, one row's stretch per step: the one-row GEMV) or the same columns of the
// next tile's rows (pf = w + NW rows). Whole: k is a multiple of 32 (no tails), so the
// accumulators go from the loop to the sums in registers (with the tails' code after the loop
// GCC kept a 4 x 2 tile's in memory: a third of its instructions were spills and reloads).
template <int R, int NW, DType D, bool Whole = false, typename T = typename Lanes16<D>::T>
void dot_tile16(const T* w, int64_t ldw, const float* x, int64_t ldx, int64_t k,
                const std::byte* pf, bool pf_linear, float (&s)[NW][R]) {
  __m512 a0[NW][R], a1[NW][R];
  for (int v = 0; v < NW; ++v)
    for (int i = 0; i < R; ++i) a0[v][i] = a1[v][i] = _mm512_setzero_ps();
  int64_t j = 0;
  constexpr size_t kStep = 32 * sizeof(T);
  for (; j + 32 <= k; j += 32) {
    if (pf != nullptr) {
      if (pf_linear) {  // the tile's rows are contiguous: NW rows' worth of bytes a step
        for (size_t b = 0; b < NW * kStep; b += 64)
          prefetch_l2(pf + static_cast<size_t>(j / 32) * NW * kStep + b);
      } else {
        for (int v = 0; v < NW; ++v)
          for (size_t b = 0; b < kStep; b += 64)
            prefetch_l1(pf + static_cast<size_t>(v * ldw + j) * sizeof(T) + b);
      }
    }
    __m512 w0[NW], w1[NW];
    for (int v = 0; v < NW; ++v) {
      w0[v] = Lanes16<D>::load16(w + v * ldw + j);
      w1[v] = Lanes16<D>::load16(w + v * ldw + j + 16);
    }
    for (int i = 0; i < R; ++i) {
      __m512 x0 = _mm512_loadu_ps(x + i * ldx + j), x1 = _mm512_loadu_ps(x + i * ldx + j + 16);
      if constexpr (NW > 1) __asm__("" : "+v"(x0), "+v"(x1));
      for (int v = 0; v < NW; ++v) {
        a0[v][i] = _mm512_fmadd_ps(w0[v], x0, a0[v][i]);
        a1[v][i] = _mm512_fmadd_ps(w1[v], x1, a1[v][i]);
      }
    }
  }
  if (!Whole && j + 16 <= k) {
    for (int v = 0; v < NW; ++v)
      for (int i = 0; i < R; ++i)
        a0[v][i] = _mm512_fmadd_ps(Lanes16<D>::load16(w + v * ldw + j),
                                   _mm512_loadu_ps(x + i * ldx + j), a0[v][i]);
    j += 16;
  }
  if (!Whole && j + 8 <= k) {
    for (int v = 0; v < NW; ++v)
      for (int i = 0; i < R; ++i)
        a1[v][i] =
            _mm512_fmadd_ps(_mm512_zextps256_ps512(Lanes16<D>::load8(w + v * ldw + j)),
                            _mm512_zextps256_ps512(_mm256_loadu_ps(x + i * ldx + j)), a1[v][i]);
    j += 8;
  }
  constexpr int kN = NW * R;
  if constexpr (kN == 8) {
    if (Whole || j == k) {      // no scalar tail: the 8 sums as one transposing reduction
      fold8(a0, a1, &s[0][0]);  // s[v][i] is output v * R + i
      return;
    }
  }
  // The horizontal sums 8 (then 4) outputs at a time: hsum_n, hsum's bits.
  __m256 f[kN];
  for (int v = 0; v < NW; ++v)
    for (int i = 0; i < R; ++i) f[v * R + i] = fold16(a0[v][i], a1[v][i]);
  float h[kN];
  hsum_all<kN>(f, h);
  for (int v = 0; v < NW; ++v)
    for (int i = 0; i < R; ++i) {
      float t = h[v * R + i];
      if constexpr (!Whole)
        for (int64_t jj = j; jj < k; ++jj)
          t += Lanes16<D>::widen(w[v * ldw + jj]) * x[i * ldx + jj];
      s[v][i] = t;
    }
}
#endif

// One 8-lane accumulator, chunks of 8 in ascending order, then hsum: the arithmetic every GEMV
// path shares (dot_tile below gives each output of a tile exactly these bits). A lone call is a
// single FMA chain (latency-bound); the GEMV runs rows in tiles so several chains overlap.
template <typename Load, typename T>
float dot_simd(const T* w, const float* x, int64_t k, Load load) {
  __m256 a = _mm256_setzero_ps();
  for (int64_t j = 0; j + 8 <= k; j += 8)
    a = _mm256_fmadd_ps(load(w + j), _mm256_loadu_ps(x + j), a);
  return hsum(a);
}
// GEMV tile: NW W rows x R x rows. Each W chunk of 8 is widened to f32 once and multiplied into
// all R rows, and each x chunk is loaded once for all NW W rows, so a batch of B sequences
// widens W once per step instead of B times. Every output is dot_simd's arithmetic exactly —
// one accumulator fed chunk by chunk in ascending j, the same hsum, the same scalar tail — so a
// row's result does not depend on how many rows share the call or on the tile shape (batch
// invariance: the engine's batched decode equals each request run alone, bit for bit).
// One accumulator per output is what lets a 4 x 3 tile keep all of its accumulators in
// registers and walk K in one pass (several interleaved accumulators per output would not fit
// and would spill). A single row keeps several chains in flight by running as a tile of
// kRowTileW rows (gemv_rows).
// Prefetch while walking K (pf set): linear — the W bytes at pf, the tile's bytes per step
// (a contiguous stretch ahead); else the same columns of the next tile's rows (pf = w + NW rows).
template <int R, int NW, typename T, typename Load, typename Widen>
void dot_tile(const T* w, int64_t ldw, const float* x, int64_t ldx, int64_t k, Load load,
              Widen widen, const std::byte* pf, bool pf_linear, float (&s)[NW][R]) {
  const int64_t k8 = k / 8 * 8;
  __m256 a[NW][R];
  for (int v = 0; v < NW; ++v)
    for (int i = 0; i < R; ++i) a[v][i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < k8; j += 8) {
    if (pf != nullptr) {
      if (pf_linear) {
        // One prefetch per line (a 2-row f16 step covers half of one), into L2 rather than
        // L1 at every step: the loads bring the line on to L1 a few steps later.
        constexpr size_t kStep = NW * 8 * sizeof(T);
        if (kStep >= 64 || ((j / 8) * kStep) % 64 == 0)
          for (size_t b = 0; b < kStep; b += 64)
            prefetch_l2(reinterpret_cast<const char*>(pf + (j / 8) * kStep + b));
      } else if (j % 32 == 0) {
        for (int v = 0; v < NW; ++v)
          for (size_t b = 0; b < 32 * sizeof(T); b += 64)
            prefetch_l1(reinterpret_cast<const char*>(pf + (v * ldw + j) *
                                                               static_cast<int64_t>(sizeof(T))) +
                        b);
      }
    }
    __m256 wv[NW];
    for (int v = 0; v < NW; ++v) wv[v] = load(w + v * ldw + j);
    for (int i = 0; i < R; ++i) {
      __m256 xv = _mm256_loadu_ps(x + i * ldx + j);
      // Opaque to the optimiser, so xv stays in a register for its NW FMAs. Without it GCC
      // folds the load into every FMA (NW loads of the same chunk) and the tile is bound by
      // the load ports, not the FMA units.
      __asm__("" : "+x"(xv));
      for (int v = 0; v < NW; ++v) a[v][i] = _mm256_fmadd_ps(wv[v], xv, a[v][i]);
    }
  }
  constexpr int kN = NW * R;
  float h[kN];
  hsum_all<kN>(&a[0][0], h);
  for (int v = 0; v < NW; ++v) {
    for (int i = 0; i < R; ++i) {
      float t = h[v * R + i];
      const T* wr = w + v * ldw;
      const float* xr = x + i * ldx;
      for (int64_t j = k8; j < k; ++j) t += widen(wr[j]) * xr[j];
      s[v][i] = t;
    }
  }
}

#endif

float dot_f32(const float* w, const float* x, int64_t k) {
#ifdef KVCACHE_MATMUL_AVX512
  float r[1][1];
  dot_tile16<1, 1, DType::kF32>(w, k, x, k, k, nullptr, false, r);
  return r[0][0];
#else
  int64_t j = 0;
  float s = 0.0f;
#ifdef KVCACHE_MATMUL_AVX2
  s = dot_simd(w, x, k, [](const float* p) { return _mm256_loadu_ps(p); });
  j = k / 8 * 8;
#endif
  for (; j < k; ++j) s += w[j] * x[j];
  return s;
#endif
}

float dot_f16(const f16_t* w, const float* x, int64_t k) {
#ifdef KVCACHE_MATMUL_AVX512
  float r[1][1];
  dot_tile16<1, 1, DType::kF16>(w, k, x, k, k, nullptr, false, r);
  return r[0][0];
#else
  int64_t j = 0;
  float s = 0.0f;
#ifdef KVCACHE_MATMUL_AVX2
  s = dot_simd(w, x, k, load_f16x8);
  j = k / 8 * 8;
#endif
  for (; j < k; ++j) s += f16_to_f32(w[j]) * x[j];
  return s;
#endif
}

float dot_bf16(const bf16_t* w, const float* x, int64_t k) {
#ifdef KVCACHE_MATMUL_AVX512
  float r[1][1];
  dot_tile16<1, 1, DType::kBF16>(w, k, x, k, k, nullptr, false, r);
  return r[0][0];
#else
  int64_t j = 0;
  float s = 0.0f;
#ifdef KVCACHE_MATMUL_AVX2
  s = dot_simd(w, x, k, load_bf16x8);
  j = k / 8 * 8;
#endif
  for (; j < k; ++j) s += bf16_to_f32(w[j]) * x[j];
  return s;
#endif
}

// q8_0 with f32 x, builds without AVX2 (with it, q8_0 takes the integer dot, dot_q8_0_int):
// per block the int8 dot in f32, then scaled by the block's d.
float dot_q8_0(const BlockQ8_0* w, const float* x, int64_t k) {
  float s = 0.0f;
  for (int64_t b = 0; b < k / 32; ++b) {
    float sb = 0.0f;
    for (int i = 0; i < 32; ++i) sb += static_cast<float>(w[b].qs[i]) * x[b * 32 + i];
    s += f16_to_f32(w[b].d) * sb;
  }
  return s;
}

#ifdef KVCACHE_MATMUL_AVX2
// q8_0 against x rounded per 32: per block the exact int32 dot, times d_w * d_x.
float dot_q8_0_int(const void* blocks, const BlockQ8A32* x, int64_t nb) {
  const auto* w = static_cast<const BlockQ8_0*>(blocks);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int64_t b = 0;
  const auto one = [&](int64_t i) {
    const __m256i p = dot_i8x32(_mm256_setzero_si256(),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs)),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs)));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(w[i].d) * x[i].d), _mm256_cvtepi32_ps(p));
  };
  for (; b + 2 <= nb; b += 2) {
    acc0 = _mm256_add_ps(acc0, one(b));
    acc1 = _mm256_add_ps(acc1, one(b + 1));
  }
  if (b < nb) acc0 = _mm256_add_ps(acc0, one(b));
  return hsum(_mm256_add_ps(acc0, acc1));
}
#endif

ActDot act_dot(DType t) {
#ifdef KVCACHE_MATMUL_AVX2
  if (t == DType::kQ8_0) return {32, nullptr, dot_q8_0_int};
#endif
  const QuantKernels* q = quant_kernels(t);
  if (q != nullptr && q->dot_q8k != nullptr) return {256, q->dot_q8k, nullptr};
  if (q != nullptr && q->dot_q8_32 != nullptr) return {32, nullptr, q->dot_q8_32};
  return {};
}

size_t row_bytes(DType t, int64_t k) {
  return dtype_bytes(t, k);
}

void validate(const MatmulParams& p) {
  KV_CHECK(p.x != nullptr && p.w != nullptr && p.y != nullptr, "matmul: null pointer");
  KV_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 0, "matmul: negative size");
  KV_CHECK(p.ldx >= p.k && p.ldy >= p.n, "matmul: row stride smaller than the row");
  KV_CHECK(p.k % dtype_info(p.w_dtype).block_elems == 0,
           "matmul: the row length must be whole blocks of the weight type");
}

int g_blas_threads = -1;

#ifdef KVCACHE_MATMUL_AVX2
#ifdef KVCACHE_MATMUL_AVX512
// dot_tile16 over p's x rows from x and W rows from w, Whole where K allows.
template <int R, int NW, DType D, typename T>
void tile16(const T* w, const MatmulParams& p, const float* x, const std::byte* pf, bool linear,
            float (&s)[NW][R]) {
  if (p.k % 32 == 0)
    dot_tile16<R, NW, D, true>(w, p.k, x, p.ldx, p.k, pf, linear, s);
  else
    dot_tile16<R, NW, D>(w, p.k, x, p.ldx, p.k, pf, linear, s);
}
#endif

// Tile of the GEMV: y[i .. i+R, r .. r+NW] (+ bias) = dot_row's value for each. rb: W's row
// bytes; pf_bytes > 0: prefetch from w + pf_bytes while computing, linearly (the contiguous W
// ahead, one-row GEMV) or at the next tile's rows (dot_tile's pf_linear).
template <int R, int NW>
void gemv_tile(const MatmulParams& p, size_t rb, int64_t r, int64_t i, size_t pf_bytes,
               bool linear) {
  float s[NW][R] = {};
  const auto* w = static_cast<const std::byte*>(p.w) + static_cast<size_t>(r) * rb;
  const float* x = p.x + i * p.ldx;
  const std::byte* pf = pf_bytes > 0 ? w + pf_bytes : nullptr;
  switch (p.w_dtype) {
    // Loaders as lambdas, not function pointers: a pointer template argument is called, not
    // inlined, which would cost a call per 8-element chunk. AVX-512 builds: dot_tile16.
#ifdef KVCACHE_MATMUL_AVX512
    case DType::kF32:
      tile16<R, NW, DType::kF32>(reinterpret_cast<const float*>(w), p, x, pf, linear, s);
      break;
    case DType::kF16:
      tile16<R, NW, DType::kF16>(reinterpret_cast<const f16_t*>(w), p, x, pf, linear, s);
      break;
    case DType::kBF16:
      tile16<R, NW, DType::kBF16>(reinterpret_cast<const bf16_t*>(w), p, x, pf, linear, s);
      break;
#else
    case DType::kF32:
      dot_tile<R, NW>(
          reinterpret_cast<const float*>(w), p.k, x, p.ldx, p.k,
          [](const float* q) { return _mm256_loadu_ps(q); }, [](float v) { return v; }, pf, linear,
          s);
      break;
    case DType::kF16:
      dot_tile<R, NW>(
          reinterpret_cast<const f16_t*>(w), p.k, x, p.ldx, p.k,
          [](const f16_t* q) { return load_f16x8(q); }, [](f16_t v) { return f16_to_f32(v); }, pf,
          linear, s);
      break;
    case DType::kBF16:
      dot_tile<R, NW>(
          reinterpret_cast<const bf16_t*>(w), p.k, x, p.ldx, p.k,
          [](const bf16_t* q) { return load_bf16x8(q); }, [](bf16_t v) { return bf16_to_f32(v); },
          pf, linear, s);
      break;
#endif
    default:  // the GGUF block types (kernels/quant_types.h): their fused dot, row by row
      if constexpr (NW == 1) {
        for (int ii = 0; ii < R; ++ii) s[0][ii] = dot_row(w, p.w_dtype, x + ii * p.ldx, p.k);
      } else {
        KV_CHECK(false, "gemv_tile: block-type tiles hold one W row");
      }
      break;
  }
  for (int v = 0; v < NW; ++v) {
    const float b = p.bias != nullptr ? p.bias[r + v] : 0.0f;
    for (int ii = 0; ii < R; ++ii) p.y[(i + ii) * p.ldy + r + v] = s[v][ii] + b;
  }
}

// x rows per tile and W rows per tile (f32/f16/bf16; other types use one). 4 x 3 keeps 12
// independent FMA chains in flight (latency 4 x 2 ports needs 8) in 12 + 3 + 1 registers, and
// widens each W chunk for 4 rows of x. AVX-512 builds: 4 x 2, each output two zmm chains (16
// accumulators + 4 W + 2 x registers of 32).
constexpr int kTileRows = 4;
#ifdef KVCACHE_MATMUL_AVX512
constexpr int kTileW = 2;
// One-row GEMV, AVX-512 builds (one row after another): the prefetch distance in W. tg64 of the
// 125M f16 model (2 threads, `kvcache bench --no-mmap`, a Zen 5 VM, two alternated rounds): no
// prefetch 134-138 tok/s, 8 KiB 258-269, 16 KiB 257-275, 32 KiB 259-263.
constexpr size_t kGemvSeqPrefetchBytes = 16 << 10;
#else
constexpr int kTileW = 3;
#endif
constexpr size_t kGemvBlockBytes = 128 << 10;
constexpr size_t kGemvPrefetchBytes = 8 << 10;  // GGUF block types: prefetch distance in W
constexpr int kRowTileW = 8;  // one-row GEMV (f32/f16/bf16): W rows per tile (see gemv_rows)
#ifdef KVCACHE_MATMUL_AVX512
// One-row GEMV, AVX-512 builds: rows shorter than this take tiles of kRowTileW rows (their
// horizontal sums and loop ends would otherwise cost as much as their FMAs: stories260K's K = 64
// rows ran 1.8x slower one at a time).
constexpr int64_t kGemvSeqMinK = 256;
#else
// One-row GEMV over f32/f16/bf16 W: the prefetch distance. Swept on a Zen 5 host streaming 128
// MiB of f16 W on one thread (bench_gemv f16/1/65536/1024): 8 KiB 19.8-23.3 GiB/s, 32-64 KiB
// 27-35.5, 128-256 KiB 25-31, a plain reader 27.5-30 on the same thread; end to end (tg64 of
// the 125M f16 model, 2 threads, 3 alternated rounds) 64 KiB gave 1.04-1.27x the tokens/s of
// 8 KiB and beat 128 and 256 KiB in every round.
constexpr size_t kGemvRowPrefetchBytes = 64 << 10;
#endif

// rows (1..R) of x from row i: the tile of that height (remainders of M use smaller tiles).
template <int NW, int R = kTileRows>
void gemv_tile_rows(const MatmulParams& p, size_t rb, int64_t r, int64_t i, int64_t rows,
                    bool prefetch = false) {
  if constexpr (R > 1) {
    if (rows < R) return gemv_tile_rows<NW, R - 1>(p, rb, r, i, rows, prefetch);
  }
  gemv_tile<R, NW>(p, rb, r, i, prefetch ? NW * rb : 0, false);
}
#endif

// Rows [r0, r1) of y for every row of x: each W row is read once for all M rows of x. One row
// of x: W rows one after another (AVX-512), or tiles of kRowTileW W rows (that many FMA chains
// in flight). Several: multi-row tiles,
// which widen each W chunk once for kTileRows x rows and load each x chunk once for kTileW W
// rows. Every output gets dot_row's exact bits either way (the integer dots: one row at a time).
// xq: x's rows rounded to int8 (act_dot), else nullptr.
void gemv_rows(const MatmulParams& p, int64_t r0, int64_t r1, const std::byte* xq) {
  const size_t rb = row_bytes(p.w_dtype, p.k);
  const auto* w = static_cast<const std::byte*>(p.w);
#ifdef KVCACHE_MATMUL_AVX2
  if (p.m == 1 && dtype_is_float(p.w_dtype)) {
    // One x row should be bound by streaming W. Without AVX-512: kRowTileW rows per tile,
    // prefetching the contiguous W kGemvRowPrefetchBytes ahead one line per step. Each row is one
    // chain of 8-lane FMAs (dot_row's bits), so a tile of NW rows does 8 NW multiply-adds per FMA
    // latency (4 cycles): at NW = 2 that is 4 per cycle, 14.7 G/s (29 GB/s of f16) on one Zen 5
    // core, which is just that core's read bandwidth (BM_ReadBandwidth, 1 thread: 29.9 GiB/s), so
    // the GEMV was compute-bound there. NW = 8 reaches 26.9 G/s on cache-resident W
    // (bench_gemv f16/1/2048/768), twice any single core's bandwidth we have measured.
    // Near the end of the rows the distance shrinks, so that the prefetches stay inside this
    // call's rows (past them: another thread's rows, or past the end of W) and still cover
    // them to the last line.
    const size_t end = static_cast<size_t>(r1) * rb;
    int64_t r = r0;
#ifdef KVCACHE_MATMUL_AVX512
    // AVX-512: one row at a time (its two 16-lane chains are enough to outrun memory), so
    // each thread reads W as one sequential stream, prefetched kGemvSeqPrefetchBytes ahead; the
    // 8-row tiles below streamed W at 0.58-0.73 of `kvcache bench`'s read probe, this at
    // 0.71-0.87 (bench_gemv BM_GemvStep/1; docs/architecture.md, "Speed against the machine's
    // limits").
    if (p.k < kGemvSeqMinK) {
      for (; r + kRowTileW <= r1; r += kRowTileW) {
        const size_t ahead = static_cast<size_t>(r + kRowTileW) * rb;
        gemv_tile<1, kRowTileW>(p, rb, r, 0, std::min(kGemvSeqPrefetchBytes, end - ahead), true);
      }
    }
    for (; r < r1; ++r) {
      const size_t row_end = static_cast<size_t>(r + 1) * rb;
      gemv_tile<1, 1>(p, rb, r, 0, std::min(kGemvSeqPrefetchBytes, end - row_end), true);
    }
#else
    for (; r + kRowTileW <= r1; r += kRowTileW) {
      const size_t ahead = static_cast<size_t>(r + kRowTileW) * rb;  // end of this tile's rows
      gemv_tile<1, kRowTileW>(p, rb, r, 0, std::min(kGemvRowPrefetchBytes, end - ahead), true);
    }
    for (; r < r1; ++r) gemv_tile<1, 1>(p, rb, r, 0, 0, false);
#endif
    return;
  }
  if (p.m > 1 && xq == nullptr) {
    const int nw = dtype_is_float(p.w_dtype) ? kTileW : 1;
    // A block of W rows (kGemvBlockBytes, meant to stay in L2) meets each group of kTileRows
    // x rows in turn, so W comes from memory once per call whatever M.
    const int64_t block = std::max<int64_t>(
        kTileW, static_cast<int64_t>(kGemvBlockBytes / std::max<size_t>(rb, 1)) / kTileW * kTileW);
    for (int64_t b0 = r0; b0 < r1; b0 += block) {
      const int64_t b1 = std::min(r1, b0 + block);
      for (int64_t i = 0; i < p.m; i += kTileRows) {
        const int64_t rows = std::min<int64_t>(kTileRows, p.m - i);
        int64_t r = b0;
        // The first x group's pass brings the block's W from memory (file-mapped, 4 KiB pages:
        // the hardware prefetcher stops at each page), so its tiles also fetch the next tile's
        // rows, a 32-block at a time as they go: spread over the tile's walk of K rather than
        // issued in one burst before each tile, whose issuing would cost the step's cycles.
        for (; nw == kTileW && r + kTileW <= b1; r += kTileW)
          gemv_tile_rows<kTileW>(p, rb, r, i, rows, i == 0 && r + 2 * kTileW <= r1);
        if (nw == kTileW && r + 2 <= b1) {
          gemv_tile_rows<2>(p, rb, r, i, rows);
          r += 2;
        }
        for (; r < b1; ++r) gemv_tile_rows<1>(p, rb, r, i, rows);
      }
    }
    return;
  }
#endif
  // q8_0 and the GGUF block types, one row of x, and the integer dots for any M (and every
  // dtype in builds without AVX2): bound by streaming W. Weights
  // are usually a file mapping on 4 KiB pages (no transparent huge pages for files on common
  // kernels), where the hardware prefetcher stops at every page boundary; prefetching
  // kGemvPrefetchBytes ahead within this block of rows keeps the stream going across pages.
#ifdef KVCACHE_MATMUL_AVX2
  const size_t end = static_cast<size_t>(r1) * rb;
#endif
  const ActDot a = xq != nullptr ? act_dot(p.w_dtype) : ActDot{};
  const size_t xb = xq != nullptr ? act_row_bytes(a, p.k) : 0;
  for (int64_t r = r0; r < r1; ++r) {
    const size_t off = static_cast<size_t>(r) * rb;
    const std::byte* wr = w + off;
#ifdef KVCACHE_MATMUL_AVX2
    for (size_t o = off + kGemvPrefetchBytes; o < std::min(off + kGemvPrefetchBytes + rb, end);
         o += 64)
      prefetch_l1(reinterpret_cast<const char*>(w + o));
#endif
    const float b = p.bias != nullptr ? p.bias[r] : 0.0f;
    if (xq != nullptr) {
      for (int64_t i = 0; i < p.m; ++i)
        p.y[i * p.ldy + r] = act_dot_row(a, wr, xq + static_cast<size_t>(i) * xb, p.k) + b;
      continue;
    }
    for (int64_t i = 0; i < p.m; ++i)
      p.y[i * p.ldy + r] = dot_row(wr, p.w_dtype, p.x + i * p.ldx, p.k) + b;
  }
}

// The GEMV path of matmul / matmul_group: the products' rows cut into contiguous blocks, all
// blocks of all products handed out by one parallel_for, largest first (guided scheduling):
// each block is 1 / (2 nt) of the rows left. A block's first kGemvRowPrefetchBytes
// (kGemvSeqPrefetchBytes with AVX-512) are never prefetched (the prefetch runs that far ahead of
// its tiles), so long blocks stream W better, and the small last ones keep the tail short and
// balance a thread slowed by a neighbour (a decode step runs ~50 loops). Before, equal blocks of
// about 1 / (8 nt) (48 rows, 72 KiB of a 768-row f16 product) left most of each block unprefetched:
// on a 2-vCPU Zen 5, one step's linears of the 125M model (bench_gemv BM_GemvStep/1) ran 12-25%
// faster guided, and tg64
// (`kvcache bench --no-mmap`) 1.03-1.08x in 4 of 4 alternated pairs, with the threads' waits
// at the loops' ends halved (~650 to ~350 us a token).
struct GemvBlock {
  size_t g;        // the product
  int64_t r0, r1;  // its rows
};
void gemv_group(std::span<const MatmulParams> group, ThreadPool& pool) {
  // x rounded to int8 once per product (once for products that read the same x), before the
  // threads split the rows.
  thread_local std::vector<std::byte> act[kMaxMatmulGroup];
  const std::byte* xq[kMaxMatmulGroup] = {};
  for (size_t g = 0; g < group.size(); ++g) {
    const MatmulParams& p = group[g];
    const ActDot a = act_dot(p.w_dtype);
    if (a.block == 0) continue;
    for (size_t h = 0; h < g && xq[g] == nullptr; ++h) {
      const MatmulParams& o = group[h];
      if (xq[h] != nullptr && act_dot(o.w_dtype).block == a.block && o.x == p.x && o.ldx == p.ldx &&
          o.m == p.m && o.k == p.k)
        xq[g] = xq[h];
    }
    if (xq[g] != nullptr) continue;
    const size_t xb = act_row_bytes(a, p.k);
    // std::vector<std::byte> storage is aligned for new's default (>= 16), enough for the
    // blocks' float scales; rows are whole blocks (292 or 36 bytes, multiples of 4).
    act[g].resize(static_cast<size_t>(p.m) * xb);
    for (int64_t i = 0; i < p.m; ++i)
      quantize_act_row(a, p.x + i * p.ldx, act[g].data() + static_cast<size_t>(i) * xb, p.k);
    xq[g] = act[g].data();
  }
  const int nt = pool.n_threads();
  int64_t macs = 0, total_rows = 0;
  for (const MatmulParams& p : group) macs += p.m * p.n * p.k, total_rows += p.n;
  if (nt <= 1 || macs < kMinParallelMacs) {
    for (size_t g = 0; g < group.size(); ++g) gemv_rows(group[g], 0, group[g].n, xq[g]);
    return;
  }
  // Guided blocks: each takes 1 / (2 nt) of the rows not yet handed out (at least 16, a
  // multiple of the one-row tile), in order, products split at their ends.
  thread_local std::vector<GemvBlock> blocks;
  blocks.clear();
  int64_t left = total_rows;
  for (size_t g = 0; g < group.size(); ++g)
    for (int64_t r = 0; r < group[g].n;) {
      int64_t rows = std::max<int64_t>(16, (left + 2 * nt - 1) / (2 * nt));
      rows = (rows + 7) / 8 * 8;  // whole tiles of the one-row GEMV (kRowTileW)
      const int64_t end = std::min(group[g].n, r + rows);
      blocks.push_back({g, r, end});
      left -= end - r;
      r = end;
    }
  const std::vector<GemvBlock>& list = blocks;  // the workers read the caller's list
  pool.parallel_for(static_cast<int64_t>(list.size()), [&](int64_t t) {
    const GemvBlock& b = list[static_cast<size_t>(t)];
    gemv_rows(group[b.g], b.r0, b.r1, xq[b.g]);
  });
}

}  // namespace

float dot_row(const void* w_row, DType t, const float* x, int64_t k) {
  switch (t) {
    case DType::kF32:
      return dot_f32(static_cast<const float*>(w_row), x, k);
    case DType::kF16:
      return dot_f16(static_cast<const f16_t*>(w_row), x, k);
    case DType::kBF16:
      return dot_bf16(static_cast<const bf16_t*>(w_row), x, k);
    default:
      break;
  }
  if (const ActDot a = act_dot(t); a.block != 0) {  // x rounded to int8, as the GEMV does
    thread_local std::vector<std::byte> xq;
    xq.resize(act_row_bytes(a, k));
    quantize_act_row(a, x, xq.data(), k);
    return act_dot_row(a, w_row, xq.data(), k);
  }
  if (t == DType::kQ8_0) return dot_q8_0(static_cast<const BlockQ8_0*>(w_row), x, k);
  const QuantKernels* q = quant_kernels(t);
  KV_CHECK(q != nullptr && q->dot != nullptr, "dot_row: no kernel for this weight type");
  return q->dot(w_row, x, k / dtype_info(t).block_elems);
}

void dequantize_row(const void* src, DType t, float* dst, int64_t k) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(k) * sizeof(float));
      return;
    case DType::kF16:
      f16_to_f32_n(static_cast<const f16_t*>(src), dst, static_cast<size_t>(k));
      return;
    case DType::kBF16:
      bf16_to_f32_n(static_cast<const bf16_t*>(src), dst, static_cast<size_t>(k));
      return;
    case DType::kQ8_0: {
      KV_CHECK(k % 32 == 0, "q8_0 row length must be a multiple of 32");
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < k / 32; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * static_cast<float>(b[i].qs[j]);
      }
      return;
    }
    default:
      break;
  }
  const QuantKernels* q = quant_kernels(t);
  KV_CHECK(q != nullptr && q->dequantize != nullptr,
           "dequantize_row: no kernel for this weight type");
  KV_CHECK(k % dtype_info(t).block_elems == 0, "dequantize_row: k must be whole blocks");
  q->dequantize(src, dst, k / dtype_info(t).block_elems);
}

void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t k) {
  KV_CHECK(k % 32 == 0, "q8_0 row length must be a multiple of 32");
  for (int64_t i = 0; i < k / 32; ++i) {
    const float* x = src + i * 32;
    float amax = 0.0f, nf = 0.0f;
    for (int j = 0; j < 32; ++j) {
      amax = std::max(amax, std::fabs(x[j]));
      nf += x[j] * 0.0f;  // NaN from a NaN or an infinity on
    }
    if (std::isnan(nf)) {  // poisoned, as a KIVI group (kv_quant.h): NaN scale, codes 0
      dst[i].d = kF16QuietNaN;
      std::fill(std::begin(dst[i].qs), std::end(dst[i].qs), int8_t{0});
      continue;
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    dst[i].d = f32_to_f16(d);
    for (int j = 0; j < 32; ++j) dst[i].qs[j] = static_cast<int8_t>(std::lround(x[j] * id));
  }
}

void set_blas_threads(int n_threads) {
  if (n_threads > 0 && n_threads != g_blas_threads) {
    openblas_set_num_threads(n_threads);
    g_blas_threads = n_threads;
  }
}

void matmul_reference(const MatmulParams& p) {
  validate(p);
  const size_t rb = row_bytes(p.w_dtype, p.k);
  std::vector<float> wrow(static_cast<size_t>(p.k));
  // The types whose products take x rounded to int8 (act_dot): the rounding spelled out,
  // per block of 32 or 256 values: x' = d * nearbyint(x * 127 / amax) with d = amax / 127
  // rounded to f16 (32) or 1 / (127 / amax) (256), NaN for a block holding an infinity or a
  // NaN (quant_types.h).
  const int block = act_dot(p.w_dtype).block;
  std::vector<float> xr;
  if (block != 0) {
    xr.resize(static_cast<size_t>(p.m * p.k));
    for (int64_t i = 0; i < p.m; ++i) {
      for (int64_t b0 = 0; b0 < p.k; b0 += block) {
        const float* x = p.x + i * p.ldx + b0;
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < block; ++j) {
          finite = finite && std::isfinite(x[j]);
          amax = std::max(amax, std::fabs(x[j]));
        }
        for (int j = 0; j < block; ++j) {
          float v = 0.0f;
          if (!finite) {
            v = std::numeric_limits<float>::quiet_NaN();
          } else if (amax > 0.0f) {
            const float d =
                block == 32 ? f16_to_f32(f32_to_f16(amax / 127.0f)) : 1.0f / (127.0f / amax);
            v = d * std::nearbyint(x[j] * (127.0f / amax));
          }
          xr[static_cast<size_t>(i * p.k + b0 + j)] = v;
        }
      }
    }
  }
  for (int64_t r = 0; r < p.n; ++r) {
    dequantize_row(static_cast<const std::byte*>(p.w) + static_cast<size_t>(r) * rb, p.w_dtype,
                   wrow.data(), p.k);
    for (int64_t i = 0; i < p.m; ++i) {
      const float* x = block != 0 ? xr.data() + i * p.k : p.x + i * p.ldx;
      float acc = 0.0f;
      for (int64_t j = 0; j < p.k; ++j) acc += wrow[static_cast<size_t>(j)] * x[j];
      if (p.bias != nullptr) acc += p.bias[r];
      p.y[i * p.ldy + r] = acc;
    }
  }
}

namespace {

// The prefill GEMM's x for weight types with an integer dot: x rounded as the GEMV rounds it
// (x' = d * q per 256, round_act_q8k), so a product's rows do not depend on which path ran.
// Returns params reading the rounded copy (a thread-local buffer), or p itself.
MatmulParams with_rounded_x(const MatmulParams& p, std::vector<float>& buf) {
  const ActDot a = act_dot(p.w_dtype);
  if (!takes_gemm(p) || a.block == 0 || p.m == 0) return p;
  buf.resize(static_cast<size_t>(p.m * p.k));
  for (int64_t i = 0; i < p.m; ++i) round_act_row(a, p.x + i * p.ldx, buf.data() + i * p.k, p.k);
  MatmulParams q = p;
  q.x = buf.data();
  q.ldx = p.k;
  return q;
}

void matmul_unrounded(const MatmulParams& p);

}  // namespace

void matmul(const MatmulParams& p) {
  validate(p);
  if (p.m == 0 || p.n == 0) return;
  thread_local std::vector<float> rounded;
  matmul_unrounded(with_rounded_x(p, rounded));
}

namespace {

void matmul_unrounded(const MatmulParams& p) {
  ThreadPool& pool = p.pool != nullptr ? *p.pool : default_pool();
  const int nt = pool.n_threads();
  const int64_t macs = p.m * p.n * p.k;
  if (takes_gemm(p) && gemm_packed_available()) {
    gemm_packed(p, nt <= 1 || macs < kMinParallelMacs ? nullptr : &pool);
    return;
  }
  if (takes_gemm(p) && p.w_dtype == DType::kF32) {  // builds without AVX2
    // OpenBLAS runs single-threaded and our pool splits W's rows: one set of threads only
    // (OpenBLAS's own pool busy-waits and fights ours for the cores).
    set_blas_threads(1);
    auto gemm = [&](int64_t r0, int64_t r1) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(p.m),
                  static_cast<int>(r1 - r0), static_cast<int>(p.k), 1.0f, p.x,
                  static_cast<int>(p.ldx), static_cast<const float*>(p.w) + r0 * p.k,
                  static_cast<int>(p.k), 0.0f, p.y + r0, static_cast<int>(p.ldy));
      if (p.bias != nullptr) {
        for (int64_t i = 0; i < p.m; ++i)
          for (int64_t r = r0; r < r1; ++r) p.y[i * p.ldy + r] += p.bias[r];
      }
    };
    if (nt <= 1 || macs < 8 * kMinParallelMacs) {
      gemm(0, p.n);
      return;
    }
    // Blocks of >= 64 rows keep sgemm's packing worthwhile; ~2 blocks per thread balance.
    const int64_t rows_per_task =
        std::max<int64_t>(64, (p.n + 2 * nt - 1) / (2 * nt) / 16 * 16 + 16);
    const int64_t n_tasks = (p.n + rows_per_task - 1) / rows_per_task;
    pool.parallel_for(n_tasks, [&](int64_t t) {
      const int64_t r0 = t * rows_per_task;
      gemm(r0, std::min(p.n, r0 + rows_per_task));
    });
    return;
  }
  const size_t rb = row_bytes(p.w_dtype, p.k);
  const auto* w = static_cast<const std::byte*>(p.w);
  if (takes_gemm(p)) {
    // Prefill over f16/bf16/q8_0 weights: dequantise a block of W rows once into a per-thread
    // f32 scratch and let sgemm do the M x block product (compute-bound), instead of
    // converting every W row M times in dot products.
    // Blocks are large because sgemm packs all of x again on every call (M x K floats), so
    // fewer blocks pack x fewer times: one block per thread when it fits, else blocks of
    // kMaxBlockRows (scratch <= kMaxBlockRows * K floats: 6 MiB per thread for llama-125m's FFN).
    set_blas_threads(1);
    constexpr int64_t kMaxBlockRows = 2048;
    const int64_t per_thread = (p.n + nt - 1) / nt;
    const int64_t block_rows = std::clamp<int64_t>((per_thread + 15) / 16 * 16, 64, kMaxBlockRows);
    const int64_t n_tasks = (p.n + block_rows - 1) / block_rows;
    auto block = [&](int64_t t) {
      thread_local std::vector<float> scratch;  // grows once per thread, reused across calls
      const int64_t r0 = t * block_rows, r1 = std::min(p.n, r0 + block_rows);
      const size_t need = static_cast<size_t>((r1 - r0) * p.k);
      if (scratch.size() < need) scratch.resize(need);
      for (int64_t r = r0; r < r1; ++r)
        dequantize_row(w + static_cast<size_t>(r) * rb, p.w_dtype, scratch.data() + (r - r0) * p.k,
                       p.k);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(p.m),
                  static_cast<int>(r1 - r0), static_cast<int>(p.k), 1.0f, p.x,
                  static_cast<int>(p.ldx), scratch.data(), static_cast<int>(p.k), 0.0f, p.y + r0,
                  static_cast<int>(p.ldy));
      if (p.bias != nullptr) {
        for (int64_t i = 0; i < p.m; ++i)
          for (int64_t r = r0; r < r1; ++r) p.y[i * p.ldy + r] += p.bias[r];
      }
    };
    if (nt <= 1 || macs < kMinParallelMacs) {
      for (int64_t t = 0; t < n_tasks; ++t) block(t);
    } else {
      pool.parallel_for(n_tasks, block);
    }
    return;
  }
  gemv_group({&p, 1}, pool);
}

}  // namespace

void matmul_group(std::span<const MatmulParams> group) {
  KV_CHECK(group.size() <= kMaxMatmulGroup, "matmul_group: too many products");
  if (group.empty()) return;
  bool gemv = true;
  for (const MatmulParams& p : group) {
    validate(p);
    KV_CHECK(p.pool == group[0].pool, "matmul_group: products must share one pool");
    if (takes_gemm(p)) gemv = false;
  }
  if (!gemv) {
    // Prefill products sharing x on the packed GEMM: x packed once, one loop over all blocks.
    bool shared = gemm_packed_available();
    int64_t macs = 0;
    for (const MatmulParams& p : group) {
      shared = shared && p.allow_blas && p.x == group[0].x && p.ldx == group[0].ldx &&
               p.m == group[0].m && p.k == group[0].k && takes_gemm(p);
      macs += p.m * p.n * p.k;
    }
    // Rounded x (int8-activation weight types) is shared only if every product rounds it.
    for (const MatmulParams& p : group)
      shared = shared && act_dot(p.w_dtype).block == act_dot(group[0].w_dtype).block;
    if (shared) {
      ThreadPool& pool = group[0].pool != nullptr ? *group[0].pool : default_pool();
      thread_local std::vector<float> rounded;
      MatmulParams q[kMaxMatmulGroup];
      for (size_t g = 0; g < group.size(); ++g) {
        q[g] = g == 0 ? with_rounded_x(group[0], rounded) : group[g];
        q[g].x = q[0].x;
        q[g].ldx = q[0].ldx;
      }
      gemm_packed({q, group.size()},
                  pool.n_threads() <= 1 || macs < kMinParallelMacs ? nullptr : &pool);
      return;
    }
    for (const MatmulParams& p : group) matmul(p);
    return;
  }
  gemv_group(group, group[0].pool != nullptr ? *group[0].pool : default_pool());
}

}  // namespace kvcache
