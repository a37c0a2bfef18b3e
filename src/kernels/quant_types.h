// GGUF weight quantisations beyond q8_0: the legacy blocks of 32 (q4_0, q4_1, q5_0, q5_1,
// iq4_nl; kernels/quant_legacy.cc) and the k-quants' super-blocks of 256 (q2_K ... q6_K;
// kernels/quant_k.cc). Block layouts are ggml-common.h's, byte for byte, so tensors of a GGUF
// are used in place, from the mapped file.
//
// Each type has:
// - dequantize_ref: the plain reference, literally the format's definition, scalar;
// - dequantize: the same values bit for bit (tests compare every block of random data), SIMD
//   where the build has it; the prefill GEMM widens W with it, a segment at a time;
// - dot: the dot product of a row of blocks with f32 x, no f32 copy of the row (decode's dot
//   in builds without the integer dot below); within kQuantDotTolerance of dot(dequantize_ref(row),
//   x) (only the summation order and, where a type says so, the precision of its products differ);
// - quantize_ref: f32 -> blocks, for the converter and tests (simple per-block fits: valid
//   files, not llama.cpp's search for the best scales).
// - dot_q8k (where the build has it): the decode dot with x rounded to int8 per 256 values
//   (BlockQ8K below), integer products summed exactly in int32, as llama.cpp does
//   (ggml-quants.c ggml_vec_dot_q*_K_q8_K). A type that has it makes matmul round x this way on
//   every path (decode and prefill alike; see matmul.h), so decode equals prefill to
//   kQuantDotTolerance on the rounded x.
// matmul / matmul_group / gemm_packed / dequantize_row dispatch to these for the types here.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace kvcache {

// x rounded to int8 per super-block of 256, llama.cpp's block_q8_K (ggml-common.h): the scale,
// the codes, and the sum of each 16 codes (which the types with mins or offset codes need).
// q = nearbyint(x * 127 / amax) and d = 1 / (127 / amax), llama.cpp's rounding of x
// (quantize_row_q8_K_ref, whose codes and d are these negated when the largest value is
// positive: the same products), so x' = d * q is within amax / 254 of x.
struct BlockQ8K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};

// x[256 n_blocks] -> blocks. A block holding an infinity or a NaN gets d = NaN and q = 0, so
// the products are NaN as the f32 product's would be (not a silently finite result).
void quantize_act_q8k(const float* x, BlockQ8K* dst, int64_t n_blocks);
// x'[j] = d * q[j] for the first n values of x rounded per 256 (n a multiple of 256): what
// quantize_act_q8k followed by d * q gives, without the codes (the prefill GEMM's x).
void round_act_q8k(const float* x, float* dst, int64_t n);

// x rounded to int8 per 32 values, for the types of blocks of 32 (q8_0 and the legacy types):
// llama.cpp's block_q8_0 rounding (quantize_row_q8_0): q = nearbyint(x * 127 / amax) and
// d = amax / 127 rounded to f16 (kept here as the float of that f16).
// s = d * sum(qs), as llama.cpp's block_q8_1 keeps it (there as f16, here as float): the
// types with a min (q4_1, q5_1) add m * s per block; computed once per row of x rather than
// once per weight row and block (a third of those dots' time when recomputed).
struct BlockQ8A32 {
  float d;
  int8_t qs[32];
  float s;
};
void quantize_act_q8_32(const float* x, BlockQ8A32* dst, int64_t n_blocks);
void round_act_q8_32(const float* x, float* dst, int64_t n);  // n a multiple of 32

struct QuantKernels {
  void (*dequantize_ref)(const void* blocks, float* dst, int64_t n_blocks) = nullptr;
  void (*dequantize)(const void* blocks, float* dst, int64_t n_blocks) = nullptr;
  float (*dot)(const void* blocks, const float* x, int64_t n_blocks) = nullptr;
  void (*quantize_ref)(const float* src, void* blocks, int64_t n_blocks) = nullptr;
  float (*dot_q8k)(const void* blocks, const BlockQ8K* x, int64_t n_blocks) = nullptr;
  // The same for the types of blocks of 32, against x rounded per 32 (BlockQ8A32). A type has
  // at most one of dot_q8k and dot_q8_32.
  float (*dot_q8_32)(const void* blocks, const BlockQ8A32* x, int64_t n_blocks) = nullptr;
};

// |dot - dot_ref| <= kQuantDotTolerance * sum_j |w_j x_j| + 1e-6 per output, where dot_ref is
// the f32 dot of the dequantize_ref values with x in index order.
// dot_q8k: the same bound against dot(dequantize_ref(row), x') with x' the rounded x
// (round_act_q8k); the integer sums are exact, only the float scaling and summation differ.
// dot_q8_32: the same against x' = round_act_q8_32(x).
inline constexpr float kQuantDotTolerance = 1e-5f;

// The kernels of a block type of this header; nullptr for f32, f16, bf16 and q8_0 (matmul.cc's
// own) and for types whose file does not provide them yet.
const QuantKernels* quant_kernels(DType t);

// Per file: the types it provides, nullptr for the others.
const QuantKernels* legacy_quant_kernels(DType t);  // quant_legacy.cc
const QuantKernels* k_quant_kernels(DType t);       // quant_k.cc

}  // namespace kvcache
