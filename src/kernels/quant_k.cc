// The k-quants q2_K, q3_K, q4_K, q5_K and q6_K: ggml's super-blocks of 256
// (kernels/quant_types.h).
//
// Block layouts (llama.cpp, ggml/src/ggml-common.h: block_q2_K ... block_q6_K, QK_K = 256,
// K_SCALE_SIZE = 12), as byte offsets in a block:
//   q2_K (84):  scales[16] (low nibble scale, high nibble min), qs[64] (2-bit), d, dmin (f16)
//   q3_K (110): hmask[32] (high bit), qs[64] (low 2 bits), scales[12] (16 x 6-bit), d
//   q4_K (144): d, dmin, scales[12] (8 scales + 8 mins, 6-bit), qs[128] (4-bit)
//   q5_K (176): d, dmin, scales[12], qh[32] (fifth bit), qs[128] (low 4 bits)
//   q6_K (210): ql[128] (low 4 bits), qh[64] (upper 2 bits), scales[16] (int8), d
// The values are those of ggml/src/ggml-quants.c's dequantize_row_q{2,3,4,5,6}_K (including
// get_scale_min_k4 for the packed 6-bit scales/mins of q4_K/q5_K and q3_K's kmask unpacking of
// its 6-bit scales). Blocks in a mapped GGUF are not aligned: every multi-byte field is read
// with memcpy.
//
// Every type has the same shape once unpacked: element e of a super-block is
// s[e / 16] * code[e] - m[e / 16] with an integer code (q4_K/q5_K have 8 sub-blocks of 32,
// stored here as 16 pairs of equal halves; types without mins have m = 0, and x - 0.0f == x
// for every float, so the SIMD dequantize is bit-identical to the reference). The reference
// functions below spell out each format separately; the SIMD paths and the dot products go
// through the unpacked form.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/int8_dot.h"
#include "kernels/quant_types.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVCACHE_QUANT_K_AVX2 1
#elif defined(__F16C__)
#include <immintrin.h>
#endif

namespace kvcache {

namespace {

constexpr int kQK = 256;

// Byte offsets of the fields (ggml-common.h order).
namespace q2k {
constexpr size_t kScales = 0, kQs = 16, kD = 80, kDmin = 82, kBytes = 84;
}
namespace q3k {
constexpr size_t kHmask = 0, kQs = 32, kScales = 96, kD = 108, kBytes = 110;
}
namespace q4k {
constexpr size_t kD = 0, kDmin = 2, kScales = 4, kQs = 16, kBytes = 144;
}
namespace q5k {
constexpr size_t kD = 0, kDmin = 2, kScales = 4, kQh = 16, kQs = 48, kBytes = 176;
}
namespace q6k {
constexpr size_t kQl = 0, kQh = 128, kScales = 192, kD = 208, kBytes = 210;
}

float load_f16(const uint8_t* p) {
  f16_t h;
  std::memcpy(&h, p, sizeof(h));
#ifdef __F16C__
  return _cvtsh_ss(h);  // the same value (f16 -> f32 is exact), in one instruction
#else
  return f16_to_f32(h);
#endif
}

void store_f16(uint8_t* p, float v) {
  const f16_t h = f32_to_f16(v);
  std::memcpy(p, &h, sizeof(h));
}

const uint8_t* block_at(const void* blocks, int64_t i, size_t bytes) {
  return static_cast<const uint8_t*>(blocks) + static_cast<size_t>(i) * bytes;
}

// get_scale_min_k4 (ggml-quants.c): sub-block j's 6-bit scale and min of q4_K/q5_K. The first
// four are the low 6 bits of bytes j and j + 4; the last four take their low 4 bits from byte
// j + 4 (scale: low nibble, min: high nibble) and their top 2 bits from the top of bytes j - 4
// (scale) and j (min).
void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// q3_K's 6-bit scale i (0..15), unsigned (the value used is this - 32). ggml unpacks the 12
// bytes with kmask1/kmask2 on 32-bit words; per scale that is: low 4 bits from byte i % 8
// (low nibble for i < 8, high nibble otherwise), top 2 bits from byte 8 + i % 4 at bit
// 2 * (i / 4).
int scale_q3k(int i, const uint8_t* s) {
  const int lo = (s[i % 8] >> (4 * (i / 8))) & 0x0F;
  const int hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return lo | (hi << 4);
}

// ---------------------------------------------------------------------------------------------
// References: literally dequantize_row_q*_K.

void dequantize_ref_q2k(const void* blocks, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = block_at(blocks, i, q2k::kBytes);
    const float d = load_f16(b + q2k::kD);
    const float min = load_f16(b + q2k::kDmin);
    const uint8_t* q = b + q2k::kQs;
    int is = 0;
    for (int n = 0; n < kQK; n += 128) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = b[q2k::kScales + is++];
          const float dl = d * static_cast<float>(sc & 0x0F);
          const float ml = min * static_cast<float>(sc >> 4);
          for (int l = 0; l < 16; ++l) {
            *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
          }
        }
      }
      q += 32;
    }
  }
}

void dequantize_ref_q3k(const void* blocks, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = block_at(blocks, i, q3k::kBytes);
    const float d_all = load_f16(b + q3k::kD);
    const uint8_t* q = b + q3k::kQs;
    const uint8_t* hm = b + q3k::kHmask;
    int is = 0;
    int bit = 0;  // the hmask bit of this group of 32
    for (int n = 0; n < kQK; n += 128) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int half = 0; half < 2; ++half) {
          const float dl = d_all * static_cast<float>(scale_q3k(is++, b + q3k::kScales) - 32);
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int code = ((q[l] >> shift) & 3) - (((hm[l] >> bit) & 1) != 0 ? 0 : 4);
            *y++ = dl * static_cast<float>(code);
          }
        }
        ++bit;
      }
      q += 32;
    }
  }
}

void dequantize_ref_q4k(const void* blocks, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = block_at(blocks, i, q4k::kBytes);
    const float d = load_f16(b + q4k::kD);
    const float min = load_f16(b + q4k::kDmin);
    const uint8_t* q = b + q4k::kQs;
    for (int j = 0; j < 8; j += 2) {  // 64 elements: low nibbles, then high nibbles of 32 bytes
      int sc, m;
      scale_min_k4(j, b + q4k::kScales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
      scale_min_k4(j + 1, b + q4k::kScales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
      q += 32;
    }
  }
}

void dequantize_ref_q5k(const void* blocks, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = block_at(blocks, i, q5k::kBytes);
    const float d = load_f16(b + q5k::kD);
    const float min = load_f16(b + q5k::kDmin);
    const uint8_t* ql = b + q5k::kQs;
    const uint8_t* qh = b + q5k::kQh;
    for (int j = 0; j < 8; j += 2) {  // qh bit j for the low nibbles, bit j + 1 for the high
      int sc, m;
      scale_min_k4(j, b + q5k::kScales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
      scale_min_k4(j + 1, b + q5k::kScales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        *y++ = d1 * static_cast<float>((ql[l] & 0x0F) + (((qh[l] >> j) & 1) != 0 ? 16 : 0)) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        *y++ =
            d2 * static_cast<float>((ql[l] >> 4) + (((qh[l] >> (j + 1)) & 1) != 0 ? 16 : 0)) - m2;
      }
      ql += 32;
    }
  }
}

void dequantize_ref_q6k(const void* blocks, float* y, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = block_at(blocks, i, q6k::kBytes);
    const float d = load_f16(b + q6k::kD);
    const uint8_t* ql = b + q6k::kQl;
    const uint8_t* qh = b + q6k::kQh;
    const uint8_t* sc = b + q6k::kScales;  // int8
    for (int n = 0; n < kQK; n += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * static_cast<float>(static_cast<int8_t>(sc[is + 0])) * static_cast<float>(q1);
        y[l + 32] =
            d * static_cast<float>(static_cast<int8_t>(sc[is + 2])) * static_cast<float>(q2);
        y[l + 64] =
            d * static_cast<float>(static_cast<int8_t>(sc[is + 4])) * static_cast<float>(q3);
        y[l + 96] =
            d * static_cast<float>(static_cast<int8_t>(sc[is + 6])) * static_cast<float>(q4);
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

#ifdef KVCACHE_QUANT_K_AVX2

// ---------------------------------------------------------------------------------------------
// The unpacked form: element e = s[e / 16] * q[e] - m[e / 16], with s and m computed exactly as
// the references compute their per-sub-block factors (same float operations, same order).

struct Unpacked {
  alignas(32) int8_t q[kQK];
  float s[16];
  float m[16];
};

void factors_q2k(const uint8_t* b, Unpacked& u) {
  const float d = load_f16(b + q2k::kD), min = load_f16(b + q2k::kDmin);
  for (int g = 0; g < 16; ++g) {
    const uint8_t sc = b[q2k::kScales + g];
    u.s[g] = d * static_cast<float>(sc & 0x0F);
    u.m[g] = min * static_cast<float>(sc >> 4);
  }
}

void factors_q3k(const uint8_t* b, Unpacked& u) {
  const float d = load_f16(b + q3k::kD);
  for (int g = 0; g < 16; ++g) {
    u.s[g] = d * static_cast<float>(scale_q3k(g, b + q3k::kScales) - 32);
    u.m[g] = 0.0f;
  }
}

// q4_K and q5_K share the scale fields and their offsets (d, dmin, scales[12] at 0, 2, 4).
void factors_k4(const uint8_t* b, Unpacked& u) {
  const float d = load_f16(b + q4k::kD), min = load_f16(b + q4k::kDmin);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(j, b + q4k::kScales, &sc, &m);
    u.s[2 * j] = u.s[2 * j + 1] = d * static_cast<float>(sc);
    u.m[2 * j] = u.m[2 * j + 1] = min * static_cast<float>(m);
  }
}

void factors_q6k(const uint8_t* b, Unpacked& u) {
  const float d = load_f16(b + q6k::kD);
  for (int g = 0; g < 16; ++g) {
    u.s[g] = d * static_cast<float>(static_cast<int8_t>(b[q6k::kScales + g]));
    u.m[g] = 0.0f;
  }
}

__m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
void store32(int8_t* p, __m256i v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
}
__m256i srl8(__m256i v, int n) {  // per-byte logical shift right (callers mask the bits kept)
  return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n));
}

void codes_q2k(const uint8_t* b, Unpacked& u) {
  const __m256i m3 = _mm256_set1_epi8(3);
  for (int n = 0; n < 2; ++n) {
    const __m256i v = load32(b + q2k::kQs + 32 * n);
    for (int j = 0; j < 4; ++j)
      store32(u.q + 128 * n + 32 * j, _mm256_and_si256(srl8(v, 2 * j), m3));
  }
}

void codes_q3k(const uint8_t* b, Unpacked& u) {
  const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
  const __m256i hm = load32(b + q3k::kHmask);
  for (int n = 0; n < 2; ++n) {
    const __m256i v = load32(b + q3k::kQs + 32 * n);
    for (int j = 0; j < 4; ++j) {
      const __m256i lo = _mm256_and_si256(srl8(v, 2 * j), m3);
      const __m256i h = _mm256_slli_epi16(_mm256_and_si256(srl8(hm, 4 * n + j), one), 2);
      store32(u.q + 128 * n + 32 * j, _mm256_sub_epi8(_mm256_add_epi8(lo, h), four));
    }
  }
}

void codes_q4k(const uint8_t* b, Unpacked& u) {
  const __m256i mf = _mm256_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m256i v = load32(b + q4k::kQs + 32 * j);
    store32(u.q + 64 * j, _mm256_and_si256(v, mf));
    store32(u.q + 64 * j + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), mf));
  }
}

void codes_q5k(const uint8_t* b, Unpacked& u) {
  const __m256i mf = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const __m256i qh = load32(b + q5k::kQh);
  for (int j = 0; j < 4; ++j) {
    const __m256i v = load32(b + q5k::kQs + 32 * j);
    const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(srl8(qh, 2 * j), one), 4);
    const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(srl8(qh, 2 * j + 1), one), 4);
    store32(u.q + 64 * j, _mm256_or_si256(_mm256_and_si256(v, mf), h1));
    store32(u.q + 64 * j + 32, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), mf), h2));
  }
}

// q6_K's codes + 32 (unsigned, 0..63) of elements 128 n + 32 k + 0..31 into q[k]: ql's low
// nibbles, then its high nibbles, each with a 2-bit pair of qh on top (dequantize_row_q6_K's
// order).
void q6k_codes(const uint8_t* b, int n, __m256i q[4]) {
  const __m256i mf = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  const __m256i l0 = load32(b + q6k::kQl + 64 * n), l1 = load32(b + q6k::kQl + 64 * n + 32);
  const __m256i h = load32(b + q6k::kQh + 32 * n);
  const auto hi2 = [&](int shift) {
    return _mm256_slli_epi16(_mm256_and_si256(srl8(h, shift), m3), 4);
  };
  q[0] = _mm256_or_si256(_mm256_and_si256(l0, mf), hi2(0));
  q[1] = _mm256_or_si256(_mm256_and_si256(l1, mf), hi2(2));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), mf), hi2(4));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), mf), hi2(6));
}

void codes_q6k(const uint8_t* b, Unpacked& u) {
  const __m256i k32 = _mm256_set1_epi8(32);
  for (int n = 0; n < 2; ++n) {
    __m256i q[4];
    q6k_codes(b, n, q);
    for (int k = 0; k < 4; ++k) store32(u.q + 128 * n + 32 * k, _mm256_sub_epi8(q[k], k32));
  }
}

__m256 codes8(const int8_t* q) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

// y = s * q - m, the references' two roundings (no FMA), 16 elements of sub-block g.
void values16(const Unpacked& u, int g, __m256* lo, __m256* hi) {
  const __m256 s = _mm256_set1_ps(u.s[g]), m = _mm256_set1_ps(u.m[g]);
  *lo = _mm256_sub_ps(_mm256_mul_ps(s, codes8(u.q + 16 * g)), m);
  *hi = _mm256_sub_ps(_mm256_mul_ps(s, codes8(u.q + 16 * g + 8)), m);
}

template <void (*Codes)(const uint8_t*, Unpacked&), void (*Factors)(const uint8_t*, Unpacked&),
          size_t kBytes>
void dequantize_simd(const void* blocks, float* y, int64_t n_blocks) {
  Unpacked u;
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = block_at(blocks, i, kBytes);
    Codes(b, u);
    Factors(b, u);
    for (int g = 0; g < 16; ++g) {
      __m256 lo, hi;
      values16(u, g, &lo, &hi);
      _mm256_storeu_ps(y + 16 * g, lo);
      _mm256_storeu_ps(y + 16 * g + 8, hi);
    }
    y += kQK;
  }
}

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The dot of the exact reference values with x: only the summation order differs from dot_ref
// (four 8-lane accumulators, then a horizontal sum).
template <void (*Codes)(const uint8_t*, Unpacked&), void (*Factors)(const uint8_t*, Unpacked&),
          size_t kBytes>
float dot_simd(const void* blocks, const float* x, int64_t n_blocks) {
  Unpacked u;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = block_at(blocks, i, kBytes);
    Codes(b, u);
    Factors(b, u);
    for (int g = 0; g < 16; g += 2) {
      __m256 w0, w1, w2, w3;
      values16(u, g, &w0, &w1);
      values16(u, g + 1, &w2, &w3);
      acc0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + 16 * g), acc0);
      acc1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + 16 * g + 8), acc1);
      acc2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + 16 * g + 16), acc2);
      acc3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + 16 * g + 24), acc3);
    }
    x += kQK;
  }
  return hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

// ---------------------------------------------------------------------------------------------
// Integer dots against x rounded to int8 (BlockQ8K), the arithmetic of llama.cpp's
// ggml_vec_dot_q*_K_q8_K (ggml-quants.c / arch/x86/quants.c; written here from the formats):
// codes as unsigned bytes times the int8 x in pairs (maddubs: |pair| <= 63 * 127 * 2 fits
// int16), times the sub-block's integer scale in int16 pairs summed into int32 (VNNI's dpwssd
// where the build has it), one float scaling per super-block. Types whose codes are signed
// (q3_K: -4..3, q6_K: -32..31) use code + c, unsigned, and take c * scale * sum(x codes) back
// with the sums of 16 that BlockQ8K carries; the mins of q2_K/q4_K/q5_K come off the same way.
// Every integer sum is exact (|sum| < 2^31: 256 * 63 * 127 * 127), so the only differences from
// dot(dequantize_ref(row), x') are the float roundings of d * d_x * sum and the summation order.

// 32 unsigned codes times 32 int8 x, times the int16 scales in sc (lanes 0-7 scale the first 16
// products, 8-15 the last 16), added to acc. Callers keep several accumulators: each dpwssd
// waits for the one before it on the same accumulator (5 cycles), so one chain per super-block
// would be latency-bound.
inline __m256i dot32(__m256i acc, __m256i codes, const int8_t* xq, __m256i sc) {
  const __m256i p =
      _mm256_maddubs_epi16(codes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq)));
  return madd_acc(acc, p, sc);
}

inline int hsum_i32(__m128i s) {
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// sum_g f[g] * bsums[g] over the 16 sums of a BlockQ8K, f as 16 int16 lanes.
inline int dot_bsums(const int16_t* bsums, __m256i f) {
  const __m256i p =
      _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums)), f);
  return hsum_i32(_mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
}

// Byte-shuffle masks that broadcast int16 lane a to lanes 0-7 and lane b to lanes 8-15 of a
// 256-bit register holding the same 8 int16 in both halves.
inline __m256i lane_pair_mask(int a, int b) {
  const char a0 = static_cast<char>(2 * a), a1 = static_cast<char>(2 * a + 1);
  const char b0 = static_cast<char>(2 * b), b1 = static_cast<char>(2 * b + 1);
  return _mm256_setr_epi8(a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, a0, a1, b0, b1,
                          b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1, b0, b1);
}

// q4_K/q5_K's 8 scales and 8 mins (get_scale_min_k4's values) from the 12 packed bytes, as
// 8 int16 lanes each. In 32-bit words: scales 0-3 and mins 0-3 are the low 6 bits of words 0
// and 1; scales 4-7 take their low 4 bits from word 2's low nibbles and their top 2 from the
// top of word 0's bytes, mins 4-7 word 2's high nibbles and the top of word 1's bytes.
inline void scales_mins_k4(const uint8_t* q, __m128i* sc, __m128i* mn) {
  uint32_t w[3];
  std::memcpy(w, q, 12);
  const uint32_t s0 = w[0] & 0x3F3F3F3Fu;
  const uint32_t s1 = (w[2] & 0x0F0F0F0Fu) | (((w[0] >> 6) & 0x03030303u) << 4);
  const uint32_t m0 = w[1] & 0x3F3F3F3Fu;
  const uint32_t m1 = ((w[2] >> 4) & 0x0F0F0F0Fu) | (((w[1] >> 6) & 0x03030303u) << 4);
  *sc = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(s1), static_cast<int>(s0)));
  *mn = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, static_cast<int>(m1), static_cast<int>(m0)));
}

float dot_q8k_q4k(const void* blocks, const BlockQ8K* x, int64_t n_blocks) {
  const __m256i mf = _mm256_set1_epi8(0x0F);
  const __m256i pick[8] = {lane_pair_mask(0, 0), lane_pair_mask(1, 1), lane_pair_mask(2, 2),
                           lane_pair_mask(3, 3), lane_pair_mask(4, 4), lane_pair_mask(5, 5),
                           lane_pair_mask(6, 6), lane_pair_mask(7, 7)};
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = block_at(blocks, i, q4k::kBytes);
    const BlockQ8K& xb = x[i];
    __m128i sc, mn;
    scales_mins_k4(b + q4k::kScales, &sc, &mn);
    // Sub-block j's min times the sum of its 32 x codes (two sums of 16).
    const __m128i bs =
        _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums)),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(xb.bsums + 8)));
    const int msum = hsum_i32(_mm_madd_epi16(bs, mn));
    const __m256i sc2 = _mm256_broadcastsi128_si256(sc);
    __m256i s[4];
    for (int j = 0; j < 4; ++j) {
      const __m256i v = load32(b + q4k::kQs + 32 * j);
      s[j] = dot32(_mm256_setzero_si256(), _mm256_and_si256(v, mf), xb.qs + 64 * j,
                   _mm256_shuffle_epi8(sc2, pick[2 * j]));
      s[j] = dot32(s[j], _mm256_and_si256(_mm256_srli_epi16(v, 4), mf), xb.qs + 64 * j + 32,
                   _mm256_shuffle_epi8(sc2, pick[2 * j + 1]));
    }
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(load_f16(b + q4k::kD) * xb.d), _mm256_cvtepi32_ps(t), acc);
    mins += load_f16(b + q4k::kDmin) * xb.d * static_cast<float>(msum);
  }
  return hsum(acc) - mins;
}

float dot_q8k_q6k(const void* blocks, const BlockQ8K* x, int64_t n_blocks) {
  const __m256i pick[4] = {lane_pair_mask(0, 1), lane_pair_mask(2, 3), lane_pair_mask(4, 5),
                           lane_pair_mask(6, 7)};
  __m256 acc = _mm256_setzero_ps();
  float offs = 0.0f;
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = block_at(blocks, i, q6k::kBytes);
    const BlockQ8K& xb = x[i];
    const __m256i sc =  // the 16 int8 scales as int16
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + q6k::kScales)));
    // The codes are used + 32 (unsigned): take 32 * sum_g sc_g * sum(x codes of g) back.
    const int off = dot_bsums(xb.bsums, sc);
    // Scales 0-7 in both halves, then 8-15 in both halves.
    const __m256i sc_lo = _mm256_permute2x128_si256(sc, sc, 0x00);
    const __m256i sc_hi = _mm256_permute2x128_si256(sc, sc, 0x11);
    __m256i s[4];
    for (int n = 0; n < 2; ++n) {
      __m256i q[4];
      q6k_codes(b, n, q);
      const __m256i half = n == 0 ? sc_lo : sc_hi;
      for (int k = 0; k < 4; ++k) {
        s[k] = dot32(n == 0 ? _mm256_setzero_si256() : s[k], q[k], xb.qs + 128 * n + 32 * k,
                     _mm256_shuffle_epi8(half, pick[k]));
      }
    }
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]));
    const float d = load_f16(b + q6k::kD) * xb.d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(t), acc);
    offs += d * static_cast<float>(32 * off);
  }
  return hsum(acc) - offs;
}

// The other k-quants through the unpacked codes (codes_*, stored to the stack) and their
// integer factors: element e = d * S[e / 16] * (u[e] - c) - dmin * M[e / 16], u = code + c >= 0.
struct IntFactors {
  float d = 0.0f, dmin = 0.0f;
  alignas(32) int16_t s[16];
  alignas(32) int16_t m[16];
};

void ifactors_q2k(const uint8_t* b, IntFactors& f) {
  f.d = load_f16(b + q2k::kD);
  f.dmin = load_f16(b + q2k::kDmin);
  for (int g = 0; g < 16; ++g) {
    f.s[g] = static_cast<int16_t>(b[q2k::kScales + g] & 0x0F);
    f.m[g] = static_cast<int16_t>(b[q2k::kScales + g] >> 4);
  }
}

void ifactors_q3k(const uint8_t* b, IntFactors& f) {
  f.d = load_f16(b + q3k::kD);
  for (int g = 0; g < 16; ++g) {
    f.s[g] = static_cast<int16_t>(scale_q3k(g, b + q3k::kScales) - 32);
    f.m[g] = 0;
  }
}

void ifactors_k4(const uint8_t* b, IntFactors& f) {  // q5_K (q4_K has its own dot)
  f.d = load_f16(b + q4k::kD);
  f.dmin = load_f16(b + q4k::kDmin);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    scale_min_k4(j, b + q4k::kScales, &sc, &m);
    f.s[2 * j] = f.s[2 * j + 1] = static_cast<int16_t>(sc);
    f.m[2 * j] = f.m[2 * j + 1] = static_cast<int16_t>(m);
  }
}

template <void (*Codes)(const uint8_t*, Unpacked&), void (*IFactors)(const uint8_t*, IntFactors&),
          size_t kBytes, int kC>
float dot_q8k_unpacked(const void* blocks, const BlockQ8K* x, int64_t n_blocks) {
  Unpacked u;
  IntFactors f;
  const __m256i c = _mm256_set1_epi8(static_cast<char>(kC));
  __m256 acc = _mm256_setzero_ps();
  float rest = 0.0f;
  for (int64_t i = 0; i < n_blocks; ++i) {
    const uint8_t* b = block_at(blocks, i, kBytes);
    const BlockQ8K& xb = x[i];
    Codes(b, u);
    IFactors(b, f);
    const __m256i sv = _mm256_load_si256(reinterpret_cast<const __m256i*>(f.s));
    const int off = kC != 0 ? dot_bsums(xb.bsums, sv) : 0;
    const int msum =
        f.dmin != 0.0f
            ? dot_bsums(xb.bsums, _mm256_load_si256(reinterpret_cast<const __m256i*>(f.m)))
            : 0;
    __m256i s[4];
    for (int k = 0; k < 8; ++k) {
      const __m256i q =
          _mm256_add_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(u.q + 32 * k)), c);
      s[k % 4] =
          dot32(k < 4 ? _mm256_setzero_si256() : s[k % 4], q, xb.qs + 32 * k,
                _mm256_set_m128i(_mm_set1_epi16(f.s[2 * k + 1]), _mm_set1_epi16(f.s[2 * k])));
    }
    const __m256i t = _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]));
    const float d = f.d * xb.d;
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(t), acc);
    rest += d * static_cast<float>(kC * off) + f.dmin * xb.d * static_cast<float>(msum);
  }
  return hsum(acc) - rest;
}

#else

// Without AVX2: dequantize is the reference, dot goes through one super-block of f32 on the
// stack at a time (not a copy of the row).
template <void (*Ref)(const void*, float*, int64_t), size_t kBytes>
float dot_scalar(const void* blocks, const float* x, int64_t n_blocks) {
  float w[kQK];
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t i = 0; i < n_blocks; ++i) {
    Ref(block_at(blocks, i, kBytes), w, 1);
    for (int e = 0; e < kQK; e += 4) {
      for (int l = 0; l < 4; ++l) acc[l] += w[e + l] * x[e + l];
    }
    x += kQK;
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

#endif  // KVCACHE_QUANT_K_AVX2

// ---------------------------------------------------------------------------------------------
// Quantizers: simple per-sub-block fits (min/max with mins, max-abs without), the sub-block
// factors quantized to their fields against the block's f16 d (and dmin).

int round_clamp(float v, int lo, int hi) {
  const float r = std::nearbyint(v);
  if (!(r >= static_cast<float>(lo))) return lo;  // also NaN
  if (r > static_cast<float>(hi)) return hi;
  return static_cast<int>(r);
}

float inverse(float d) {
  return d != 0.0f ? 1.0f / d : 0.0f;
}

// Affine fit of n values to codes 0..levels with w = scale * q - offset, offset = -min(0, min x)
// >= 0 (the k-quant mins are subtracted).
void affine_fit(const float* x, int n, int levels, float* scale, float* offset) {
  float lo = 0.0f, hi = 0.0f;
  for (int l = 0; l < n; ++l) {
    lo = std::min(lo, x[l]);
    hi = std::max(hi, x[l]);
  }
  *scale = (hi - lo) / static_cast<float>(levels);
  *offset = -lo;
}

// Codes of n values for w = s * q - m with the quantized factors.
void affine_codes(const float* x, int n, float s, float m, int levels, uint8_t* q) {
  const float inv = inverse(s);
  for (int l = 0; l < n; ++l) q[l] = static_cast<uint8_t>(round_clamp((x[l] + m) * inv, 0, levels));
}

// Super-block factor of 8 or 16 sub-block values quantized to 0..max_code: f16 d and the codes.
float fit_super(const float* v, int n, int max_code, uint8_t* out_d16, int* codes) {
  float vmax = 0.0f;
  for (int j = 0; j < n; ++j) vmax = std::max(vmax, v[j]);
  store_f16(out_d16, vmax / static_cast<float>(max_code));
  const float d = load_f16(out_d16);
  const float inv = inverse(d);
  for (int j = 0; j < n; ++j) codes[j] = round_clamp(v[j] * inv, 0, max_code);
  return d;
}

void quantize_ref_q2k(const float* src, void* blocks, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, src += kQK) {
    uint8_t* b = static_cast<uint8_t*>(blocks) + static_cast<size_t>(i) * q2k::kBytes;
    float scale[16], offset[16];
    for (int g = 0; g < 16; ++g) affine_fit(src + 16 * g, 16, 3, &scale[g], &offset[g]);
    int sc[16], mn[16];
    const float d = fit_super(scale, 16, 15, b + q2k::kD, sc);
    const float dmin = fit_super(offset, 16, 15, b + q2k::kDmin, mn);
    uint8_t codes[kQK];
    for (int g = 0; g < 16; ++g) {
      b[q2k::kScales + g] = static_cast<uint8_t>(sc[g] | (mn[g] << 4));
      affine_codes(src + 16 * g, 16, d * static_cast<float>(sc[g]),
                   dmin * static_cast<float>(mn[g]), 3, codes + 16 * g);
    }
    // Element 128 n + 32 j + l (l < 32) is bits 2j of qs[32 n + l].
    uint8_t* qs = b + q2k::kQs;
    std::memset(qs, 0, 64);
    for (int e = 0; e < kQK; ++e) {
      qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>(codes[e] << (2 * ((e % 128) / 32)));
    }
  }
}

// Per sub-block of 16 (16 of them): the scale that maps the sub-block's largest-magnitude value
// to code -neg when it is negative, else to +pos (q3_K: 4 / 3, q6_K: 32 / 31), so it stays >= 0.
void signed_scales(const float* src, float neg, float pos, float* scale) {
  for (int g = 0; g < 16; ++g) {
    float amax = 0.0f, vmax = 0.0f;
    for (int l = 0; l < 16; ++l) {
      if (std::fabs(src[16 * g + l]) > amax) {
        amax = std::fabs(src[16 * g + l]);
        vmax = src[16 * g + l];
      }
    }
    scale[g] = vmax < 0.0f ? -vmax / neg : vmax / pos;
  }
}

void quantize_ref_q3k(const float* src, void* blocks, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, src += kQK) {
    uint8_t* b = static_cast<uint8_t*>(blocks) + static_cast<size_t>(i) * q3k::kBytes;
    // Signed scales: codes -4..3 (max-abs maps to +-4 when the extreme is negative, else 3).
    float scale[16];
    signed_scales(src, 4.0f, 3.0f, scale);
    int sc[16];
    const float d = fit_super(scale, 16, 31, b + q3k::kD, sc);
    uint8_t* s = b + q3k::kScales;
    std::memset(s, 0, 12);
    std::memset(b + q3k::kHmask, 0, 32);
    std::memset(b + q3k::kQs, 0, 64);
    for (int g = 0; g < 16; ++g) {
      const int v = sc[g] + 32;  // stored unsigned; scales used are v - 32 in 0..31 here
      s[g % 8] |= static_cast<uint8_t>((v & 0x0F) << (4 * (g / 8)));
      s[8 + g % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (g / 4)));
      const float inv = inverse(d * static_cast<float>(sc[g]));
      for (int l = 0; l < 16; ++l) {
        const int e = 16 * g + l;
        const int code = round_clamp(src[e] * inv, -4, 3) + 4;  // 0..7: hmask bit = code >= 4
        const int at = 32 * (e / 128) + e % 32, shift = 2 * ((e % 128) / 32);
        b[q3k::kQs + at] |= static_cast<uint8_t>((code & 3) << shift);
        b[q3k::kHmask + e % 32] |= static_cast<uint8_t>((code >> 2) << (e / 32));
      }
    }
  }
}

// Packs q4_K/q5_K's 8 scales and 8 mins (6-bit) into 12 bytes, the inverse of scale_min_k4.
void pack_scale_min_k4(const int* sc, const int* mn, uint8_t* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<uint8_t>(mn[j] | ((mn[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4));
  }
}

// q4_K / q5_K: 8 sub-blocks of 32 with codes 0..levels; writes d, dmin, scales, and codes.
void fit_k4(const float* src, uint8_t* b, int levels, uint8_t* codes) {
  float scale[8], offset[8];
  for (int j = 0; j < 8; ++j) affine_fit(src + 32 * j, 32, levels, &scale[j], &offset[j]);
  int sc[8], mn[8];
  const float d = fit_super(scale, 8, 63, b + q4k::kD, sc);
  const float dmin = fit_super(offset, 8, 63, b + q4k::kDmin, mn);
  pack_scale_min_k4(sc, mn, b + q4k::kScales);
  for (int j = 0; j < 8; ++j) {
    affine_codes(src + 32 * j, 32, d * static_cast<float>(sc[j]), dmin * static_cast<float>(mn[j]),
                 levels, codes + 32 * j);
  }
}

void quantize_ref_q4k(const float* src, void* blocks, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, src += kQK) {
    uint8_t* b = static_cast<uint8_t*>(blocks) + static_cast<size_t>(i) * q4k::kBytes;
    uint8_t codes[kQK];
    fit_k4(src, b, 15, codes);
    for (int j = 0; j < 4; ++j) {  // sub-block 2j in the low nibbles, 2j + 1 in the high
      for (int l = 0; l < 32; ++l) {
        b[q4k::kQs + 32 * j + l] =
            static_cast<uint8_t>(codes[64 * j + l] | (codes[64 * j + 32 + l] << 4));
      }
    }
  }
}

void quantize_ref_q5k(const float* src, void* blocks, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, src += kQK) {
    uint8_t* b = static_cast<uint8_t*>(blocks) + static_cast<size_t>(i) * q5k::kBytes;
    uint8_t codes[kQK];
    fit_k4(src, b, 31, codes);
    std::memset(b + q5k::kQh, 0, 32);
    for (int j = 0; j < 4; ++j) {
      for (int l = 0; l < 32; ++l) {
        const int c1 = codes[64 * j + l], c2 = codes[64 * j + 32 + l];
        b[q5k::kQs + 32 * j + l] = static_cast<uint8_t>((c1 & 0x0F) | ((c2 & 0x0F) << 4));
        b[q5k::kQh + l] |=
            static_cast<uint8_t>(((c1 >> 4) << (2 * j)) | ((c2 >> 4) << (2 * j + 1)));
      }
    }
  }
}

void quantize_ref_q6k(const float* src, void* blocks, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, src += kQK) {
    uint8_t* b = static_cast<uint8_t*>(blocks) + static_cast<size_t>(i) * q6k::kBytes;
    // Codes -32..31; a sub-block's scale maps its max-abs value to -32 or 31 by its sign (the
    // scale itself then stays positive, 0..127).
    float scale[16];
    signed_scales(src, 32.0f, 31.0f, scale);
    int sc[16];
    const float d = fit_super(scale, 16, 127, b + q6k::kD, sc);
    int8_t codes[kQK];
    for (int g = 0; g < 16; ++g) {
      b[q6k::kScales + g] = static_cast<uint8_t>(sc[g]);
      const float inv = inverse(d * static_cast<float>(sc[g]));
      for (int l = 0; l < 16; ++l) {
        codes[16 * g + l] = static_cast<int8_t>(round_clamp(src[16 * g + l] * inv, -32, 31));
      }
    }
    // Element 128 n + 32 k + l (k = 0..3, l < 32): low 4 bits in ql[64 n + 32 (k % 2) + l]
    // (low nibble for k < 2), top 2 bits in qh[32 n + l] at bit 2 k.
    std::memset(b + q6k::kQl, 0, 192);
    for (int e = 0; e < kQK; ++e) {
      const int n = e / 128, k = (e % 128) / 32, l = e % 32;
      const int v = codes[e] + 32;
      b[q6k::kQl + 64 * n + 32 * (k % 2) + l] |= static_cast<uint8_t>((v & 0x0F) << (4 * (k / 2)));
      b[q6k::kQh + 32 * n + l] |= static_cast<uint8_t>((v >> 4) << (2 * k));
    }
  }
}

#ifdef KVCACHE_QUANT_K_AVX2
// Each type: SIMD dequantize, the f32 dot (the reference values' dot; decode takes the integer
// dot, so it serves builds' contract and tests), and the integer dot against int8 x.
const QuantKernels kQ2K = {dequantize_ref_q2k, dequantize_simd<codes_q2k, factors_q2k, q2k::kBytes>,
                           dot_simd<codes_q2k, factors_q2k, q2k::kBytes>, quantize_ref_q2k,
                           dot_q8k_unpacked<codes_q2k, ifactors_q2k, q2k::kBytes, 0>};
const QuantKernels kQ3K = {  // codes_q3k stores code - 4
    dequantize_ref_q3k, dequantize_simd<codes_q3k, factors_q3k, q3k::kBytes>,
    dot_simd<codes_q3k, factors_q3k, q3k::kBytes>, quantize_ref_q3k,
    dot_q8k_unpacked<codes_q3k, ifactors_q3k, q3k::kBytes, 4>};
const QuantKernels kQ4K = {dequantize_ref_q4k, dequantize_simd<codes_q4k, factors_k4, q4k::kBytes>,
                           dot_simd<codes_q4k, factors_k4, q4k::kBytes>, quantize_ref_q4k,
                           dot_q8k_q4k};
const QuantKernels kQ5K = {dequantize_ref_q5k, dequantize_simd<codes_q5k, factors_k4, q5k::kBytes>,
                           dot_simd<codes_q5k, factors_k4, q5k::kBytes>, quantize_ref_q5k,
                           dot_q8k_unpacked<codes_q5k, ifactors_k4, q5k::kBytes, 0>};
const QuantKernels kQ6K = {dequantize_ref_q6k, dequantize_simd<codes_q6k, factors_q6k, q6k::kBytes>,
                           dot_simd<codes_q6k, factors_q6k, q6k::kBytes>, quantize_ref_q6k,
                           dot_q8k_q6k};
#else
// Without AVX2: the reference dequantize, the f32 dot through it, no integer dot (matmul then
// multiplies the unrounded x).
#define KQ_KERNELS(ref, bytes, quant)                \
  QuantKernels {                                     \
    ref, ref, dot_scalar<ref, bytes>, quant, nullptr \
  }
const QuantKernels kQ2K = KQ_KERNELS(dequantize_ref_q2k, q2k::kBytes, quantize_ref_q2k);
const QuantKernels kQ3K = KQ_KERNELS(dequantize_ref_q3k, q3k::kBytes, quantize_ref_q3k);
const QuantKernels kQ4K = KQ_KERNELS(dequantize_ref_q4k, q4k::kBytes, quantize_ref_q4k);
const QuantKernels kQ5K = KQ_KERNELS(dequantize_ref_q5k, q5k::kBytes, quantize_ref_q5k);
const QuantKernels kQ6K = KQ_KERNELS(dequantize_ref_q6k, q6k::kBytes, quantize_ref_q6k);
#undef KQ_KERNELS
#endif

}  // namespace

const QuantKernels* k_quant_kernels(DType t) {
  switch (t) {
    case DType::kQ2_K:
      return &kQ2K;
    case DType::kQ3_K:
      return &kQ3K;
    case DType::kQ4_K:
      return &kQ4K;
    case DType::kQ5_K:
      return &kQ5K;
    case DType::kQ6_K:
      return &kQ6K;
    default:
      return nullptr;
  }
}

}  // namespace kvcache
