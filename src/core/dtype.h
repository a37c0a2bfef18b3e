// Element types of tensors and caches, and exact conversions between them.
// Float types are per-element; block types (q8_0 and the GGUF weight quants) store
// `block_elems` elements in `block_bytes` bytes, so a row's size is computed per block.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvcache {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kQ8_0,  // llama.cpp's q8_0: blocks of 32 int8 with one f16 scale (34 bytes)
  // GGUF weight types (ggml-common.h's block layouts; kernels/quant_types.h): blocks of 32
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kIQ4_NL,
  // k-quants: super-blocks of 256
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
};
inline constexpr int kDTypeCount = static_cast<int>(DType::kQ6_K) + 1;

struct DTypeInfo {
  const char* name;
  int64_t block_elems;  // elements per block (1 for float types)
  int64_t block_bytes;  // bytes per block
  bool is_float;        // element-addressable float type
  uint32_t ggml_type;   // ggml.h's enum ggml_type id (GGUF tensor type)
};

const DTypeInfo& dtype_info(DType t);
inline const char* dtype_name(DType t) {
  return dtype_info(t).name;
}
inline bool dtype_is_float(DType t) {
  return dtype_info(t).is_float;
}
// Bytes of `n` elements; n must be a multiple of the block size (checked).
size_t dtype_bytes(DType t, int64_t n);
// Element size for float types; aborts for block types (their elements have no own address).
size_t dtype_elem_size(DType t);
// Parses a dtype name ("f32", "f16", "bf16", "q8_0", "q4_0", ..., "q4_K", ..., "iq4_nl";
// case-insensitive); throws Error naming the choices.
DType parse_dtype(std::string_view name);

// ---- scalar conversions (round to nearest, ties to even; NaN stays NaN, quieted) ----
using f16_t = uint16_t;   // IEEE 754 binary16 bits
using bf16_t = uint16_t;  // bfloat16 bits

// binary16's positive quiet NaN: the scale a poisoned quantization block holds (a KIVI group or
// a q8_0 / q4_0 block with a NaN or an infinity in it, kernels/kv_quant.h).
inline constexpr f16_t kF16QuietNaN = 0x7e00u;

f16_t f32_to_f16(float f);
float f16_to_f32(f16_t h);

inline bf16_t f32_to_bf16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<bf16_t>((x >> 16) | 0x0040u);
  const uint32_t bias = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<bf16_t>((x + bias) >> 16);
}
inline float bf16_to_f32(bf16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// ---- bulk conversions of contiguous runs (SIMD where the build allows) ----
void f32_to_f16_n(const float* src, f16_t* dst, size_t n);
void f16_to_f32_n(const f16_t* src, float* dst, size_t n);
void f32_to_bf16_n(const float* src, bf16_t* dst, size_t n);
void bf16_to_f32_n(const bf16_t* src, float* dst, size_t n);
// Any float dtype to any float dtype; same dtype is a memcpy (bit-exact).
void convert_n(const void* src, DType src_t, void* dst, DType dst_t, size_t n);

}  // namespace kvcache
