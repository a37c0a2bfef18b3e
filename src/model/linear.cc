#include "model/linear.h"

namespace kvcache {

LinearOptions LinearOptions::as_rows(int64_t whole_rows) const {
  MatmulParams whole;
  whole.m = whole_rows;
  whole.allow_blas = allow_blas;
  LinearOptions o = *this;
  o.gemm_any_rows = takes_gemm(whole);
  return o;
}

MatmulParams linear_params(const LinearOptions& o, const float* x, int64_t rows,
                           const TensorView& w, const float* bias, float* y, int64_t ldx) {
  MatmulParams p;
  p.x = x;
  p.ldx = ldx > 0 ? ldx : w.dim(1);
  p.w = w.data();
  p.w_dtype = w.dtype();
  p.bias = bias;
  p.y = y;
  p.ldy = w.dim(0);
  p.m = rows;
  p.n = w.dim(0);
  p.k = w.dim(1);
  p.allow_blas = o.allow_blas;
  p.gemm_any_rows = o.gemm_any_rows;
  p.pack_scratch = o.pack;
  p.pack_scratch_floats = o.pack_floats;
  return p;
}

void linear(const LinearOptions& o, const float* x, int64_t rows, const TensorView& w,
            const float* bias, float* y, int64_t ldx) {
  matmul(linear_params(o, x, rows, w, bias, y, ldx));
}

}  // namespace kvcache
