#include "model/block.h"

#include <cstring>

#include "kernels/norm.h"

namespace kvcache {

void keep_last_rows(float* rows, int64_t B, int64_t S, int64_t width) {
  for (int64_t b = 0; b < B; ++b)
    std::memmove(rows + b * width, rows + (b * S + S - 1) * width,
                 static_cast<size_t>(width) * sizeof(float));
}

void norm_rows(const float* x, float* y, int64_t rows, int64_t dim, float eps, const float* weight,
               int64_t ld) {
  RmsNormParams n;
  n.x = x;
  n.y = y;
  n.rows = rows;
  n.dim = dim;
  n.ld_x = ld;
  n.ld_y = ld;
  n.eps = eps;
  n.weight = weight;
  rms_norm(n);
}

}  // namespace kvcache
