// The model family registry: a family is one .cc file under src/model that registers an entry
// saying which config architectures it serves, how it builds its blocks from the weights, and
// which scratch its blocks use. Model looks the entry up by ModelConfig::architecture; nothing
// else in the forward knows families (no switch to extend, no branch in a shared loop).
//
//   KVCACHE_REGISTER_FAMILY(gemma2, Family{"gemma2", {"gemma2"}, &build, &scratch});
//
// The helpers below are what the families built from transformers checkpoints share.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/block.h"
#include "model/weights.h"

namespace kvcache {

// What a family builds for a Model.
struct ModelParts {
  std::vector<Block> blocks;  // one per layer
  std::unique_ptr<Stack> stack;
  TensorView embeddings;               // [vocab, dim]
  TensorView output;                   // [vocab, dim] (the embeddings when tied)
  const float* output_norm = nullptr;  // [dim]
};

struct Family {
  const char* name;
  std::vector<std::string> architectures;  // ModelConfig::architecture values it serves
  // Fills every part from the weights (shapes were validated against the config before).
  void (*build)(Weights& weights, ModelParts& parts);
  // The scratch kinds its blocks use for this config (the forward's own included by Forward).
  std::vector<const ScratchKind*> (*scratch)(const ModelConfig& config);
};

// Registers a family; an architecture registered twice aborts (a bug).
void register_family(const Family& family);
// Error(kUnsupported) naming the registered architectures when none serves `architecture`.
const Family& find_family(const std::string& architecture);

#define KVCACHE_REGISTER_FAMILY(ident, ...)       \
  static const bool kvcache_family_##ident = [] { \
    ::kvcache::register_family(__VA_ARGS__);      \
    return true;                                  \
  }()

// --- shared by the families with transformers tensor names ---

// model.embed_tokens, lm_head (or the embeddings when tied), model.norm.
void load_hf_embeddings(Weights& w, ModelParts& parts);
// input_layernorm, then post_attention_layernorm before the MLP, or with sandwich norms
// (Gemma) post_attention_layernorm / pre_feedforward_layernorm / post_feedforward_layernorm.
BlockNorms load_hf_norms(Weights& w, int64_t layer);

// The transformers-named families on the residual stack: embeddings and head, then per layer
// the norms and the modules the family's factories make (rope: the config's RoPE table).
using AttentionFactory = std::unique_ptr<Attention> (*)(Weights& w, int64_t layer,
                                                        const float* rope);
using MlpFactory = std::unique_ptr<Mlp> (*)(Weights& w, int64_t layer);
void build_hf_residual(Weights& w, ModelParts& parts, AttentionFactory attention, MlpFactory mlp);

// The RoPE frequencies of the config ([rope_dim / 2]: rope_freq_factors applied), kept by w.
const float* rope_table(Weights& w);

}  // namespace kvcache
