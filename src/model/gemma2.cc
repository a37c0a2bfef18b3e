// Gemma-2 (models/gemma2/modeling_gemma2.py): GQA attention with query_pre_attn_scalar^-0.5 as
// its scale and a tanh softcap on the logits, even layers sliding; a GeGLU(tanh) MLP; the
// sandwich norms (post-attention, pre- and post-feedforward), (1 + w) RMSNorm weights, the
// sqrt(dim) embedding scale and the final logit softcap — all read from the config by the
// shared pieces, so the family is only its choice of blocks.
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

KVCACHE_REGISTER_FAMILY(gemma2, Family{"gemma2", {"gemma2"}, &build, &scratch});

}  // namespace kvcache
