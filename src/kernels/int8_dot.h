// The integer multiply-accumulate steps of the int8-activation dots (matmul.cc's q8_0,
// quant_legacy.cc, quant_k.cc): VNNI's fused forms where the build has them (AVX512-VNNI with
// VL, or AVX-VNNI), else AVX2's maddubs / madd, the same exact int32 results either way.
// AVX2 builds only.
#pragma once

#if defined(__AVX2__)
#include "core/x86_intrin.h"  // <immintrin.h>, first in the unit (GCC 12, see there)

namespace kvcache {

// acc + the 32 products of unsigned bytes u and signed bytes x, summed in fours into int32
// lanes. Without VNNI maddubs forms int16 pairs first: callers keep |2 u x| <= 32767.
inline __m256i dot_u8x32(__m256i acc, __m256i u, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, x);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, u, x);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
#endif
}

// The same for signed w: |w| times x with w's sign (llama.cpp's mul_sum_i8_pairs trick,
// ggml-cpu/arch/x86); |pair| <= 2 * 128 * 127 fits int16 (x never -128: codes are within 127).
inline __m256i dot_i8x32(__m256i acc, __m256i w, __m256i x) {
  return dot_u8x32(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// acc + the int16 pair products of a and b summed into int32 lanes.
inline __m256i madd_acc(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

}  // namespace kvcache

#endif  // __AVX2__
