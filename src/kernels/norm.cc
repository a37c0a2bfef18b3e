#include "kernels/norm.h"

#include <cmath>

#include "core/error.h"

namespace kvcache {

void rms_norm(const RmsNormParams& p) {
  KV_CHECK(p.x != nullptr && p.weight != nullptr && p.y != nullptr && p.dim > 0,
           "rms_norm: bad params");
  const int64_t ldx = p.ld_x > 0 ? p.ld_x : p.dim;
  const int64_t ldy = p.ld_y > 0 ? p.ld_y : p.dim;
  for (int64_t r = 0; r < p.rows; ++r) {
    const float* x = p.x + r * ldx;
    float* y = p.y + r * ldy;
    // Sequential on purpose: this is O(dim) next to the O(dim^2) matmuls, and the order is
    // llama2.c's (the golden logits are bit-identical only with this order).
    float ss = 0.0f;
    for (int64_t j = 0; j < p.dim; ++j) ss += x[j] * x[j];
    ss /= static_cast<float>(p.dim);
    ss += p.eps;
    ss = 1.0f / std::sqrt(ss);
    for (int64_t j = 0; j < p.dim; ++j) y[j] = p.weight[j] * (ss * x[j]);
  }
}

}  // namespace kvcache
