// Prefill GEMM over f32, f16, bf16 and q8_0 weights without a widened copy of W:
// y[M, N] = x[M, K] · W[N, K]^T.
//
// The classic register-blocked layout (BLIS's "6 x 16" AVX2 micro-kernel shape: 12 accumulators,
// two vectors of W, one broadcast of x): W is dequantised, a block of kPackRows rows x kPackK
// columns at a time, straight into the micro-kernel's panel layout ([16 rows interleaved] per k,
// L2-resident) and then meets every row of x, so each weight is converted once per call and
// never written to memory as f32 — unlike dequantising W into an f32 scratch for OpenBLAS
// sgemm, which then packs both operands again. With AVX-512, two neighbouring full panels go
// through a 6 x 32 zmm micro-kernel (12 zmm accumulators; each lane the same FMA chain as the
// 6 x 16 kernel's, so the same bits): a core with full-width 512-bit units issues as many
// 512-bit FMAs per cycle as 256-bit ones, so that kernel does the work in half the
// instructions.
//
// Arithmetic: each output is one fused multiply-add chain over k in increasing order, starting
// from 0 (then + bias), whatever M, the tile it falls in or the thread count — so a row of x
// gets the same bits alone or in a batch (not the bits of dot_row, whose 8-lane accumulator and
// horizontal sum the GEMV path keeps). Tolerance against matmul_reference: matmul()'s
// (1e-5 * sum |x w| + 1e-6 per output).
#pragma once

#include <cstdint>
#include <span>

#include "kernels/matmul.h"

namespace kvcache {

class ThreadPool;

// False when the build has no AVX2/FMA/F16C (then matmul() falls back to OpenBLAS sgemm).
bool gemm_packed_available();

// y = x · W^T (+ bias) for W of dtype f16, bf16, q8_0 or f32, for each product of `group`
// (1..kMaxMatmulGroup products that share x, ldx, m and k: a layer's Q/K/V, gate/up), on
// `pool` (nullptr or one thread: the caller alone). x is first packed into the micro-kernel's
// tile layout (M x K floats of the caller's thread-local scratch, shared by the tasks); then the
// blocks of kPackRows W rows of all products are handed out in one loop, each thread packing
// its block's weights into its own L2-sized scratch.
void gemm_packed(std::span<const MatmulParams> group, ThreadPool* pool);
inline void gemm_packed(const MatmulParams& p, ThreadPool* pool) {
  gemm_packed({&p, 1}, pool);
}

// Floats of the packed copy of x for m rows of k (rows padded to the 6-row tile, 64-byte
// alignment slack): what a caller passes as MatmulParams::pack_scratch to own that memory (the
// model's forward does, so its workspace counts it).
inline size_t gemm_packed_scratch_floats(int64_t m, int64_t k) {
  return static_cast<size_t>((m + 5) / 6 * 6 * k + 16);
}

inline constexpr int64_t kPackRows = 128;  // W rows per packed block (multiple of 16)
inline constexpr int64_t kPackK = 256;     // k per packed block (multiple of 32 for q8_0)

}  // namespace kvcache
