// Pointwise activations of the feed-forward block (Llama SwiGLU, Gemma GeGLU, GPT-OSS's clamp).
// SwiGLU (Llama's FFN gate): out = silu(gate) * up with silu(g) = g * (1 / (1 + exp(-g))), in
// float, in llama2.c's order; exp is the kernels' 8-lane polynomial (detail::exp256, ~1e-7
// relative) where AVX2 is built, libm's expf otherwise. Tolerance against double: 1e-6 relative +
// 1e-7. An element's value depends only on its own inputs (not on n or its position).
#pragma once

#include <cstdint>

namespace kvcache {

// gate, up, out: [n] f32; out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n);
// GeGLU with the tanh approximation (transformers' gelu_pytorch_tanh, Gemma's FFN):
// out = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up, in float.
void geglu_tanh(const float* gate, const float* up, float* out, int64_t n);
// GPT-OSS experts' clamped SwiGLU on interleaved gate/up pairs (GptOssExperts.forward):
// g = min(gate_up[2i], limit), u = clamp(gate_up[2i+1], -limit, limit),
// out[i] = (u + 1) * g * sigmoid(alpha * g). gate_up: [2n], out: [n].
void swiglu_oss(const float* gate_up, float* out, int64_t n, float alpha, float limit);

}  // namespace kvcache
