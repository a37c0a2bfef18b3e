// KV-cache quantization formats: block layouts, quantizers and dequantizers. The quantized cache
// layer (cache/quantized_layer) writes blocks with these functions and the fused dequantizing
// attention (kernels/attention_quant) reads them in place; both depend on this file only, so
// the layout is defined once. Plain functions on caller-owned memory; nothing here allocates.
//
// KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", 2024):
// keys have outlier *channels*, so a key block quantizes each channel over G consecutive tokens
// (one scale/zero per channel per block); values have no such structure and are quantized per
// token over groups of v_group channels. Asymmetric: x ~ scale * code + zero, code in
// [0, 2^bits - 1]. Scale and zero are stored as f16 (the memory budget: at 4 bits and G = 64
// they add 1/8 to the codes). To keep the round-trip bound exact despite f16 rounding, the zero
// is rounded *down* to f16 and the scale *up*, then codes are computed from the stored values:
// every element of [zero, zero + scale * (2^bits - 1)] is within scale / 2 of its code's value.
//
// Block layouts (bytes):
//   key block   [scale f16 x D_k][zero f16 x D_k][codes: D_k columns x col_bytes(G, bits)]
//   value block [scale f16: (D_v / v_group) groups x G tokens][zero f16: same]
//               [codes: G rows x row_bytes(D_v, bits)]
// Value rows (row_bytes(D, bits) = 4 * ceil(D * bits / 32)): one token's codes packed
// little-endian into u32 words, channel d at bit (d % (32 / bits)) * bits of word d / (32 / bits)
// — byte-natural order, so 8 consecutive 4-bit channels are one u32.
// Key columns are channel-major, matching how keys are quantized (per channel, along tokens):
// column c holds the G codes of channel c in "token chunks" of 8 bytes, each 8 * (8 / bits)
// tokens: token t of chunk k sits in byte t % 8 at bit (t / 8) * bits (so col_bytes(G, bits) =
// 8 * ceil(G * bits / 64), zero-padded). One zero-extending load of a chunk puts 8 consecutive
// tokens' codes in 8 lanes after a shift and a mask, so the attention kernel computes the logits
// of 8 keys per vector, one FMA per channel, with no horizontal sums.
// (value scales group-major, so the G scales of one channel group are contiguous: the kernel
// widens them with one bulk f16 conversion per block.)
//
// Per-token formats after llama.cpp's KV cache types, for comparison (ggml-common.h /
// ggml-quants.c facts, our own code): q8_0 = blocks of 32 values, f16 d = max|x| / 127,
// int8 q = round(x / d), x ~ d * q (34 bytes, matmul.h's BlockQ8_0); q4_0 = blocks of 32,
// d = m / -8 where m is the value of largest magnitude (sign kept), q = min(15, floor(x / d
// + 8.5)), x ~ (q - 8) * d, byte j holding element j in its low nibble and element j + 16 in its
// high nibble (18 bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "core/dtype.h"
#include "core/kv_span.h"

namespace kvcache {

// ---- f16 rounding with a direction (the KIVI bound needs zero <= min, zero + 15 scale >= max)
// ---- Largest f16 <= x / smallest f16 >= x (finite x within the f16 range).
f16_t f16_round_down(float x);
f16_t f16_round_up(float x);

// ---- KIVI layout ----
inline int64_t kivi_codes_per_word(int bits) {
  return 32 / bits;
}
inline int64_t kivi_row_bytes(int64_t d, int bits) {
  const int64_t per = kivi_codes_per_word(bits);
  return 4 * ((d + per - 1) / per);
}
// Tokens per 8-byte chunk of a key column, and the bytes of one column of G tokens.
inline int64_t kivi_chunk_tokens(int bits) {
  return 8 * (8 / bits);
}
inline int64_t kivi_col_bytes(int64_t group, int bits) {
  return 8 * ((group + kivi_chunk_tokens(bits) - 1) / kivi_chunk_tokens(bits));
}
inline int64_t kivi_k_block_bytes(int64_t group, int64_t d, int bits) {
  return 4 * d + d * kivi_col_bytes(group, bits);
}
inline int64_t kivi_v_block_bytes(int64_t group, int64_t d, int64_t v_group, int bits) {
  return 4 * group * (d / v_group) + group * kivi_row_bytes(d, bits);
}
// The value channel group actually used: the largest divisor of d that is <= g (d itself when
// g >= d), so that head dims that are not multiples of g (e.g. 80) still work.
int64_t kivi_value_group(int64_t d, int64_t g);

inline uint32_t kivi_code(const std::byte* row, int64_t d, int bits) {
  const int64_t per = kivi_codes_per_word(bits);
  uint32_t w;
  __builtin_memcpy(&w, row + 4 * (d / per), 4);
  return (w >> ((d % per) * bits)) & ((1u << bits) - 1u);
}

// Where token t's code sits in a key column: byte offset from the column's start, bit shift.
struct KiviKeyPos {
  int64_t byte = 0;
  int shift = 0;
};
inline KiviKeyPos kivi_key_pos(int64_t t, int bits) {
  const int64_t span = kivi_chunk_tokens(bits), w = t % span;
  return {8 * (t / span) + w % 8, static_cast<int>(w / 8) * bits};
}
// Code of token t in a key column (the column's first byte).
inline uint32_t kivi_key_code(const std::byte* col, int64_t t, int bits) {
  const KiviKeyPos at = kivi_key_pos(t, bits);
  return (static_cast<uint32_t>(col[at.byte]) >> at.shift) & ((1u << bits) - 1u);
}

struct KiviBlockParams {
  int64_t group = 64;    // G tokens per block
  int64_t d = 0;         // channels (D_k or D_v)
  int64_t v_group = 64;  // values: channels per scale/zero (must divide d)
  int bits = 4;          // 2, 4 or 8
};

// keys: [G, D] f32 rows (row stride ld floats) -> one key block. Per channel over the G tokens.
// A group (a key channel, a token's value group) that holds a NaN or an infinity is poisoned:
// its f16 scale and zero are NaN (kF16QuietNaN) and its codes 0, so it dequantizes to NaN and
// attention over it returns NaN instead of finite values from clamped or dropped inputs. Finite
// values beyond the f16 range are clamped to +-65504.
void kivi_quantize_keys(const float* keys, int64_t ld, const KiviBlockParams& p, std::byte* block);
// values: [G, D] f32 rows -> one value block. Per token over groups of v_group channels.
void kivi_quantize_values(const float* values, int64_t ld, const KiviBlockParams& p,
                          std::byte* block);
// The scalar loops the two above must equal byte for byte (tests).
void kivi_quantize_keys_reference(const float* keys, int64_t ld, const KiviBlockParams& p,
                                  std::byte* block);
void kivi_quantize_values_reference(const float* values, int64_t ld, const KiviBlockParams& p,
                                    std::byte* block);
// Inverse: out [G, D] f32 rows (stride ld): scale * code + zero, computed in float.
void kivi_dequantize_keys(const std::byte* block, const KiviBlockParams& p, float* out, int64_t ld);
void kivi_dequantize_values(const std::byte* block, const KiviBlockParams& p, float* out,
                            int64_t ld);

// Step (scale) of the group element (t, c) belongs to, for tests of the round-trip bound.
float kivi_key_step(const std::byte* block, const KiviBlockParams& p, int64_t channel);
float kivi_value_step(const std::byte* block, const KiviBlockParams& p, int64_t token,
                      int64_t channel);

// ---- llama.cpp-like per-token formats ----
struct BlockQ4_0 {
  f16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18, "q4_0 block must be 18 bytes");
// k % 32 == 0. (q8_0: quantize_row_q8_0 in kernels/matmul.h.) A block holding a NaN or an
// infinity is poisoned, as a KIVI group: d = f16 NaN, codes 0.
void quantize_row_q4_0(const float* src, BlockQ4_0* dst, int64_t k);
void dequantize_row_q4_0(const BlockQ4_0* src, float* dst, int64_t k);

// ---- one packed block, whatever the scheme: the cache layer and the kernel agree here ----
// A block holds `group` consecutive tokens of one (batch row, KV head). KIVI blocks use the
// layouts above; per-token blocks (q8_0, q4_0) are `group` rows of D / 32 llama.cpp blocks,
// K rows then nothing else (no block header).
struct KVBlockFormat {
  KVQuantScheme scheme = KVQuantScheme::kKivi;
  int bits = 4;        // KIVI: 2, 4, 8; q8_0: 8; q4_0: 4
  int64_t group = 64;  // tokens per block
  int64_t dk = 0, dv = 0;
  int64_t v_group = 0;  // KIVI value channels per scale/zero (kivi_value_group); else 0
};
// "kivi", "q8_0", "q4_0".
const char* kv_quant_scheme_name(KVQuantScheme s);
// Parses a scheme name; nullopt for anything else.
std::optional<KVQuantScheme> parse_kv_quant_scheme(std::string_view name);
inline bool kv_quant_per_token(KVQuantScheme s) {
  return s != KVQuantScheme::kKivi;
}
// The format for these shapes; `bits` is used by KIVI only (per-token schemes fix it). Throws
// Error(kInvalidArgument) naming the problem: KIVI bits not 2/4/8, group < 1, D not a multiple
// of 32 for a per-token scheme.
KVBlockFormat make_kv_block_format(KVQuantScheme scheme, int bits, int64_t group, int64_t dk,
                                   int64_t dv);
int64_t kv_k_block_bytes(const KVBlockFormat& f);
int64_t kv_v_block_bytes(const KVBlockFormat& f);
// rows: [group, D] f32 (row stride ld floats) -> one block; and back (out [group, D], stride ld).
void kv_quantize_k_block(const KVBlockFormat& f, const float* rows, int64_t ld, std::byte* block);
void kv_quantize_v_block(const KVBlockFormat& f, const float* rows, int64_t ld, std::byte* block);
void kv_dequantize_k_block(const KVBlockFormat& f, const std::byte* block, float* out, int64_t ld);
void kv_dequantize_v_block(const KVBlockFormat& f, const std::byte* block, float* out, int64_t ld);

}  // namespace kvcache
