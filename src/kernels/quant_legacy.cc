// q4_0, q4_1, q5_0, q5_1 and iq4_nl: ggml's blocks of 32 (kernels/quant_types.h).
//
// Block layouts, byte for byte (llama.cpp ggml/src/ggml-common.h: block_q4_0, block_q4_1,
// block_q5_0, block_q5_1, block_iq4_nl; values as ggml/src/ggml-quants.c's dequantize_row_q4_0
// ... dequantize_row_iq4_nl define them):
//   q4_0   f16 d,             qs[16]   18 bytes   x = (nibble - 8) * d
//   q4_1   f16 d, f16 m,      qs[16]   20 bytes   x = nibble * d + m
//   q5_0   f16 d,   qh[4],    qs[16]   22 bytes   x = ((nibble | high << 4) - 16) * d
//   q5_1   f16 d, f16 m, qh[4], qs[16] 24 bytes   x = (nibble | high << 4) * d + m
//   iq4_nl f16 d,             qs[16]   18 bytes   x = d * kIq4nlValues[nibble]
// Element j < 16 is the low nibble of qs[j], element j + 16 its high nibble; the fifth bit of
// element j is bit j of qh read as a little-endian uint32 (ggml memcpy's qh into a uint32_t and
// takes (qh >> j) for the low half, (qh >> (j + 12)) & 0x10 for element j + 16).
// Blocks are 18..24 bytes, so their fields are not aligned: read with memcpy / unaligned loads.
// AVX2 builds also have dot_q8_32, the integer dot with x rounded per 32 (BlockQ8A32), which
// matmul then uses on every path (kernels/matmul.h).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>

#include "kernels/int8_dot.h"
#include "kernels/quant_types.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "core/x86_intrin.h"
#define KVCACHE_QUANT_LEGACY_AVX2 1
#if defined(__AVX512F__)
#define KVCACHE_QUANT_LEGACY_AVX512 1
#endif
#endif

namespace kvcache {

namespace {

// ggml-common.h's kvalues_iq4nl: the 16 non-linear levels of iq4_nl.
alignas(16) constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                 1,    13,   25,  38,  53,  69,  89,  113};

enum class Kind { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kIQ4_NL };

template <Kind K>
struct Layout {
  static constexpr bool kHasMin = K == Kind::kQ4_1 || K == Kind::kQ5_1;
  static constexpr bool kHasHigh = K == Kind::kQ5_0 || K == Kind::kQ5_1;
  static constexpr size_t kQhOff = kHasMin ? 4 : 2;
  static constexpr size_t kQsOff = kQhOff + (kHasHigh ? 4 : 0);
  static constexpr size_t kBytes = kQsOff + 16;
  // Subtracted from the 4- or 5-bit code (the _0 types are symmetric around 0).
  static constexpr int kOffset = K == Kind::kQ4_0 ? 8 : K == Kind::kQ5_0 ? 16 : 0;
};

inline float load_f16(const uint8_t* p) {
  f16_t h;
  std::memcpy(&h, p, sizeof(h));
  return f16_to_f32(h);
}

inline void store_f16(uint8_t* p, float v) {
  const f16_t h = f32_to_f16(v);
  std::memcpy(p, &h, sizeof(h));
}

inline uint32_t load_qh(const uint8_t* p) {
  uint32_t qh;
  std::memcpy(&qh, p, sizeof(qh));
  return qh;  // little-endian hosts only (as the mapped GGUF file itself)
}

// Signed integer level of element j of a block (before the scale).
template <Kind K>
int level(const uint8_t* blk, int j) {
  using L = Layout<K>;
  const uint8_t* qs = blk + L::kQsOff;
  const int nibble = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
  if constexpr (K == Kind::kIQ4_NL) {
    return kIq4nlValues[nibble];
  } else if constexpr (L::kHasHigh) {
    const int high = static_cast<int>((load_qh(blk + L::kQhOff) >> j) & 1u);
    return (nibble | (high << 4)) - L::kOffset;
  } else {
    return nibble - L::kOffset;
  }
}

// The format's definition, element by element. The _1 types are `q * d + m` in two roundings
// (the build has -ffp-contract=off; the SIMD path keeps the same mul then add).
template <Kind K>
void dequantize_ref(const void* blocks, float* dst, int64_t n_blocks) {
  using L = Layout<K>;
  const auto* p = static_cast<const uint8_t*>(blocks);
  for (int64_t b = 0; b < n_blocks; ++b, p += L::kBytes, dst += 32) {
    const float d = load_f16(p);
    const float m = L::kHasMin ? load_f16(p + 2) : 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float q = static_cast<float>(level<K>(p, j));
      dst[j] = L::kHasMin ? q * d + m : q * d;
    }
  }
}

#ifdef KVCACHE_QUANT_LEGACY_AVX2
// kHighBit[g][i] = 1 << (8 g + i): the qh bit of element 8 g + i.
alignas(32) constexpr uint32_t kHighBit[4][8] = {
    {1u << 0, 1u << 1, 1u << 2, 1u << 3, 1u << 4, 1u << 5, 1u << 6, 1u << 7},
    {1u << 8, 1u << 9, 1u << 10, 1u << 11, 1u << 12, 1u << 13, 1u << 14, 1u << 15},
    {1u << 16, 1u << 17, 1u << 18, 1u << 19, 1u << 20, 1u << 21, 1u << 22, 1u << 23},
    {1u << 24, 1u << 25, 1u << 26, 1u << 27, 1u << 28, 1u << 29, 1u << 30, 1u << 31}};

// The 32 levels of a block as f32, elements 8g .. 8g+7 in f[g]. Exact (|level| <= 127).
template <Kind K>
inline void levels_f32(const uint8_t* blk, __m256 (&f)[4]) {
  using L = Layout<K>;
  const uint8_t* qs = blk + L::kQsOff;
  if constexpr (K == Kind::kIQ4_NL) {
    // Table lookup on bytes (pshufb), then widen the int8 values.
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0F);
    const __m128i tab = _mm_load_si128(reinterpret_cast<const __m128i*>(kIq4nlValues));
    const __m128i lo = _mm_shuffle_epi8(tab, _mm_and_si128(q, mask));
    const __m128i hi = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(q, 4), mask));
    f[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    f[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    f[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    f[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  } else {
    // Bytes 0..7 and 8..15 in 32-bit lanes: their low nibbles are elements 0..15, their high
    // nibbles elements 16..31, each group of 8 in lane order (no cross-lane shuffles).
    const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
    const __m256i v1 =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
    const __m256i low4 = _mm256_set1_epi32(0x0F);
    __m256i g[4] = {_mm256_and_si256(v0, low4), _mm256_and_si256(v1, low4),
                    _mm256_srli_epi32(v0, 4), _mm256_srli_epi32(v1, 4)};
    if constexpr (L::kHasHigh) {
      // Lane i of group g tests bit 8g + i of qh; where set, add 16 (the nibble is < 16, so
      // this is the OR of the fifth bit).
      const __m256i qh = _mm256_set1_epi32(static_cast<int>(load_qh(blk + L::kQhOff)));
      const __m256i sixteen = _mm256_set1_epi32(16);
      for (int i = 0; i < 4; ++i) {
        const __m256i bit = _mm256_load_si256(reinterpret_cast<const __m256i*>(kHighBit[i]));
        const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(qh, bit), bit);
        g[i] = _mm256_add_epi32(g[i], _mm256_and_si256(set, sixteen));
      }
    }
    for (int i = 0; i < 4; ++i) {
      if constexpr (L::kOffset != 0) g[i] = _mm256_sub_epi32(g[i], _mm256_set1_epi32(L::kOffset));
      f[i] = _mm256_cvtepi32_ps(g[i]);
    }
  }
}

#ifdef KVCACHE_QUANT_LEGACY_AVX512
// levels_f32's values in 16 lanes: lo = elements 0..15, hi = 16..31. The fifth bits are a
// mask register each (qh's low and high 16 bits); iq4_nl's levels a permute of the table.
template <Kind K>
inline void levels_f32x16(const uint8_t* blk, __m512& lo, __m512& hi) {
  using L = Layout<K>;
  const __m512i v =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + L::kQsOff)));
  __m512i a = _mm512_and_si512(v, _mm512_set1_epi32(0x0F));
  __m512i b = _mm512_srli_epi32(v, 4);
  if constexpr (K == Kind::kIQ4_NL) {
    const __m512 tab = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4nlValues))));
    lo = _mm512_permutexvar_ps(a, tab);
    hi = _mm512_permutexvar_ps(b, tab);
  } else {
    if constexpr (L::kHasHigh) {
      const uint32_t qh = load_qh(blk + L::kQhOff);
      const __m512i sixteen = _mm512_set1_epi32(16);
      a = _mm512_mask_add_epi32(a, static_cast<__mmask16>(qh & 0xFFFFu), a, sixteen);
      b = _mm512_mask_add_epi32(b, static_cast<__mmask16>(qh >> 16), b, sixteen);
    }
    if constexpr (L::kOffset != 0) {
      a = _mm512_sub_epi32(a, _mm512_set1_epi32(L::kOffset));
      b = _mm512_sub_epi32(b, _mm512_set1_epi32(L::kOffset));
    }
    lo = _mm512_cvtepi32_ps(a);
    hi = _mm512_cvtepi32_ps(b);
  }
}
#endif

// load_f16's value through F16C (exact for every f16, as f16_to_f32; inlined, where
// f16_to_f32 is a call into core/dtype.cc per block).
inline float load_f16_fast(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
#endif

// dequantize_ref's values: the same products (and sums for the _1 types), 8 lanes at a time.
template <Kind K>
void dequantize_simd(const void* blocks, float* dst, int64_t n_blocks) {
#ifdef KVCACHE_QUANT_LEGACY_AVX2
  using L = Layout<K>;
  const auto* p = static_cast<const uint8_t*>(blocks);
  for (int64_t b = 0; b < n_blocks; ++b, p += L::kBytes, dst += 32) {
    __m256 f[4];
    levels_f32<K>(p, f);
    const __m256 d = _mm256_set1_ps(load_f16_fast(p));
    if constexpr (L::kHasMin) {
      const __m256 m = _mm256_set1_ps(load_f16_fast(p + 2));
      for (int i = 0; i < 4; ++i)
        _mm256_storeu_ps(dst + 8 * i, _mm256_add_ps(_mm256_mul_ps(f[i], d), m));
    } else {
      for (int i = 0; i < 4; ++i) _mm256_storeu_ps(dst + 8 * i, _mm256_mul_ps(f[i], d));
    }
  }
#else
  dequantize_ref<K>(blocks, dst, n_blocks);
#endif
}

// Fused dot with f32 x. The _0 types and iq4_nl: d * sum(level * x) per block (levels exact
// in f32); the _1 types: sum((level * d + m) * x), the weight formed in a register with one FMA
// (one rounding of w, as dequantize_ref has two) — not d * sum(q x) + m * sum(x), which can
// cancel where m ~ -q d. Per block two partial sums of 16 products, added and accumulated
// into one of two accumulators alternating by block, so no FMA chain is longer than one step
// per two blocks (the loop is bound by the widening, not by FMA latency).
template <Kind K>
float dot(const void* blocks, const float* x, int64_t n_blocks) {
  using L = Layout<K>;
  const auto* p = static_cast<const uint8_t*>(blocks);
#ifdef KVCACHE_QUANT_LEGACY_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (int64_t b = 0; b < n_blocks; ++b, p += L::kBytes, x += 32) {
    const __m256 d = _mm256_set1_ps(load_f16_fast(p));
#ifdef KVCACHE_QUANT_LEGACY_AVX512
    // 16 lanes: lo = groups 0|1, hi = groups 2|3, so lo * x + hi * x' has s0 in its low half
    // and s1 in its high half, as the AVX2 path computes them: the same bits.
    __m512 lo, hi;
    levels_f32x16<K>(p, lo, hi);
    if constexpr (L::kHasMin) {
      const __m512 d16 = _mm512_set1_ps(load_f16_fast(p));
      const __m512 m16 = _mm512_set1_ps(load_f16_fast(p + 2));
      lo = _mm512_fmadd_ps(lo, d16, m16);
      hi = _mm512_fmadd_ps(hi, d16, m16);
    }
    const __m512 s16 =
        _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(x)));
    const __m256 s0 = _mm512_castps512_ps256(s16);
    const __m256 s1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s16), 1));
#else
    __m256 f[4];
    levels_f32<K>(p, f);
    if constexpr (L::kHasMin) {
      const __m256 m = _mm256_set1_ps(load_f16_fast(p + 2));
      for (int i = 0; i < 4; ++i) f[i] = _mm256_fmadd_ps(f[i], d, m);
    }
    __m256 s0 = _mm256_mul_ps(f[0], _mm256_loadu_ps(x));
    __m256 s1 = _mm256_mul_ps(f[1], _mm256_loadu_ps(x + 8));
    s0 = _mm256_fmadd_ps(f[2], _mm256_loadu_ps(x + 16), s0);
    s1 = _mm256_fmadd_ps(f[3], _mm256_loadu_ps(x + 24), s1);
#endif
    const __m256 s = _mm256_add_ps(s0, s1);
    if constexpr (L::kHasMin) {
      if (b & 1) {
        acc1 = _mm256_add_ps(acc1, s);
      } else {
        acc0 = _mm256_add_ps(acc0, s);
      }
    } else {
      if (b & 1) {
        acc1 = _mm256_fmadd_ps(d, s, acc1);
      } else {
        acc0 = _mm256_fmadd_ps(d, s, acc0);
      }
    }
  }
  return hsum(_mm256_add_ps(acc0, acc1));
#else
  float acc = 0.0f;
  for (int64_t b = 0; b < n_blocks; ++b, p += L::kBytes, x += 32) {
    const float d = load_f16(p);
    float s = 0.0f;
    if constexpr (L::kHasMin) {
      const float m = load_f16(p + 2);
      for (int j = 0; j < 32; ++j) s += (static_cast<float>(level<K>(p, j)) * d + m) * x[j];
      acc += s;
    } else {
      for (int j = 0; j < 32; ++j) s += static_cast<float>(level<K>(p, j)) * x[j];
      acc += d * s;
    }
  }
  return acc;
#endif
}

#ifdef KVCACHE_QUANT_LEGACY_AVX2
// ---- dot_q8_32: the integer dot with x rounded per 32 (BlockQ8A32), llama.cpp's arithmetic
// for these types (ggml/src/ggml-cpu/arch/x86/quants.c: ggml_vec_dot_q4_0_q8_0,
// q4_1_q8_1, q5_0_q8_0, q5_1_q8_1, iq4_nl_q8_0): per block the exact int32 sum of the
// products of the weight codes with the x codes, then one float scaling d_w * d_x (and, for
// the _1 types, + m_w * d_x * sum(x codes)). ----

// The 32 4-bit codes of a block as bytes in element order: low nibbles (elements 0..15) in
// the low 128 bits, high nibbles (16..31) in the high 128 bits.
inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

// 0xFF in byte j where bit j of qh (the fifth bit of element j) is set, else 0: byte j takes
// qh's byte j / 8 (a byte shuffle of qh broadcast to every 32-bit lane), then tests bit j % 8.
inline __m256i high_bits32(const uint8_t* qh_ptr) {
  const __m256i qh = _mm256_set1_epi32(static_cast<int>(load_qh(qh_ptr)));
  const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, pick), bit), bit);
}

// The int32 lanes of one block's product (sum of lanes = sum_j code_j * x_j, exact), codes as
// the format defines them: q4_0 nibble - 8, q5_0 (nibble | high << 4) - 16, iq4_nl the table's
// value (signed, through the sign trick); q4_1 nibble and q5_1 nibble | high << 4 (unsigned).
template <Kind K>
inline __m256i block_dot_i32(const uint8_t* blk, const int8_t* xq) {
  using L = Layout<K>;
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  const __m256i u = nibbles32(blk + L::kQsOff);
  const __m256i zero = _mm256_setzero_si256();
  if constexpr (K == Kind::kQ4_0) {
    return dot_i8x32(zero, _mm256_sub_epi8(u, _mm256_set1_epi8(8)), x);
  } else if constexpr (K == Kind::kIQ4_NL) {
    const __m256i tab =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(kIq4nlValues)));
    return dot_i8x32(zero, _mm256_shuffle_epi8(tab, u), x);
  } else if constexpr (K == Kind::kQ5_0) {
    // code - 16 as int8: the nibble where the fifth bit is set, else nibble - 16, which is
    // the nibble with its top four bits set (two's complement).
    const __m256i hi = _mm256_andnot_si256(high_bits32(blk + L::kQhOff), _mm256_set1_epi8(-16));
    return dot_i8x32(zero, _mm256_or_si256(u, hi), x);
  } else if constexpr (K == Kind::kQ5_1) {
    const __m256i hi = _mm256_and_si256(high_bits32(blk + L::kQhOff), _mm256_set1_epi8(16));
    return dot_u8x32(zero, _mm256_or_si256(u, hi), x);
  } else {
    return dot_u8x32(zero, u, x);
  }
}

// Two blocks per step into two float accumulators (two independent FMA chains; the integer
// work of a block does not depend on the one before). The _1 types' min term m_w * s_x
// (s_x = d_x * sum(x codes), BlockQ8A32::s, as llama.cpp's q8_1 carries it) goes to two
// scalar accumulators, one per chain.
template <Kind K>
float dot_q8_32(const void* blocks, const BlockQ8A32* x, int64_t n_blocks) {
  using L = Layout<K>;
  const auto* p = static_cast<const uint8_t*>(blocks);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  float mins[2] = {0.0f, 0.0f};
  const auto one = [&](int64_t b, int a) {
    const uint8_t* blk = p + b * static_cast<int64_t>(L::kBytes);
    const BlockQ8A32& xb = x[b];
    const __m256i s = block_dot_i32<K>(blk, xb.qs);
    acc[a] =
        _mm256_fmadd_ps(_mm256_set1_ps(load_f16_fast(blk) * xb.d), _mm256_cvtepi32_ps(s), acc[a]);
    if constexpr (L::kHasMin) mins[a] += load_f16_fast(blk + 2) * xb.s;
  };
  int64_t b = 0;
  for (; b + 2 <= n_blocks; b += 2) {
    one(b, 0);
    one(b + 1, 1);
  }
  if (b < n_blocks) one(b, 0);
  return hsum(_mm256_add_ps(acc[0], acc[1])) + (mins[0] + mins[1]);
}
#endif

// ---- quantize_ref: simple per-block fits (llama.cpp ggml-quants.c quantize_row_q4_0_ref ...
// q5_1_ref: the same scale choice; iq4_nl: d from the largest magnitude, nearest level) ----

// Stores 32 codes (0..15 or 0..31) as nibbles (+ qh for the 5-bit types).
template <Kind K>
void pack_codes(const int (&c)[32], uint8_t* blk) {
  using L = Layout<K>;
  uint8_t* qs = blk + L::kQsOff;
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((c[j] & 0x0F) | ((c[j + 16] & 0x0F) << 4));
    qh |= static_cast<uint32_t>((c[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((c[j + 16] >> 4) & 1) << (j + 16);
  }
  if constexpr (L::kHasHigh) std::memcpy(blk + L::kQhOff, &qh, sizeof(qh));
}

// x * inv + add, truncated (as ggml's (int8_t) cast of a non-negative value) into [0, hi].
inline int code_of(float v, int hi) {
  if (!(v > 0.0f)) return 0;  // also NaN
  return std::min(hi, static_cast<int>(std::min(v, static_cast<float>(hi))));
}

template <Kind K>
void quantize_ref(const float* src, void* blocks, int64_t n_blocks) {
  using L = Layout<K>;
  auto* p = static_cast<uint8_t*>(blocks);
  for (int64_t b = 0; b < n_blocks; ++b, p += L::kBytes, src += 32) {
    int c[32];
    if constexpr (K == Kind::kIQ4_NL) {
      // The value of largest magnitude maps to level -127 (d keeps its sign), the others to
      // their nearest level; then d is refitted by least squares to those levels and the
      // levels picked again (one step of ggml's refinement, without its importance weights).
      float vmax = 0.0f;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(src[j]) > std::fabs(vmax)) vmax = src[j];
      float d = vmax / -127.0f;
      auto pick = [&](float dd) {
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        for (int j = 0; j < 32; ++j) {
          const float t = src[j] * id;
          int best = 0;
          for (int v = 1; v < 16; ++v)
            if (std::fabs(t - kIq4nlValues[v]) < std::fabs(t - kIq4nlValues[best])) best = v;
          c[j] = best;
        }
      };
      pick(d);
      float sxv = 0.0f, svv = 0.0f;
      for (int j = 0; j < 32; ++j) {
        const float v = kIq4nlValues[c[j]];
        sxv += src[j] * v;
        svv += v * v;
      }
      if (d != 0.0f && svv > 0.0f) {
        d = sxv / svv;
        pick(d);
      }
      store_f16(p, d);
    } else if constexpr (L::kHasMin) {
      // [min, max] onto the 2^bits codes.
      constexpr int kMaxCode = L::kHasHigh ? 31 : 15;
      float lo = src[0], hi = src[0];
      for (int j = 1; j < 32; ++j) {
        lo = std::min(lo, src[j]);
        hi = std::max(hi, src[j]);
      }
      const float d = (hi - lo) / kMaxCode;
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      store_f16(p, d);
      store_f16(p + 2, lo);
      for (int j = 0; j < 32; ++j) c[j] = code_of((src[j] - lo) * id + 0.5f, kMaxCode);
    } else {
      // Symmetric: the value of largest magnitude maps to the most negative level (-8 / -16).
      constexpr int kMaxCode = L::kHasHigh ? 31 : 15;
      float vmax = 0.0f;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(src[j]) > std::fabs(vmax)) vmax = src[j];
      const float d = vmax / static_cast<float>(-L::kOffset);
      const float id = d != 0.0f ? 1.0f / d : 0.0f;
      store_f16(p, d);
      for (int j = 0; j < 32; ++j)
        c[j] = code_of(src[j] * id + (static_cast<float>(L::kOffset) + 0.5f), kMaxCode);
    }
    pack_codes<K>(c, p);
  }
}

template <Kind K>
constexpr QuantKernels make_kernels() {
  QuantKernels k;
  k.dequantize_ref = &dequantize_ref<K>;
  k.dequantize = &dequantize_simd<K>;
  k.dot = &dot<K>;
  k.quantize_ref = &quantize_ref<K>;
#ifdef KVCACHE_QUANT_LEGACY_AVX2
  k.dot_q8_32 = &dot_q8_32<K>;
#endif
  return k;
}

constexpr QuantKernels kQ4_0Kernels = make_kernels<Kind::kQ4_0>();
constexpr QuantKernels kQ4_1Kernels = make_kernels<Kind::kQ4_1>();
constexpr QuantKernels kQ5_0Kernels = make_kernels<Kind::kQ5_0>();
constexpr QuantKernels kQ5_1Kernels = make_kernels<Kind::kQ5_1>();
constexpr QuantKernels kIQ4_NLKernels = make_kernels<Kind::kIQ4_NL>();

static_assert(Layout<Kind::kQ4_0>::kBytes == 18 && Layout<Kind::kQ4_1>::kBytes == 20 &&
              Layout<Kind::kQ5_0>::kBytes == 22 && Layout<Kind::kQ5_1>::kBytes == 24 &&
              Layout<Kind::kIQ4_NL>::kBytes == 18);

}  // namespace

const QuantKernels* legacy_quant_kernels(DType t) {
  switch (t) {
    case DType::kQ4_0:
      return &kQ4_0Kernels;
    case DType::kQ4_1:
      return &kQ4_1Kernels;
    case DType::kQ5_0:
      return &kQ5_0Kernels;
    case DType::kQ5_1:
      return &kQ5_1Kernels;
    case DType::kIQ4_NL:
      return &kIQ4_NLKernels;
    default:
      return nullptr;
  }
}

}  // namespace kvcache
