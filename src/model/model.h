// Model: a decoder's weights and structure, assembled once from a ModelFile (llama2.c, GGUF or
// safetensors) by the family registered for its architecture (model/family.h): one Block per
// layer (attention and MLP modules, each with its own weights, and the norms around them), the
// Stack that runs them, the embeddings and the LM head. Immutable after construction and
// shared by any number of Forwards (model/forward.h); weights stay views into the ModelFile it
// owns, except small vectors converted to f32 once.
//
// Families and the transformers files followed: model/llama.cc (llama, mistral, qwen2),
// gemma2.cc, gpt_oss.cc, deepseek.cc (deepseek_v2, deepseek_v3), gemma3n.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "model/block.h"
#include "model/family.h"
#include "model/model_file.h"
#include "model/weights.h"

namespace kvcache {

class Model {
 public:
  // Validates the weights against the config (Error(kFormat) naming the file and tensor) and
  // builds every block; Error(kUnsupported) for an architecture no family serves.
  explicit Model(std::unique_ptr<ModelFile> file);

  const ModelConfig& config() const { return file_->config(); }
  const ModelFile& file() const { return *file_; }
  const std::vector<Block>& blocks() const { return parts_.blocks; }
  const Stack& stack() const { return *parts_.stack; }
  const TensorView& embeddings() const { return parts_.embeddings; }  // [vocab, dim]
  const TensorView& output() const { return parts_.output; }          // [vocab, dim]
  const float* output_norm() const { return parts_.output_norm; }     // [dim]
  // The layer whose K/V `layer` attends (itself unless KV-shared).
  int64_t kv_source(int64_t layer) const;
  // The scratch every Forward of this model reserves: the forward's own and its family's.
  const std::vector<const ScratchKind*>& scratch() const { return scratch_; }
  static std::vector<const ScratchKind*> scratch_for(const ModelConfig& config);
  // The dtype most weight bytes are stored in (what `kvcache bench` reports as the type).
  DType weight_dtype() const;
  size_t weight_bytes() const { return file_->weight_bytes(); }

 private:
  std::unique_ptr<ModelFile> file_;
  Weights weights_;
  ModelParts parts_;
  std::vector<const ScratchKind*> scratch_;
};

}  // namespace kvcache
