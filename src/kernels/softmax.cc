#include "kernels/softmax.h"

#include <cmath>

#include "core/error.h"

namespace kvcache {

void softmax_inplace(float* x, int64_t n) {
  KV_CHECK(n >= 1, "softmax of an empty row");
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
}

double log_sum_exp(const float* x, int64_t n) {
  KV_CHECK(n >= 1, "log_sum_exp of an empty row");
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = x[i] > mx ? x[i] : mx;
  if (std::isinf(mx)) return mx;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i] - mx));
  return static_cast<double>(mx) + std::log(sum);
}

int64_t argmax(const float* x, int64_t n) {
  KV_CHECK(n >= 1, "argmax of an empty row");
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return best;
}

}  // namespace kvcache
