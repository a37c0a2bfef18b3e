// GGUF weight quantisations beyond q8_0: the legacy blocks of 32 (q4_0, q4_1, q5_0, q5_1,
// iq4_nl; kernels/quant_legacy.cc) and the k-quants' super-blocks of 256 (q2_K ... q6_K;
// kernels/quant_k.cc). Block layouts are ggml-common.h's, byte for byte, so tensors of a GGUF
// are used in place, from the mapped file.
//
// Each type has:
// - dequantize_ref: the plain reference, literally the format's definition, scalar;
// - dequantize: the same values bit for bit (tests compare every block of random data), SIMD
//   where the build has it; the prefill GEMM widens W with it, a segment at a time;
// - dot: the fused decode dot product of a row of blocks with f32 x, no f32 copy of the row;
//   within kQuantDotTolerance of dot(dequantize_ref(row), x) (only the summation order and,
//   where a type says so, the precision of its products differ);
// - quantize_ref: f32 -> blocks, for the converter and tests (simple per-block fits: valid
//   files, not llama.cpp's search for the best scales).
// matmul / matmul_group / gemm_packed / dequantize_row dispatch to these for the types here.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace kvcache {

struct QuantKernels {
  void (*dequantize_ref)(const void* blocks, float* dst, int64_t n_blocks) = nullptr;
  void (*dequantize)(const void* blocks, float* dst, int64_t n_blocks) = nullptr;
  float (*dot)(const void* blocks, const float* x, int64_t n_blocks) = nullptr;
  void (*quantize_ref)(const float* src, void* blocks, int64_t n_blocks) = nullptr;
};

// |dot - dot_ref| <= kQuantDotTolerance * sum_j |w_j x_j| + 1e-6 per output, where dot_ref is
// the f32 dot of the dequantize_ref values with x in index order.
inline constexpr float kQuantDotTolerance = 1e-5f;

// The kernels of a block type of this header; nullptr for f32, f16, bf16 and q8_0 (matmul.cc's
// own) and for types whose file does not provide them yet.
const QuantKernels* quant_kernels(DType t);

// Per file: the types it provides, nullptr for the others.
const QuantKernels* legacy_quant_kernels(DType t);  // quant_legacy.cc
const QuantKernels* k_quant_kernels(DType t);       // quant_k.cc

}  // namespace kvcache
