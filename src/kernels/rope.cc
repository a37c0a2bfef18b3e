#include "kernels/rope.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace kvcache {

std::vector<float> rope_inv_freq(int64_t rot_dim, float theta, const float* freq_factors) {
  KV_CHECK(rot_dim > 0 && rot_dim % 2 == 0, "rope: rot_dim must be even and positive");
  const int64_t half = rot_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // float exponent and powf: the arithmetic of llama2.c and of transformers' float32 inv_freq
    const float e = static_cast<float>(2 * i) / static_cast<float>(rot_dim);
    float f = 1.0f / std::pow(theta, e);
    if (freq_factors != nullptr) f /= freq_factors[i];
    inv[static_cast<size_t>(i)] = f;
  }
  return inv;
}

std::vector<float> rope_llama3_freq_factors(const RopeLlama3Params& p) {
  const std::vector<float> inv = rope_inv_freq(p.rot_dim, p.theta, nullptr);
  const float old_len = static_cast<float>(p.original_max_position_embeddings);
  const float low_freq_wavelen = old_len / p.low_freq_factor;
  const float high_freq_wavelen = old_len / p.high_freq_factor;
  std::vector<float> factors(inv.size(), 1.0f);
  for (size_t i = 0; i < inv.size(); ++i) {
    const float f = inv[i];
    const float wavelen = 2.0f * std::numbers::pi_v<float> / f;
    if (wavelen > low_freq_wavelen) {
      factors[i] = p.factor;
    } else if (wavelen >= high_freq_wavelen) {
      const float smooth =
          (old_len / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
      const float scaled = (1.0f - smooth) * f / p.factor + smooth * f;
      factors[i] = f / scaled;
    }
  }
  return factors;
}

namespace {

constexpr int64_t kMaxHalf = 512;  // head_dim <= 1024

void check(const RopeParams& p) {
  KV_CHECK(p.x != nullptr && p.inv_freq != nullptr, "rope: null pointer");
  KV_CHECK(p.rot_dim > 0 && p.rot_dim % 2 == 0 && p.rot_dim <= p.head_dim, "rope: bad rot_dim");
  KV_CHECK(p.rot_dim / 2 <= kMaxHalf, "rope: head_dim above 1024");
}

inline void rotate_head(float* h, const float* cs, const float* sn, int64_t half, RopeStyle style) {
  if (style == RopeStyle::kInterleaved) {
    for (int64_t i = 0; i < half; ++i) {
      const float a = h[2 * i], b = h[2 * i + 1];
      h[2 * i] = a * cs[i] - b * sn[i];
      h[2 * i + 1] = a * sn[i] + b * cs[i];
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const float a = h[i], b = h[i + half];
      h[i] = a * cs[i] - b * sn[i];
      h[i + half] = b * cs[i] + a * sn[i];
    }
  }
}

}  // namespace

void rope_apply(const RopeParams& p) {
  check(p);
  const int64_t ld = p.ld_token > 0 ? p.ld_token : p.n_heads * p.head_dim;
  const int64_t half = p.rot_dim / 2;
  float cs[kMaxHalf], sn[kMaxHalf];
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const int64_t pos = p.positions != nullptr ? p.positions[t] : p.pos0 + t;
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * p.inv_freq[i];
      cs[i] = std::cos(angle) * p.attention_factor;
      sn[i] = std::sin(angle) * p.attention_factor;
    }
    for (int64_t h = 0; h < p.n_heads; ++h)
      rotate_head(p.x + t * ld + h * p.head_dim, cs, sn, half, p.style);
  }
}

void rope_reference(const RopeParams& p) {
  check(p);
  const int64_t ld = p.ld_token > 0 ? p.ld_token : p.n_heads * p.head_dim;
  const int64_t half = p.rot_dim / 2;
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    const int64_t pos = p.positions != nullptr ? p.positions[t] : p.pos0 + t;
    for (int64_t h = 0; h < p.n_heads; ++h) {
      float* v = p.x + t * ld + h * p.head_dim;
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(pos) * p.inv_freq[i];
        const float c = std::cos(angle) * p.attention_factor,
                    s = std::sin(angle) * p.attention_factor;
        const int64_t i0 = p.style == RopeStyle::kInterleaved ? 2 * i : i;
        const int64_t i1 = p.style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
        const float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = a * s + b * c;
      }
    }
  }
}

}  // namespace kvcache
