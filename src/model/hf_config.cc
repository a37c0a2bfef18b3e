#include "model/hf_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numbers>
#include <sstream>

#include "core/error.h"
#include "model/config_limits.h"
#include "model/decoder_layout.h"

namespace kvcache {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(ErrorKind::kFormat, source + ": " + what);
}

int64_t get_int(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null())
    bad(source, std::string("config field '") + key + "' is missing");
  if (!it->is_number_integer())
    bad(source, std::string("config field '") + key + "' must be an integer");
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    bad(source, std::string("config field '") + key + "' = " + std::to_string(it->get<uint64_t>()) +
                    " is too large");
  }
  return it->get<int64_t>();
}
int64_t get_int_or(const json& j, const char* key, int64_t fallback, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return get_int(j, key, source);
}
// Counts (layers, heads, sizes, ...) are checked against config_limits.h as they are read,
// before anything is sized or looped over from them.
int64_t get_count(const json& j, const char* key, ConfigCount kind, const std::string& source) {
  return check_config_count(source, key, get_int(j, key, source), kind);
}
int64_t get_count_or(const json& j, const char* key, int64_t fallback, ConfigCount kind,
                     const std::string& source) {
  return check_config_count(source, key, get_int_or(j, key, fallback, source), kind);
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
  if (!it->is_boolean())
    bad(source, std::string("config field '") + key + "' must be true or false");
  return it->get<bool>();
}
// bos/eos ids may be an int or a list of ints (Llama 3.1 lists several EOS ids): take the first.
int32_t token_id(const json& j, const char* key, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return -1;
  if (it->is_array() && !it->empty() && (*it)[0].is_number_integer())
    return (*it)[0].get<int32_t>();
  if (it->is_number_integer()) return it->get<int32_t>();
  bad(source, std::string("config field '") + key + "' must be an integer or a list of integers");
}

}  // namespace

std::vector<float> llama3_rope_freq_factors(float rope_theta, int64_t head_dim,
                                            const RopeScaling& s) {
  // Follows the definition in Meta's Llama 3.1 reference (apply_scaling) as restated by
  // llama.cpp's converter (per-pair divisors); computed in double, stored as float.
  std::vector<float> out(static_cast<size_t>(head_dim / 2));
  const double orig = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = orig / s.low_freq_factor;
  const double high_wavelen = orig / s.high_freq_factor;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double freq = std::pow(static_cast<double>(rope_theta),
                                 -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double f;
    if (wavelen < high_wavelen) {
      f = 1.0;
    } else if (wavelen > low_wavelen) {
      f = s.factor;
    } else {
      const double smooth =
          (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / s.factor + smooth);
    }
    out[static_cast<size_t>(i)] = static_cast<float>(f);
  }
  return out;
}

double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

YarnResult yarn_rope(float rope_theta, int64_t dim, const YarnParams& y) {
  // transformers modeling_rope_utils._compute_yarn_parameters, in double then rounded to float:
  // inv_freq = inv_extrapolation * e + inv_interpolation * (1 - e) with e = 1 - ramp, i.e. a
  // per-pair divisor 1 / (e + (1 - e) / factor).
  YarnResult r;
  const double base = rope_theta;
  const double orig = static_cast<double>(y.original_max_position_embeddings);
  if (y.attention_factor > 0.0) {
    r.attention_factor = y.attention_factor;
  } else if (y.mscale != 0.0 && y.mscale_all_dim != 0.0) {
    r.attention_factor =
        yarn_get_mscale(y.factor, y.mscale) / yarn_get_mscale(y.factor, y.mscale_all_dim);
  } else {
    r.attention_factor = yarn_get_mscale(y.factor, 1.0);
  }
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(orig / (rotations * 2.0 * std::numbers::pi))) /
           (2.0 * std::log(base));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  r.freq_factors.resize(static_cast<size_t>(dim / 2));
  for (int64_t i = 0; i < dim / 2; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    const double e = 1.0 - ramp;  // inv_freq_extrapolation_factor
    r.freq_factors[static_cast<size_t>(i)] = static_cast<float>(1.0 / (e + (1.0 - e) / y.factor));
  }
  return r;
}

namespace {

// ModelConfig::architecture (what a registered family serves, model/family.h) by the
// checkpoint's architectures[0], or by its model_type when it names none.
struct HfArchitecture {
  const char* hf_class;
  const char* model_type;
  const char* architecture;
};
constexpr HfArchitecture kHfArchitectures[] = {
    {"LlamaForCausalLM", "llama", "llama"},
    {"MistralForCausalLM", "mistral", "mistral"},
    {"Qwen2ForCausalLM", "qwen2", "qwen2"},
    {"Gemma2ForCausalLM", "gemma2", "gemma2"},
    {"GptOssForCausalLM", "gpt_oss", "gpt_oss"},
    {"Gemma3nForCausalLM", "gemma3n_text", "gemma3n"},
    {"DeepseekV3ForCausalLM", "deepseek_v3", "deepseek_v3"},
    {"DeepseekV2ForCausalLM", "deepseek_v2", "deepseek_v2"},
    {"Qwen3NextForCausalLM", "qwen3_next", "qwen3_next"},
    {"DeepseekV4ForCausalLM", "deepseek_v4", "deepseek_v4"},
    {"Qwen3ForCausalLM", "qwen3", "qwen3"},
    {"Phi3ForCausalLM", "phi3", "phi3"},
    {"Gemma3ForCausalLM", "gemma3_text", "gemma3"},
};

// Which family-specific keys and defaults apply.
struct FamilyKeys {
  bool gemma2 = false, gemma3n = false, gpt_oss = false, deepseek = false, qwen3_next = false;
  bool deepseek_v4 = false, qwen3 = false, phi3 = false, gemma3 = false;
};
FamilyKeys family_keys(const std::string& architecture) {
  FamilyKeys f;
  f.gemma2 = architecture == "gemma2";
  f.gemma3n = architecture == "gemma3n";
  f.gpt_oss = architecture == "gpt_oss";
  f.deepseek = architecture == "deepseek_v2" || architecture == "deepseek_v3";
  f.qwen3_next = architecture == "qwen3_next";
  f.deepseek_v4 = architecture == "deepseek_v4";
  f.qwen3 = architecture == "qwen3";
  f.phi3 = architecture == "phi3";
  f.gemma3 = architecture == "gemma3";
  return f;
}

json parse_json_object(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(source, std::string("invalid JSON: ") + e.what());
  }
  if (!j.is_object()) bad(source, "config.json must be a JSON object");
  return j;
}

std::string first_architecture(const json& root) {
  if (auto it = root.find("architectures");
      it != root.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
    return (*it)[0].get<std::string>();
  }
  return {};
}

// The released Gemma-3n checkpoints are multimodal; the text decoder's config is text_config
// (with the root's bos/eos ids when it lacks them) and its tensors live under
// model.language_model (the loader maps them to model.).
bool is_multimodal_gemma3n(const std::string& arch, const std::string& model_type) {
  return arch == "Gemma3nForConditionalGeneration" || (arch.empty() && model_type == "gemma3n");
}
// Gemma3ForConditionalGeneration likewise (models/gemma3/modeling_gemma3.py: its
// language_model is a Gemma3TextModel configured by text_config).
bool is_multimodal_gemma3(const std::string& arch, const std::string& model_type) {
  return arch == "Gemma3ForConditionalGeneration" || (arch.empty() && model_type == "gemma3");
}
json gemma3n_text_config(const json& root, const std::string& source,
                         const char* wrapper = "Gemma3nForConditionalGeneration") {
  auto it = root.find("text_config");
  if (it == root.end() || !it->is_object()) {
    bad(source, std::string(wrapper) + " needs a text_config object");
  }
  json t = *it;
  for (const char* k : {"bos_token_id", "eos_token_id"})
    if (!t.contains(k) && root.contains(k)) t[k] = root[k];
  return t;
}

std::string architecture_of(const std::string& arch, const std::string& model_type,
                            const std::string& source) {
  for (const HfArchitecture& a : kHfArchitectures) {
    if (arch == a.hf_class || (arch.empty() && model_type == a.model_type)) return a.architecture;
  }
  throw Error(ErrorKind::kUnsupported,
              source + ": architecture '" + (arch.empty() ? model_type : arch) +
                  "' is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                  "Gemma2ForCausalLM, Gemma3nForCausalLM, Gemma3nForConditionalGeneration (text), "
                  "GptOssForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM, "
                  "Qwen3NextForCausalLM, DeepseekV4ForCausalLM, Qwen3ForCausalLM, "
                  "Phi3ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration (text))");
}

// intermediate_size: one FFN size, or (Gemma3nTextConfig) one per layer or one for all.
void read_ffn_size(const json& j, const FamilyKeys& f, ModelConfig& c, const std::string& source) {
  if (auto it = j.find("intermediate_size"); f.gemma3n && it != j.end() && it->is_array()) {
    for (const auto& v : *it) {
      if (!v.is_number_integer()) bad(source, "intermediate_size entries must be integers");
      c.gemma3n.intermediate_sizes.push_back(
          check_config_count(source, "intermediate_size", v.get<int64_t>(), ConfigCount::kFfnSize));
    }
    if (c.gemma3n.intermediate_sizes.empty()) bad(source, "intermediate_size is an empty list");
    c.hidden_dim =
        *std::max_element(c.gemma3n.intermediate_sizes.begin(), c.gemma3n.intermediate_sizes.end());
  } else if (f.deepseek_v4) {
    // DeepseekV4Config maps intermediate_size to moe_intermediate_size (the shared expert's).
    c.hidden_dim = get_count_or(j, "moe_intermediate_size", 2048, ConfigCount::kFfnSize, source);
  } else {
    c.hidden_dim = get_count(j, "intermediate_size", ConfigCount::kFfnSize, source);
  }
}

// The keys every family has: sizes, context, norm epsilon, tied embeddings, special tokens.
// Everything that shapes the cache (layers, heads, head dim, layer types, windows, sharing, MLA
// dims) comes from the reader `kvcache plan` uses too; the layout is returned for later steps.
DecoderLayout read_common_keys(const json& root, const json& j, const FamilyKeys& f, ModelConfig& c,
                               const std::string& source) {
  c.dim = get_count(j, "hidden_size", ConfigCount::kHiddenSize, source);
  DecoderLayout layout = read_decoder_layout(root, j, source);
  c.n_layers = layout.n_layers;
  c.n_heads = layout.n_heads;
  c.n_kv_heads = layout.n_kv_heads;
  c.head_dim = layout.head_dim;
  read_ffn_size(j, f, c, source);
  c.vocab_size = get_count(j, "vocab_size", ConfigCount::kVocab, source);
  c.max_seq_len = get_count_or(j, "max_position_embeddings", 2048, ConfigCount::kContext, source);
  c.rms_eps = static_cast<float>(get_num_or(j, "rms_norm_eps", 1e-6, source));
  c.tie_word_embeddings =
      get_bool_or(j, "tie_word_embeddings", f.gemma2 || f.gemma3n || f.gemma3, source);
  c.rope_interleaved = false;  // HF checkpoints keep q/k rows in rotate_half order
  c.bos_id = token_id(j, "bos_token_id", source);
  c.eos_id = token_id(j, "eos_token_id", source);
  return layout;
}

// attention_bias / mlp_bias, and the FFN activation.
void read_bias_and_activation(const json& j, const FamilyKeys& f, ModelConfig& c,
                              const std::string& source) {
  const bool attention_bias = get_bool_or(j, "attention_bias", f.gpt_oss, source);
  if (c.architecture == "qwen2") {
    c.qkv_bias = true;
  } else if (f.gemma2 || f.gemma3n || f.gpt_oss || f.gemma3 || f.qwen3) {
    // Qwen3Attention / Gemma3Attention: attention_bias on q/k/v and o_proj alike.
    c.qkv_bias = attention_bias;
    c.attn_out_bias = attention_bias;
  } else if (attention_bias) {
    throw Error(ErrorKind::kUnsupported,
                source +
                    ": attention_bias = true (bias on q/k/v/o projections) is not supported for " +
                    c.architecture);
  }
  if (get_bool_or(j, "mlp_bias", false, source)) {
    throw Error(ErrorKind::kUnsupported, source + ": mlp_bias is not supported");
  }
  // Gemma calls the field hidden_activation (older configs: hidden_act); GPT-OSS experts use
  // their own clamped SwiGLU whatever hidden_act says.
  std::string act = f.gemma2 || f.gemma3n || f.gemma3 ? "gelu_pytorch_tanh" : "silu";
  for (const char* key : {"hidden_activation", "hidden_act"}) {
    if (auto it = j.find(key); it != j.end() && it->is_string()) {
      act = it->get<std::string>();
      break;
    }
  }
  if (act == "gelu_pytorch_tanh" && !f.gpt_oss) {
    c.ffn_act = FfnActivation::kGeluTanh;
  } else if (act != "silu" && !f.gpt_oss) {
    throw Error(ErrorKind::kUnsupported,
                source + ": hidden_act '" + act + "' is not supported (silu, gelu_pytorch_tanh)");
  }
}

// A logit softcap with its family's default when absent; an explicit null disables it.
float softcap_or(const json& j, const char* key, double fallback, const std::string& source) {
  if (auto it = j.find(key); it != j.end() && it->is_null()) return 0.0f;
  return static_cast<float>(get_num_or(j, key, fallback, source));
}

// models/gemma2/modeling_gemma2.py: Gemma2RMSNorm (1 + w), embeddings x sqrt(hidden_size),
// scaling = query_pre_attn_scalar ** -0.5, tanh softcaps on attention logits and logits, and
// the four norms per layer.
void read_gemma2_keys(const json& j, ModelConfig& c, const std::string& source) {
  c.norm_add_one = true;
  c.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c.dim)));
  c.sandwich_norms = true;
  c.query_scale =
      static_cast<float>(std::pow(get_num_or(j, "query_pre_attn_scalar", 256.0, source), -0.5));
  c.attn_softcap = softcap_or(j, "attn_logit_softcapping", 50.0, source);
  c.final_softcap = softcap_or(j, "final_logit_softcapping", 30.0, source);
}

// models/gemma3/modeling_gemma3.py (Gemma3TextConfig defaults): Gemma-2's (1 + w) norms,
// sqrt(hidden_size) embedding scale, sandwich norms and query_pre_attn_scalar ** -0.5, plus
// Gemma3Attention's q_norm / k_norm (Gemma3RMSNorm, also 1 + w) before RoPE; both softcaps
// default to None (no softcap) but are applied when a config sets them.
void read_gemma3_keys(const json& j, ModelConfig& c, const std::string& source) {
  c.norm_add_one = true;
  c.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c.dim)));
  c.sandwich_norms = true;
  c.qk_norm = true;
  c.query_scale =
      static_cast<float>(std::pow(get_num_or(j, "query_pre_attn_scalar", 256.0, source), -0.5));
  c.attn_softcap = softcap_or(j, "attn_logit_softcapping", 0.0, source);
  c.final_softcap = softcap_or(j, "final_logit_softcapping", 0.0, source);
}

// models/qwen3/modeling_qwen3.py, Qwen3Attention: q_norm / k_norm (Qwen3RMSNorm: w, not 1 + w)
// over head_dim on q and k before RoPE; the rest is Llama's block with transformers' names.
void read_qwen3_keys(ModelConfig& c) {
  c.qk_norm = true;
}

// models/phi3/modeling_phi3.py: fused qkv_proj and gate_up_proj (the family splits them into
// views), RoPE on the first int(head_dim * partial_rotary_factor) dims of each head. The
// longrope scaling of the 128k checkpoints switches between short_factor and long_factor by
// the sequence length (Phi3ForCausalLM.prepare_inputs_for_generation drops the cache at the
// switch), which a cache that keeps rotated keys cannot follow: refused by name.
void read_phi3_keys(const json& j, ModelConfig& c, const std::string& source) {
  double partial = get_num_or(j, "partial_rotary_factor", 1.0, source);
  const json* rope = nullptr;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    rope = &*it;
    partial = get_num_or(*it, "partial_rotary_factor", partial, source);
  } else if (auto it2 = j.find("rope_scaling"); it2 != j.end() && it2->is_object()) {
    rope = &*it2;
  }
  c.partial_rotary_factor = static_cast<float>(partial);
  if (rope) {
    const std::string type = rope->value("rope_type", rope->value("type", std::string("default")));
    if (type == "longrope" || type == "su") {
      throw Error(ErrorKind::kUnsupported,
                  source + ": rope_scaling type '" + type +
                      "' (Phi-3 LongRoPE, short_factor / long_factor switched by sequence "
                      "length) is not supported; use a checkpoint without rope_scaling "
                      "(e.g. Phi-3-mini-4k)");
    }
  }
}

// Gemma3TextConfig: sliding layers rotate with rope_local_base_freq and default RoPE, full
// layers with rope_theta and rope_scaling (linear in the 4B+ checkpoints); v5 nests both in
// rope_parameters.{full_attention, sliding_attention}. Returns the full layers' scaling object
// (or null).
const json* read_gemma3_rope_thetas(const json& j, const json* rope, ModelConfig& c,
                                    const std::string& source) {
  c.rope_local_theta = static_cast<float>(get_num_or(j, "rope_local_base_freq", 10000.0, source));
  const json* scaling = rope;
  if (rope && rope->contains("full_attention")) {
    const json& full = (*rope)["full_attention"];
    if (!full.is_object()) bad(source, "rope_parameters.full_attention must be an object");
    if (auto it = rope->find("sliding_attention"); it != rope->end()) {
      if (!it->is_object() || it->value("rope_type", std::string("default")) != "default")
        throw Error(ErrorKind::kUnsupported,
                    source +
                        ": Gemma-3 rope_parameters.sliding_attention other than rope_type "
                        "'default' is not supported");
      c.rope_local_theta = static_cast<float>(get_num_or(*it, "rope_theta", 10000.0, source));
    }
    c.rope_theta = static_cast<float>(get_num_or(full, "rope_theta", 1000000.0, source));
    scaling = &full;
  }
  if (scaling) {
    // make_hf_gqa gives both layer kinds the one attention factor: only scalings without one.
    const std::string type =
        scaling->value("rope_type", scaling->value("type", std::string("default")));
    if (type != "default" && type != "linear")
      throw Error(ErrorKind::kUnsupported, source + ": Gemma-3 rope_scaling type '" + type +
                                               "' is not supported (default, linear)");
  }
  if (!(c.rope_local_theta > 0.0f)) bad(source, "rope_local_base_freq must be positive");
  return scaling;
}

// Gemma3nTextConfig's activation_sparsity_pattern: one value in [0, 1) per layer.
void read_gemma3n_sparsity(const json& j, ModelConfig& c, const std::string& source) {
  Gemma3nConfig& g = c.gemma3n;
  if (auto it = j.find("activation_sparsity_pattern"); it != j.end() && it->is_array()) {
    for (const auto& v : *it) {
      if (!v.is_number()) bad(source, "activation_sparsity_pattern entries must be numbers");
      g.activation_sparsity.push_back(v.get<float>());
    }
  } else {
    // Gemma3nTextConfig: 0.95 on the first 10 layers when there are more than 10.
    const int64_t sparse = c.n_layers > 10 ? 10 : 0;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      g.activation_sparsity.push_back(l < sparse ? 0.95f : 0.0f);
    }
  }
  if (static_cast<int64_t>(g.activation_sparsity.size()) != c.n_layers) {
    bad(source, "activation_sparsity_pattern has " + std::to_string(g.activation_sparsity.size()) +
                    " entries for " + std::to_string(c.n_layers) + " layers");
  }
  for (float sp : g.activation_sparsity) {
    if (!(sp >= 0.0f && sp < 1.0f))
      bad(source, "activation_sparsity_pattern values must be in [0, 1)");
  }
}

// models/gemma3n/modeling_gemma3n.py: Gemma3nRMSNorm multiplies by w (not 1 + w), the embedding
// by sqrt(hidden_size), attention scaling 1.0 with q/k/v norms, sandwich norms, final logit
// softcap, AltUp / Laurel / per-layer inputs (Gemma3nConfig).
void read_gemma3n_keys(const json& j, ModelConfig& c, const std::string& source) {
  c.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c.dim)));
  c.sandwich_norms = true;
  c.qkv_norm = true;
  c.query_scale = 1.0f;
  c.final_softcap = softcap_or(j, "final_logit_softcapping", 30.0, source);
  if (auto it = j.find("attn_logit_softcapping"); it != j.end() && !it->is_null()) {
    throw Error(
        ErrorKind::kUnsupported,
        source +
            ": attn_logit_softcapping is not used by Gemma-3n; refusing a config that sets it");
  }
  Gemma3nConfig& g = c.gemma3n;
  g.altup_num_inputs = get_count_or(j, "altup_num_inputs", 4, ConfigCount::kHeads, source);
  g.altup_active_idx = get_int_or(j, "altup_active_idx", 0, source);
  g.altup_coef_clip = static_cast<float>(get_num_or(j, "altup_coef_clip", 120.0, source));
  g.altup_correct_scale = get_bool_or(j, "altup_correct_scale", true, source);
  g.laurel_rank = get_count_or(j, "laurel_rank", 64, ConfigCount::kHeadDim, source);
  g.hidden_size_per_layer_input =
      get_count_or(j, "hidden_size_per_layer_input", 256, ConfigCount::kHiddenSize, source);
  g.vocab_size_per_layer_input =
      get_count_or(j, "vocab_size_per_layer_input", 262144, ConfigCount::kVocab, source);
  if (g.altup_active_idx != 0) {
    throw Error(ErrorKind::kUnsupported,
                source + ": altup_active_idx = " + std::to_string(g.altup_active_idx) +
                    " is not supported (0)");
  }
  if (g.altup_num_inputs < 1 || g.laurel_rank <= 0 || g.hidden_size_per_layer_input <= 0 ||
      g.vocab_size_per_layer_input <= 0) {
    bad(source,
        "altup_num_inputs, laurel_rank, hidden_size_per_layer_input and vocab_size_per_layer_input "
        "must be positive");
  }
  if (g.intermediate_sizes.empty()) {
    g.intermediate_sizes.assign(static_cast<size_t>(c.n_layers), c.hidden_dim);
  }
  if (static_cast<int64_t>(g.intermediate_sizes.size()) != c.n_layers) {
    bad(source, "intermediate_size has " + std::to_string(g.intermediate_sizes.size()) +
                    " entries for " + std::to_string(c.n_layers) + " layers");
  }
  read_gemma3n_sparsity(j, c, source);
}

// models/gpt_oss/modeling_gpt_oss.py: sinks per head, MoE of every layer.
void read_gpt_oss_keys(const json& j, ModelConfig& c, const std::string& source) {
  c.attn_sinks = true;
  MoeConfig& m = c.moe;
  m.router = MoeRouter::kGptOss;
  m.n_experts = get_count_or(j, "num_local_experts", 128, ConfigCount::kExperts, source);
  m.n_experts_used = get_count_or(j, "num_experts_per_tok", 4, ConfigCount::kExperts, source);
  m.expert_hidden_dim = c.hidden_dim;
  m.swiglu_alpha = static_cast<float>(get_num_or(j, "swiglu_alpha", 1.702, source));
  m.swiglu_limit = static_cast<float>(get_num_or(j, "swiglu_limit", 7.0, source));
}

// models/deepseek_v3/modeling_deepseek_v3.py (and deepseek_v2): MLA attention.
void read_mla_keys(const json& j, const DecoderLayout& layout, ModelConfig& c,
                   const std::string& source) {
  MlaConfig& a = c.mla;
  if (layout.kv_lora_rank == 0) {
    bad(source, "config field 'kv_lora_rank' is missing: " + c.architecture + " uses MLA");
  }
  a.kv_lora_rank = layout.kv_lora_rank;
  a.q_lora_rank = get_count_or(j, "q_lora_rank", 0, ConfigCount::kHeadDim, source);
  a.qk_nope_head_dim = layout.qk_nope_head_dim;
  a.qk_rope_head_dim = layout.qk_rope_head_dim;
  a.v_head_dim = layout.v_head_dim;
  a.rope_interleave =
      c.architecture == "deepseek_v2" || get_bool_or(j, "rope_interleave", true, source);
  c.head_dim = a.qk_nope_head_dim + a.qk_rope_head_dim;
  c.n_kv_heads = c.n_heads;  // MLA configs repeat the head count; the cache ignores it
  c.query_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
}

// DeepSeek's MoE (n_routed_experts > 0) after first_k_dense_replace dense layers: V3's grouped
// sigmoid router, V2's softmax greedy one.
void read_deepseek_moe_keys(const json& j, ModelConfig& c, const std::string& source) {
  MoeConfig& m = c.moe;
  m.n_experts = get_count_or(j, "n_routed_experts", 0, ConfigCount::kExperts, source);
  if (m.n_experts <= 0) return;
  m.n_experts_used = get_count(j, "num_experts_per_tok", ConfigCount::kExperts, source);
  m.expert_hidden_dim = get_count(j, "moe_intermediate_size", ConfigCount::kFfnSize, source);
  m.n_shared_experts = get_count_or(j, "n_shared_experts", 0, ConfigCount::kExperts, source);
  m.first_dense_layers = get_count_or(j, "first_k_dense_replace", 0, ConfigCount::kLayers, source);
  m.norm_topk_prob = get_bool_or(j, "norm_topk_prob", c.architecture == "deepseek_v3", source);
  m.routed_scaling_factor = static_cast<float>(get_num_or(j, "routed_scaling_factor", 1.0, source));
  if (get_int_or(j, "moe_layer_freq", 1, source) != 1) {
    throw Error(ErrorKind::kUnsupported, source + ": moe_layer_freq other than 1 is not supported");
  }
  if (c.architecture == "deepseek_v3") {
    m.router = MoeRouter::kDeepseekV3;
    m.n_group = get_count_or(j, "n_group", 1, ConfigCount::kExperts, source);
    m.topk_group = get_count_or(j, "topk_group", 1, ConfigCount::kExperts, source);
    const std::string scoring = j.value("scoring_func", std::string("sigmoid"));
    if (scoring != "sigmoid") {
      throw Error(ErrorKind::kUnsupported, source + ": scoring_func '" + scoring +
                                               "' is not supported for deepseek_v3 (sigmoid)");
    }
  } else {
    m.router = MoeRouter::kSoftmaxGreedy;
    const std::string scoring = j.value("scoring_func", std::string("softmax"));
    if (scoring != "softmax") {
      throw Error(ErrorKind::kUnsupported, source + ": scoring_func '" + scoring +
                                               "' is not supported for deepseek_v2 (softmax)");
    }
    const std::string method = j.value("topk_method", std::string("greedy"));
    if (method != "greedy") {
      throw Error(ErrorKind::kUnsupported, source + ": topk_method '" + method +
                                               "' is not supported for deepseek_v2 (greedy)");
    }
  }
}

// models/qwen3_next/configuration_qwen3_next.py and modeling_qwen3_next.py: zero-centred
// RMSNorm (1 + w), gated attention (q_proj doubled, sigmoid output gate) with q/k norms,
// partial RoPE, Gated DeltaNet layers (linear_*), MoE with a gated shared expert.
void read_qwen3_next_keys(const json& j, ModelConfig& c, const std::string& source) {
  if (c.ffn_act != FfnActivation::kSilu) {
    // Qwen3NextGatedDeltaNet's conv activation is hidden_act too; only SiLU is run.
    throw Error(ErrorKind::kUnsupported,
                source + ": hidden_act other than silu is not supported for qwen3_next");
  }
  c.norm_add_one = true;
  c.qk_norm = true;
  c.attn_output_gate = true;
  double partial = get_num_or(j, "partial_rotary_factor", 0.25, source);
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object())
    partial = get_num_or(*it, "partial_rotary_factor", partial, source);
  c.partial_rotary_factor = static_cast<float>(partial);
  LinearAttentionConfig& a = c.linear_attn;
  a.num_key_heads = get_count_or(j, "linear_num_key_heads", 16, ConfigCount::kHeads, source);
  a.num_value_heads = get_count_or(j, "linear_num_value_heads", 32, ConfigCount::kHeads, source);
  a.key_head_dim = get_count_or(j, "linear_key_head_dim", 128, ConfigCount::kHeadDim, source);
  a.value_head_dim = get_count_or(j, "linear_value_head_dim", 128, ConfigCount::kHeadDim, source);
  a.conv_kernel = get_count_or(j, "linear_conv_kernel_dim", 4, ConfigCount::kHeadDim, source);
  if (a.num_key_heads <= 0 || a.num_value_heads <= 0 || a.key_head_dim <= 0 ||
      a.value_head_dim <= 0 || a.conv_kernel <= 0) {
    bad(source,
        "linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, "
        "linear_value_head_dim and linear_conv_kernel_dim must be positive");
  }
  MoeConfig& m = c.moe;
  m.n_experts = get_count_or(j, "num_experts", 512, ConfigCount::kExperts, source);
  if (m.n_experts <= 0) return;
  m.router = MoeRouter::kSoftmaxTopK;
  m.n_experts_used = get_count_or(j, "num_experts_per_tok", 10, ConfigCount::kExperts, source);
  m.expert_hidden_dim =
      get_count_or(j, "moe_intermediate_size", 512, ConfigCount::kFfnSize, source);
  m.shared_expert_hidden_dim =
      get_count_or(j, "shared_expert_intermediate_size", 512, ConfigCount::kFfnSize, source);
  m.shared_expert_gate = m.shared_expert_hidden_dim > 0;
  m.norm_topk_prob = get_bool_or(j, "norm_topk_prob", true, source);
  m.sparse_step = get_count_or(j, "decoder_sparse_step", 1, ConfigCount::kLayers, source);
  if (m.sparse_step <= 0) bad(source, "config field 'decoder_sparse_step' must be positive");
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) bad(source, "config field 'mlp_only_layers' must be a list of layers");
    for (const auto& v : *it) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.n_layers) {
        bad(source, "mlp_only_layers entries must be layer indices in [0, " +
                        std::to_string(c.n_layers) + ")");
      }
      m.dense_layers.push_back(v.get<int64_t>());
    }
  }
}

// models/deepseek_v4/configuration_deepseek_v4.py (DeepseekV4Config and its __post_init__, which
// folds the legacy keys in): attention, compressors and indexer, hyper-connections, MoE.
// Layer types and compress rates come from the decoder layout.
void read_deepseek_v4_keys(const json& j, const DecoderLayout& layout, ModelConfig& c,
                           const std::string& source) {
  DeepseekV4Config& v = c.deepseek_v4;
  v.q_lora_rank = get_count_or(j, "q_lora_rank", 1024, ConfigCount::kHeadDim, source);
  v.o_groups = get_count_or(j, "o_groups", 8, ConfigCount::kHeads, source);
  v.o_lora_rank = get_count_or(j, "o_lora_rank", 1024, ConfigCount::kHeadDim, source);
  v.index_n_heads = get_count_or(j, "index_n_heads", 64, ConfigCount::kHeads, source);
  v.index_head_dim = get_count_or(j, "index_head_dim", 128, ConfigCount::kHeadDim, source);
  v.index_topk = get_count_or(j, "index_topk", 512, ConfigCount::kContext, source);
  v.hc_mult = get_count_or(j, "hc_mult", 4, ConfigCount::kHeads, source);
  v.hc_sinkhorn_iters = get_count_or(j, "hc_sinkhorn_iters", 20, ConfigCount::kLayers, source);
  v.hc_eps = static_cast<float>(get_num_or(j, "hc_eps", 1e-6, source));
  v.swiglu_limit = static_cast<float>(get_num_or(j, "swiglu_limit", 10.0, source));
  if (v.q_lora_rank <= 0 || v.o_groups <= 0 || v.o_lora_rank <= 0 || v.hc_mult <= 0 ||
      v.hc_sinkhorn_iters <= 0 || v.index_n_heads <= 0 || v.index_head_dim <= 0 ||
      v.index_topk <= 0) {
    bad(source,
        "q_lora_rank, o_groups, o_lora_rank, hc_mult, hc_sinkhorn_iters, index_n_heads, "
        "index_head_dim and index_topk must be positive");
  }
  if (!(v.hc_eps >= 0.0f)) bad(source, "config field 'hc_eps' must be >= 0");
  for (const auto& [type, rate] : layout.compress_rates) {
    if (type == "compressed_sparse_attention") {
      v.csa_rate = rate;
    } else if (type == "heavily_compressed_attention") {
      v.hca_rate = rate;
    } else {
      bad(source, "compress_rates names '" + type +
                      "'; DeepSeek-V4 compresses compressed_sparse_attention and "
                      "heavily_compressed_attention only");
    }
  }
  // Partial rotary: partial_rotary_factor, else the legacy qk_rope_head_dim / head_dim, else
  // 64 / 512; the rotated dims are int(head_dim * factor), the trailing ones of each head.
  double partial = 64.0 / 512.0;
  if (auto it = j.find("qk_rope_head_dim"); it != j.end() && !it->is_null())
    partial = static_cast<double>(get_count(j, "qk_rope_head_dim", ConfigCount::kHeadDim, source)) /
              static_cast<double>(c.head_dim);
  partial = get_num_or(j, "partial_rotary_factor", partial, source);
  c.partial_rotary_factor = static_cast<float>(partial);
  c.query_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  c.attn_sinks = true;
  c.rope_interleaved = true;  // pairs (2i, 2i + 1) of the trailing rope dims

  const std::string scoring = j.value("scoring_func", std::string("sqrtsoftplus"));
  if (scoring == "sqrtsoftplus") {
    v.scoring = V4Scoring::kSqrtSoftplus;
  } else if (scoring == "softmax") {
    v.scoring = V4Scoring::kSoftmax;
  } else if (scoring == "sigmoid") {
    v.scoring = V4Scoring::kSigmoid;
  } else {
    throw Error(ErrorKind::kUnsupported, source + ": scoring_func '" + scoring +
                                             "' is not supported (sqrtsoftplus, softmax, sigmoid)");
  }
  MoeConfig& m = c.moe;
  m.n_experts = get_count_or(j, "n_routed_experts", 256, ConfigCount::kExperts, source);
  m.n_experts_used = get_count_or(j, "num_experts_per_tok", 6, ConfigCount::kExperts, source);
  m.expert_hidden_dim = c.hidden_dim;
  m.routed_scaling_factor = static_cast<float>(get_num_or(j, "routed_scaling_factor", 1.5, source));
  m.norm_topk_prob = true;  // DeepseekV4TopKRouter always renormalises
  if (m.n_experts <= 0 || m.n_experts_used <= 0 || m.n_experts_used > m.n_experts)
    bad(source,
        "n_routed_experts must be positive and num_experts_per_tok in [1, n_routed_experts]");

  // mlp_layer_types: explicit (truncated to the layers), else num_hash_layers (default 3)
  // hash_moe layers first, then moe.
  const int64_t n = c.n_layers;
  v.hash_layers.assign(static_cast<size_t>(n), 0);
  if (auto it = j.find("mlp_layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || static_cast<int64_t>(it->size()) < n)
      bad(source, "config field 'mlp_layer_types' must list one of hash_moe / moe per layer (" +
                      std::to_string(n) + ")");
    for (int64_t i = 0; i < n; ++i) {
      const json& t = (*it)[static_cast<size_t>(i)];
      const std::string s = t.is_string() ? t.get<std::string>() : std::string();
      if (s != "hash_moe" && s != "moe")
        bad(source, "mlp_layer_types[" + std::to_string(i) + "] must be 'hash_moe' or 'moe'");
      v.hash_layers[static_cast<size_t>(i)] = s == "hash_moe";
    }
  } else {
    const int64_t hashed = get_count_or(j, "num_hash_layers", 3, ConfigCount::kLayers, source);
    if (hashed < 0) bad(source, "config field 'num_hash_layers' must be >= 0");
    for (int64_t i = 0; i < std::min(n, hashed); ++i) v.hash_layers[static_cast<size_t>(i)] = 1;
  }
}

void read_rope_scaling(const json& rope, const FamilyKeys& f, ModelConfig& c,
                       const std::string& source);

// DeepSeek-V4's two rotary embeddings (DeepseekV4Config.__post_init__): "main" (sliding layers:
// rope_theta, default RoPE) and "compress" (CSA/HCA layers, their compressors and indexer:
// compress_rope_theta, with the scaling of a flat rope_parameters / rope_scaling, YaRN with
// attention_factor 1.0 unless given). A rope_parameters already nested as {main, compress} is
// taken as is.
void read_deepseek_v4_rope(const json& j, const FamilyKeys& f, ModelConfig& c,
                           const std::string& source) {
  DeepseekV4Config& v = c.deepseek_v4;
  c.rope_theta = static_cast<float>(get_num_or(j, "rope_theta", 10000.0, source));
  v.compress_rope_theta =
      static_cast<float>(get_num_or(j, "compress_rope_theta", 160000.0, source));
  const json* rp = nullptr;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) {
    rp = &*it;
  } else if (auto it2 = j.find("rope_scaling"); it2 != j.end() && it2->is_object()) {
    rp = &*it2;
  }
  json compress = json::object();
  if (rp && rp->contains("main") && (*rp)["main"].is_object() && rp->contains("compress") &&
      (*rp)["compress"].is_object()) {
    const json& main = (*rp)["main"];
    const std::string main_type =
        main.value("rope_type", main.value("type", std::string("default")));
    if (main_type != "default")
      throw Error(ErrorKind::kUnsupported, source + ": rope_parameters.main rope_type '" +
                                               main_type + "' is not supported (default)");
    c.rope_theta = static_cast<float>(get_num_or(main, "rope_theta", c.rope_theta, source));
    compress = (*rp)["compress"];
    v.compress_rope_theta =
        static_cast<float>(get_num_or(compress, "rope_theta", v.compress_rope_theta, source));
  } else if (rp) {
    for (auto it = rp->begin(); it != rp->end(); ++it)
      if (it.key() != "main" && it.key() != "compress") compress[it.key()] = it.value();
    if (compress.value("rope_type", compress.value("type", std::string("default"))) == "yarn" &&
        !compress.contains("attention_factor"))
      compress["attention_factor"] = 1.0;
  }
  if (!(c.rope_theta > 0.0f) || !(v.compress_rope_theta > 0.0f))
    bad(source, "rope_theta and compress_rope_theta must be positive");
  const std::string type =
      compress.value("rope_type", compress.value("type", std::string("default")));
  if (type == "default") return;
  if (type != "yarn")
    throw Error(ErrorKind::kUnsupported, source + ": the compress rope's rope_type '" + type +
                                             "' is not supported (default, yarn)");
  // The compress rope's YaRN, through the shared reader on its own theta; the main rope stays
  // plain (rope_freq_factors empty).
  ModelConfig tmp = c;
  tmp.rope_theta = v.compress_rope_theta;
  tmp.query_scale = 0.0f;
  read_rope_scaling(compress, f, tmp, source);
  v.compress_freq_factors = tmp.rope_freq_factors;
  v.compress_attention_factor = tmp.rope_attention_factor;
  c.rope_scaling = tmp.rope_scaling;
}

// Gemma-3n: sliding layers rotate with rope_local_base_freq (v4) /
// rope_parameters.sliding_attention (v5); full layers with rope_theta /
// rope_parameters.full_attention. Only default RoPE. Returns the scaling object left to read
// (none once v5's per-layer-type parameters were read).
const json* read_gemma3n_rope_thetas(const json& j, const json* rope, ModelConfig& c,
                                     const std::string& source) {
  c.rope_local_theta = static_cast<float>(get_num_or(j, "rope_local_base_freq", 10000.0, source));
  if (!rope || !rope->contains("full_attention")) return rope;
  const json& full = (*rope)["full_attention"];
  const json& local = rope->contains("sliding_attention") ? (*rope)["sliding_attention"] : full;
  for (const json* r : {&full, &local}) {
    if (!r->is_object() || r->value("rope_type", std::string("default")) != "default") {
      throw Error(
          ErrorKind::kUnsupported,
          source + ": Gemma-3n rope_parameters other than rope_type 'default' are not supported");
    }
  }
  c.rope_theta = static_cast<float>(get_num_or(full, "rope_theta", 1000000.0, source));
  c.rope_local_theta = static_cast<float>(get_num_or(local, "rope_theta", 10000.0, source));
  return nullptr;
}

// rope_scaling / rope_parameters' rope_type folded into rope_freq_factors (and YaRN's attention
// factor).
void read_rope_scaling(const json& rope, const FamilyKeys& f, ModelConfig& c,
                       const std::string& source) {
  std::string type = rope.value("rope_type", rope.value("type", std::string("default")));
  RopeScaling& s = c.rope_scaling;
  if (type == "default") {
    // no scaling
  } else if (type == "linear") {
    s.type = RopeScalingType::kLinear;
    s.factor = static_cast<float>(get_num_or(rope, "factor", 1.0, source));
    if (!(s.factor > 0.0f)) bad(source, "rope_scaling.factor must be positive");
    c.rope_freq_factors.assign(static_cast<size_t>(c.rope_dim() / 2), s.factor);
  } else if (type == "llama3") {
    s.type = RopeScalingType::kLlama3;
    s.factor = static_cast<float>(get_num_or(rope, "factor", 8.0, source));
    s.low_freq_factor = static_cast<float>(get_num_or(rope, "low_freq_factor", 1.0, source));
    s.high_freq_factor = static_cast<float>(get_num_or(rope, "high_freq_factor", 4.0, source));
    s.original_max_position_embeddings =
        get_count_or(rope, "original_max_position_embeddings", 8192, ConfigCount::kContext, source);
    if (!(s.factor > 0.0f) || !(s.high_freq_factor > s.low_freq_factor) ||
        s.original_max_position_embeddings <= 0) {
      bad(source,
          "rope_scaling llama3 needs factor > 0, high_freq_factor > low_freq_factor, "
          "original_max_position_embeddings > 0");
    }
    c.rope_freq_factors = llama3_rope_freq_factors(c.rope_theta, c.head_dim, s);
  } else if (type == "yarn") {
    s.type = RopeScalingType::kYarn;
    YarnParams y;
    y.factor = get_num_or(rope, "factor", 1.0, source);
    y.beta_fast = get_num_or(rope, "beta_fast", 32.0, source);
    y.beta_slow = get_num_or(rope, "beta_slow", 1.0, source);
    y.mscale = get_num_or(rope, "mscale", 0.0, source);
    y.mscale_all_dim = get_num_or(rope, "mscale_all_dim", 0.0, source);
    y.attention_factor = get_num_or(rope, "attention_factor", 0.0, source);
    y.truncate = get_bool_or(rope, "truncate", true, source);
    y.original_max_position_embeddings = get_count_or(rope, "original_max_position_embeddings",
                                                      c.max_seq_len, ConfigCount::kContext, source);
    if (!(y.factor > 0.0) || y.original_max_position_embeddings <= 0) {
      bad(source, "rope_scaling yarn needs factor > 0 and original_max_position_embeddings > 0");
    }
    s.factor = static_cast<float>(y.factor);
    s.original_max_position_embeddings = y.original_max_position_embeddings;
    const YarnResult r = yarn_rope(c.rope_theta, c.rope_dim(), y);
    c.rope_freq_factors = r.freq_factors;
    c.rope_attention_factor = static_cast<float>(r.attention_factor);
    // DeepseekV3Attention: softmax scale times mscale^2 when mscale_all_dim is set.
    if (f.deepseek && y.mscale_all_dim != 0.0) {
      const double m = yarn_get_mscale(y.factor, y.mscale_all_dim);
      c.query_scale = static_cast<float>(static_cast<double>(c.query_scale) * m * m);
    }
  } else {
    throw Error(ErrorKind::kUnsupported, source + ": rope_scaling type '" + type +
                                             "' is not supported (linear, llama3, yarn)");
  }
}

// RoPE: transformers v5 nests theta and scaling in rope_parameters; v4 has rope_theta and
// rope_scaling at the top level.
void read_rope(const json& j, const FamilyKeys& f, ModelConfig& c, const std::string& source) {
  const json* rope = nullptr;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) rope = &*it;
  // GptOssConfig.default_theta, Gemma3nTextConfig's rope_theta, else transformers' default.
  const double default_theta = f.gpt_oss ? 150000.0 : f.gemma3n || f.gemma3 ? 1000000.0 : 10000.0;
  const double top_theta = get_num_or(j, "rope_theta", default_theta, source);
  c.rope_theta =
      static_cast<float>(rope ? get_num_or(*rope, "rope_theta", top_theta, source) : top_theta);
  if (!rope) {
    if (auto it = j.find("rope_scaling"); it != j.end() && it->is_object()) rope = &*it;
  }
  if (f.gemma3n) rope = read_gemma3n_rope_thetas(j, rope, c, source);
  if (f.gemma3) rope = read_gemma3_rope_thetas(j, rope, c, source);
  if (f.gpt_oss && (rope == nullptr || !rope->contains("rope_type"))) {
    // GptOssConfig.__post_init__ fills this in when the config has no rope_parameters.
    const json gpt_oss_default_rope = {
        {"rope_type", "yarn"}, {"factor", 32.0},    {"beta_fast", 32.0},
        {"beta_slow", 1.0},    {"truncate", false}, {"original_max_position_embeddings", 4096}};
    read_rope_scaling(gpt_oss_default_rope, f, c, source);
  } else if (rope) {
    read_rope_scaling(*rope, f, c, source);
  }
}

// Layer types, windows, chunks and cross-layer KV sharing, as the decoder layout read them.
void read_layer_plan(const DecoderLayout& layout, const FamilyKeys& f, ModelConfig& c,
                     const std::string& source) {
  c.layer_types = layout.layer_types;
  c.sliding_window = layout.sliding_window;
  c.attention_chunk_size = layout.attention_chunk_size;
  c.num_kv_shared_layers = layout.num_kv_shared_layers;
  if (c.num_kv_shared_layers != 0 && !f.gemma3n) {
    throw Error(ErrorKind::kUnsupported,
                source + ": num_kv_shared_layers = " + std::to_string(c.num_kv_shared_layers) +
                    " (Gemma-3n cross-layer KV sharing) is not supported for " + c.architecture);
  }
}

ModelConfig parse_hf_config_unchecked(const std::string& text, const std::string& source) {
  const json root = parse_json_object(text, source);
  std::string arch = first_architecture(root);
  const std::string model_type = root.value("model_type", std::string());
  json j = root;
  if (is_multimodal_gemma3n(arch, model_type)) {
    j = gemma3n_text_config(root, source);
    arch = "Gemma3nForCausalLM";
  } else if (is_multimodal_gemma3(arch, model_type)) {
    // The loader maps model.language_model.* (transformers v5 checkpoints) to model.*.
    j = gemma3n_text_config(root, source, "Gemma3ForConditionalGeneration");
    arch = "Gemma3ForCausalLM";
  }
  ModelConfig c;
  c.architecture = architecture_of(arch, model_type, source);
  const FamilyKeys f = family_keys(c.architecture);
  const DecoderLayout layout = read_common_keys(root, j, f, c, source);
  read_bias_and_activation(j, f, c, source);
  if (f.gemma2) read_gemma2_keys(j, c, source);
  if (f.gemma3n) read_gemma3n_keys(j, c, source);
  if (f.gemma3) read_gemma3_keys(j, c, source);
  if (f.qwen3) read_qwen3_keys(c);
  if (f.phi3) read_phi3_keys(j, c, source);
  if (f.gpt_oss) read_gpt_oss_keys(j, c, source);
  if (f.deepseek) {
    read_mla_keys(j, layout, c, source);
    read_deepseek_moe_keys(j, c, source);
  }
  if (f.qwen3_next) read_qwen3_next_keys(j, c, source);
  if (f.deepseek_v4) {
    read_deepseek_v4_keys(j, layout, c, source);
    read_deepseek_v4_rope(j, f, c, source);
  } else {
    read_rope(j, f, c, source);
  }
  read_layer_plan(layout, f, c, source);
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
    throw Error(ErrorKind::kFormat,
                source + ": a field has the wrong JSON type (" + e.what() + ")");
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
