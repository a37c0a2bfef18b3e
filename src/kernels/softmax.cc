#include "kernels/softmax.h"

#include <cmath>
#include <cstring>
#include <limits>

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

float max_value(const float* x, int64_t n) {
  KV_CHECK(n >= 1, "max of an empty row");
  // One running max per lane of a 16-value block (a GCC vector: one or more SIMD registers on
  // any target): the lanes' selects are independent, where one running max is a chain of
  // compares the compiler keeps scalar (a float max is not reassociable without -ffast-math).
  // Same result: a max is a max, in any order.
  using V16 = float __attribute__((vector_size(64)));
  constexpr float kLow = -std::numeric_limits<float>::infinity();
  V16 m = {kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow,
           kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    V16 v;
    std::memcpy(&v, x + i, sizeof v);
    m = v > m ? v : m;
  }
  float r = kLow;
  for (int j = 0; j < 16; ++j) r = m[j] > r ? m[j] : r;
  for (; i < n; ++i) r = x[i] > r ? x[i] : r;
  return r;
}

int64_t argmax(const float* x, int64_t n) {
  KV_CHECK(n >= 1, "argmax of an empty row");
  // The first index of the largest value: where a scan keeping the first strictly greater value
  // ends. Nothing compares greater than a NaN in front, so then that scan stays at 0.
  if (std::isnan(x[0])) return 0;
  const float m = max_value(x, n);
  int64_t i = 0;
  while (!(x[i] == m)) ++i;  // m is one of x's values (x[0] is not NaN), so this ends
  return i;
}

}  // namespace kvcache
