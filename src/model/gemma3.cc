// Gemma-3 text (models/gemma3/modeling_gemma3.py: Gemma3TextModel, Gemma3DecoderLayer,
// Gemma3Attention): Gemma-2's block — sandwich norms, (1 + w) RMSNorm, sqrt(dim) embedding
// scale, GeGLU(tanh), query_pre_attn_scalar — with q_norm / k_norm before RoPE, no softcaps by
// default, and two RoPE tables: sliding layers rotate with rope_local_base_freq (default RoPE,
// Gemma3TextModel.rotary_emb_local), full layers with rope_theta and the config's scaling.
#include "kernels/rope.h"
#include "model/dense_mlp.h"
#include "model/family.h"
#include "model/gqa_attention.h"
#include "model/residual_stack.h"

namespace kvcache {

namespace {

void build(Weights& w, ModelParts& parts) {
  const ModelConfig& c = w.config();
  load_hf_embeddings(w, parts);
  const float* global = rope_table(w);
  const float* local = w.keep(rope_inv_freq(c.rope_dim(), c.rope_local_theta, nullptr));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    Block& block = parts.blocks.emplace_back();
    block.norms = load_hf_norms(w, l);
    block.attention = make_hf_gqa(w, l, global, local);
    block.mlp = make_hf_dense_mlp(w, l);
  }
  parts.stack = std::make_unique<ResidualStack>();
}

std::vector<const ScratchKind*> scratch(const ModelConfig&) {
  return {&kGqaScratch, &kDenseMlpScratch};
}

}  // namespace

KVCACHE_REGISTER_FAMILY(gemma3, Family{"gemma3", {"gemma3"}, &build, &scratch});

}  // namespace kvcache
