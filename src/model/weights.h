// Weights: what the family builders read a ModelFile through while they assemble a Model.
// Matrices stay views into the file (mapped, never copied); small vectors (norms, biases,
// sinks, coefficients, RoPE tables) become f32 arrays kept here, alive as long as the Model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/model_file.h"

namespace kvcache {

// How a family's files name per-layer tensors: llama.cpp's canonical "blk.<l>.<name>" (the
// llama family, whatever the file format) or transformers' "model.layers.<l>.<name>".
enum class TensorNames { kCanonical, kHf };

class Weights {
 public:
  explicit Weights(const ModelFile& file) : file_(file) {}
  Weights(const Weights&) = delete;
  Weights& operator=(const Weights&) = delete;

  const ModelFile& file() const { return file_; }
  const ModelConfig& config() const { return file_.config(); }

  // A weight matrix (or stack of expert matrices) by name, as stored. Error(kFormat) naming
  // the file and tensor when it is missing, or q8_0 with rows that are not whole blocks.
  TensorView matrix(const std::string& name) const;
  // A float vector by name as f32: the file's own array when stored as f32, else a copy.
  const float* vector(const std::string& name);
  // An RMSNorm weight: vector(), plus 1 for Gemma-2's (1 + w) norms (config norm_add_one).
  const float* norm(const std::string& name);
  // A float tensor by name, converted to an f32 copy the caller may change (then keep()).
  std::vector<float> read(const std::string& name) const;
  // Keeps computed values alive with the model.
  const float* keep(std::vector<float> values);
  // Keeps a tensor built at load (a matrix with reordered rows, ...) and returns its view.
  TensorView keep(Tensor tensor);

 private:
  const ModelFile& file_;
  std::vector<Tensor> kept_;  // f32 copies (a Tensor's data does not move with the vector)
};

}  // namespace kvcache
