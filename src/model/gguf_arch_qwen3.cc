// GGUF architecture qwen3 -> the qwen3 family (model/qwen3.cc, transformers names).
// llama.cpp facts used here:
//  - keys (src/llama-arch.cpp LLM_KV_NAMES; src/llama-model.cpp load_hparams, LLM_ARCH_QWEN3
//    reads only attention.layer_norm_rms_epsilon beyond the common keys): no sliding-window
//    key, so every layer is full attention; head_dim is attention.key_length;
//  - tensors (LLM_TENSOR_NAMES for LLM_ARCH_QWEN3; gguf-py/gguf/tensor_mapping.py):
//    attn_q_norm / attn_k_norm are transformers' self_attn.q_norm / k_norm ([head_dim], plain
//    w, stored unchanged by convert_hf_to_gguf.py's Qwen3Model); no q/k/v/o biases;
//  - RoPE is NEOX (llama_model_rope_type: LLM_ARCH_QWEN3 -> LLAMA_ROPE_TYPE_NEOX), so the Q/K
//    rows are transformers' half-split order and are not permuted.
#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"

namespace kvcache {

namespace {

constexpr const char* kArch = "qwen3";

void read_config(const GgufFile& g, ModelFile& mf) {
  ModelConfig& c = mf.mutable_config();
  const std::string p = std::string(kArch) + ".";
  check_gguf_value_length(g, kArch, c.head_dim);
  const int64_t rope_dims = g.get_int_or(p + "rope.dimension_count", c.head_dim);
  if (rope_dims != c.head_dim) {
    throw Error(ErrorKind::kUnsupported, g.path() + ": qwen3 with rope.dimension_count " +
                                             std::to_string(rope_dims) + " != key_length " +
                                             std::to_string(c.head_dim) + " is not supported");
  }
  const std::string scaling = g.get_string_or(p + "rope.scaling.type", "none");
  if (scaling != "none") {
    throw Error(ErrorKind::kUnsupported,
                g.path() + ": qwen3 rope scaling type '" + scaling + "' is not supported (none)");
  }
  c.rope_interleaved = false;
  c.qk_norm = true;
  c.qkv_bias = false;
}

void write_config(GgufWriter& w, const ModelConfig& c) {
  for (size_t l = 0; l < c.layer_types.size(); ++l) {
    if (c.layer_types[l] != "full_attention") {
      throw Error(ErrorKind::kUnsupported,
                  "qwen3: layer " + std::to_string(l) + " is '" + c.layer_types[l] +
                      "', but llama.cpp's qwen3 has no sliding-window key (every layer is full "
                      "attention), so a GGUF cannot express it; convert a config with "
                      "use_sliding_window false");
    }
  }
  if (c.qkv_bias || c.attn_out_bias || c.rope_interleaved || !c.qk_norm ||
      c.rope_scaling.type != RopeScalingType::kNone || c.partial_rotary_factor != 1.0f) {
    throw Error(ErrorKind::kUnsupported,
                "qwen3: only transformers-layout Qwen3 models (q/k norms, half-split RoPE over "
                "the whole head, no rope scaling, no attention bias) can be written as GGUF qwen3");
  }
  write_gguf_common_config(w, kArch, c);
  const std::string p = std::string(kArch) + ".";
  auto u32 = [](int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  w.set(p + "attention.key_length", u32(c.head_dim));
  w.set(p + "attention.value_length", u32(c.head_dim));
  w.set(p + "rope.dimension_count", u32(c.head_dim));
}

const std::vector<GgufTensorName> kTensors = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"blk.{N}.attn_norm.weight", "model.layers.{N}.input_layernorm.weight"},
    {"blk.{N}.attn_q.weight", "model.layers.{N}.self_attn.q_proj.weight"},
    {"blk.{N}.attn_k.weight", "model.layers.{N}.self_attn.k_proj.weight"},
    {"blk.{N}.attn_v.weight", "model.layers.{N}.self_attn.v_proj.weight"},
    {"blk.{N}.attn_q_norm.weight", "model.layers.{N}.self_attn.q_norm.weight"},
    {"blk.{N}.attn_k_norm.weight", "model.layers.{N}.self_attn.k_norm.weight"},
    {"blk.{N}.attn_output.weight", "model.layers.{N}.self_attn.o_proj.weight"},
    {"blk.{N}.ffn_norm.weight", "model.layers.{N}.post_attention_layernorm.weight"},
    {"blk.{N}.ffn_gate.weight", "model.layers.{N}.mlp.gate_proj.weight"},
    {"blk.{N}.ffn_up.weight", "model.layers.{N}.mlp.up_proj.weight"},
    {"blk.{N}.ffn_down.weight", "model.layers.{N}.mlp.down_proj.weight"},
};

}  // namespace

KVCACHE_REGISTER_GGUF_ARCH(qwen3, GgufArchitecture{kArch, "qwen3", nullptr, &read_config, kTensors,
                                                   nullptr, &write_config, nullptr});

}  // namespace kvcache
