// Internal to the kernels layer: the element loaders, horizontal sums, vector exp and the SIMD
// online-softmax update shared by the fused (attention_fused.cc) and quantized
// (attention_quant.cc) attention kernels through their skeleton (attention_skeleton.h), so both
// compute softmax pieces with the same arithmetic.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KVCACHE_ATTN_AVX2 1
#include "core/x86_intrin.h"  // <immintrin.h> without GCC 12's false warnings
#else
#define KVCACHE_ATTN_AVX2 0
#endif
// AVX-512 (F + DQ) on top: the decode loops issue half the FMA instructions on a CPU with
// full-width 512-bit units (Zen 4/5, Intel server cores). Every use keeps the AVX2 path's
// arithmetic per output element, so both builds give the same bits.
#if KVCACHE_ATTN_AVX2 && defined(__AVX512F__) && defined(__AVX512DQ__)
#define KVCACHE_ATTN_AVX512 1
#else
#define KVCACHE_ATTN_AVX512 0
#endif

namespace kvcache::detail {

template <DType KD>
struct Elem;
template <>
struct Elem<DType::kF32> {
  using T = float;
  static float get(T x) { return x; }
};
template <>
struct Elem<DType::kF16> {
  using T = f16_t;
  static float get(T x) { return f16_to_f32(x); }
};
template <>
struct Elem<DType::kBF16> {
  using T = bf16_t;
  static float get(T x) { return bf16_to_f32(x); }
};

#if KVCACHE_ATTN_AVX2
template <DType KD>
inline __m256 load8(const typename Elem<KD>::T* p) {
  if constexpr (KD == DType::kF32) {
    return _mm256_loadu_ps(p);
  } else if constexpr (KD == DType::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else {  // bf16: the upper half of an f32
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
}

#if KVCACHE_ATTN_AVX512
template <DType KD>
inline __m512 load16(const typename Elem<KD>::T* p) {
  if constexpr (KD == DType::kF32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (KD == DType::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  } else {
    const __m512i w =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}
// Keeps v in a register: GCC 12 folds a vector loaded straight from f32 memory into every FMA
// that uses it (one load per use), which makes the 4- and 6-row P.V over f32 values load-bound
// (16 loads + 4 broadcasts per 16 FMAs).
// Converted vectors (f16, bf16, codes) are in registers anyway.
__attribute__((always_inline)) inline void pin(__m512& v) {
  asm("" : "+v"(v));
}
// One key's step of a P.V pass over 64 columns: a[r][i] += p[r * st] * v[i] (NR rows).
template <int NR>
__attribute__((always_inline)) inline void pv_step64(const float* p, int64_t st, const __m512* v,
                                                     __m512 (&a)[NR][4]) {
  for (int r = 0; r < NR; ++r) {
    const __m512 pj = _mm512_set1_ps(p[r * st]);
    for (int i = 0; i < 4; ++i) a[r][i] = _mm512_fmadd_ps(pj, v[i], a[r][i]);
  }
}
// load8<KD>(a) in lanes 0-7 and load8<KD>(b) in lanes 8-15: two rows' 8 elements side by side.
// 16-bit types: b's 16 bytes broadcast to both halves (vbroadcasti128 from memory, a load) and
// a's blended into the low half (vpblendd), instead of inserting b into the upper half
// (vinserti128, a shuffle): a broadcast from memory is a load and the blend runs on any vector
// unit, which leaves the shuffle unit to the rest of the decode score block.
template <DType KD>
inline __m512 load8x2(const typename Elem<KD>::T* a, const typename Elem<KD>::T* b) {
  if constexpr (KD == DType::kF32) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
  } else {
    const __m256i w = _mm256_blend_epi32(
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b))),
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))), 0x0F);
    if constexpr (KD == DType::kF16) return _mm512_cvtph_ps(w);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(w), 16));
  }
}
#endif

// Sum of the 8 lanes as ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)), the same tree as hsum8.
inline float hsum1(__m256 x) {
  const __m256 t = _mm256_hadd_ps(x, x);
  const __m256 u = _mm256_hadd_ps(t, t);
  return _mm_cvtss_f32(_mm_add_ss(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1)));
}
// Lane i of the result is the sum of a[i]'s lanes, with hsum1's tree.
inline __m256 hsum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Lane i (i < 4) of the result is the sum of a[i]'s lanes, with hsum1's tree: half of hsum8's
// shuffles for 4 sums (the 12 sums of a 4 x 3 score block are one hsum8 and one hsum4).
inline __m128 hsum4(const __m256* a) {
  const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

// exp(x) for x <= 0 (softmax arguments): Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, and
// the degree-7 Taylor polynomial of e^r (truncation < 1e-8 relative), scaled by 2^n through the
// exponent bits. Lanes below -87.3 (including -inf) give exactly 0. The constants are shared by
// the 8- and 16-lane versions, which give the same bits per lane (see exp512).
struct ExpConst {
  static constexpr float kLo = -87.3f, kHi = 88.3f, kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  // Horner coefficients of e^r, highest degree first.
  static constexpr float kPoly[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                                     1.0f / 6,    0.5f,       1.0f,       1.0f};
};
inline __m256 exp256(__m256 x) {
  using C = ExpConst;
  const __m256 lo = _mm256_set1_ps(C::kLo);
  const __m256 valid = _mm256_cmp_ps(x, lo, _CMP_GE_OQ);
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(C::kHi)), lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(C::kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C::kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(C::kLn2Lo), r);
  __m256 p = _mm256_set1_ps(C::kPoly[0]);
  for (int i = 1; i < 8; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(C::kPoly[i]));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_and_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), valid);
}

#if KVCACHE_ATTN_AVX512
// exp256's lanes for x <= 0 (its only use, softmax_update), in fewer ops: no upper clamp, and
// vscalefps multiplies by 2^n in one op where exp256 builds 2^n's bits (convert, add the bias,
// shift, multiply). Exact either way for these arguments (the product is a power-of-two scaling,
// identical rounding), so the AVX2 and AVX-512 paths keep the same bits (checked bit for bit on
// 4M vectors of x in [-100, 0] with -inf, -0 and the -87.3 boundary).
inline __m512 exp512(__m512 x) {
  using C = ExpConst;
  const __m512 lo = _mm512_set1_ps(C::kLo);
  const __mmask16 valid = _mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ);
  x = _mm512_max_ps(x, lo);
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(C::kLog2e)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C::kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(C::kLn2Lo), r);
  __m512 p = _mm512_set1_ps(C::kPoly[0]);
  for (int i = 1; i < 8; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(C::kPoly[i]));
  return _mm512_maskz_scalef_ps(valid, p, n);
}
#endif

// One online-softmax step of a row (flash attention's update), the SIMD version of the
// skeleton's softmax_update_scalar (same m_new == m rule; the sum runs in 8 lanes, so other
// bits): s[0, n) holds this tile's logits; lanes [n, round8(n)) are set to -inf so
// every operation runs on whole vectors (exp gives exactly 0 there). On return s holds
// exp(s - m_new), l = l * exp(m - m_new) + sum, acc[0, Dv) is rescaled by exp(m - m_new) and
// m = m_new. Returns false (s zeroed, state untouched) when every logit is -inf. A NaN logit
// poisons the row (softmax_update_scalar's rule): m, l and acc become NaN and stay NaN.
inline bool softmax_update(float* s, int64_t n, float& m, float& l, float* acc, int64_t Dv) {
  constexpr float kMinusInf = -std::numeric_limits<float>::infinity();
  const int64_t n8 = (n + 7) & ~int64_t{7};
  for (int64_t j = n; j < n8; ++j) s[j] = kMinusInf;
  __m256 vmax = _mm256_set1_ps(kMinusInf), vnan = _mm256_setzero_ps();
  int64_t j0 = 0;
#if KVCACHE_ATTN_AVX512
  {
    __m512 vmax16 = _mm512_set1_ps(kMinusInf);
    __mmask16 nan16 = 0;
    for (; j0 + 16 <= n8; j0 += 16) {
      const __m512 x = _mm512_loadu_ps(s + j0);
      vmax16 = _mm512_max_ps(vmax16, x);
      nan16 |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    }
    vmax = _mm256_max_ps(_mm512_castps512_ps256(vmax16), _mm512_extractf32x8_ps(vmax16, 1));
    if (nan16) vnan = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  }
#endif
  for (int64_t j = j0; j < n8; j += 8) {
    const __m256 x = _mm256_loadu_ps(s + j);
    vmax = _mm256_max_ps(vmax, x);
    vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
  const float mt = _mm_cvtss_f32(m4);
  const bool poisoned = _mm256_movemask_ps(vnan) != 0;
  if (mt == kMinusInf && !poisoned) {
    std::fill(s, s + n8, 0.0f);
    return false;
  }
  // std::max(NaN, x) is NaN: a poisoned row's m stays NaN at every later tile.
  const float m_new = poisoned ? std::numeric_limits<float>::quiet_NaN() : std::max(m, mt);
  const float alpha = m_new == m ? 1.0f : std::exp(m - m_new);  // exp(0) = 1 exactly
  const __m256 vm = _mm256_set1_ps(m_new);
  __m256 vsum = _mm256_setzero_ps();
  int64_t j1 = 0;
#if KVCACHE_ATTN_AVX512
  {  // 16 logits at a time; the sum still adds the 8-lane halves in order (the AVX2 bits)
    const __m512 vm16 = _mm512_set1_ps(m_new);
    for (; j1 + 16 <= n8; j1 += 16) {
      const __m512 p = exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j1), vm16));
      _mm512_storeu_ps(s + j1, p);
      vsum = _mm256_add_ps(vsum, _mm512_castps512_ps256(p));
      vsum = _mm256_add_ps(vsum, _mm512_extractf32x8_ps(p, 1));
    }
  }
#endif
  for (int64_t j = j1; j < n8; j += 8) {
    const __m256 p = exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(s + j, p);
    vsum = _mm256_add_ps(vsum, p);
  }
  l = l * alpha + hsum1(vsum);
  if (alpha != 1.0f) {
    const __m256 va = _mm256_set1_ps(alpha);
    int64_t d = 0;
#if KVCACHE_ATTN_AVX512
    for (; d + 16 <= Dv; d += 16)
      _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), _mm512_set1_ps(alpha)));
#endif
    for (; d + 8 <= Dv; d += 8)
      _mm256_storeu_ps(acc + d, _mm256_mul_ps(_mm256_loadu_ps(acc + d), va));
    for (; d < Dv; ++d) acc[d] *= alpha;
  }
  m = m_new;
  return true;
}

#endif  // KVCACHE_ATTN_AVX2

}  // namespace kvcache::detail
