// Sane maxima for the counts a model config declares (layers, heads, head and hidden sizes, FFN
// size, vocabulary, context, experts), in one place for every config reader: HF config.json
// (hf_config), the planner's reader (kv_plan), GGUF metadata and llama2.c headers. A reader
// checks each count as it reads it, before anything is sized or looped over from it, so a
// corrupt or hostile config (num_hidden_layers: 1e12) is an error naming the field instead of
// minutes of work and gigabytes of memory. The bounds are far above every released model and
// low enough that no product the readers form (parameters, bytes per token) overflows int64.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvcache {

struct ModelConfig;

enum class ConfigCount : uint8_t {
  kLayers,      // transformer blocks
  kHeads,       // attention heads, KV heads, linear-attention heads
  kHeadDim,     // per-head sizes, MLA ranks and head parts, conv kernels
  kHiddenSize,  // the residual width (embedding length)
  kFfnSize,     // dense or expert FFN intermediate size
  kVocab,       // tokens
  kContext,     // positions: context length, windows, chunks, original context of RoPE scaling
  kExperts,     // routed or shared experts, experts per token, expert groups
};

struct ConfigCountLimit {
  const char* what;  // plural noun for messages: "layers", "attention heads", ...
  int64_t max;
};
ConfigCountLimit config_count_limit(ConfigCount kind);

// Returns `value` when it is in [0, max] for `kind`; otherwise throws Error(kFormat)
// "<source>: <field> = <value> ..." naming the maximum (positivity, where a field needs it, is
// the reader's own check with its own message).
int64_t check_config_count(const std::string& source, std::string_view field, int64_t value,
                           ConfigCount kind);

// Every count of a parsed ModelConfig (the fields named as the runtime calls them), for loaders
// that fill a ModelConfig before they size anything from it (GGUF, llama2.c); also part of
// ModelConfig::validate.
void check_config_limits(const ModelConfig& config, const std::string& source);

}  // namespace kvcache
