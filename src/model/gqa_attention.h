// Grouped-query attention (multi-head and multi-query as its ends): Llama, Mistral, Qwen2,
// Gemma-2, GPT-OSS, Gemma-3n.
//
//   Q, K, V (+ biases) -> [q/k/v norms per head] -> RoPE(Q, K) -> cache -> kernel -> O (+ bias)
//
// The kernel applies the layer type's window or chunk, the softcap (Gemma-2) and the sinks
// (GPT-OSS: one logit per head in the softmax denominator, no cache slot). RoPE rotates the new
// keys only, before they enter the cache: cached keys are never rotated again. A KV-shared
// layer (num_kv_shared_layers, Gemma-3n's rule) projects only its queries and attends the span
// of its source — the last earlier non-shared layer of its type, the rule Cache applies too.
// K/V reach the cache as [B, H_kv, S, D] views of the row-major projection buffers: no
// transpose copy.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/attention.h"
#include "kernels/rope.h"
#include "model/block.h"
#include "model/weights.h"

namespace kvcache {

struct GqaWeights {
  TensorView wq;                  // [H*D, dim]
  TensorView wk, wv;              // [H_kv*D, dim] each (present, unused, in KV-shared layers)
  TensorView wo;                  // [dim, H*D]
  const float* bq = nullptr;      // [H*D] (qkv_bias: Qwen2, GPT-OSS) or null
  const float* bk = nullptr;      // [H_kv*D]
  const float* bv = nullptr;      // [H_kv*D]
  const float* bo = nullptr;      // [dim] (attention_bias: GPT-OSS) or null
  const float* sinks = nullptr;   // [H] GPT-OSS sink logits or null
  const float* q_norm = nullptr;  // [D] per-head RMSNorm weights (Gemma-3n) or null
  const float* k_norm = nullptr;  // [D]
  const float* v_norm = nullptr;  // [D] of ones: Gemma-3n's v_norm has no weight (else null)

  // Biases, sinks and norms as the config asks for them, by llama.cpp's canonical names
  // (blk.<l>.attn_q ...) or transformers' (model.layers.<l>.self_attn.q_proj ...).
  static GqaWeights load(Weights& w, int64_t layer, TensorNames names);
};

// A layer of a transformers-named family: its weights, this layer type's RoPE table (rope:
// [D/2], or local_rope for sliding layers when the family has one) in the config's pair order.
std::unique_ptr<Attention> make_hf_gqa(Weights& w, int64_t layer, const float* rope,
                                       const float* local_rope = nullptr);

class GqaAttention final : public Attention {
 public:
  // rope: this layer's RoPE ([D/2] frequencies). Error(kFormat) for a KV-shared layer with no
  // earlier layer of its type to read.
  GqaAttention(const ModelFile& file, int64_t layer, const GqaWeights& weights,
               const RopeTable& rope);

  int64_t forward(Step& st, int64_t layer) const override;
  int64_t kv_source() const override { return kv_source_; }

 private:
  // xb [R, dim] -> q [R, H*D], and k, v [R, H_kv*D] unless KV-shared.
  void project(Step& st, const float* xb, float* q, float* k, float* v) const;
  void norm_heads(const Step& st, float* q, float* k, float* v) const;
  void rotate(const Step& st, float* q, float* k) const;
  // Gated attention (Qwen3-Next): q [R, H, 2D] -> q [R, H*D] and gate [R, H*D].
  void split_gate(const Step& st, float* q, float* gate) const;
  // att rows *= sigmoid(gate); last_rows: att row b holds the chunk's row b*S + S-1.
  void apply_gate(float* att, const float* gate, int64_t rows, int64_t S, bool last_rows) const;

  GqaWeights w_;
  int64_t H_, Hkv_, D_;
  float eps_;
  RopeTable rope_;
  int64_t kv_source_;
  bool kv_shared_;
  bool gated_;                // attn_output_gate
  int64_t rot_dim_;           // dims RoPE rotates per head (partial_rotary_factor)
  AttentionOptions options_;  // scale, window or chunk, softcap, sinks
};

// q [R, H*D] (gated attention: [R, 2*H*D], q_proj's output), k and v [R, H_kv*D], the output
// gate [R, H*D] (gated attention only, else empty).
extern const ScratchKind kGqaScratch;
enum GqaBuffer : size_t { kGqaQ, kGqaK, kGqaV, kGqaGate };

// The layer whose K/V `layer` reads (itself unless among the last num_kv_shared_layers);
// Error(kFormat) naming the file and layer when a shared layer has no earlier layer of its type.
int64_t kv_source_layer(const ModelFile& file, int64_t layer);
// The same error, for blocks that cannot read another layer's K/V (MLA).
[[noreturn]] void refuse_kv_sharing(const ModelFile& file, int64_t layer);

}  // namespace kvcache
