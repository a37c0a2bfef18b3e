#include "kernels/activation.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kvcache {

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    g *= 1.0f / (1.0f + std::exp(-g));
    out[i] = g * up[i];
  }
}

void geglu_tanh(const float* gate, const float* up, float* out, int64_t n) {
  const float k = std::sqrt(2.0f / std::numbers::pi_v<float>);
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void swiglu_oss(const float* gate_up, float* out, int64_t n, float alpha, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = std::min(gate_up[2 * i], limit);
    const float u = std::clamp(gate_up[2 * i + 1], -limit, limit);
    const float glu = g * (1.0f / (1.0f + std::exp(-g * alpha)));
    out[i] = (u + 1.0f) * glu;
  }
}

}  // namespace kvcache
