// GGUF metadata of the llama family -> ModelConfig, tensors -> ModelFile views, and back.
// Key names follow llama.cpp's llama-arch.cpp (LLM_KV_*), all prefixed by the architecture.
#include <cmath>

#include "core/error.h"
#include "model/config_limits.h"
#include "model/decoder_layout.h"
#include "model/gguf.h"

namespace kvcache {

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ": " + what);
}

}  // namespace

std::unique_ptr<ModelFile> load_gguf_model(const std::string& path) {
  return load_gguf_model(GgufFile::open(path));
}

std::unique_ptr<ModelFile> load_gguf_model(std::shared_ptr<const GgufFile> g) {
  const std::string& path = g->path();
  const std::string arch = g->get_string_or("general.architecture", "");
  if (arch.empty())
    bad(path,
        "metadata 'general.architecture' is missing: not a model GGUF (a vocabulary-only file?)");
  if (arch != "llama" && arch != "mistral" && arch != "qwen2") {
    throw Error(ErrorKind::kUnsupported,
                path + ": architecture '" + arch + "' is not supported (llama, mistral, qwen2)");
  }
  auto mf = std::make_unique<ModelFile>(path, "gguf");
  ModelConfig& c = mf->mutable_config();
  const std::string p = arch + ".";
  c.architecture = arch;
  // Counts are checked against config_limits.h under their GGUF names as they are read, before
  // anything is sized from them (a fuzzed block_count of 2^32 once asked for 137 GB of
  // layer types).
  auto count = [&](const std::string& key, ConfigCount kind) {
    return check_config_count(path, key, g->get_int(key), kind);
  };
  auto count_or = [&](const std::string& key, int64_t fallback, ConfigCount kind) {
    return check_config_count(path, key, g->get_int_or(key, fallback), kind);
  };
  // The cache's shape (layers, heads, head dim, layer types, window) from the reader `kvcache
  // plan` uses too.
  const DecoderLayout layout = read_decoder_layout(*g);
  c.dim = layout.hidden_size;
  c.n_layers = layout.n_layers;
  c.n_heads = layout.n_heads;
  c.n_kv_heads = layout.n_kv_heads;
  c.head_dim = layout.head_dim;
  c.layer_types = layout.layer_types;
  c.sliding_window = layout.sliding_window;
  c.hidden_dim = count(p + "feed_forward_length", ConfigCount::kFfnSize);
  c.max_seq_len = count(p + "context_length", ConfigCount::kContext);
  if (g->get_int_or(p + "attention.value_length", c.head_dim) != c.head_dim) {
    throw Error(ErrorKind::kUnsupported, path + ": key_length != value_length is not supported");
  }
  const int64_t rope_dims = g->get_int_or(p + "rope.dimension_count", c.head_dim);
  if (rope_dims != c.head_dim) {
    throw Error(ErrorKind::kUnsupported, path + ": partial RoPE (rope.dimension_count " +
                                             std::to_string(rope_dims) + " < head_dim " +
                                             std::to_string(c.head_dim) + ") is not supported");
  }
  c.rope_theta = static_cast<float>(g->get_float_or(p + "rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(g->get_float_or(p + "attention.layer_norm_rms_epsilon", 1e-5));
  // ggml: llama/mistral use ROPE_TYPE_NORM on rows permuted by the converter -> pairs (2i, 2i+1);
  // qwen2 uses ROPE_TYPE_NEOX on unpermuted rows -> pairs (i, i + D/2).
  c.rope_interleaved = arch != "qwen2";

  const std::string scaling = g->get_string_or(p + "rope.scaling.type", "none");
  float factor = static_cast<float>(g->get_float_or(p + "rope.scaling.factor", 0.0));
  if (factor == 0.0f) {
    // Older files store only the reciprocal.
    const double scale = g->get_float_or(p + "rope.scale_linear", 0.0);
    if (scale > 0.0) factor = static_cast<float>(scale);
  }
  c.rope_scaling.original_max_position_embeddings =
      count_or(p + "rope.scaling.original_context_length", 0, ConfigCount::kContext);
  if (scaling == "linear" && factor != 0.0f && factor != 1.0f) {
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = factor;
  } else if (scaling != "none" && scaling != "linear") {
    throw Error(ErrorKind::kUnsupported,
                path + ": rope scaling type '" + scaling + "' is not supported (none, linear)");
  }

  // Tokenizer-derived values.
  if (const GgufValue* toks = g->find("tokenizer.ggml.tokens"))
    c.vocab_size = static_cast<int64_t>(toks->array_size());
  c.vocab_size = count_or(p + "vocab_size", c.vocab_size, ConfigCount::kVocab);
  c.bos_id = static_cast<int32_t>(g->get_int_or("tokenizer.ggml.bos_token_id", -1));
  c.eos_id = static_cast<int32_t>(g->get_int_or("tokenizer.ggml.eos_token_id", -1));

  for (const GgufTensorInfo& info : g->tensor_infos())
    mf->add_tensor(info.name, g->tensor_view(info));
  if (c.vocab_size == 0) {
    if (const TensorView* e = mf->find("token_embd.weight"); e && e->ndim() == 2)
      c.vocab_size = e->dim(0);
  }
  c.tie_word_embeddings = mf->find("output.weight") == nullptr;
  c.qkv_bias = mf->find("blk.0.attn_q.bias") != nullptr;

  // Llama 3.1 scaling: llama.cpp's converter stores per-pair divisors as rope_freqs.weight.
  if (const TensorView* rf = mf->find("rope_freqs.weight")) {
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
  c.fill_defaults();
  mf->keep_alive(g);
  mf->validate_llama_weights();
  return mf;
}

void gguf_write_llama_config(GgufWriter& w, const ModelConfig& c) {
  if (!c.rope_interleaved) {
    throw Error(
        ErrorKind::kInvalidArgument,
        "a GGUF of architecture llama expects Q/K rows permuted for interleaved RoPE; this config "
        "uses half-split RoPE (HF layout): permute attn_q/attn_k rows first");
  }
  const std::string p = "llama.";
  w.set("general.architecture", GgufValue::str("llama"));
  w.set(p + "context_length", GgufValue::u32(static_cast<uint32_t>(c.max_seq_len)));
  w.set(p + "embedding_length", GgufValue::u32(static_cast<uint32_t>(c.dim)));
  w.set(p + "block_count", GgufValue::u32(static_cast<uint32_t>(c.n_layers)));
  w.set(p + "feed_forward_length", GgufValue::u32(static_cast<uint32_t>(c.hidden_dim)));
  w.set(p + "attention.head_count", GgufValue::u32(static_cast<uint32_t>(c.n_heads)));
  w.set(p + "attention.head_count_kv", GgufValue::u32(static_cast<uint32_t>(c.n_kv_heads)));
  if (c.head_dim != 0 && c.head_dim * c.n_heads != c.dim) {
    w.set(p + "attention.key_length", GgufValue::u32(static_cast<uint32_t>(c.head_dim)));
    w.set(p + "attention.value_length", GgufValue::u32(static_cast<uint32_t>(c.head_dim)));
  }
  w.set(p + "rope.dimension_count", GgufValue::u32(static_cast<uint32_t>(c.head_dim)));
  w.set(p + "rope.freq_base", GgufValue::f32(c.rope_theta));
  w.set(p + "attention.layer_norm_rms_epsilon", GgufValue::f32(c.rms_eps));
  if (c.vocab_size > 0)
    w.set(p + "vocab_size", GgufValue::u32(static_cast<uint32_t>(c.vocab_size)));
  if (c.sliding_window > 0)
    w.set(p + "attention.sliding_window", GgufValue::u32(static_cast<uint32_t>(c.sliding_window)));
  if (c.rope_scaling.type == RopeScalingType::kLinear) {
    w.set(p + "rope.scaling.type", GgufValue::str("linear"));
    w.set(p + "rope.scaling.factor", GgufValue::f32(c.rope_scaling.factor));
  }
  if (c.rope_scaling.original_max_position_embeddings > 0) {
    w.set(p + "rope.scaling.original_context_length",
          GgufValue::u32(static_cast<uint32_t>(c.rope_scaling.original_max_position_embeddings)));
  }
  if (c.bos_id >= 0)
    w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<uint32_t>(c.bos_id)));
  if (c.eos_id >= 0)
    w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<uint32_t>(c.eos_id)));
  // Llama 3 factors travel as the tensor rope_freqs.weight, which the caller adds (its data must
  // outlive write()).
}

}  // namespace kvcache
