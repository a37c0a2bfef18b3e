// Pointwise activations of the feed-forward block. SwiGLU (Llama's FFN gate):
// out = silu(gate) * up with silu(g) = g * (1 / (1 + exp(-g))), in float, as llama2.c.
#pragma once

#include <cstdint>

namespace kvcache {

// gate, up, out: [n] f32; out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n);

}  // namespace kvcache
