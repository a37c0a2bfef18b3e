// The llama family: Llama, Mistral, Qwen2 (models/llama/modeling_llama.py, and mistral, qwen2).
// GQA attention (Qwen2: q/k/v biases) and a SwiGLU MLP in the plain pre-norm stack. Their
// tensors go by llama.cpp's canonical names whatever the file format (model/model_file.h):
// GGUF as written, llama2.c and Hugging Face checkpoints renamed at load.
#include "model/dense_mlp.h"
#include "model/family.h"
#include "model/gqa_attention.h"
#include "model/residual_stack.h"

namespace kvcache {

namespace {

void build(Weights& w, ModelParts& parts) {
  const ModelConfig& c = w.config();
  parts.embeddings = w.matrix("token_embd.weight");
  parts.output = c.tie_word_embeddings ? parts.embeddings : w.matrix("output.weight");
  parts.output_norm = w.vector("output_norm.weight");
  const RopeTable rope{rope_table(w),
                       c.rope_interleaved ? RopeStyle::kInterleaved : RopeStyle::kHalf,
                       c.rope_attention_factor};
  for (int64_t l = 0; l < c.n_layers; ++l) {
    Block& block = parts.blocks.emplace_back();
    block.norms.attn = w.vector(layer_tensor(l, "attn_norm.weight"));
    block.attention = std::make_unique<GqaAttention>(
        w.file(), l, GqaWeights::load(w, l, TensorNames::kCanonical), rope);
    block.norms.ffn = w.vector(layer_tensor(l, "ffn_norm.weight"));
    block.mlp = std::make_unique<DenseMlp>(DenseMlpWeights::canonical(w, l), c.ffn_act);
  }
  parts.stack = std::make_unique<ResidualStack>();
}

std::vector<const ScratchKind*> scratch(const ModelConfig&) {
  return {&kGqaScratch, &kDenseMlpScratch};
}

}  // namespace

KVCACHE_REGISTER_FAMILY(llama, Family{"llama", {"llama", "mistral", "qwen2"}, &build, &scratch});

}  // namespace kvcache
