// GGUF architectures llama, mistral and qwen2 -> the llama family. Their tensor names are our
// canonical names (model/model_file.h), so the name table is empty. Keys: llama.cpp
// src/llama-arch.cpp LLM_KV_NAMES; RoPE types: src/llama-model.cpp llama_model_rope_type
// (LLM_ARCH_LLAMA: LLAMA_ROPE_TYPE_NORM, LLM_ARCH_QWEN2: LLAMA_ROPE_TYPE_NEOX).
#include <cstring>

#include "core/error.h"
#include "model/config_limits.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"

namespace kvcache {

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ": " + what);
}

void read_config(const GgufFile& g, ModelFile& mf) {
  const std::string& path = g.path();
  ModelConfig& c = mf.mutable_config();
  const std::string arch = g.get_string("general.architecture");
  const std::string p = arch + ".";
  check_gguf_value_length(g, arch, c.head_dim);
  const int64_t rope_dims = g.get_int_or(p + "rope.dimension_count", c.head_dim);
  if (rope_dims != c.head_dim) {
    throw Error(ErrorKind::kUnsupported, path + ": partial RoPE (rope.dimension_count " +
                                             std::to_string(rope_dims) + " < head_dim " +
                                             std::to_string(c.head_dim) + ") is not supported");
  }
  // ggml: llama/mistral use ROPE_TYPE_NORM on rows permuted by the converter -> pairs (2i, 2i+1);
  // qwen2 uses ROPE_TYPE_NEOX on unpermuted rows -> pairs (i, i + D/2).
  c.rope_interleaved = arch != "qwen2";

  const std::string scaling = g.get_string_or(p + "rope.scaling.type", "none");
  float factor = static_cast<float>(g.get_float_or(p + "rope.scaling.factor", 0.0));
  if (factor == 0.0f) {
    // Older files store only the reciprocal.
    const double scale = g.get_float_or(p + "rope.scale_linear", 0.0);
    if (scale > 0.0) factor = static_cast<float>(scale);
  }
  c.rope_scaling.original_max_position_embeddings = check_config_count(
      path, p + "rope.scaling.original_context_length",
      g.get_int_or(p + "rope.scaling.original_context_length", 0), ConfigCount::kContext);
  if (scaling == "linear" && factor != 0.0f && factor != 1.0f) {
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = factor;
  } else if (scaling != "none" && scaling != "linear") {
    throw Error(ErrorKind::kUnsupported,
                path + ": rope scaling type '" + scaling + "' is not supported (none, linear)");
  }
  c.qkv_bias = mf.find("blk.0.attn_q.bias") != nullptr;

  // Llama 3.1 scaling: llama.cpp's converter stores per-pair divisors as rope_freqs.weight.
  if (const TensorView* rf = mf.find("rope_freqs.weight")) {
    if (rf->dtype() != DType::kF32 || rf->ndim() != 1 || rf->dim(0) != c.head_dim / 2) {
      bad(path,
          "tensor 'rope_freqs.weight' must be f32 [head_dim/2 = " + std::to_string(c.head_dim / 2) +
              "], got " + dtype_name(rf->dtype()) + " " + rf->shape().str());
    }
    const float* f = rf->data_as<const float>();
    c.rope_freq_factors.assign(f, f + rf->dim(0));
    c.rope_scaling.type = RopeScalingType::kLlama3;
  } else if (c.rope_scaling.type == RopeScalingType::kLinear) {
    c.rope_freq_factors.assign(static_cast<size_t>(c.head_dim / 2), c.rope_scaling.factor);
  }
}

// HF checkpoints rotate the pairs (i, i + D/2) of each head (rotate_half); GGUF `llama` rotates
// (2i, 2i+1). Reordering each head's Q/K output rows so that new row 2i+j is old row i + j*D/2
// (j in {0, 1}) makes the two equivalent: RoPE then rotates the same value pairs, and q·k is
// unchanged because q and k are permuted alike. This is the permutation llama.cpp's
// convert_hf_to_gguf.py applies (reshape(n_head, 2, D/2, ...) then swapaxes(1, 2)).
// Works on whole rows, so any row-wise dtype (q8_0 included); a 1-D tensor is a bias.
Tensor permute_rope_rows(const TensorView& t, int64_t n_heads, int64_t head_dim) {
  const int64_t rows = t.dim(0);
  KV_CHECK(rows == n_heads * head_dim && head_dim % 2 == 0,
           "permute_rope_rows: shape does not match the heads");
  const size_t rb = t.ndim() == 2 ? dtype_bytes(t.dtype(), t.dim(1)) : dtype_bytes(t.dtype(), 1);
  Tensor out = Tensor::empty(t.dtype(), t.shape());
  const auto* src = static_cast<const std::byte*>(t.data());
  auto* dst = static_cast<std::byte*>(out.data());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t from = h * head_dim + j * half + i, to = h * head_dim + 2 * i + j;
        std::memcpy(dst + static_cast<size_t>(to) * rb, src + static_cast<size_t>(from) * rb, rb);
      }
    }
  }
  return out;
}

void write_config(GgufWriter& w, const ModelConfig& c) {
  ModelConfig written = c;
  written.rope_interleaved = true;  // half-split (HF) models get their Q/K rows permuted
  gguf_write_llama_config(w, written);
}

void write_tensors(const ModelFile& model, GgufTensorList& out, std::vector<Tensor>& owned) {
  const ModelConfig& c = model.config();
  for (const auto& [name, original] : model.tensors()) {
    TensorView view = original;
    if (!c.rope_interleaved) {
      const bool q = name.ends_with(".attn_q.weight") || name.ends_with(".attn_q.bias");
      const bool k = name.ends_with(".attn_k.weight") || name.ends_with(".attn_k.bias");
      if (q || k) {
        owned.push_back(permute_rope_rows(view, q ? c.n_heads : c.n_kv_heads, c.head_dim));
        view = owned.back().view();
      }
    }
    out.emplace_back(name, view);
  }
}

}  // namespace

KVCACHE_REGISTER_GGUF_ARCH(
    llama,
    GgufArchitecture{
        "llama", "llama", nullptr, &read_config, {}, nullptr, &write_config, &write_tensors});
// Mistral and Qwen2 files are written as `llama` (the llama writer permutes Q/K rows), so these
// two are read only.
KVCACHE_REGISTER_GGUF_ARCH(
    mistral,
    GgufArchitecture{"mistral", "mistral", nullptr, &read_config, {}, nullptr, nullptr, nullptr});
KVCACHE_REGISTER_GGUF_ARCH(
    qwen2,
    GgufArchitecture{"qwen2", "qwen2", nullptr, &read_config, {}, nullptr, nullptr, nullptr});

}  // namespace kvcache
