#include "kernels/quant_types.h"

#include <cmath>
#include <cstring>
#include <limits>

#if defined(__AVX2__)
#include <immintrin.h>
#define KVCACHE_QUANT_ACT_AVX2 1
#endif

namespace kvcache {

namespace {

constexpr int kQK = 256;

// The scale of a block and the factor that maps x to codes: id = 127 / amax (x * id then never
// exceeds 127 in magnitude before rounding), and the scale llama.cpp stores, so that our
// rounded x is its rounded x and the two engines' quantized products differ only in float
// summation order:
// - blocks of 256 (quantize_row_q8_K_ref, ggml-quants.c): d = 1 / iscale with
//   iscale = -127 / max, the value of largest magnitude; the codes there are ours negated
//   and d = -1 / id, so d * q is the same product;
// - blocks of 32 (quantize_row_q8_0, ggml-cpu/arch/x86/quants.c): d = amax / 127 stored as
//   f16, so d is that value rounded to f16.
// Codes round to nearest, ties to even, in both (nearest_int there, cvtps / nearbyint here).
// Non-finite blocks: d = NaN, id = 0 (codes 0, products NaN).
struct ActScale {
  float d, id;
};

template <int kN>
ActScale act_scale(const float* x) {
#ifdef KVCACHE_QUANT_ACT_AVX2
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps(), fin = _mm256_setzero_ps();
  for (int j = 0; j < kN; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
    fin = _mm256_add_ps(fin, _mm256_mul_ps(v, _mm256_setzero_ps()));  // NaN if any is inf/NaN
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  __m128 f = _mm_add_ps(_mm256_castps256_ps128(fin), _mm256_extractf128_ps(fin, 1));
  f = _mm_add_ps(f, _mm_movehl_ps(f, f));
  f = _mm_add_ss(f, _mm_movehdup_ps(f));
  const float a = _mm_cvtss_f32(m);
  const bool finite = _mm_cvtss_f32(f) == 0.0f;
#else
  float a = 0.0f, fin = 0.0f;
  for (int j = 0; j < kN; ++j) {
    a = std::fmax(a, std::fabs(x[j]));
    fin += x[j] * 0.0f;
  }
  const bool finite = fin == 0.0f;
#endif
  if (!finite) return {std::numeric_limits<float>::quiet_NaN(), 0.0f};
  if (a == 0.0f) return {0.0f, 0.0f};
  const float id = 127.0f / a;
  if constexpr (kN == 32) {
    return {f16_to_f32(f32_to_f16(a / 127.0f)), id};
  } else {
    return {1.0f / id, id};
  }
}

// codes[j] = nearbyint(x[j] * id) for kN values (|x * id| <= 127 by act_scale's id).
template <int kN>
void act_codes(const float* x, float id_scalar, int8_t* codes) {
#ifdef KVCACHE_QUANT_ACT_AVX2
  const __m256 id = _mm256_set1_ps(id_scalar);
  for (int j = 0; j < kN; j += 32) {
    // cvtps rounds to nearest even (the default MXCSR mode), as nearbyint does below.
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j), id));
    const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 8), id));
    const __m256i e = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 16), id));
    const __m256i f = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + j + 24), id));
    // packs interleave the 128-bit lanes; the permute puts the 32 codes back in order.
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, c), _mm256_packs_epi32(e, f));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + j),
                        _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
#else
  for (int j = 0; j < kN; ++j) codes[j] = static_cast<int8_t>(std::nearbyint(x[j] * id_scalar));
#endif
}

// x'[j] = d * nearbyint(x[j] * id): the values act_codes' codes stand for.
template <int kN>
void act_round(const float* x, const ActScale& s, float* dst) {
#ifdef KVCACHE_QUANT_ACT_AVX2
  const __m256 id = _mm256_set1_ps(s.id), d = _mm256_set1_ps(s.d);
  for (int j = 0; j < kN; j += 8) {
    const __m256 q = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + j), id),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_ps(dst + j, _mm256_mul_ps(d, q));
  }
#else
  for (int j = 0; j < kN; ++j) dst[j] = s.d * std::nearbyint(x[j] * s.id);
#endif
}

}  // namespace

void quantize_act_q8k(const float* x, BlockQ8K* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, x += kQK) {
    const ActScale s = act_scale<kQK>(x);
    BlockQ8K& b = dst[i];
    b.d = s.d;
    if (s.id == 0.0f) {  // all zero, or not finite (d = NaN carries it into the products)
      std::memset(b.qs, 0, sizeof(b.qs));
      std::memset(b.bsums, 0, sizeof(b.bsums));
      continue;
    }
    act_codes<kQK>(x, s.id, b.qs);
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b.qs[16 * g + l];
      b.bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

void round_act_q8k(const float* x, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += kQK, x += kQK, dst += kQK)
    act_round<kQK>(x, act_scale<kQK>(x), dst);
}

void quantize_act_q8_32(const float* x, BlockQ8A32* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, x += 32) {
    const ActScale s = act_scale<32>(x);
    dst[i].d = s.d;
    if (s.id == 0.0f) {  // all zero, or not finite (d = NaN: s and the products NaN too)
      std::memset(dst[i].qs, 0, sizeof(dst[i].qs));
      dst[i].s = s.d * 0.0f;
      continue;
    }
    act_codes<32>(x, s.id, dst[i].qs);
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += dst[i].qs[j];
    dst[i].s = s.d * static_cast<float>(sum);
  }
}

void round_act_q8_32(const float* x, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 32, x += 32, dst += 32) act_round<32>(x, act_scale<32>(x), dst);
}

const QuantKernels* quant_kernels(DType t) {
  if (const QuantKernels* k = legacy_quant_kernels(t)) return k;
  return k_quant_kernels(t);
}

}  // namespace kvcache
