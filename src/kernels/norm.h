// RMSNorm over rows: y = w * (x / sqrt(mean(x^2) + eps)), the Llama family's only norm.
// Computed exactly as llama2.c's rmsnorm (sequential float sum of squares, 1/sqrtf, then
// w * (s * x)), so f32 checkpoints reproduce its activations bit for bit.
#pragma once

#include <cstdint>

namespace kvcache {

struct RmsNormParams {
  const float* x = nullptr;       // [rows, dim], row stride ld_x
  const float* weight = nullptr;  // [dim]
  float* y = nullptr;             // [rows, dim], row stride ld_y; may alias x (in place)
  int64_t rows = 1, dim = 0;
  int64_t ld_x = 0, ld_y = 0;  // 0: dim
  float eps = 1e-5f;
};

void rms_norm(const RmsNormParams& p);

}  // namespace kvcache
