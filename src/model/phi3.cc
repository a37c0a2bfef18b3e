// Phi-3 (models/phi3/modeling_phi3.py: Phi3Attention, Phi3MLP, Phi3DecoderLayer): Llama's
// pre-norm block with fused projections — qkv_proj rows [q (H*D); k (H_kv*D); v (H_kv*D)] and
// gate_up_proj rows [gate (I); up (I)], SiLU — and RoPE on the first
// int(head_dim * partial_rotary_factor) dims of each head (1.0 for Phi-3 itself). The fused
// matrices are not copied: q, k, v, gate and up are row-range views of the file's tensors (a
// range of whole rows of a row-major matrix is itself a row-major matrix, any dtype).
#include "model/dense_mlp.h"
#include "model/family.h"
#include "model/gqa_attention.h"
#include "model/residual_stack.h"
#include "model/weight_spec.h"

namespace kvcache {

namespace {

std::unique_ptr<Attention> make_attention(Weights& w, int64_t l, const float* rope) {
  const ModelConfig& c = w.config();
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  const TensorView qkv = w.matrix(hf_layer_tensor(l, "self_attn.qkv_proj.weight"));
  GqaWeights g;
  g.wq = qkv.slice(0, 0, q);
  g.wk = qkv.slice(0, q, q + kv);
  g.wv = qkv.slice(0, q + kv, q + 2 * kv);
  g.wo = w.matrix(hf_layer_tensor(l, "self_attn.o_proj.weight"));
  const RopeTable table{rope, c.rope_interleaved ? RopeStyle::kInterleaved : RopeStyle::kHalf,
                        c.rope_attention_factor};
  return std::make_unique<GqaAttention>(w.file(), l, g, table);
}

std::unique_ptr<Mlp> make_mlp(Weights& w, int64_t l) {
  const ModelConfig& c = w.config();
  const int64_t I = c.hidden_dim;
  const TensorView gate_up = w.matrix(hf_layer_tensor(l, "mlp.gate_up_proj.weight"));
  DenseMlpWeights m;
  m.gate = gate_up.slice(0, 0, I);  // up_states.chunk(2, dim=-1): gate first
  m.up = gate_up.slice(0, I, 2 * I);
  m.down = w.matrix(hf_layer_tensor(l, "mlp.down_proj.weight"));
  return std::make_unique<DenseMlp>(m, c.ffn_act);
}

void build(Weights& w, ModelParts& parts) {
  build_hf_residual(w, parts, &make_attention, &make_mlp);
}

std::vector<const ScratchKind*> scratch(const ModelConfig&) {
  return {&kGqaScratch, &kDenseMlpScratch};
}

}  // namespace

KVCACHE_REGISTER_FAMILY(phi3, Family{"phi3", {"phi3"}, &build, &scratch});

}  // namespace kvcache
