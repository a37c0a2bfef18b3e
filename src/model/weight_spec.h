// The weights each non-llama family needs, by their transformers names and shapes: one table
// that drives load-time validation (ModelFile::validate_weights), the dummy presets' random
// checkpoints and the tests' safetensors writers, so the three can never disagree.
// Llama-family files use llama.cpp's canonical names instead (model/model_file.h).
#pragma once

#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/model_file.h"

namespace kvcache {

enum class WeightRole {
  kMatrix,  // a projection or embedding: any weight dtype (f32/f16/bf16/q8_0)
  kNorm,    // an RMSNorm weight (float types only)
  kBias,    // a bias, a router correction bias or an attention sink (float types only)
};

struct WeightSpec {
  std::string name;  // e.g. "model.layers.3.self_attn.q_proj.weight"
  Shape shape;       // row-major, [out, in] for projections (GPT-OSS experts: [E, in, out])
  bool matrix = true;
  WeightRole role = WeightRole::kMatrix;
};

// "model.layers.<layer>.<suffix>"
std::string hf_layer_tensor(int64_t layer, const std::string& suffix);

// Every tensor of `config`'s family (gemma2, gpt_oss, deepseek_v2, deepseek_v3), in a stable
// order. Throws Error(kUnsupported) for a llama-family config (they use canonical names).
std::vector<WeightSpec> hf_weight_specs(const ModelConfig& config);

}  // namespace kvcache
