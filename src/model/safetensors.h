// Hugging Face safetensors (+ config.json) reader and writer.
// Format (https://huggingface.co/docs/safetensors): uint64 little-endian header length N, then N
// bytes of JSON {"name": {"dtype": "F16", "shape": [out, in], "data_offsets": [begin, end]},
// "__metadata__": {...}} with offsets relative to the byte after the header, then the data.
// A model is one model.safetensors or shards listed by model.safetensors.index.json
// ({"weight_map": {"name": "model-00001-of-00002.safetensors"}}). HF names are mapped to the
// canonical GGUF names of model_file.h; Q/K rows stay in HF's order (rope_interleaved = false).
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/mapped_file.h"
#include "model/model_file.h"

namespace kvcache {

// One parsed .safetensors file: its mapping and views of its tensors (by the names stored).
class SafetensorsFile {
 public:
  // Throws Error(kFormat) "<path>: <problem>" for a bad header length, JSON, dtype (F32, F16,
  // BF16 are supported; others are refused naming the tensor), shape/offset mismatch, overlap or
  // out-of-bounds data.
  static std::shared_ptr<const SafetensorsFile> open(const std::string& path,
                                                     MapMode mode = MapMode::kMap);
  // The same from a mapping or an in-memory copy (MappedFile::copy_of): fuzzers, tests.
  static std::shared_ptr<const SafetensorsFile> open(MappedFile file);
  const std::string& path() const { return file_.path(); }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  explicit SafetensorsFile(MappedFile f) : file_(std::move(f)) {}
  MappedFile file_;
  std::vector<Tensor> converted_;  // integer tensors read as f32 (their views point here)
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes one .safetensors file from named contiguous f32/f16/bf16 views (tests, converters);
// the f32 views named in as_int64 are written as I64 (integer tables such as DeepSeek-V4's
// tid2eid).
void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const std::set<std::string>& as_int64 = {});

// Maps one HF tensor name to its canonical name ("model.layers.3.self_attn.q_proj.weight" ->
// "blk.3.attn_q.weight"); returns "" for names the llama block does not use (e.g.
// rotary_emb.inv_freq).
std::string hf_to_canonical_name(const std::string& hf_name);

// The shard file names of a model.safetensors.index.json ({"weight_map": {tensor: file}}), in
// first-seen order without repeats. Throws Error(kFormat) naming `source` for bad JSON, a
// missing or empty weight_map, or a name that is not a plain file name (no '/', no "..").
std::vector<std::string> parse_safetensors_index(const std::string& json_text,
                                                 const std::string& source);

// Loads a HF model: `path` is a folder with config.json and model.safetensors or
// model.safetensors.index.json, or a .safetensors file with config.json in its folder.
// Validates the llama weights against the config.
std::unique_ptr<ModelFile> load_hf_model(const std::string& path, MapMode mode = MapMode::kMap);
// The ModelFile of a parsed config and its opened shards (load_hf_model's second half, also for
// fuzzers): tensor names mapped, the ModelFile keeps the shards alive, weights validated.
std::unique_ptr<ModelFile> hf_model_from_safetensors(
    const std::string& path, ModelConfig config,
    const std::vector<std::shared_ptr<const SafetensorsFile>>& shards);

}  // namespace kvcache
