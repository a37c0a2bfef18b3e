// GPT-OSS (models/gpt_oss/modeling_gpt_oss.py): GQA attention with q/k/v/o biases and one
// learned sink logit per head (softmax denominator only), sliding and full layers, YaRN RoPE;
// every MLP a mixture of experts (GptOssMoe: top-k of the router logits, clamped SwiGLU).
#include "model/dense_mlp.h"
#include "model/family.h"
#include "model/gqa_attention.h"
#include "model/moe_mlp.h"

namespace kvcache {

namespace {

std::unique_ptr<Mlp> mlp(Weights& w, int64_t l) {
  if (!w.config().moe.is_moe_layer(l)) return make_hf_dense_mlp(w, l);
  return std::make_unique<GptOssMoe>(w.config(), GptOssExperts::hf(w, l));
}

void build(Weights& w, ModelParts& parts) {
  build_hf_residual(
      w, parts, [](Weights& w, int64_t l, const float* rope) { return make_hf_gqa(w, l, rope); },
      &mlp);
}

std::vector<const ScratchKind*> scratch(const ModelConfig& c) {
  std::vector<const ScratchKind*> kinds = {&kGqaScratch, &kMoeScratch};
  if (c.moe.first_dense_layers > 0 || c.moe.n_experts == 0) kinds.push_back(&kDenseMlpScratch);
  return kinds;
}

}  // namespace

KVCACHE_REGISTER_FAMILY(gpt_oss, Family{"gpt_oss", {"gpt_oss"}, &build, &scratch});

}  // namespace kvcache
