// KV-cache quantizers and dequantizers (layouts and bounds in kv_quant.h). The KIVI quantizers
// run in vectors (the min / max and the codes; the reference versions are the scalar loops
// they must equal byte for byte); the rest is scalar, run once per G tokens.
#include "kernels/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

#include "core/error.h"
#include "kernels/matmul.h"

#if defined(__AVX2__)
#include "core/x86_intrin.h"  // <immintrin.h> without GCC 12's false warnings
#endif

namespace kvcache {

namespace {

constexpr float kF16Max = 65504.0f;

// The next f16 towards -inf from h (h finite, not the most negative value).
f16_t f16_next_down(f16_t h) {
  if (h == 0x0000u || h == 0x8000u) return 0x8001u;  // +-0 -> smallest negative subnormal
  return (h & 0x8000u) ? static_cast<f16_t>(h + 1) : static_cast<f16_t>(h - 1);
}

void check_params(const KiviBlockParams& p) {
  KV_CHECK(p.bits == 2 || p.bits == 4 || p.bits == 8, "KIVI bits must be 2, 4 or 8");
  KV_CHECK(p.group > 0 && p.d > 0, "KIVI block needs G > 0 and D > 0");
}

// One asymmetric group: zero = min rounded down to f16, scale = (max - zero) / qmax rounded up.
// A group holding a NaN or an infinity comes with lo = hi = NaN (poison_bounds) and is
// poisoned: its scale and zero are NaN and its codes 0, so every element dequantizes to NaN and
// an attention over it returns NaN, never finite values made up from clamped or dropped inputs.
struct GroupQuant {
  f16_t scale16 = 0, zero16 = 0;
  float scale = 0, zero = 0, inv = 0;
  uint32_t qmax = 0;
  bool poisoned = false;
  GroupQuant(float lo, float hi, int bits) : qmax((1u << bits) - 1u) {
    if (std::isnan(lo) || std::isnan(hi)) {
      poisoned = true;
      scale16 = zero16 = kF16QuietNaN;
      scale = zero = std::numeric_limits<float>::quiet_NaN();
      return;
    }
    // + 0: -0 becomes +0, so the result does not depend on which of two equal zeros a min or a
    // max kept (the vector paths reduce in another order than the reference's loops).
    lo = std::clamp(lo, -kF16Max, kF16Max) + 0.0f;
    hi = std::clamp(hi, -kF16Max, kF16Max) + 0.0f;
    zero16 = f16_round_down(lo);
    zero = f16_to_f32(zero16);
    scale16 = f16_round_up((hi - zero) / static_cast<float>(qmax));
    scale = f16_to_f32(scale16);
    inv = scale > 0 ? 1.0f / scale : 0.0f;
  }
  uint32_t code(float x) const {
    if (poisoned) return 0;
    const float c = std::nearbyint((x - zero) * inv);
    return static_cast<uint32_t>(std::clamp(c, 0.0f, static_cast<float>(qmax)));
  }
};

void put_code(std::byte* row, int64_t d, int bits, uint32_t code) {
  const int64_t per = kivi_codes_per_word(bits);
  uint32_t w;
  std::memcpy(&w, row + 4 * (d / per), 4);
  w |= code << ((d % per) * bits);
  std::memcpy(row + 4 * (d / per), &w, 4);
}

// A group's bounds as GroupQuant takes them: NaN where the group holds a non-finite element.
// nf is the sum of the group's x * 0 (0 when all are finite, NaN otherwise).
void poison_bounds(float nf, float& lo, float& hi) {
  if (std::isnan(nf)) lo = hi = std::numeric_limits<float>::quiet_NaN();
}

}  // namespace

f16_t f16_round_down(float x) {
  const f16_t h = f32_to_f16(x);
  return f16_to_f32(h) > x ? f16_next_down(h) : h;
}

f16_t f16_round_up(float x) {
  const f16_t h = f16_round_down(-x);
  return static_cast<f16_t>(h ^ 0x8000u);
}

int64_t kivi_value_group(int64_t d, int64_t g) {
  if (g >= d) return d;
  for (int64_t c = g; c > 1; --c)
    if (d % c == 0) return c;
  return 1;
}

void kivi_quantize_keys_reference(const float* keys, int64_t ld, const KiviBlockParams& p,
                                  std::byte* block) {
  check_params(p);
  const int64_t D = p.d, G = p.group, cb = kivi_col_bytes(G, p.bits);
  auto* scales = reinterpret_cast<f16_t*>(block);
  auto* zeros = scales + D;
  std::byte* codes = block + 4 * D;
  std::memset(codes, 0, static_cast<size_t>(D * cb));
  for (int64_t c = 0; c < D; ++c) {
    float lo = keys[c], hi = keys[c], nf = keys[c] * 0.0f;
    for (int64_t t = 1; t < G; ++t) {
      lo = std::min(lo, keys[t * ld + c]);
      hi = std::max(hi, keys[t * ld + c]);
      nf += keys[t * ld + c] * 0.0f;
    }
    poison_bounds(nf, lo, hi);
    const GroupQuant q(lo, hi, p.bits);
    std::memcpy(scales + c, &q.scale16, 2);
    std::memcpy(zeros + c, &q.zero16, 2);
    for (int64_t t = 0; t < G; ++t) {
      const KiviKeyPos at = kivi_key_pos(t, p.bits);
      codes[c * cb + at.byte] |= static_cast<std::byte>(q.code(keys[t * ld + c]) << at.shift);
    }
  }
}

void kivi_quantize_values_reference(const float* values, int64_t ld, const KiviBlockParams& p,
                                    std::byte* block) {
  check_params(p);
  KV_CHECK(p.v_group > 0 && p.d % p.v_group == 0, "KIVI v_group must divide D");
  const int64_t D = p.d, G = p.group, rb = kivi_row_bytes(D, p.bits), ng = D / p.v_group;
  auto* scales = reinterpret_cast<f16_t*>(block);
  auto* zeros = scales + G * ng;
  std::byte* codes = block + 4 * G * ng;
  std::memset(codes, 0, static_cast<size_t>(G * rb));
  for (int64_t t = 0; t < G; ++t) {
    const float* x = values + t * ld;
    for (int64_t g = 0; g < ng; ++g) {
      const float* xg = x + g * p.v_group;
      const auto [lo_at, hi_at] = std::minmax_element(xg, xg + p.v_group);
      float lo = *lo_at, hi = *hi_at, nf = 0.0f;
      for (int64_t c = 0; c < p.v_group; ++c) nf += xg[c] * 0.0f;
      poison_bounds(nf, lo, hi);
      const GroupQuant q(lo, hi, p.bits);
      std::memcpy(scales + g * G + t, &q.scale16, 2);
      std::memcpy(zeros + g * G + t, &q.zero16, 2);
      for (int64_t c = 0; c < p.v_group; ++c)
        put_code(codes + t * rb, g * p.v_group + c, p.bits, q.code(xg[c]));
    }
  }
}

namespace {

// Codes of n elements x against per-element zero z and inverse scale iv (the values GroupQuant
// holds), written as bytes: GroupQuant::code's float operations in vectors (subtract, multiply,
// round to nearest even, clamp), so the same codes. zs = 0: one zero and inverse (z[0], iv[0])
// for all n (a value group); zs = 1: one per element (key channels).
void codes_of(const float* x, const float* z, const float* iv, int zs, float qmax, int64_t n,
              uint8_t* out) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512 zv = zs ? _mm512_loadu_ps(z + i) : _mm512_set1_ps(*z);
    const __m512 ivv = zs ? _mm512_loadu_ps(iv + i) : _mm512_set1_ps(*iv);
    __m512 c = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), zv), ivv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    c = _mm512_min_ps(_mm512_max_ps(c, _mm512_setzero_ps()), _mm512_set1_ps(qmax));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(c)));
  }
#endif
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m256 zv = zs ? _mm256_loadu_ps(z + i) : _mm256_set1_ps(*z);
    const __m256 ivv = zs ? _mm256_loadu_ps(iv + i) : _mm256_set1_ps(*iv);
    __m256 c = _mm256_round_ps(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), zv), ivv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    c = _mm256_min_ps(_mm256_max_ps(c, _mm256_setzero_ps()), _mm256_set1_ps(qmax));
    alignas(32) int32_t t[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(t), _mm256_cvttps_epi32(c));
    for (int k = 0; k < 8; ++k) out[i + k] = static_cast<uint8_t>(t[k]);
  }
#endif
  // The vector clamp's operand order, min(max(c, 0), qmax): a NaN code (a poisoned group's,
  // whose zero is NaN) becomes 0, as maxps returns its second operand then.
  for (; i < n; ++i) {
    const float c = std::nearbyint((x[i] - z[zs ? i : 0]) * iv[zs ? i : 0]);
    const float m = c > 0.0f ? c : 0.0f;
    out[i] = static_cast<uint8_t>(m < qmax ? m : qmax);
  }
}

// lo[i] = min(lo[i], x[i]), hi[i] = max(hi[i], x[i]) as the reference's std::min / std::max
// (x < lo ? x : lo; hi < x ? x : hi): what minps / maxps compute with x as the first operand;
// nf[i] += x[i] * 0 (NaN from a non-finite x on).
void fold_min_max(const float* x, int64_t n, float* lo, float* hi, float* nf) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    _mm512_storeu_ps(lo + i, _mm512_min_ps(v, _mm512_loadu_ps(lo + i)));
    _mm512_storeu_ps(hi + i, _mm512_max_ps(v, _mm512_loadu_ps(hi + i)));
    _mm512_storeu_ps(nf + i, _mm512_fmadd_ps(v, _mm512_setzero_ps(), _mm512_loadu_ps(nf + i)));
  }
#endif
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(lo + i, _mm256_min_ps(v, _mm256_loadu_ps(lo + i)));
    _mm256_storeu_ps(hi + i, _mm256_max_ps(v, _mm256_loadu_ps(hi + i)));
    _mm256_storeu_ps(nf + i, _mm256_fmadd_ps(v, _mm256_setzero_ps(), _mm256_loadu_ps(nf + i)));
  }
#endif
  for (; i < n; ++i) {
    lo[i] = std::min(lo[i], x[i]);
    hi[i] = std::max(hi[i], x[i]);
    nf[i] += x[i] * 0.0f;
  }
}

// The smallest and largest of x[0, n), n >= 1 (GroupQuant makes a tie of -0 and +0 immaterial),
// both NaN where x holds a NaN or an infinity (poison_bounds).
std::pair<float, float> min_max(const float* x, int64_t n) {
  float lo = x[0], hi = x[0], nf = 0.0f;
  int64_t i = 0;
#if defined(__AVX512F__)
  if (n >= 16) {
    __m512 l = _mm512_loadu_ps(x), h = l, f = _mm512_mul_ps(l, _mm512_setzero_ps());
    for (i = 16; i + 16 <= n; i += 16) {
      const __m512 v = _mm512_loadu_ps(x + i);
      l = _mm512_min_ps(v, l);
      h = _mm512_max_ps(v, h);
      f = _mm512_fmadd_ps(v, _mm512_setzero_ps(), f);
    }
    lo = _mm512_reduce_min_ps(l);
    hi = _mm512_reduce_max_ps(h);
    nf = _mm512_reduce_add_ps(f);
  }
#endif
  for (; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    nf += x[i] * 0.0f;
  }
  poison_bounds(nf, lo, hi);
  return {lo, hi};
}

// GroupQuant of n groups from their lo[i] / hi[i] in vectors: the same clamps, the same f16
// rounding (F16C's round-to-nearest-even conversion is f32_to_f16's rule) and the same divisions,
// so the same scales, zeros and inverse scales.
void quant_many(int64_t n, const float* lo, const float* hi, int bits, f16_t* s16, f16_t* z16,
                float* zero, float* inv) {
  int64_t i = 0;
#if defined(__AVX2__) && defined(__F16C__)
  const __m256 fmax = _mm256_set1_ps(kF16Max), fmin = _mm256_set1_ps(-kF16Max);
  const __m256 q = _mm256_set1_ps(static_cast<float>((1u << bits) - 1u));
  const __m256 neg = _mm256_set1_ps(-0.0f), z = _mm256_setzero_ps();
  // std::clamp's lanes (a NaN stays NaN: maxps / minps return their second operand then), + 0.
  const auto clamp = [&](__m256 v) {
    return _mm256_add_ps(_mm256_min_ps(fmax, _mm256_max_ps(fmin, v)), z);
  };
  // f16_round_down's lanes: the nearest f16, one step down (f16_next_down) where it is above x.
  const auto round_down = [](__m256 x) {
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 above = _mm256_cmp_ps(_mm256_cvtph_ps(h), x, _CMP_GT_OQ);
    const __m128i up = _mm_packs_epi32(_mm_castps_si128(_mm256_castps256_ps128(above)),
                                       _mm_castps_si128(_mm256_extractf128_ps(above, 1)));
    const __m128i sgn = _mm_srai_epi16(h, 15);  // -1 where negative
    __m128i down = _mm_sub_epi16(_mm_sub_epi16(h, _mm_set1_epi16(1)), _mm_add_epi16(sgn, sgn));
    const __m128i is_zero =
        _mm_cmpeq_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)), _mm_setzero_si128());
    down = _mm_blendv_epi8(down, _mm_set1_epi16(static_cast<int16_t>(0x8001)), is_zero);
    return _mm_blendv_epi8(h, down, up);
  };
  for (; i + 8 <= n; i += 8) {
    const __m128i zh = round_down(clamp(_mm256_loadu_ps(lo + i)));
    const __m256 zf = _mm256_cvtph_ps(zh);
    const __m256 x = _mm256_div_ps(_mm256_sub_ps(clamp(_mm256_loadu_ps(hi + i)), zf), q);
    const __m128i sh = _mm_xor_si128(round_down(_mm256_xor_ps(x, neg)),
                                     _mm_set1_epi16(static_cast<int16_t>(0x8000)));
    const __m256 sf = _mm256_cvtph_ps(sh);
    const __m256 iv =
        _mm256_and_ps(_mm256_cmp_ps(sf, z, _CMP_GT_OQ), _mm256_div_ps(_mm256_set1_ps(1.0f), sf));
    // Poisoned lanes (lo NaN): GroupQuant's f16 NaN for both, a NaN zero and inverse 0.
    const __m256 bad = _mm256_cmp_ps(_mm256_loadu_ps(lo + i), z, _CMP_UNORD_Q);
    const __m128i bad16 = _mm_packs_epi32(_mm_castps_si128(_mm256_castps256_ps128(bad)),
                                          _mm_castps_si128(_mm256_extractf128_ps(bad, 1)));
    const __m128i nan16 = _mm_set1_epi16(static_cast<int16_t>(kF16QuietNaN));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(z16 + i), _mm_blendv_epi8(zh, nan16, bad16));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(s16 + i), _mm_blendv_epi8(sh, nan16, bad16));
    _mm256_storeu_ps(zero + i, _mm256_blendv_ps(zf, _mm256_set1_ps(NAN), bad));
    _mm256_storeu_ps(inv + i, _mm256_andnot_ps(bad, iv));
  }
#endif
  for (; i < n; ++i) {
    const GroupQuant g(lo[i], hi[i], bits);
    s16[i] = g.scale16;
    z16[i] = g.zero16;
    zero[i] = g.zero;
    inv[i] = g.inv;
  }
}

}  // namespace

void kivi_quantize_keys(const float* keys, int64_t ld, const KiviBlockParams& p, std::byte* block) {
  check_params(p);
  const int64_t D = p.d, G = p.group, cb = kivi_col_bytes(G, p.bits);
  const int64_t span = kivi_chunk_tokens(p.bits), per = 8 / p.bits;
  auto* scales = reinterpret_cast<f16_t*>(block);
  auto* zeros = scales + D;
  std::byte* codes = block + 4 * D;
  const float qmax = static_cast<float>((1u << p.bits) - 1u);
  // Slabs of kC channels: their min / max over the G tokens, their GroupQuants, then per chunk
  // of `span` tokens the codes as bytes [token][channel] and the column bytes packed from them.
  constexpr int64_t kC = 64;
  float lo[kC], hi[kC], nf[kC], zero[kC], inv[kC];
  uint8_t code[32 * kC];  // span <= 32 tokens
  for (int64_t c0 = 0; c0 < D; c0 += kC) {
    const int64_t nc = std::min(kC, D - c0);
    std::copy(keys + c0, keys + c0 + nc, lo);
    std::copy(keys + c0, keys + c0 + nc, hi);
    for (int64_t c = 0; c < nc; ++c) nf[c] = keys[c0 + c] * 0.0f;
    for (int64_t t = 1; t < G; ++t) fold_min_max(keys + t * ld + c0, nc, lo, hi, nf);
    for (int64_t c = 0; c < nc; ++c) poison_bounds(nf[c], lo[c], hi[c]);
    f16_t s16[kC], z16[kC];
    quant_many(nc, lo, hi, p.bits, s16, z16, zero, inv);
    std::memcpy(scales + c0, s16, static_cast<size_t>(nc) * 2);
    std::memcpy(zeros + c0, z16, static_cast<size_t>(nc) * 2);
    for (int64_t t0 = 0; t0 < G; t0 += span) {
      const int64_t nt = std::min(span, G - t0);
      for (int64_t w = 0; w < nt; ++w)
        codes_of(keys + (t0 + w) * ld + c0, zero, inv, 1, qmax, nc, code + w * kC);
      std::fill(code + nt * kC, code + span * kC, uint8_t{0});
      for (int64_t c = 0; c < nc; ++c) {
        std::byte* col = codes + (c0 + c) * cb + 8 * (t0 / span);
        for (int64_t b = 0; b < 8; ++b) {
          unsigned v = 0;
          for (int64_t k = 0; k < per; ++k)
            v |= unsigned{code[(8 * k + b) * kC + c]} << (k * p.bits);
          col[b] = static_cast<std::byte>(v);
        }
      }
    }
  }
}

void kivi_quantize_values(const float* values, int64_t ld, const KiviBlockParams& p,
                          std::byte* block) {
  check_params(p);
  KV_CHECK(p.v_group > 0 && p.d % p.v_group == 0, "KIVI v_group must divide D");
  const int64_t D = p.d, G = p.group, rb = kivi_row_bytes(D, p.bits), ng = D / p.v_group;
  const int64_t per = kivi_codes_per_word(p.bits);
  auto* scales = reinterpret_cast<f16_t*>(block);
  auto* zeros = scales + G * ng;
  std::byte* codes = block + 4 * G * ng;
  const float qmax = static_cast<float>((1u << p.bits) - 1u);
  // (row, group) entries in order, kE at a time: their min / max, their GroupQuants in vectors,
  // their codes as bytes into the row's buffer; a row's words are packed from it in registers
  // once its last group is coded (a read-modify-write of a byte per code, as the reference
  // does, is a chain through memory).
  constexpr int64_t kMaxD = 4096, kE = 256;
  if (D > kMaxD) return kivi_quantize_values_reference(values, ld, p, block);
  uint8_t code[kMaxD];
  float lo[kE], hi[kE], zero[kE], inv[kE];
  f16_t s16[kE], z16[kE];
  for (int64_t e0 = 0; e0 < G * ng; e0 += kE) {
    const int64_t ne = std::min(kE, G * ng - e0);
    for (int64_t i = 0; i < ne; ++i) {
      const int64_t t = (e0 + i) / ng, g = (e0 + i) % ng;
      std::tie(lo[i], hi[i]) = min_max(values + t * ld + g * p.v_group, p.v_group);
    }
    quant_many(ne, lo, hi, p.bits, s16, z16, zero, inv);
    for (int64_t i = 0; i < ne; ++i) {
      const int64_t t = (e0 + i) / ng, g = (e0 + i) % ng;
      scales[g * G + t] = s16[i];
      zeros[g * G + t] = z16[i];
      codes_of(values + t * ld + g * p.v_group, zero + i, inv + i, 0, qmax, p.v_group,
               code + g * p.v_group);
      if (g + 1 < ng) continue;
      std::byte* row = codes + t * rb;
      for (int64_t w = 0; w * per < D; ++w) {  // the last word's missing codes are 0
        uint32_t v = 0;
        for (int64_t k = 0; k < per && w * per + k < D; ++k)
          v |= uint32_t{code[w * per + k]} << (k * p.bits);
        std::memcpy(row + 4 * w, &v, 4);
      }
    }
  }
}

void kivi_dequantize_keys(const std::byte* block, const KiviBlockParams& p, float* out,
                          int64_t ld) {
  check_params(p);
  const int64_t D = p.d, G = p.group, cb = kivi_col_bytes(G, p.bits);
  const auto* scales = reinterpret_cast<const f16_t*>(block);
  const auto* zeros = scales + D;
  const std::byte* codes = block + 4 * D;
  for (int64_t t = 0; t < G; ++t)
    for (int64_t c = 0; c < D; ++c)
      out[t * ld + c] =
          f16_to_f32(scales[c]) * static_cast<float>(kivi_key_code(codes + c * cb, t, p.bits)) +
          f16_to_f32(zeros[c]);
}

void kivi_dequantize_values(const std::byte* block, const KiviBlockParams& p, float* out,
                            int64_t ld) {
  check_params(p);
  const int64_t D = p.d, G = p.group, rb = kivi_row_bytes(D, p.bits), ng = D / p.v_group;
  const auto* scales = reinterpret_cast<const f16_t*>(block);
  const auto* zeros = scales + G * ng;
  const std::byte* codes = block + 4 * G * ng;
  for (int64_t t = 0; t < G; ++t)
    for (int64_t c = 0; c < D; ++c) {
      const int64_t g = c / p.v_group;
      out[t * ld + c] =
          f16_to_f32(scales[g * G + t]) * static_cast<float>(kivi_code(codes + t * rb, c, p.bits)) +
          f16_to_f32(zeros[g * G + t]);
    }
}

float kivi_key_step(const std::byte* block, const KiviBlockParams& p, int64_t channel) {
  (void)p;
  return f16_to_f32(reinterpret_cast<const f16_t*>(block)[channel]);
}

float kivi_value_step(const std::byte* block, const KiviBlockParams& p, int64_t token,
                      int64_t channel) {
  return f16_to_f32(reinterpret_cast<const f16_t*>(block)[channel / p.v_group * p.group + token]);
}

void quantize_row_q4_0(const float* src, BlockQ4_0* dst, int64_t k) {
  KV_CHECK(k % 32 == 0, "q4_0 row length must be a multiple of 32");
  for (int64_t i = 0; i < k / 32; ++i) {
    const float* x = src + i * 32;
    float m = 0.0f, nf = 0.0f;  // the value of largest magnitude, sign kept
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(x[j]) > std::fabs(m)) m = x[j];
      nf += x[j] * 0.0f;
    }
    if (std::isnan(nf)) {  // poisoned, as a KIVI group: NaN scale, codes 0
      dst[i].d = kF16QuietNaN;
      std::fill(std::begin(dst[i].qs), std::end(dst[i].qs), uint8_t{0});
      continue;
    }
    const float d = m / -8.0f;
    dst[i].d = f32_to_f16(d);
    const float d16 = f16_to_f32(dst[i].d);
    const float id = d16 != 0.0f ? 1.0f / d16 : 0.0f;
    for (int j = 0; j < 16; ++j) {
      // x/d + 8.5 >= 0 up to rounding (|x| <= |m|); clamp both ends like ggml's MIN(15, ...).
      const auto q = [&](float v) {
        return static_cast<uint8_t>(std::clamp(std::floor(v * id + 8.5f), 0.0f, 15.0f));
      };
      dst[i].qs[j] = static_cast<uint8_t>(q(x[j]) | (q(x[j + 16]) << 4));
    }
  }
}

void dequantize_row_q4_0(const BlockQ4_0* src, float* dst, int64_t k) {
  KV_CHECK(k % 32 == 0, "q4_0 row length must be a multiple of 32");
  for (int64_t i = 0; i < k / 32; ++i) {
    const float d = f16_to_f32(src[i].d);
    for (int j = 0; j < 16; ++j) {
      dst[i * 32 + j] = static_cast<float>((src[i].qs[j] & 0x0F) - 8) * d;
      dst[i * 32 + j + 16] = static_cast<float>((src[i].qs[j] >> 4) - 8) * d;
    }
  }
}

// ---- block codec ----

const char* kv_quant_scheme_name(KVQuantScheme s) {
  switch (s) {
    case KVQuantScheme::kKivi:
      return "kivi";
    case KVQuantScheme::kQ8_0:
      return "q8_0";
    case KVQuantScheme::kQ4_0:
      return "q4_0";
  }
  return "?";
}

std::optional<KVQuantScheme> parse_kv_quant_scheme(std::string_view name) {
  for (KVQuantScheme s : {KVQuantScheme::kKivi, KVQuantScheme::kQ8_0, KVQuantScheme::kQ4_0})
    if (name == kv_quant_scheme_name(s)) return s;
  return std::nullopt;
}

KVBlockFormat make_kv_block_format(KVQuantScheme scheme, int bits, int64_t group, int64_t dk,
                                   int64_t dv) {
  const auto bad = [&](const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string("KV quantization ") + kv_quant_scheme_name(scheme) + ": " + what);
  };
  if (group < 1) bad("the group (tokens per block) must be >= 1, got " + std::to_string(group));
  if (dk < 1 || dv < 1) bad("head dims must be >= 1");
  KVBlockFormat f;
  f.scheme = scheme;
  f.group = group;
  f.dk = dk;
  f.dv = dv;
  if (scheme == KVQuantScheme::kKivi) {
    if (bits != 2 && bits != 4 && bits != 8)
      bad("bits must be 2, 4 or 8, got " + std::to_string(bits));
    f.bits = bits;
    f.v_group = kivi_value_group(dv, group);
  } else {
    if (dk % 32 != 0 || dv % 32 != 0)
      bad("per-token blocks of 32 channels need head dims that are multiples of 32, got D_k " +
          std::to_string(dk) + ", D_v " + std::to_string(dv) + " (use the KIVI scheme instead)");
    f.bits = scheme == KVQuantScheme::kQ8_0 ? 8 : 4;
  }
  return f;
}

namespace {
int64_t per_token_row_bytes(const KVBlockFormat& f, int64_t d) {
  return d / 32 *
         (f.scheme == KVQuantScheme::kQ8_0 ? int64_t{sizeof(BlockQ8_0)}
                                           : int64_t{sizeof(BlockQ4_0)});
}
void per_token_quantize(const KVBlockFormat& f, int64_t d, const float* rows, int64_t ld,
                        std::byte* block) {
  const int64_t rb = per_token_row_bytes(f, d);
  for (int64_t t = 0; t < f.group; ++t) {
    if (f.scheme == KVQuantScheme::kQ8_0)
      quantize_row_q8_0(rows + t * ld, reinterpret_cast<BlockQ8_0*>(block + t * rb), d);
    else
      quantize_row_q4_0(rows + t * ld, reinterpret_cast<BlockQ4_0*>(block + t * rb), d);
  }
}
void per_token_dequantize(const KVBlockFormat& f, int64_t d, const std::byte* block, float* out,
                          int64_t ld) {
  const int64_t rb = per_token_row_bytes(f, d);
  for (int64_t t = 0; t < f.group; ++t) {
    if (f.scheme == KVQuantScheme::kQ8_0)
      dequantize_row(block + t * rb, DType::kQ8_0, out + t * ld, d);
    else
      dequantize_row_q4_0(reinterpret_cast<const BlockQ4_0*>(block + t * rb), out + t * ld, d);
  }
}
KiviBlockParams kivi_params(const KVBlockFormat& f, bool keys) {
  KiviBlockParams p;
  p.group = f.group;
  p.bits = f.bits;
  p.d = keys ? f.dk : f.dv;
  if (!keys) p.v_group = f.v_group;
  return p;
}
}  // namespace

int64_t kv_k_block_bytes(const KVBlockFormat& f) {
  return kv_quant_per_token(f.scheme) ? f.group * per_token_row_bytes(f, f.dk)
                                      : kivi_k_block_bytes(f.group, f.dk, f.bits);
}
int64_t kv_v_block_bytes(const KVBlockFormat& f) {
  return kv_quant_per_token(f.scheme) ? f.group * per_token_row_bytes(f, f.dv)
                                      : kivi_v_block_bytes(f.group, f.dv, f.v_group, f.bits);
}
void kv_quantize_k_block(const KVBlockFormat& f, const float* rows, int64_t ld, std::byte* block) {
  if (kv_quant_per_token(f.scheme))
    per_token_quantize(f, f.dk, rows, ld, block);
  else
    kivi_quantize_keys(rows, ld, kivi_params(f, true), block);
}
void kv_quantize_v_block(const KVBlockFormat& f, const float* rows, int64_t ld, std::byte* block) {
  if (kv_quant_per_token(f.scheme))
    per_token_quantize(f, f.dv, rows, ld, block);
  else
    kivi_quantize_values(rows, ld, kivi_params(f, false), block);
}
void kv_dequantize_k_block(const KVBlockFormat& f, const std::byte* block, float* out, int64_t ld) {
  if (kv_quant_per_token(f.scheme))
    per_token_dequantize(f, f.dk, block, out, ld);
  else
    kivi_dequantize_keys(block, kivi_params(f, true), out, ld);
}
void kv_dequantize_v_block(const KVBlockFormat& f, const std::byte* block, float* out, int64_t ld) {
  if (kv_quant_per_token(f.scheme))
    per_token_dequantize(f, f.dv, block, out, ld);
  else
    kivi_dequantize_values(block, kivi_params(f, false), out, ld);
}

}  // namespace kvcache
