#include "model/model.h"

#include <map>

#include "core/error.h"

namespace kvcache {

namespace {
const ModelFile& validated(const std::unique_ptr<ModelFile>& file) {
  KV_CHECK(file != nullptr, "Model needs a model file");
  file->validate_weights();
  return *file;
}
}  // namespace

Model::Model(std::unique_ptr<ModelFile> file)
    : file_(std::move(file)), weights_(validated(file_)), scratch_(scratch_for(file_->config())) {
  find_family(config().architecture).build(weights_, parts_);
  KV_CHECK(static_cast<int64_t>(parts_.blocks.size()) == config().n_layers &&
               parts_.stack != nullptr && parts_.output_norm != nullptr,
           "a model family built an incomplete model");
}

std::vector<const ScratchKind*> Model::scratch_for(const ModelConfig& config) {
  std::vector<const ScratchKind*> kinds = {&kForwardScratch};
  for (const ScratchKind* kind : find_family(config.architecture).scratch(config))
    kinds.push_back(kind);
  return kinds;
}

int64_t Model::kv_source(int64_t layer) const {
  return parts_.blocks[static_cast<size_t>(layer)].attention->kv_source();
}

DType Model::weight_dtype() const {
  std::map<DType, size_t> bytes;
  for (const auto& [name, t] : file_->tensors())
    bytes[t.dtype()] += dtype_bytes(t.dtype(), t.numel());
  DType most = DType::kF32;
  size_t best = 0;
  for (const auto& [dtype, n] : bytes)
    if (n > best) {
      best = n;
      most = dtype;
    }
  return most;
}

}  // namespace kvcache
