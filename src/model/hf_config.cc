#include "model/hf_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "core/error.h"

namespace kvcache {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(ErrorKind::kFormat, source + ": " + what);
}

int64_t get_int(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) bad(source, std::string("config field '") + key + "' is missing");
  if (!it->is_number_integer()) bad(source, std::string("config field '") + key + "' must be an integer");
  return it->get<int64_t>();
}
int64_t get_int_or(const json& j, const char* key, int64_t fallback, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return get_int(j, key, source);
}
double get_num_or(const json& j, const char* key, double fallback, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) bad(source, std::string("config field '") + key + "' must be a number");
  return it->get<double>();
}
bool get_bool_or(const json& j, const char* key, bool fallback, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad(source, std::string("config field '") + key + "' must be true or false");
  return it->get<bool>();
}
// bos/eos ids may be an int or a list of ints (Llama 3.1 lists several EOS ids): take the first.
int32_t token_id(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return -1;
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) return (*it)[0].get<int32_t>();
  if (it->is_number_integer()) return it->get<int32_t>();
  bad(source, std::string("config field '") + key + "' must be an integer or a list of integers");
}

}  // namespace

std::vector<float> llama3_rope_freq_factors(float rope_theta, int64_t head_dim, const RopeScaling& s) {
  // Follows the definition in Meta's Llama 3.1 reference (apply_scaling) as restated by
  // llama.cpp's converter (per-pair divisors); computed in double, stored as float.
  std::vector<float> out(static_cast<size_t>(head_dim / 2));
  const double orig = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = orig / s.low_freq_factor;
  const double high_wavelen = orig / s.high_freq_factor;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double freq = std::pow(static_cast<double>(rope_theta), -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double f;
    if (wavelen < high_wavelen) {
      f = 1.0;
    } else if (wavelen > low_wavelen) {
      f = s.factor;
    } else {
      const double smooth = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / s.factor + smooth);
    }
    out[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return out;
}

namespace {
ModelConfig parse_hf_config_unchecked(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    bad(source, std::string("invalid JSON: ") + e.what());
  }
  if (!j.is_object()) bad(source, "config.json must be a JSON object");
  std::string arch;
  if (auto it = j.find("architectures"); it != j.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    arch = (*it)[0].get<std::string>();
  }
  std::string model_type = j.value("model_type", std::string());
  ModelConfig c;
  if (arch == "LlamaForCausalLM" || (arch.empty() && model_type == "llama")) {
    c.architecture = "llama";
  } else if (arch == "MistralForCausalLM" || (arch.empty() && model_type == "mistral")) {
    c.architecture = "mistral";
  } else if (arch == "Qwen2ForCausalLM" || (arch.empty() && model_type == "qwen2")) {
    c.architecture = "qwen2";
  } else {
    throw Error(ErrorKind::kUnsupported,
                source + ": architecture '" + (arch.empty() ? model_type : arch) +
                    "' is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)");
  }
  c.dim = get_int(j, "hidden_size", source);
  c.n_layers = get_int(j, "num_hidden_layers", source);
  c.n_heads = get_int(j, "num_attention_heads", source);
  c.n_kv_heads = get_int_or(j, "num_key_value_heads", c.n_heads, source);
  c.head_dim = get_int_or(j, "head_dim", c.n_heads > 0 ? c.dim / c.n_heads : 0, source);
  c.hidden_dim = get_int(j, "intermediate_size", source);
  c.vocab_size = get_int(j, "vocab_size", source);
  c.max_seq_len = get_int_or(j, "max_position_embeddings", 2048, source);
  c.rms_eps = static_cast<float>(get_num_or(j, "rms_norm_eps", 1e-6, source));
  c.tie_word_embeddings = get_bool_or(j, "tie_word_embeddings", false, source);
  c.rope_interleaved = false;  // HF checkpoints keep q/k rows in rotate_half order
  c.bos_id = token_id(j, "bos_token_id", source);
  c.eos_id = token_id(j, "eos_token_id", source);
  if (c.architecture == "qwen2") {
    c.qkv_bias = true;
  } else if (get_bool_or(j, "attention_bias", false, source)) {
    throw Error(ErrorKind::kUnsupported, source + ": attention_bias (bias on q/k/v/o projections) is supported only for Qwen2");
  }
  if (get_bool_or(j, "mlp_bias", false, source)) throw Error(ErrorKind::kUnsupported, source + ": mlp_bias is not supported");
  if (auto it = j.find("hidden_act"); it != j.end() && it->is_string() && *it != "silu") {
    throw Error(ErrorKind::kUnsupported, source + ": hidden_act '" + it->get<std::string>() + "' is not supported (silu)");
  }

  // RoPE: transformers v5 nests theta and scaling in rope_parameters; v4 has rope_theta and
  // rope_scaling at the top level.
  const json* rope = nullptr;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) rope = &*it;
  c.rope_theta = static_cast<float>(rope ? get_num_or(*rope, "rope_theta", get_num_or(j, "rope_theta", 10000.0, source), source)
                                         : get_num_or(j, "rope_theta", 10000.0, source));
  if (!rope) {
    if (auto it = j.find("rope_scaling"); it != j.end() && it->is_object()) rope = &*it;
  }
  if (rope) {
    std::string type = rope->value("rope_type", rope->value("type", std::string("default")));
    RopeScaling& s = c.rope_scaling;
    if (type == "default") {
      // no scaling
    } else if (type == "linear") {
      s.type = RopeScalingType::kLinear;
      s.factor = static_cast<float>(get_num_or(*rope, "factor", 1.0, source));
      if (!(s.factor > 0.0f)) bad(source, "rope_scaling.factor must be positive");
      c.rope_freq_factors.assign(static_cast<size_t>(c.head_dim / 2), s.factor);
    } else if (type == "llama3") {
      s.type = RopeScalingType::kLlama3;
      s.factor = static_cast<float>(get_num_or(*rope, "factor", 8.0, source));
      s.low_freq_factor = static_cast<float>(get_num_or(*rope, "low_freq_factor", 1.0, source));
      s.high_freq_factor = static_cast<float>(get_num_or(*rope, "high_freq_factor", 4.0, source));
      s.original_max_position_embeddings = get_int_or(*rope, "original_max_position_embeddings", 8192, source);
      if (!(s.factor > 0.0f) || !(s.high_freq_factor > s.low_freq_factor) || s.original_max_position_embeddings <= 0) {
        bad(source, "rope_scaling llama3 needs factor > 0, high_freq_factor > low_freq_factor, original_max_position_embeddings > 0");
      }
      c.rope_freq_factors = llama3_rope_freq_factors(c.rope_theta, c.head_dim, s);
    } else {
      throw Error(ErrorKind::kUnsupported, source + ": rope_scaling type '" + type + "' is not supported (linear, llama3)");
    }
  }

  // Sliding window and per-layer types.
  if (c.architecture == "mistral") {
    c.sliding_window = get_int_or(j, "sliding_window", 0, source);
  } else if (c.architecture == "qwen2") {
    if (get_bool_or(j, "use_sliding_window", false, source)) c.sliding_window = get_int_or(j, "sliding_window", 0, source);
  }
  if (auto it = j.find("layer_types"); it != j.end() && it->is_array()) {
    for (const auto& t : *it) {
      if (!t.is_string()) bad(source, "layer_types must be a list of strings");
      c.layer_types.push_back(t.get<std::string>());
    }
  } else if (c.architecture == "qwen2" && c.sliding_window > 0) {
    // transformers' Qwen2Config: layers from max_window_layers on use the window.
    const int64_t max_window_layers = get_int_or(j, "max_window_layers", 28, source);
    for (int64_t l = 0; l < c.n_layers; ++l) {
      c.layer_types.push_back(l >= max_window_layers ? "sliding_attention" : "full_attention");
    }
  }
  bool any_sliding = false;
  for (const auto& t : c.layer_types) any_sliding |= t == "sliding_attention";
  if (!any_sliding && !c.layer_types.empty()) c.sliding_window = 0;
  c.fill_defaults();
  c.validate(source);
  return c;
}
}  // namespace

// A field of the wrong JSON type (a number where a string belongs, ...) is bad input like any
// other: reported as Error(kFormat) naming the file, never as a raw library exception.
ModelConfig parse_hf_config(const std::string& text, const std::string& source) {
  try {
    return parse_hf_config_unchecked(text, source);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kFormat, source + ": a field has the wrong JSON type (" + e.what() + ")");
  }
}

ModelConfig load_hf_config(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_hf_config(ss.str(), path);
}

}  // namespace kvcache
