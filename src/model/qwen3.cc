// Qwen3 (models/qwen3/modeling_qwen3.py): Llama's pre-norm block with transformers' tensor
// names, plus Qwen3Attention's q_norm / k_norm (plain RMSNorm over head_dim, before RoPE);
// head_dim from the config, sliding layers from layer_types / max_window_layers, optional
// q/k/v/o biases (attention_bias). All read from the config by the shared pieces.
#include "model/dense_mlp.h"
#include "model/family.h"
#include "model/gqa_attention.h"

namespace kvcache {

namespace {

void build(Weights& w, ModelParts& parts) {
  build_hf_residual(
      w, parts, [](Weights& w, int64_t l, const float* rope) { return make_hf_gqa(w, l, rope); },
      &make_hf_dense_mlp);
}

std::vector<const ScratchKind*> scratch(const ModelConfig&) {
  return {&kGqaScratch, &kDenseMlpScratch};
}

}  // namespace

KVCACHE_REGISTER_FAMILY(qwen3, Family{"qwen3", {"qwen3"}, &build, &scratch});

}  // namespace kvcache
