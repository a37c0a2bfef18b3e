// Hugging Face config.json -> ModelConfig for LlamaForCausalLM, MistralForCausalLM and
// Qwen2ForCausalLM (the llama block with their variations: Mistral's sliding_window, Qwen2's QKV
// bias and tied embeddings, rope_scaling linear/llama3/yarn, an explicit head_dim), and for
// Gemma2ForCausalLM, Gemma3nForCausalLM (or the text_config of Gemma3nForConditionalGeneration),
// GptOssForCausalLM, DeepseekV2ForCausalLM and DeepseekV3ForCausalLM with each family's
// transformers defaults (layer_types, softcaps, sinks, AltUp/Laurel, MoE, MLA).
#pragma once

#include <string>

#include "model/model_file.h"

namespace kvcache {

// Parses config.json text; `source` names the file in errors (Error(kFormat) for bad JSON or a
// missing/ill-typed field, Error(kUnsupported) for other architectures or rope_scaling types).
ModelConfig parse_hf_config(const std::string& json_text, const std::string& source);
ModelConfig load_hf_config(const std::string& config_json_path);

// Llama 3.1 per-pair divisors (the rope_freqs.weight values llama.cpp's converter writes):
// wavelength 2*pi/freq_i < orig/high_freq_factor -> 1; > orig/low_freq_factor -> factor;
// otherwise 1 / ((1 - s)/factor + s) with s = (orig/wavelength - low)/(high - low).
std::vector<float> llama3_rope_freq_factors(float rope_theta, int64_t head_dim,
                                            const RopeScaling& s);

// rope_type "yarn" (GPT-OSS, DeepSeek-V3), after transformers' _compute_yarn_parameters.
struct YarnParams {
  double factor = 1.0;
  double beta_fast = 32.0, beta_slow = 1.0;
  double mscale = 0.0, mscale_all_dim = 0.0;  // 0: absent
  double attention_factor = 0.0;              // 0: derived from factor / mscales
  bool truncate = true;
  int64_t original_max_position_embeddings = 0;
};
struct YarnResult {
  std::vector<float> freq_factors;  // [dim / 2] divisors of the default inverse frequencies
  double attention_factor = 1.0;    // cos and sin are multiplied by it
};
YarnResult yarn_rope(float rope_theta, int64_t dim, const YarnParams& params);
// 0.1 * mscale * ln(scale) + 1 for scale > 1, else 1 (yarn_get_mscale).
double yarn_get_mscale(double scale, double mscale);

}  // namespace kvcache
