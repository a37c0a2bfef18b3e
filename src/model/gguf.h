// GGUF v3 reader and writer (llama.cpp's single-file model format).
// Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md — little-endian; header
// (magic "GGUF", uint32 version, uint64 tensor_count, uint64 metadata_kv_count); metadata KV
// (gguf string key = uint64 length + bytes, uint32 value type, value; arrays = uint32 element
// type + uint64 count + elements); tensor infos (name, uint32 n_dims, uint64 ne[n_dims] fastest
// dim first, uint32 ggml type, uint64 offset relative to the data section); zero padding to
// `general.alignment` (uint32, default 32); tensor data, each tensor at an aligned offset.
// GgufFile owns its MappedFile; tensor views point into it. GgufWriter builds a file in memory
// order and streams it out (tests, dummy models, `kvcache convert`).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "model/mapped_file.h"
#include "model/model_file.h"

namespace kvcache {

// Metadata value types, numbered as in the spec (gguf_metadata_value_type).
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
const char* gguf_type_name(GgufType t);

// ggml tensor types we read and write (ids from ggml.h's enum ggml_type). Others are refused
// with an Error naming the tensor and the type.
inline constexpr uint32_t kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ8_0 = 8, kGgmlBF16 = 30;
const char* ggml_type_name(uint32_t ggml_type);  // "q4_K", "f16", ... or "type 123"

// One metadata value. Scalars: signed integers and bool in `i`, unsigned integers in `u`,
// float32/float64 in `f`, strings in `s`. Arrays (type kArray, element type in `array_type`):
// integer/bool elements in `ints`, float elements in `floats`, strings in `strs`, arrays of
// arrays in `items`. A plain struct rather than a variant: metadata is small and read once.
struct GgufValue {
  GgufType type = GgufType::kUint32;
  GgufType array_type = GgufType::kUint8;  // element type when type == kArray
  int64_t i = 0;                           // signed integer types and bool
  uint64_t u = 0;                          // unsigned integer types
  double f = 0.0;                          // float32 / float64
  std::string s;                           // kString
  std::vector<int64_t> ints;               // arrays of integer types / bool (uint64 > 2^63: wraps)
  std::vector<double> floats;              // arrays of float32 / float64
  std::vector<std::string> strs;           // arrays of strings
  std::vector<GgufValue> items;            // arrays of arrays

  // Constructors for the writer.
  static GgufValue u32(uint32_t v);
  static GgufValue i32(int32_t v);
  static GgufValue u64(uint64_t v);
  static GgufValue f32(float v);
  static GgufValue boolean(bool v);
  static GgufValue str(std::string v);
  static GgufValue str_array(std::vector<std::string> v);
  static GgufValue f32_array(std::vector<float> v);
  static GgufValue i32_array(std::vector<int32_t> v);

  bool is_integer() const;  // any integer scalar type
  bool is_float() const;    // float32 / float64 scalar
  uint64_t array_size() const;
};

struct GgufTensorInfo {
  std::string name;
  uint32_t ggml_type = 0;
  std::vector<uint64_t> ne;  // dims, fastest first (ne[0] = row length / in_features)
  uint64_t offset = 0;       // from the start of the data section
  uint64_t size_bytes = 0;   // 0 for unsupported types (size unknown to us)
};

class GgufFile {
 public:
  // Maps and parses `path`. Throws Error(kIo) if unreadable, Error(kFormat) "<path>: <problem>"
  // for a bad magic, a version other than 3 (v1/v2 are refused: 32-bit counts), truncation,
  // an unknown value type, a bad alignment, overlapping or out-of-bounds tensor data.
  static std::shared_ptr<const GgufFile> open(const std::string& path,
                                              MapMode mode = MapMode::kMap);
  // The same from a mapping or an in-memory copy (MappedFile::copy_of): fuzzers, tests.
  static std::shared_ptr<const GgufFile> open(MappedFile file);

  const std::string& path() const { return file_.path(); }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // absolute file offset of tensor data

  // Metadata, in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find(std::string_view key) const;
  // Typed getters: throw Error(kFormat) "<path>: metadata '<key>' is missing" / "has type X,
  // expected Y". The *_or variants return `fallback` when the key is absent.
  int64_t get_int(std::string_view key) const;
  int64_t get_int_or(std::string_view key, int64_t fallback) const;
  double get_float(std::string_view key) const;
  double get_float_or(std::string_view key, double fallback) const;
  bool get_bool_or(std::string_view key, bool fallback) const;
  const std::string& get_string(std::string_view key) const;
  std::string get_string_or(std::string_view key, const std::string& fallback) const;
  const GgufValue& get_array(std::string_view key, GgufType elem) const;

  const std::vector<GgufTensorInfo>& tensor_infos() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;
  // A view of the tensor's bytes with shape reversed to row-major ([ne1, ne0] for matrices).
  // Throws Error(kUnsupported) "<path>: tensor '<name>' has type q4_K; supported: f32, f16,
  // bf16, q8_0" for other types and Error(kFormat) for more than 4 dims.
  TensorView tensor_view(const GgufTensorInfo& info) const;

 private:
  explicit GgufFile(MappedFile file) : file_(std::move(file)) {}
  void parse();

  MappedFile file_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// Builds a ModelFile from a GGUF of any architecture registered in model/gguf_arch.h (llama,
// mistral, qwen2, qwen3, gemma2, gemma3, phi3, gpt-oss, deepseek2): the shared `{arch}.*` keys
// (context_length, embedding_length, block_count, attention.head_count(_kv), key_length,
// rope.*, layer_norm_rms_epsilon, feed_forward_length, sliding_window), then the entry's own;
// vocab size from tokenizer.ggml.tokens or the output/token_embd tensor, bos/eos from
// tokenizer.ggml.*; every tensor renamed by the entry's table, as a view. Validates the weights
// of the family it becomes. Another architecture is Error(kUnsupported) naming it.
std::unique_ptr<ModelFile> load_gguf_model(const std::string& path, MapMode mode = MapMode::kMap);
std::unique_ptr<ModelFile> load_gguf_model(std::shared_ptr<const GgufFile> gguf);

// Writes a GGUF v3 file. Tensor shapes are given row-major (as TensorView shapes: [out, in]);
// the writer reverses them into ne[]. Data is copied at write() time from the views, which must
// stay valid until then and be contiguous. Throws Error(kIo) when the file cannot be written.
class GgufWriter {
 public:
  explicit GgufWriter(uint32_t alignment = 32);
  void set(const std::string& key, GgufValue value);  // replaces an existing key in place
  void add_tensor(const std::string& name, const TensorView& view);
  void write(const std::string& path) const;

 private:
  uint32_t alignment_;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<std::pair<std::string, TensorView>> tensors_;
};

// Writes the llama-architecture metadata of `cfg` (general.architecture = "llama" and the
// llama.* keys load_gguf_model reads) into `w`. Used by dummy models and converters.
void gguf_write_llama_config(GgufWriter& w, const ModelConfig& cfg);

}  // namespace kvcache
