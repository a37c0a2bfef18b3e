// Hugging Face config.json -> ModelConfig for LlamaForCausalLM, MistralForCausalLM and
// Qwen2ForCausalLM (the llama block with their variations: Mistral's sliding_window, Qwen2's QKV
// bias and tied embeddings, rope_scaling linear/llama3, an explicit head_dim).
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
std::vector<float> llama3_rope_freq_factors(float rope_theta, int64_t head_dim, const RopeScaling& s);

}  // namespace kvcache
