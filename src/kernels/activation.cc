#include "kernels/activation.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/attention_simd.h"

namespace kvcache {

#if KVCACHE_ATTN_AVX2
namespace {
// silu(g) * u on 8 lanes, in llama2.c's order: (g * (1 / (1 + exp(-g)))) * u. exp256 clamps its
// argument to [-87.3, 88.3]: g > 87.3 takes exp(-g) = 0 (silu = g, as in float), g < -88.3 a
// finite 2e38 instead of inf (silu ~ -1e-36 instead of -0, both far below the tolerance).
inline __m256 swiglu8(__m256 g, __m256 u) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = detail::exp256(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_mul_ps(g, _mm256_div_ps(one, _mm256_add_ps(one, e))), u);
}
}  // namespace
#endif

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
#if KVCACHE_ATTN_AVX2
  // Vector exp instead of libm's expf: a scalar libm call per element would make SwiGLU a
  // visible share of a prefill. Every element, tail included, goes through the same 8-lane
  // arithmetic, so its value does not depend on n or its position (batch invariance).
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, swiglu8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    alignas(32) float g[8] = {}, u[8] = {}, o[8];
    std::copy(gate + i, gate + n, g);
    std::copy(up + i, up + n, u);
    _mm256_store_ps(o, swiglu8(_mm256_load_ps(g), _mm256_load_ps(u)));
    std::copy(o, o + (n - i), out + i);
  }
#else
  for (; i < n; ++i) {
    float g = gate[i];
    g *= 1.0f / (1.0f + std::exp(-g));
    out[i] = g * up[i];
  }
#endif
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
