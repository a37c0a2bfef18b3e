// Embedded model configs for `kvcache plan --preset`, so the planner works offline. Each is a
// config.json excerpt with the public values of the model's published config (Hugging Face
// model cards / config.json), keeping only what the KV bill needs; `kvcache_params` is the
// published total parameter count (for the weights line) where the block is not a dense llama.
// Where a value comes from the KV cache notes instead, the comment says so.
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/kv_plan.h"

namespace kvcache {
namespace {

// Layer-type list of `n` layers from a repeating pattern.
std::string pattern(int n, const std::vector<std::string>& cycle) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) {
    if (i) s += ",";
    s += "\"" + cycle[static_cast<size_t>(i) % cycle.size()] + "\"";
  }
  return s + "]";
}

// Layer-type list made of consecutive runs: {{2, "a"}, {3, "b"}} -> a a b b b.
std::string runs(const std::vector<std::pair<int, std::string>>& parts) {
  std::vector<std::string> all;
  for (const auto& [n, t] : parts) all.insert(all.end(), static_cast<size_t>(n), t);
  return pattern(static_cast<int>(all.size()), all);
}

const std::map<std::string, std::string>& presets() {
  static const std::map<std::string, std::string> kPresets = {
      // meta-llama/Llama-2-7b-hf: MHA 32/32, head_dim 128.
      {"llama2-7b", R"({"model_type":"llama","num_hidden_layers":32,"num_attention_heads":32,
        "num_key_value_heads":32,"hidden_size":4096,"intermediate_size":11008,"vocab_size":32000,
        "max_position_embeddings":4096,"tie_word_embeddings":false})"},
      // meta-llama/Llama-2-70b-hf: GQA 64/8.
      {"llama2-70b", R"({"model_type":"llama","num_hidden_layers":80,"num_attention_heads":64,
        "num_key_value_heads":8,"hidden_size":8192,"intermediate_size":28672,"vocab_size":32000,
        "max_position_embeddings":4096,"tie_word_embeddings":false})"},
      // mistralai/Mistral-7B-v0.1: GQA 32/8, sliding_window 4096 on every layer.
      {"mistral-7b", R"({"model_type":"mistral","num_hidden_layers":32,"num_attention_heads":32,
        "num_key_value_heads":8,"hidden_size":4096,"intermediate_size":14336,"vocab_size":32000,
        "max_position_embeddings":32768,"sliding_window":4096,"tie_word_embeddings":false})"},
      // google/gemma-2-9b: 16/8 heads of 256, sliding 4096 on every other layer (from layer 0).
      {"gemma2-9b", R"({"model_type":"gemma2","num_hidden_layers":42,"num_attention_heads":16,
        "num_key_value_heads":8,"head_dim":256,"hidden_size":3584,"intermediate_size":14336,
        "vocab_size":256000,"max_position_embeddings":8192,"sliding_window":4096,
        "tie_word_embeddings":true})"},
      // DeepSeek-V3: MLA kv_lora_rank 512 + qk_rope_head_dim 64 over 61 layers; MoE, 671B.
      {"deepseek-v3", R"({"model_type":"deepseek_v3","num_hidden_layers":61,
        "num_attention_heads":128,"num_key_value_heads":128,"hidden_size":7168,
        "kv_lora_rank":512,"q_lora_rank":1536,"qk_rope_head_dim":64,"qk_nope_head_dim":128,
        "v_head_dim":128,"n_routed_experts":256,"max_position_embeddings":163840,
        "kvcache_params":671000000000})"},
      // openai/gpt-oss-120b: 64/8 heads of 64, sliding 128 on alternate layers, sinks; 116.8B.
      {"gpt-oss-120b", R"({"model_type":"gpt_oss","num_hidden_layers":36,
        "num_attention_heads":64,"num_key_value_heads":8,"head_dim":64,"hidden_size":2880,
        "sliding_window":128,"num_local_experts":128,"max_position_embeddings":131072,
        "kvcache_params":116800000000,"layer_types":)" +
                           pattern(36, {"sliding_attention", "full_attention"}) + "}"},
      // google/gemma-3n-E4B (text_config): 35 layers, 8/2 heads of 256, sliding 512 in a
      // 4:1 pattern, the last 15 layers share KV (num_kv_shared_layers); ~8B raw parameters.
      {"gemma3n", R"({"model_type":"gemma3n","text_config":{"model_type":"gemma3n_text",
        "num_hidden_layers":35,"num_attention_heads":8,"num_key_value_heads":2,"head_dim":256,
        "hidden_size":2048,"sliding_window":512,"num_kv_shared_layers":15,
        "max_position_embeddings":32768,"layer_types":)" +
                      pattern(35, {"sliding_attention", "sliding_attention", "sliding_attention",
                                   "sliding_attention", "full_attention"}) +
                      R"(},"kvcache_params":7850000000})"},
      // Qwen3.5-MoE as the KV cache notes describe it: 40 layers, one full-attention layer in
      // four (10 layers, 2 KV heads of 256); Gated DeltaNet linear layers with Qwen3-Next's
      // dims (16 key / 32 value heads of 128, conv kernel 4). 35B total parameters.
      {"qwen3.5-moe", R"({"model_type":"qwen3_5_moe","num_hidden_layers":40,
        "num_attention_heads":16,"num_key_value_heads":2,"head_dim":256,"hidden_size":2048,
        "full_attention_interval":4,"linear_num_key_heads":16,"linear_num_value_heads":32,
        "linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,
        "num_experts":256,"max_position_embeddings":262144,"kvcache_params":35000000000})"},
      // Qwen/Qwen3-Next-80B-A3B-Instruct config.json (Hugging Face): 48 layers, one
      // full-attention layer in four (12 layers, 16 query / 2 KV heads of 256), 36 Gated
      // DeltaNet layers (16 key / 32 value heads of 128, conv kernel 4), 512 experts, 262,144
      // positions; 80B parameters in total (model card).
      {"qwen3-next-80b-a3b", R"({"architectures":["Qwen3NextForCausalLM"],
        "model_type":"qwen3_next","num_hidden_layers":48,"num_attention_heads":16,
        "num_key_value_heads":2,"head_dim":256,"hidden_size":2048,"intermediate_size":5120,
        "full_attention_interval":4,"linear_num_key_heads":16,"linear_num_value_heads":32,
        "linear_key_head_dim":128,"linear_value_head_dim":128,"linear_conv_kernel_dim":4,
        "num_experts":512,"num_experts_per_tok":10,"moe_intermediate_size":512,
        "shared_expert_intermediate_size":512,"partial_rotary_factor":0.25,
        "vocab_size":151936,"max_position_embeddings":262144,"kvcache_params":80000000000})"},
      // DeepSeek-V4-Flash as the KV cache notes give it: 43 layers = 2 sliding + 21 CSA (rate 4)
      // + 20 HCA (rate 128), one shared K==V head of 512. Window 128 assumed for the sliding
      // layers; 1M context. The parameter count is not in the notes: weights not shown.
      {"deepseek-v4-flash", R"({"model_type":"deepseek_v4","num_hidden_layers":43,
        "num_attention_heads":64,"num_key_value_heads":1,"head_dim":512,"hidden_size":4096,
        "sliding_window":128,"max_position_embeddings":1048576,"n_routed_experts":256,
        "compress_rates":{"compressed_sparse_attention":4,"heavily_compressed_attention":128},
        "layer_types":)" +
                                runs({{2, "sliding_attention"},
                                      {21, "compressed_sparse_attention"},
                                      {20, "heavily_compressed_attention"}}) +
                                "}"},
  };
  return kPresets;
}

}  // namespace

std::vector<std::string> plan_preset_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : presets()) names.push_back(k);
  return names;
}

const std::string& plan_preset_json(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string list;
    for (const auto& n : plan_preset_names()) list += (list.empty() ? "" : ", ") + n;
    throw Error(ErrorKind::kInvalidArgument,
                "unknown preset '" + name + "': known presets are " + list);
  }
  return it->second;
}

PlanModel plan_preset(const std::string& name) {
  PlanModel m = plan_model_from_hf_json(plan_preset_json(name), "preset " + name);
  m.name = name;
  m.source = "preset";
  return m;
}

}  // namespace kvcache
