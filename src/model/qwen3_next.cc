// Qwen3-Next (models/qwen3_next/modeling_qwen3_next.py, Qwen3NextForCausalLM): a hybrid of
// Gated DeltaNet layers ("linear_attention", model/gated_deltanet.h) and gated attention layers
// ("full_attention": GqaAttention with the sigmoid output gate from the doubled q_proj, q/k
// norms and partial rotary RoPE), every RMSNorm zero-centred (1 + w, norm_add_one), a dense
// SwiGLU MLP on mlp_only_layers (or every layer without experts) and otherwise QwenMoe (softmax
// top-k, renormalised, plus the sigmoid-gated shared expert), in the plain pre-norm stack.
#include "model/dense_mlp.h"
#include "model/family.h"
#include "model/gated_deltanet.h"
#include "model/gqa_attention.h"
#include "model/moe_mlp.h"

namespace kvcache {

namespace {

std::unique_ptr<Attention> attention(Weights& w, int64_t l, const float* rope) {
  if (w.config().layer_types[static_cast<size_t>(l)] == "linear_attention")
    return make_hf_gated_deltanet(w, l);
  return make_hf_gqa(w, l, rope);
}

std::unique_ptr<Mlp> mlp(Weights& w, int64_t l) {
  if (!w.config().moe.is_moe_layer(l)) return make_hf_dense_mlp(w, l);
  return QwenMoe::hf(w, l);
}

void build(Weights& w, ModelParts& parts) {
  build_hf_residual(w, parts, &attention, &mlp);
}

std::vector<const ScratchKind*> scratch(const ModelConfig& c) {
  std::vector<const ScratchKind*> kinds = {&kGqaScratch, &kDenseMlpScratch};
  if (c.linear_attn.enabled()) kinds.push_back(&kGatedDeltaNetScratch);
  if (c.moe.n_experts > 0) kinds.push_back(&kMoeScratch);
  return kinds;
}

}  // namespace

KVCACHE_REGISTER_FAMILY(qwen3_next, Family{"qwen3_next", {"qwen3_next"}, &build, &scratch});

}  // namespace kvcache
