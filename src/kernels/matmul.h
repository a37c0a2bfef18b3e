// Matmul / GEMV over model weights: y[M, N] = x[M, K] · W[N, K]^T (+ bias), the layout of
// llama2.c, GGUF and HF Linear weights (one output feature per row of W). x and y are f32;
// W is f32, f16, bf16 or q8_0 and is only read (it usually points into a memory-mapped file).
// Decode (M = 1) is bound by reading W once: rows are split across the thread pool; with
// AVX-512 each thread reads its rows one after another (two 16-lane FMA chains per row), else in
// tiles of 8 W rows (8 chains). Batched decode (M > 1 on the GEMV path) runs tiles of 4 x rows
// x 2 (AVX-512) or 3 W rows (each W chunk widened once, each x chunk loaded once). Every
// output's arithmetic is exactly dot_row's (AVX-512: two 16-lane FMA accumulators over k; else
// one 8-lane accumulator; then a horizontal sum), so a row's result is the same bits whatever
// M (batch invariance: the serving engine relies on it). Prefill (M >= kBlasMinRows) goes to
// gemm_packed (kernels/gemm_packed.h: W widened per L2-sized block straight into register-tile
// panels, never as an f32 copy; measured at or above OpenBLAS sgemm on the model's shapes, f32
// included), or, in builds without AVX2, to OpenBLAS sgemm (other dtypes dequantised per block of W
// rows into a per-thread f32 scratch first).
#pragma once

#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace kvcache {

class ThreadPool;

struct MatmulParams {
  const float* x = nullptr;  // [M, K] f32, row stride ldx (>= K)
  int64_t ldx = 0;
  const void* w = nullptr;  // [N, K] in w_dtype, rows contiguous (row bytes = dtype_bytes(K))
  DType w_dtype = DType::kF32;
  const float* bias = nullptr;  // [N] or nullptr (Qwen2's QKV bias)
  float* y = nullptr;           // [M, N] f32, row stride ldy (>= N); must not alias x
  int64_t ldy = 0;
  int64_t m = 0, n = 0, k = 0;  // q8_0 needs k % 32 == 0
  ThreadPool* pool = nullptr;   // nullptr: default_pool()
  // false: the GEMV kernels for every M, whose rows equal dot_row bit for bit (the serving
  // engine's batch invariance, tests); true: M >= kBlasMinRows takes the prefill GEMM.
  bool allow_blas = true;
  // With allow_blas: the prefill GEMM for any M, not only M >= kBlasMinRows. A forward that
  // carries only some rows of a prefill chunk on (the last layer's rows whose logits are
  // wanted) gives them the bits they had in the chunk's GEMM, whose rows do not depend on M.
  bool gemm_any_rows = false;
  // Optional caller-owned scratch for the prefill GEMM's packed copy of x (see
  // gemm_packed_scratch_floats); nullptr or too small: a thread-local buffer of the kernel.
  float* pack_scratch = nullptr;
  size_t pack_scratch_floats = 0;
};

// Rows of x from which matmul() takes the prefill GEMM (gemm_packed, or sgemm without AVX2)
// instead of the GEMV.
inline constexpr int64_t kBlasMinRows = 4;
inline bool takes_gemm(const MatmulParams& p) {
  return p.allow_blas && (p.m >= kBlasMinRows || p.gemm_any_rows);
}

// GEMV path (m < kBlasMinRows, or !allow_blas): y[i, r] == dot_row(W[r], x[i]) + bias[r]
// bit for bit, for every M and any thread count.
// Block-quantized weights with an integer dot in this build (AVX2: q8_0, the legacy types and
// the k-quants) take x rounded to int8 first, as llama.cpp does: per 32 values for q8_0 and the
// legacy types (q4_0, q4_1, q5_0, q5_1, iq4_nl), per 256 for the k-quants
// (kernels/quant_types.h, BlockQ8A32 / BlockQ8K; |x' - x| <= amax / 254 of the block per 256,
// plus 127 |d - amax / 127| per 32, whose d is rounded to f16 as llama.cpp stores it), on the
// GEMV and the GEMM alike, row by row, so decode equals prefill and batch invariance holds. The
// integer dot is what makes quantized decode fast (llama.cpp's speed at depth 0);
// matmul_reference spells out the same rounding.
// Tolerance of matmul() against matmul_reference(): |y - y_ref| <= 1e-5 * sum_j |x_j w_j| + 1e-6
// per output, x being the rounded x' where it is rounded (only the summation order and the
// float scaling of exact integer sums differ; same dequantized values).
void matmul(const MatmulParams& p);

// Several products that read the same x rows (a layer's Q, K and V; gate and up), each with
// matmul()'s contract and the same pool. On the GEMV path (m < kBlasMinRows, or !allow_blas)
// their rows are handed to the pool as ONE parallel loop, so a decode step synchronises the
// threads 4 times per layer instead of 7; larger m goes to gemm_packed as one group (x packed
// once, the blocks of all products in one loop), else the products run one after the other.
// Results are those of matmul() on each, bit for bit (threads only split rows). At most
// kMaxMatmulGroup entries.
inline constexpr size_t kMaxMatmulGroup = 4;
void matmul_group(std::span<const MatmulParams> group);

// Plain reference: for each output, `acc += w[j] * x[j]` sequentially in float, no FMA, no
// threads — llama2.c's matmul, bit for bit, for f32 weights (x rounded first for the types
// above, the rounding written out in scalar code).
void matmul_reference(const MatmulParams& p);

// Dot product of one W row (k elements of dtype t) with f32 x, SIMD where available.
float dot_row(const void* w_row, DType t, const float* x, int64_t k);

// One row of k elements of dtype t to f32 (embedding lookups, tests).
void dequantize_row(const void* src, DType t, float* dst, int64_t k);

// llama.cpp's q8_0: per block of 32, d = max|x| / 127 stored as f16, q = round(x / d).
struct BlockQ8_0 {
  f16_t d;
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34, "q8_0 block must be 34 bytes");
// k % 32 == 0. A block holding a NaN or an infinity is poisoned: d = f16 NaN, codes 0.
void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t k);

// Sets OpenBLAS's own thread count. matmul() keeps it at 1 and parallelises sgemm calls over
// our pool instead; exposed for callers using BLAS directly.
void set_blas_threads(int n_threads);

}  // namespace kvcache
