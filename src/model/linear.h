// Linear layers over model weights (y = x W^T + b, W [out, in] as stored), with the options a
// forward chooses passed explicitly with every product: which kernels may run (the serving
// engine's batch invariance keeps every product on the row-wise GEMV), the packed-input scratch
// of the prefill GEMM, and, for the rows a last layer carries on, the kernel the whole chunk's
// product would have taken.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"
#include "kernels/matmul.h"

namespace kvcache {

struct LinearOptions {
  // false: the row-wise kernels only (MatmulParams::allow_blas), so each row's result is the
  // same bits whatever the number of rows (ForwardParams::batch_invariant).
  bool allow_blas = true;
  // MatmulParams::gemm_any_rows: set through as_rows(), never directly.
  bool gemm_any_rows = false;
  float* pack = nullptr;  // the prefill GEMM's packed copy of x (MatmulParams::pack_scratch)
  size_t pack_floats = 0;

  // For a product carrying only some rows of a chunk of `whole_rows` rows (the last layer's
  // rows whose logits are wanted): the kernel a product over the whole chunk takes, so those
  // rows keep the bits they have in it.
  LinearOptions as_rows(int64_t whole_rows) const;
};

// matmul()'s parameters for y [rows, out] = x [rows, in] (row stride ldx, 0: in) W^T + bias.
MatmulParams linear_params(const LinearOptions& o, const float* x, int64_t rows,
                           const TensorView& w, const float* bias, float* y, int64_t ldx = 0);
void linear(const LinearOptions& o, const float* x, int64_t rows, const TensorView& w,
            const float* bias, float* y, int64_t ldx = 0);

}  // namespace kvcache
