#include "kernels/activation.h"

#include <cmath>

namespace kvcache {

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    g *= 1.0f / (1.0f + std::exp(-g));
    out[i] = g * up[i];
  }
}

}  // namespace kvcache
