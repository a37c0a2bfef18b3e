#include "model/decoder_layout.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "model/config_limits.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"

namespace kvcache {

using nlohmann::json;

namespace {

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(ErrorKind::kFormat, source + ": " + what);
}

// How a family's transformers configuration derives layer_types when config.json has none.
enum class TypesRule {
  kGeneric,          // cache_utils' rule: all sliding / all chunked / all full
  kMaxWindowLayers,  // Qwen2/Qwen3: sliding from max_window_layers on, if use_sliding_window
  kAlternate,        // Gemma-2, GPT-OSS: "sliding_attention" if bool((i + 1) % 2)
  kPattern,          // Gemma-3: every sliding_window_pattern-th layer full
  kEveryFifthFull,   // Gemma-3n
  kFullInterval,     // Qwen3-Next: one full-attention layer every full_attention_interval
  kNoRopeLayers,     // Llama-4: chunked where no_rope_layers[i] (RoPE layers), else full
  kDeepseekV4,       // DeepSeek-V4: compress_ratios (legacy), else 2 HCA then CSA/HCA alternating
};

struct Family {
  std::string_view model_type;
  std::string_view architecture;  // architectures[0] of its CausalLM checkpoints
  TypesRule rule;
  int64_t default_window = 0;    // the config class's sliding_window default
  int64_t default_chunk = 0;     // attention_chunk_size default
  int64_t default_head_dim = 0;  // 0: hidden_size / num_attention_heads
};

// Defaults are those of each transformers configuration_<family>.py.
constexpr Family kFamilies[] = {
    {"llama", "LlamaForCausalLM", TypesRule::kGeneric},
    {"mistral", "MistralForCausalLM", TypesRule::kGeneric, 4096},
    {"qwen2", "Qwen2ForCausalLM", TypesRule::kMaxWindowLayers, 4096},
    {"qwen2_moe", "Qwen2MoeForCausalLM", TypesRule::kMaxWindowLayers, 4096},
    {"qwen3", "Qwen3ForCausalLM", TypesRule::kMaxWindowLayers, 4096, 0, 128},
    {"qwen3_moe", "Qwen3MoeForCausalLM", TypesRule::kMaxWindowLayers, 4096},
    {"qwen3_next", "Qwen3NextForCausalLM", TypesRule::kFullInterval, 0, 0, 256},
    {"gemma2", "Gemma2ForCausalLM", TypesRule::kAlternate, 4096, 0, 256},
    {"gemma3_text", "Gemma3ForCausalLM", TypesRule::kPattern, 4096, 0, 256},
    {"gemma3n_text", "Gemma3nForCausalLM", TypesRule::kEveryFifthFull, 512, 0, 256},
    {"gpt_oss", "GptOssForCausalLM", TypesRule::kAlternate, 128, 0, 64},
    {"llama4_text", "Llama4ForCausalLM", TypesRule::kNoRopeLayers, 0, 8192},
    {"deepseek_v2", "DeepseekV2ForCausalLM", TypesRule::kGeneric},
    {"deepseek_v3", "DeepseekV3ForCausalLM", TypesRule::kGeneric},
    {"deepseek_v4", "DeepseekV4ForCausalLM", TypesRule::kDeepseekV4, 128, 0, 512},
};

// Multimodal wrappers name their text decoder's family differently.
std::string_view canonical_model_type(std::string_view t) {
  if (t == "gemma3") return "gemma3_text";
  if (t == "gemma3n") return "gemma3n_text";
  if (t == "llama4") return "llama4_text";
  return t;
}

const Family* find_family(std::string_view model_type) {
  for (const Family& f : kFamilies)
    if (f.model_type == model_type) return &f;
  return nullptr;
}

std::string str_or(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// An integer field; absent or null: nullopt. Integral floats (configs write 1e5) are taken, and
// values beyond int64 saturate, so that the count limits report them as too large with their
// value instead of wrapping around. Anything else is an error naming the key.
std::optional<int64_t> opt_int(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  }
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (d == std::floor(d)) {
      if (!(d > -9.2e18)) return INT64_MIN;
      if (!(d < 9.2e18)) return INT64_MAX;
      return static_cast<int64_t>(d);
    }
  }
  bad(source, std::string("config field '") + key + "' must be an integer");
}

std::optional<int64_t> opt_count(const json& j, const char* key, ConfigCount kind,
                                 const std::string& source) {
  std::optional<int64_t> v = opt_int(j, key, source);
  if (v) check_config_count(source, key, *v, kind);
  return v;
}

int64_t req_count(const json& j, const char* key, ConfigCount kind, const std::string& source) {
  const std::optional<int64_t> v = opt_count(j, key, kind, source);
  if (!v || *v <= 0)
    bad(source, std::string("config field '") + key + "' is missing or not a positive integer");
  return *v;
}

bool bool_or(const json& j, const char* key, bool fallback, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    bad(source, std::string("config field '") + key + "' must be true or false");
  return it->get<bool>();
}

std::string family_of(const json& root, const json& config) {
  if (auto it = root.find("architectures");
      it != root.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    const std::string arch = (*it)[0].get<std::string>();
    for (const Family& f : kFamilies)
      if (f.architecture == arch) return std::string(f.model_type);
    // Multimodal checkpoints whose text decoder is one of the families.
    static constexpr std::pair<std::string_view, std::string_view> kWrappers[] = {
        {"Gemma3ForConditionalGeneration", "gemma3_text"},
        {"Gemma3nForConditionalGeneration", "gemma3n_text"},
        {"Llama4ForConditionalGeneration", "llama4_text"}};
    for (const auto& [wrapper, family] : kWrappers)
      if (wrapper == arch) return std::string(family);
  }
  std::string t = str_or(config, "model_type");
  if (t.empty()) t = str_or(root, "model_type");
  return std::string(canonical_model_type(t));
}

std::vector<std::string> derived_layer_types(const json& j, const Family* fam,
                                             const DecoderLayout& d, const std::string& source) {
  const int64_t n = d.n_layers;
  std::vector<std::string> t(static_cast<size_t>(n), "full_attention");
  const TypesRule rule = fam ? fam->rule : TypesRule::kGeneric;
  const auto set = [&](auto&& pick) {
    for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = pick(i);
  };
  switch (rule) {
    case TypesRule::kMaxWindowLayers: {
      // Qwen2Config: sliding_window is kept only with use_sliding_window; layers from
      // max_window_layers on use it.
      if (!bool_or(j, "use_sliding_window", false, source)) break;
      const int64_t from =
          opt_count(j, "max_window_layers", ConfigCount::kLayers, source).value_or(28);
      set([&](int64_t i) { return i >= from ? "sliding_attention" : "full_attention"; });
      break;
    }
    case TypesRule::kAlternate:
      set([](int64_t i) { return (i + 1) % 2 ? "sliding_attention" : "full_attention"; });
      break;
    case TypesRule::kPattern: {
      const int64_t p =
          opt_count(j, "sliding_window_pattern", ConfigCount::kLayers, source).value_or(6);
      set([&](int64_t i) {
        return p == 0 || (i + 1) % p ? "sliding_attention" : "full_attention";
      });
      break;
    }
    case TypesRule::kEveryFifthFull:
      set([](int64_t i) { return (i + 1) % 5 == 0 ? "full_attention" : "sliding_attention"; });
      break;
    case TypesRule::kNoRopeLayers: {
      std::vector<int64_t> rope_layers;
      if (auto it = j.find("no_rope_layers"); it != j.end() && it->is_array() && !it->empty()) {
        for (const json& v : *it) {
          if (!v.is_number_integer())
            bad(source, "config field 'no_rope_layers' must be a list of 0/1 integers");
          rope_layers.push_back(v.get<int64_t>());
        }
        if (static_cast<int64_t>(rope_layers.size()) != n)
          bad(source, "config field 'no_rope_layers' has " + std::to_string(rope_layers.size()) +
                          " entries for num_hidden_layers " + std::to_string(n));
      } else {
        const int64_t every =
            opt_count(j, "no_rope_layer_interval", ConfigCount::kLayers, source).value_or(4);
        if (every <= 0) bad(source, "config field 'no_rope_layer_interval' must be positive");
        for (int64_t i = 0; i < n; ++i) rope_layers.push_back((i + 1) % every != 0);
      }
      set([&](int64_t i) {
        return rope_layers[static_cast<size_t>(i)] ? "chunked_attention" : "full_attention";
      });
      break;
    }
    case TypesRule::kDeepseekV4: {
      // DeepseekV4Config.__post_init__: legacy per-layer compress_ratios (0 / 4 / 128, a fixed
      // map to the three types, truncated to the layer count: checkpoints list the MTP layer
      // too), else two HCA layers then HCA / CSA alternating (CSA on odd i of the rest).
      if (auto it = j.find("compress_ratios"); it != j.end() && !it->is_null()) {
        if (!it->is_array() || static_cast<int64_t>(it->size()) < n)
          bad(source, "config field 'compress_ratios' must list at least num_hidden_layers (" +
                          std::to_string(n) + ") rates");
        set([&](int64_t i) {
          const json& r = (*it)[static_cast<size_t>(i)];
          const int64_t v = r.is_number_integer() ? r.get<int64_t>() : -1;
          if (v != 0 && v != 4 && v != 128)
            bad(source, "compress_ratios[" + std::to_string(i) +
                            "] must be 0 (sliding_attention), 4 (compressed_sparse_attention) or "
                            "128 (heavily_compressed_attention)");
          return v == 0   ? "sliding_attention"
                 : v == 4 ? "compressed_sparse_attention"
                          : "heavily_compressed_attention";
        });
      } else {
        set([](int64_t i) {
          return i >= 2 && (i - 2) % 2 ? "compressed_sparse_attention"
                                       : "heavily_compressed_attention";
        });
      }
      break;
    }
    case TypesRule::kFullInterval:
    case TypesRule::kGeneric: {
      std::optional<int64_t> interval =
          opt_count(j, "full_attention_interval", ConfigCount::kLayers, source);
      if (!interval && rule == TypesRule::kFullInterval) interval = 4;  // Qwen3NextConfig
      if (interval) {
        if (*interval <= 0) bad(source, "config field 'full_attention_interval' must be positive");
        set([&](int64_t i) {
          return (i + 1) % *interval == 0 ? "full_attention" : "linear_attention";
        });
      } else {
        t = generic_layer_types(n, d.sliding_window, d.attention_chunk_size);
      }
      break;
    }
  }
  return t;
}

// Every type known, each window given; windows nobody uses are dropped (a config may carry a
// sliding_window that its layer types do not use, as Qwen2's do).
void check_layer_types(DecoderLayout& d, const std::string& source, bool explicit_types) {
  const std::string where = explicit_types ? "layer_types" : "the derived layer types";
  // DeepSeek-V4's compressed layers keep a sliding window of raw K==V rows too.
  bool sliding = d.family == "deepseek_v4", chunked = false;
  const std::vector<std::string>& known = known_layer_types();
  for (size_t i = 0; i < d.layer_types.size(); ++i) {
    const std::string& t = d.layer_types[i];
    if (d.compress_rates.count(t)) {
      // DeepSeek-V4's CSA/HCA layers keep a sliding K==V window next to their entries
      // (DeepseekV4HCACache is a DynamicSlidingWindowLayer of config.sliding_window).
      sliding = true;
      continue;
    }
    if (std::find(known.begin(), known.end(), t) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      bad(source, where + "[" + std::to_string(i) + "] is '" + t +
                      "', a layer type no cache defines (" + list +
                      ", or a compressed type named in compress_rates)");
    }
    if (t == "sliding_attention" || t == "hybrid_sliding") {
      sliding = true;
      if (d.sliding_window <= 0)
        bad(source, where + "[" + std::to_string(i) + "] is '" + t +
                        "' but 'sliding_window' is missing, null or not positive: give the window");
    }
    if (t == "chunked_attention") {
      chunked = true;
      if (d.attention_chunk_size <= 0)
        bad(source, where + "[" + std::to_string(i) +
                        "] is 'chunked_attention' but 'attention_chunk_size' is missing, null or "
                        "not positive");
    }
  }
  if (!sliding) d.sliding_window = 0;
  if (!chunked) d.attention_chunk_size = 0;
}

}  // namespace

const std::vector<std::string>& known_layer_types() {
  static const std::vector<std::string> kTypes = {"full_attention",
                                                  "sliding_attention",
                                                  "chunked_attention",
                                                  "linear_attention",
                                                  "conv",
                                                  "hybrid",
                                                  "hybrid_sliding",
                                                  "deepseek_sparse_attention",
                                                  "qwen_sparse_attention",
                                                  "moe",
                                                  "mlp"};
  return kTypes;
}

std::vector<std::string> generic_layer_types(int64_t n_layers, int64_t sliding_window,
                                             int64_t attention_chunk_size) {
  const char* t = sliding_window > 0         ? "sliding_attention"
                  : attention_chunk_size > 0 ? "chunked_attention"
                                             : "full_attention";
  return std::vector<std::string>(static_cast<size_t>(std::max<int64_t>(n_layers, 0)), t);
}

json decoder_config(const json& root) {
  auto it = root.find("text_config");
  if (it == root.end() || !it->is_object()) return root;
  json t = *it;
  for (const char* k : {"bos_token_id", "eos_token_id", "model_type"})
    if (!t.contains(k) && root.contains(k)) t[k] = root[k];
  return t;
}

DecoderLayout read_decoder_layout(const json& root, const json& j, const std::string& source) {
  DecoderLayout d;
  d.family = family_of(root, j);
  const Family* fam = find_family(d.family);
  d.n_layers = req_count(j, "num_hidden_layers", ConfigCount::kLayers, source);
  d.n_heads = req_count(j, "num_attention_heads", ConfigCount::kHeads, source);
  const bool v4 = d.family == "deepseek_v4";  // one shared K==V head by default
  d.n_kv_heads =
      opt_count(j, "num_key_value_heads", ConfigCount::kHeads, source).value_or(v4 ? 1 : d.n_heads);
  if (d.n_kv_heads <= 0) bad(source, "config field 'num_key_value_heads' must be positive");
  d.hidden_size = opt_count(j, "hidden_size", ConfigCount::kHiddenSize, source).value_or(0);
  d.max_position_embeddings =
      opt_count(j, "max_position_embeddings", ConfigCount::kContext, source).value_or(0);
  const int64_t default_head_dim =
      fam && fam->default_head_dim ? fam->default_head_dim : d.hidden_size / d.n_heads;
  d.head_dim = opt_count(j, "head_dim", ConfigCount::kHeadDim, source).value_or(default_head_dim);
  if (d.head_dim <= 0) bad(source, "neither 'head_dim' nor 'hidden_size' gives the head dim");

  d.sliding_window = opt_count(j, "sliding_window", ConfigCount::kContext, source)
                         .value_or(j.contains("sliding_window") || !fam ? 0 : fam->default_window);
  d.attention_chunk_size =
      opt_count(j, "attention_chunk_size", ConfigCount::kContext, source)
          .value_or(j.contains("attention_chunk_size") || !fam ? 0 : fam->default_chunk);
  if (auto it = j.find("compress_rates"); it != j.end() && !it->is_null()) {
    if (!it->is_object())
      bad(source, "config field 'compress_rates' must be an object of layer type -> rate");
    for (auto& [k, v] : it->items()) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1)
        bad(source, "compress_rates." + k + " must be a positive integer");
      d.compress_rates[k] = check_config_count(source, "compress_rates." + k, v.get<int64_t>(),
                                               ConfigCount::kContext);
    }
  }

  if (v4) {
    // DeepseekV4Config: compress_rates defaults per type; the legacy scalars override them.
    d.compress_rates.try_emplace("compressed_sparse_attention", 4);
    d.compress_rates.try_emplace("heavily_compressed_attention", 128);
    for (const auto& [key, type] :
         {std::pair{"compress_rate_csa", "compressed_sparse_attention"},
          std::pair{"compress_rate_hca", "heavily_compressed_attention"}}) {
      if (const std::optional<int64_t> r = opt_count(j, key, ConfigCount::kContext, source)) {
        if (*r < 1) bad(source, std::string("config field '") + key + "' must be positive");
        d.compress_rates[type] = *r;
      }
    }
  }

  const bool explicit_types = j.contains("layer_types") && !j["layer_types"].is_null();
  if (explicit_types) {
    const json& lt = j["layer_types"];
    if (!lt.is_array()) bad(source, "config field 'layer_types' must be a list of strings");
    for (const json& t : lt) {
      if (!t.is_string()) bad(source, "config field 'layer_types' must be a list of strings");
      d.layer_types.push_back(t.get<std::string>());
    }
    // DeepseekV4Config keeps the first num_hidden_layers entries.
    if (v4 && static_cast<int64_t>(d.layer_types.size()) > d.n_layers)
      d.layer_types.resize(static_cast<size_t>(d.n_layers));
    if (static_cast<int64_t>(d.layer_types.size()) != d.n_layers)
      bad(source, "'layer_types' has " + std::to_string(d.layer_types.size()) +
                      " entries but num_hidden_layers is " + std::to_string(d.n_layers));
  } else {
    d.layer_types = derived_layer_types(j, fam, d, source);
  }
  check_layer_types(d, source, explicit_types);
  if (std::find(d.layer_types.begin(), d.layer_types.end(), "compressed_sparse_attention") !=
      d.layer_types.end()) {
    d.index_head_dim = opt_count(j, "index_head_dim", ConfigCount::kHeadDim, source).value_or(128);
    if (d.index_head_dim <= 0) bad(source, "config field 'index_head_dim' must be positive");
  }

  d.num_kv_shared_layers =
      opt_count(j, "num_kv_shared_layers", ConfigCount::kLayers, source).value_or(0);
  if (d.num_kv_shared_layers < 0 || d.num_kv_shared_layers >= d.n_layers)
    bad(source, "config field 'num_kv_shared_layers' = " + std::to_string(d.num_kv_shared_layers) +
                    " must be in [0, num_hidden_layers)");

  if (const std::optional<int64_t> r =
          opt_count(j, "kv_lora_rank", ConfigCount::kHeadDim, source)) {
    d.kv_lora_rank = *r;
    if (d.kv_lora_rank <= 0) bad(source, "config field 'kv_lora_rank' must be positive");
    d.qk_rope_head_dim = req_count(j, "qk_rope_head_dim", ConfigCount::kHeadDim, source);
    d.qk_nope_head_dim = req_count(j, "qk_nope_head_dim", ConfigCount::kHeadDim, source);
    d.v_head_dim = req_count(j, "v_head_dim", ConfigCount::kHeadDim, source);
  }

  const auto hv = opt_count(j, "linear_num_value_heads", ConfigCount::kHeads, source);
  const auto hk = opt_count(j, "linear_num_key_heads", ConfigCount::kHeads, source);
  const auto dk = opt_count(j, "linear_key_head_dim", ConfigCount::kHeadDim, source);
  const auto dv = opt_count(j, "linear_value_head_dim", ConfigCount::kHeadDim, source);
  const auto kc = opt_count(j, "linear_conv_kernel_dim", ConfigCount::kHeadDim, source);
  if (hv && hk && dk && dv && kc) {
    const int64_t d_qkv = 2 * *hk * *dk + *hv * *dv;
    d.linear_state_elems = *hv * *dk * *dv + (*kc - 1) * d_qkv;
    d.linear_heads_k = *hk;
    d.linear_heads_v = *hv;
    d.linear_head_dim_k = *dk;
    d.linear_head_dim_v = *dv;
    d.linear_conv_kernel = *kc;
  }
  return d;
}

DecoderLayout read_decoder_layout(const GgufFile& g) {
  const std::string& path = g.path();
  const std::string arch = g.get_string_or("general.architecture", "");
  if (arch.empty()) bad(path, "metadata 'general.architecture' is missing: not a model GGUF");
  const auto key = [&](const char* k) { return arch + "." + k; };
  const auto count = [&](const char* k, ConfigCount kind) {
    return check_config_count(path, key(k), g.get_int(key(k)), kind);
  };
  const auto count_or = [&](const char* k, int64_t fallback, ConfigCount kind) {
    return check_config_count(path, key(k), g.get_int_or(key(k), fallback), kind);
  };
  DecoderLayout d;
  d.n_layers = count("block_count", ConfigCount::kLayers);
  d.n_heads = count("attention.head_count", ConfigCount::kHeads);
  if (d.n_layers <= 0 || d.n_heads <= 0)
    bad(path, key("block_count") + " and " + key("attention.head_count") + " must be positive");
  d.n_kv_heads = count_or("attention.head_count_kv", d.n_heads, ConfigCount::kHeads);
  d.hidden_size = count("embedding_length", ConfigCount::kHiddenSize);
  d.head_dim = count_or("attention.key_length", d.hidden_size / d.n_heads, ConfigCount::kHeadDim);
  d.max_position_embeddings = count_or("context_length", 0, ConfigCount::kContext);
  d.sliding_window = count_or("attention.sliding_window", 0, ConfigCount::kContext);
  d.layer_types = generic_layer_types(d.n_layers, d.sliding_window, 0);
  if (const int64_t r = count_or("attention.kv_lora_rank", 0, ConfigCount::kHeadDim); r > 0) {
    // llama.cpp's deepseek2: key_length = qk_nope + qk_rope, rope.dimension_count = qk_rope.
    d.kv_lora_rank = r;
    d.qk_rope_head_dim = count("rope.dimension_count", ConfigCount::kHeadDim);
    d.qk_nope_head_dim = d.head_dim - d.qk_rope_head_dim;
    d.v_head_dim = count_or("attention.value_length", d.head_dim, ConfigCount::kHeadDim);
  }
  // Only architectures we run are billed (their entry knows the per-layer pattern); the counts
  // above are checked first, whatever the architecture.
  const GgufArchitecture& entry = find_gguf_architecture(arch, path);
  d.family = entry.family;
  if (entry.read_layout != nullptr) entry.read_layout(g, d);
  return d;
}

}  // namespace kvcache
