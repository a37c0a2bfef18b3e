// KV-cache quantizers and dequantizers (layouts and bounds in kv_quant.h). Scalar: they run
// once per G tokens when the cache flushes its residual, not per decode step.
#include "kernels/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "kernels/matmul.h"

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
struct GroupQuant {
  f16_t scale16 = 0, zero16 = 0;
  float scale = 0, zero = 0, inv = 0;
  uint32_t qmax = 0;
  GroupQuant(float lo, float hi, int bits) : qmax((1u << bits) - 1u) {
    lo = std::clamp(lo, -kF16Max, kF16Max);
    hi = std::clamp(hi, -kF16Max, kF16Max);
    zero16 = f16_round_down(lo);
    zero = f16_to_f32(zero16);
    scale16 = f16_round_up((hi - zero) / static_cast<float>(qmax));
    scale = f16_to_f32(scale16);
    inv = scale > 0 ? 1.0f / scale : 0.0f;
  }
  uint32_t code(float x) const {
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

void kivi_quantize_keys(const float* keys, int64_t ld, const KiviBlockParams& p, std::byte* block) {
  check_params(p);
  const int64_t D = p.d, G = p.group, cb = kivi_col_bytes(G, p.bits);
  auto* scales = reinterpret_cast<f16_t*>(block);
  auto* zeros = scales + D;
  std::byte* codes = block + 4 * D;
  std::memset(codes, 0, static_cast<size_t>(D * cb));
  for (int64_t c = 0; c < D; ++c) {
    float lo = keys[c], hi = keys[c];
    for (int64_t t = 1; t < G; ++t) {
      lo = std::min(lo, keys[t * ld + c]);
      hi = std::max(hi, keys[t * ld + c]);
    }
    const GroupQuant q(lo, hi, p.bits);
    std::memcpy(scales + c, &q.scale16, 2);
    std::memcpy(zeros + c, &q.zero16, 2);
    for (int64_t t = 0; t < G; ++t) {
      const KiviKeyPos at = kivi_key_pos(t, p.bits);
      codes[c * cb + at.byte] |= static_cast<std::byte>(q.code(keys[t * ld + c]) << at.shift);
    }
  }
}

void kivi_quantize_values(const float* values, int64_t ld, const KiviBlockParams& p,
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
      const auto [lo, hi] = std::minmax_element(xg, xg + p.v_group);
      const GroupQuant q(*lo, *hi, p.bits);
      std::memcpy(scales + g * G + t, &q.scale16, 2);
      std::memcpy(zeros + g * G + t, &q.zero16, 2);
      for (int64_t c = 0; c < p.v_group; ++c)
        put_code(codes + t * rb, g * p.v_group + c, p.bits, q.code(xg[c]));
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
    float m = 0.0f;  // the value of largest magnitude, sign kept
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[j]) > std::fabs(m)) m = x[j];
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
