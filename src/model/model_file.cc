#include "model/model_file.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/safetensors.h"

namespace kvcache {

const char* rope_scaling_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kNone: return "none";
    case RopeScalingType::kLinear: return "linear";
    case RopeScalingType::kLlama3: return "llama3";
  }
  return "?";
}

namespace {
[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(ErrorKind::kFormat, source + ": " + what);
}
}  // namespace

void ModelConfig::fill_defaults() {
  if (head_dim == 0 && n_heads > 0 && dim % n_heads == 0) head_dim = dim / n_heads;
  if (n_kv_heads == 0) n_kv_heads = n_heads;
  if (layer_types.empty() && n_layers > 0) {
    layer_types.assign(static_cast<size_t>(n_layers),
                       sliding_window > 0 ? "sliding_attention" : "full_attention");
  }
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* name) {
    if (v <= 0) bad(source, std::string("model config: ") + name + " must be positive, got " + std::to_string(v));
  };
  positive(dim, "dim (hidden size)");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_kv_heads, "n_kv_heads");
  positive(head_dim, "head_dim");
  positive(hidden_dim, "hidden_dim (FFN size)");
  positive(vocab_size, "vocab_size");
  positive(max_seq_len, "max_seq_len (context length)");
  if (n_heads % n_kv_heads != 0) {
    bad(source, "model config: n_heads " + std::to_string(n_heads) + " is not a multiple of n_kv_heads " +
                    std::to_string(n_kv_heads));
  }
  if (head_dim % 2 != 0) bad(source, "model config: head_dim " + std::to_string(head_dim) + " is odd; RoPE needs pairs");
  if (!(rope_theta > 0.0f)) bad(source, "model config: rope_theta must be positive");
  if (!(rms_eps > 0.0f)) bad(source, "model config: rms_eps must be positive");
  if (sliding_window < 0) bad(source, "model config: sliding_window must be >= 0");
  if (static_cast<int64_t>(layer_types.size()) != n_layers) {
    bad(source, "model config: layer_types has " + std::to_string(layer_types.size()) + " entries for " +
                    std::to_string(n_layers) + " layers");
  }
  for (const auto& t : layer_types) {
    if (t != "full_attention" && t != "sliding_attention") {
      bad(source, "model config: unsupported layer type '" + t + "' (full_attention, sliding_attention)");
    }
    if (t == "sliding_attention" && sliding_window <= 0) {
      bad(source, "model config: sliding_attention layers need a positive sliding_window");
    }
  }
  if (!rope_freq_factors.empty() && static_cast<int64_t>(rope_freq_factors.size()) != head_dim / 2) {
    bad(source, "model config: rope_freq_factors has " + std::to_string(rope_freq_factors.size()) +
                    " entries, expected head_dim/2 = " + std::to_string(head_dim / 2));
  }
}

std::string ModelConfig::summary() const {
  std::string s = architecture + " dim=" + std::to_string(dim) + " layers=" + std::to_string(n_layers) +
                  " heads=" + std::to_string(n_heads) + "/" + std::to_string(n_kv_heads) +
                  " head_dim=" + std::to_string(head_dim) + " ffn=" + std::to_string(hidden_dim) +
                  " vocab=" + std::to_string(vocab_size) + " ctx=" + std::to_string(max_seq_len) +
                  " rope_theta=" + std::to_string(rope_theta) +
                  (rope_interleaved ? " rope=interleaved" : " rope=half-split");
  if (rope_scaling.type != RopeScalingType::kNone) {
    s += std::string(" rope_scaling=") + rope_scaling_name(rope_scaling.type) + "x" + std::to_string(rope_scaling.factor);
  }
  if (sliding_window > 0) s += " sliding_window=" + std::to_string(sliding_window);
  if (qkv_bias) s += " qkv_bias";
  if (tie_word_embeddings) s += " tied";
  return s;
}

std::string layer_tensor(int64_t layer, const char* suffix) {
  return "blk." + std::to_string(layer) + "." + suffix;
}

const TensorView* ModelFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& ModelFile::tensor(const std::string& name) const {
  const TensorView* t = find(name);
  if (!t) bad(path_, "missing tensor '" + name + "'");
  return *t;
}

const TensorView& ModelFile::tensor(const std::string& name, const Shape& expected) const {
  const TensorView& t = tensor(name);
  if (!(t.shape() == expected)) {
    bad(path_, "tensor '" + name + "' has shape " + t.shape().str() + " but the config implies " + expected.str());
  }
  return t;
}

size_t ModelFile::weight_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : tensors_) n += dtype_bytes(t.dtype(), t.numel());
  return n;
}

void ModelFile::add_tensor(const std::string& name, const TensorView& view) {
  if (!tensors_.emplace(name, view).second) bad(path_, "tensor '" + name + "' appears twice");
}

void ModelFile::validate_llama_weights() const {
  const ModelConfig& c = config_;
  c.validate(path_);
  auto check = [&](const std::string& name, const Shape& shape, bool matrix) {
    const TensorView& t = tensor(name, shape);
    if (!matrix && !dtype_is_float(t.dtype())) {
      bad(path_, "tensor '" + name + "' has type " + dtype_name(t.dtype()) + "; norms and biases must be f32/f16/bf16");
    }
    if (!t.is_contiguous()) bad(path_, "tensor '" + name + "' is not contiguous");
  };
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  check("token_embd.weight", {c.vocab_size, c.dim}, true);
  check("output_norm.weight", {c.dim}, false);
  if (!c.tie_word_embeddings) check("output.weight", {c.vocab_size, c.dim}, true);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    check(layer_tensor(l, "attn_norm.weight"), {c.dim}, false);
    check(layer_tensor(l, "attn_q.weight"), {q, c.dim}, true);
    check(layer_tensor(l, "attn_k.weight"), {kv, c.dim}, true);
    check(layer_tensor(l, "attn_v.weight"), {kv, c.dim}, true);
    check(layer_tensor(l, "attn_output.weight"), {c.dim, q}, true);
    if (c.qkv_bias) {
      check(layer_tensor(l, "attn_q.bias"), {q}, false);
      check(layer_tensor(l, "attn_k.bias"), {kv}, false);
      check(layer_tensor(l, "attn_v.bias"), {kv}, false);
    }
    check(layer_tensor(l, "ffn_norm.weight"), {c.dim}, false);
    check(layer_tensor(l, "ffn_gate.weight"), {c.hidden_dim, c.dim}, true);
    check(layer_tensor(l, "ffn_up.weight"), {c.hidden_dim, c.dim}, true);
    check(layer_tensor(l, "ffn_down.weight"), {c.dim, c.hidden_dim}, true);
  }
}

std::unique_ptr<ModelFile> open_model_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return load_hf_model(path);
  if (!fs::exists(path, ec)) throw Error(ErrorKind::kIo, path + ": no such file or directory");
  char magic[4] = {};
  {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(ErrorKind::kIo, path + ": cannot open");
    f.read(magic, 4);
  }
  if (std::string_view(magic, 4) == "GGUF") return load_gguf_model(path);
  if (path.size() > 12 && path.ends_with(".safetensors")) return load_hf_model(path);
  if (is_llama2c_checkpoint(path)) return load_llama2c(path);
  throw Error(ErrorKind::kFormat,
              path + ": unrecognised model file: expected a GGUF file, a llama2.c checkpoint, a Hugging "
                     "Face folder (config.json + *.safetensors) or a .safetensors file with config.json beside it");
}

}  // namespace kvcache
