// GGUF -> ModelFile through the architecture registry (model/gguf_arch.h), and the llama
// writer. Key names follow llama.cpp's llama-arch.cpp (LLM_KV_*), prefixed by the architecture.

#include "core/error.h"
#include "model/config_limits.h"
#include "model/decoder_layout.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"

namespace kvcache {

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ": " + what);
}

}  // namespace

std::unique_ptr<ModelFile> load_gguf_model(const std::string& path, MapMode mode) {
  return load_gguf_model(GgufFile::open(path, mode));
}

std::unique_ptr<ModelFile> load_gguf_model(std::shared_ptr<const GgufFile> g) {
  const std::string& path = g->path();
  const std::string name = g->get_string_or("general.architecture", "");
  if (name.empty())
    bad(path,
        "metadata 'general.architecture' is missing: not a model GGUF (a vocabulary-only file?)");
  // Each architecture is one registered entry (model/gguf_arch.h); others are refused by name.
  const GgufArchitecture& arch = find_gguf_architecture(name, path);
  auto mf = std::make_unique<ModelFile>(path, "gguf");
  read_gguf_common_config(*g, arch, mf->mutable_config());
  if (arch.load_tensors != nullptr) {
    arch.load_tensors(*g, *mf);
  } else {
    load_gguf_tensors_by_table(arch, *g, *mf);
  }
  if (arch.read_config != nullptr) arch.read_config(*g, *mf);
  mf->mutable_config().fill_defaults();
  mf->keep_alive(g);
  mf->validate_weights();
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
