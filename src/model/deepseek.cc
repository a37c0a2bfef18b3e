// DeepSeek-V2 and V3 (models/deepseek_v3/modeling_deepseek_v3.py, and deepseek_v2): MLA
// attention (model/mla_attention.h) on RoPE pairs (2i, 2i+1) or halves as the config says;
// the first first_k_dense_replace layers a SwiGLU MLP, the others DeepseekMoe (V3's
// group-limited sigmoid routing or V2's greedy softmax, plus shared experts).
#include "model/dense_mlp.h"
#include "model/family.h"
#include "model/mla_attention.h"
#include "model/moe_mlp.h"

namespace kvcache {

namespace {

std::unique_ptr<Mlp> mlp(Weights& w, int64_t l) {
  if (!w.config().moe.is_moe_layer(l)) return make_hf_dense_mlp(w, l);
  return DeepseekMoe::hf(w, l);
}

void build(Weights& w, ModelParts& parts) {
  build_hf_residual(w, parts, &make_hf_mla, &mlp);
}

std::vector<const ScratchKind*> scratch(const ModelConfig& c) {
  std::vector<const ScratchKind*> kinds = {&kMlaScratch, &kDenseMlpScratch};
  if (c.moe.n_experts > 0) kinds.push_back(&kMoeScratch);
  return kinds;
}

}  // namespace

KVCACHE_REGISTER_FAMILY(deepseek,
                        Family{"deepseek", {"deepseek_v2", "deepseek_v3"}, &build, &scratch});

}  // namespace kvcache
