#include "model/config_limits.h"

#include "core/error.h"
#include "model/model_file.h"

namespace kvcache {

ConfigCountLimit config_count_limit(ConfigCount kind) {
  // Released models (2025) reach 126 layers, 128 heads, head dims of 576 (MLA latent + rope),
  // hidden sizes of 16,384, FFN sizes near 100,000, vocabularies of 262,144, contexts of 10M
  // tokens and 512 experts: each bound leaves an order of magnitude or more above them.
  switch (kind) {
    case ConfigCount::kLayers:
      return {"layers", 4096};
    case ConfigCount::kHeads:
      return {"heads", 4096};
    case ConfigCount::kHeadDim:
      return {"elements per head (or latent rank)", int64_t{1} << 16};
    case ConfigCount::kHiddenSize:
      return {"hidden elements", int64_t{1} << 20};
    case ConfigCount::kFfnSize:
      return {"FFN elements", int64_t{1} << 22};
    case ConfigCount::kVocab:
      return {"tokens in a vocabulary", int64_t{1} << 24};
    case ConfigCount::kContext:
      return {"positions", int64_t{1} << 30};
    case ConfigCount::kExperts:
      return {"experts", int64_t{1} << 16};
  }
  return {"", 0};
}

int64_t check_config_count(const std::string& source, std::string_view field, int64_t value,
                           ConfigCount kind) {
  const ConfigCountLimit limit = config_count_limit(kind);
  if (value < 0) {
    throw Error(ErrorKind::kFormat, source + ": config field '" + std::string(field) +
                                        "' = " + std::to_string(value) +
                                        " is negative; it counts " + limit.what);
  }
  if (value > limit.max) {
    throw Error(ErrorKind::kFormat, source + ": config field '" + std::string(field) + "' = " +
                                        std::to_string(value) + " is larger than the maximum of " +
                                        std::to_string(limit.max) + " " + limit.what +
                                        " this engine accepts (far above any released model): the "
                                        "config is corrupt or not a model's");
  }
  return value;
}

void check_config_limits(const ModelConfig& c, const std::string& source) {
  const struct {
    const char* field;
    int64_t value;
    ConfigCount kind;
  } counts[] = {
      {"n_layers", c.n_layers, ConfigCount::kLayers},
      {"dim (hidden size)", c.dim, ConfigCount::kHiddenSize},
      {"n_heads", c.n_heads, ConfigCount::kHeads},
      {"n_kv_heads", c.n_kv_heads, ConfigCount::kHeads},
      {"head_dim", c.head_dim, ConfigCount::kHeadDim},
      {"hidden_dim (FFN size)", c.hidden_dim, ConfigCount::kFfnSize},
      {"vocab_size", c.vocab_size, ConfigCount::kVocab},
      {"max_seq_len (context length)", c.max_seq_len, ConfigCount::kContext},
      {"sliding_window", c.sliding_window, ConfigCount::kContext},
      {"attention_chunk_size", c.attention_chunk_size, ConfigCount::kContext},
      {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings,
       ConfigCount::kContext},
      {"num_kv_shared_layers", c.num_kv_shared_layers, ConfigCount::kLayers},
      {"experts", c.moe.n_experts, ConfigCount::kExperts},
      {"experts per token", c.moe.n_experts_used, ConfigCount::kExperts},
      {"shared experts", c.moe.n_shared_experts, ConfigCount::kExperts},
      {"expert groups", c.moe.n_group, ConfigCount::kExperts},
      {"expert groups per token", c.moe.topk_group, ConfigCount::kExperts},
      {"expert FFN size", c.moe.expert_hidden_dim, ConfigCount::kFfnSize},
      {"first dense layers", c.moe.first_dense_layers, ConfigCount::kLayers},
      {"kv_lora_rank", c.mla.kv_lora_rank, ConfigCount::kHeadDim},
      {"q_lora_rank", c.mla.q_lora_rank, ConfigCount::kHeadDim},
      {"qk_nope_head_dim", c.mla.qk_nope_head_dim, ConfigCount::kHeadDim},
      {"qk_rope_head_dim", c.mla.qk_rope_head_dim, ConfigCount::kHeadDim},
      {"v_head_dim", c.mla.v_head_dim, ConfigCount::kHeadDim},
      {"altup_num_inputs", c.gemma3n.altup_num_inputs, ConfigCount::kHeads},
      {"laurel_rank", c.gemma3n.laurel_rank, ConfigCount::kHeadDim},
      {"hidden_size_per_layer_input", c.gemma3n.hidden_size_per_layer_input,
       ConfigCount::kHiddenSize},
      {"vocab_size_per_layer_input", c.gemma3n.vocab_size_per_layer_input, ConfigCount::kVocab},
  };
  for (const auto& x : counts) check_config_count(source, x.field, x.value, x.kind);
  for (int64_t size : c.gemma3n.intermediate_sizes)
    check_config_count(source, "intermediate_size", size, ConfigCount::kFfnSize);
}

}  // namespace kvcache
