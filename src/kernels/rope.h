// Rotary position embeddings (RoPE). Two pairings of the head dimensions exist in the wild:
//  - kInterleaved: pairs (2i, 2i+1) — Meta's original layout, llama2.c, GGUF `llama`
//  (ROPE_TYPE_NORM);
//  - kHalf: pairs (i, i + rot_dim/2) — HF transformers' rotate_half, GGUF NeoX-style models.
// The frequencies inv_freq[i] = 1 / theta^(2i / rot_dim) are computed once per model in float
// (HF's and llama2.c's arithmetic), divided by optional per-pair factors (rope scaling).
// The angle of position p is p * inv_freq[i] in float, and cos/sin in float, as both references do.
#pragma once

#include <cstdint>
#include <vector>

namespace kvcache {

enum class RopeStyle { kInterleaved, kHalf };

// [rot_dim / 2] inverse frequencies inv_freq[i] = theta^(-2i / rot_dim) / freq_factors[i]
// (freq_factors: [rot_dim / 2] divisors or nullptr for none — ggml_rope_ext's freq_factors,
// into which loaders fold HF's rope_scaling: linear = all `factor`, llama3 = below).
std::vector<float> rope_inv_freq(int64_t rot_dim, float theta, const float* freq_factors);

// Llama 3.1's rope_type "llama3" as per-pair divisors of the default frequencies (transformers'
// _compute_llama3_parameters): long wavelengths slowed by `factor`, short ones kept, a linear
// blend in between. Multiplying back gives HF's inv_freq within 1 ulp.
struct RopeLlama3Params {
  int64_t rot_dim = 0;
  float theta = 500000.0f;
  float factor = 8.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position_embeddings = 8192;
};
std::vector<float> rope_llama3_freq_factors(const RopeLlama3Params& p);

struct RopeParams {
  float* x = nullptr;  // [n_tokens, n_heads, head_dim], rotated in place
  int64_t n_tokens = 0, n_heads = 0, head_dim = 0;
  int64_t ld_token = 0;  // elements between consecutive tokens (0: n_heads * head_dim)
  int64_t pos0 = 0;      // position of token t is pos0 + t ...
  const int64_t* positions = nullptr;  // ... unless given here: [n_tokens]
  const float* inv_freq = nullptr;     // [rot_dim / 2]
  int64_t rot_dim = 0;                 // <= head_dim, even; dims past rot_dim pass through
  RopeStyle style = RopeStyle::kInterleaved;
  // YaRN's attention factor: cos and sin are multiplied by it (transformers' attention_scaling
  // of the rotary embedding); 1 for every other rope type, where the product is exact.
  float attention_factor = 1.0f;
};

// cos/sin computed once per token and shared by every head. Bit-identical to rope_reference.
void rope_apply(const RopeParams& p);
// Plain reference: one cos/sin evaluation per rotated pair, no sharing.
void rope_reference(const RopeParams& p);

}  // namespace kvcache
