#include "model/family.h"

#include <map>

#include "core/error.h"
#include "kernels/rope.h"
#include "model/residual_stack.h"
#include "model/weight_spec.h"

namespace kvcache {

namespace {
// Function-local so that registration from any file's static initialiser finds it built.
std::map<std::string, Family>& families() {
  static std::map<std::string, Family> map;
  return map;
}
}  // namespace

void register_family(const Family& family) {
  for (const std::string& arch : family.architectures) {
    const bool inserted = families().emplace(arch, family).second;
    KV_CHECK(inserted, std::string("model family ") + family.name + ": architecture " + arch +
                           " registered twice");
  }
}

const Family& find_family(const std::string& architecture) {
  const auto it = families().find(architecture);
  if (it == families().end()) {
    std::string known;
    for (const auto& [arch, _] : families()) known += (known.empty() ? "" : ", ") + arch;
    throw Error(ErrorKind::kUnsupported,
                "no model family runs architecture '" + architecture + "'; registered: " + known);
  }
  return it->second;
}

void load_hf_embeddings(Weights& w, ModelParts& parts) {
  parts.embeddings = w.matrix("model.embed_tokens.weight");
  parts.output = w.config().tie_word_embeddings ? parts.embeddings : w.matrix("lm_head.weight");
  parts.output_norm = w.norm("model.norm.weight");
}

BlockNorms load_hf_norms(Weights& w, int64_t l) {
  BlockNorms n;
  n.attn = w.norm(hf_layer_tensor(l, "input_layernorm.weight"));
  if (w.config().sandwich_norms) {
    n.post_attn = w.norm(hf_layer_tensor(l, "post_attention_layernorm.weight"));
    n.ffn = w.norm(hf_layer_tensor(l, "pre_feedforward_layernorm.weight"));
    n.post_ffn = w.norm(hf_layer_tensor(l, "post_feedforward_layernorm.weight"));
  } else {
    n.ffn = w.norm(hf_layer_tensor(l, "post_attention_layernorm.weight"));
  }
  return n;
}

void build_hf_residual(Weights& w, ModelParts& parts, AttentionFactory attention, MlpFactory mlp) {
  load_hf_embeddings(w, parts);
  const float* rope = rope_table(w);
  for (int64_t l = 0; l < w.config().n_layers; ++l) {
    Block& block = parts.blocks.emplace_back();
    block.norms = load_hf_norms(w, l);
    block.attention = attention(w, l, rope);
    block.mlp = mlp(w, l);
  }
  parts.stack = std::make_unique<ResidualStack>();
}

const float* rope_table(Weights& w) {
  const ModelConfig& c = w.config();
  return w.keep(rope_inv_freq(c.rope_dim(), c.rope_theta,
                              c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data()));
}

}  // namespace kvcache
