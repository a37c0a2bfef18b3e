// GGUF architecture gemma3 -> the gemma3 family (model/gemma3.cc, transformers names).
// llama.cpp facts used here (src/llama-model.cpp load_hparams, LLM_ARCH_GEMMA3; keys from
// src/llama-arch.cpp LLM_KV_NAMES):
//  - the sliding pattern is fixed, hparams.set_swa_pattern(6): layer il slides when
//    il % 6 < 5 (transformers' sliding_window_pattern 6); the window is
//    attention.sliding_window;
//  - sliding layers rotate with a fixed base 10000 and no scaling (rope_freq_base_train_swa,
//    rope_freq_scale_train_swa = 1): no key carries the local base; full layers use
//    rope.freq_base and rope.scaling.type / rope.scaling.factor (convert_hf_to_gguf.py
//    Gemma3Model writes "linear" and the factor when the config has rope_scaling);
//  - the attention scale is 1/sqrt(attention.key_length), except for the 27B (62 layers),
//    1/sqrt(embedding_length / head_count): query_pre_attn_scalar is not in the file;
//  - logit softcaps: convert_hf_to_gguf.py's Gemma3Model asserts attn_logit_softcapping is None
//    and writes final_logit_softcapping only when the config sets one, so the attention softcap
//    is never in the file and the final one is read when present;
//  - tensors (LLM_TENSOR_NAMES for LLM_ARCH_GEMMA3; gguf-py/gguf/tensor_mapping.py): as gemma2
//    plus attn_q_norm / attn_k_norm; no output.weight (tied);
//  - Gemma3Model.modify_tensors stores every "norm.weight" (q/k norms included) as w + 1, so
//    the loaded config scales by w as stored; RoPE is NEOX (half-split rows, unpermuted).
#include <cmath>

#include "core/error.h"
#include "model/decoder_layout.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"

namespace kvcache {

namespace {

constexpr const char* kArch = "gemma3";
constexpr int64_t kSwaPattern = 6;      // llama.cpp set_swa_pattern(6)
constexpr float kLocalRopeBase = 1e4f;  // llama.cpp rope_freq_base_train_swa

const char* layer_type(size_t l) {
  return static_cast<int64_t>(l) % kSwaPattern < kSwaPattern - 1 ? "sliding_attention"
                                                                 : "full_attention";
}

void read_layout(const GgufFile& g, DecoderLayout& d) {
  if (d.sliding_window <= 0) {
    throw Error(ErrorKind::kFormat,
                g.path() + ": gemma3 needs metadata 'gemma3.attention.sliding_window' > 0");
  }
  for (size_t l = 0; l < d.layer_types.size(); ++l) d.layer_types[l] = layer_type(l);
}

float attention_scale(int64_t n_layers, int64_t dim, int64_t n_heads, int64_t head_dim) {
  const int64_t d = n_layers == 62 ? dim / n_heads : head_dim;
  return static_cast<float>(std::pow(static_cast<double>(d), -0.5));
}

void read_config(const GgufFile& g, ModelFile& mf) {
  ModelConfig& c = mf.mutable_config();
  const std::string p = std::string(kArch) + ".";
  check_gguf_value_length(g, kArch, c.head_dim);
  const int64_t rope_dims = g.get_int_or(p + "rope.dimension_count", c.head_dim);
  if (rope_dims != c.head_dim) {
    throw Error(ErrorKind::kUnsupported, g.path() + ": gemma3 with rope.dimension_count " +
                                             std::to_string(rope_dims) + " != key_length " +
                                             std::to_string(c.head_dim) + " is not supported");
  }
  const std::string scaling = g.get_string_or(p + "rope.scaling.type", "none");
  const double factor = g.get_float_or(p + "rope.scaling.factor", 1.0);
  if (scaling == "linear" && factor != 1.0) {
    if (!(factor > 0.0)) {
      throw Error(ErrorKind::kFormat, g.path() + ": 'gemma3.rope.scaling.factor' must be positive");
    }
    c.rope_scaling.type = RopeScalingType::kLinear;
    c.rope_scaling.factor = static_cast<float>(factor);
    // Full layers only: the family's local table is built without factors.
    c.rope_freq_factors.assign(static_cast<size_t>(c.head_dim / 2), c.rope_scaling.factor);
  } else if (scaling != "none" && scaling != "linear") {
    throw Error(ErrorKind::kUnsupported, g.path() + ": gemma3 rope scaling type '" + scaling +
                                             "' is not supported (none, linear)");
  }
  c.rope_interleaved = false;
  c.rope_local_theta = kLocalRopeBase;
  c.norm_add_one = false;  // the converter stored 1 + w
  c.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c.dim)));
  c.sandwich_norms = true;
  c.qk_norm = true;
  c.ffn_act = FfnActivation::kGeluTanh;
  c.query_scale = attention_scale(c.n_layers, c.dim, c.n_heads, c.head_dim);
  c.attn_softcap = 0.0f;
  c.final_softcap = static_cast<float>(g.get_float_or(p + "final_logit_softcapping", 0.0));
  c.qkv_bias = false;
}

void write_config(GgufWriter& w, const ModelConfig& c) {
  if (c.query_scale != attention_scale(c.n_layers, c.dim, c.n_heads, c.head_dim)) {
    throw Error(ErrorKind::kUnsupported,
                "gemma3: llama.cpp derives the attention scale from attention.key_length (" +
                    std::to_string(c.head_dim) +
                    "); this model's query_pre_attn_scalar differs, so a GGUF cannot express it");
  }
  for (size_t l = 0; l < c.layer_types.size(); ++l) {
    if (c.layer_types[l] != layer_type(l)) {
      throw Error(ErrorKind::kUnsupported,
                  "gemma3: layer " + std::to_string(l) + " is '" + c.layer_types[l] +
                      "', but llama.cpp's gemma3 fixes the sliding_window_pattern at 6 (every "
                      "6th layer full), so a GGUF cannot express this model's layer types");
    }
  }
  if (c.rope_local_theta != kLocalRopeBase) {
    throw Error(ErrorKind::kUnsupported,
                "gemma3: llama.cpp rotates sliding layers with base 10000; this model's "
                "rope_local_base_freq " +
                    std::to_string(c.rope_local_theta) + " cannot be expressed in a GGUF");
  }
  if (c.attn_softcap != 0.0f) {
    throw Error(ErrorKind::kUnsupported,
                "gemma3: llama.cpp's gemma3 has no attention softcap (its converter asserts "
                "attn_logit_softcapping is None); this model's cannot be written as GGUF");
  }
  if (!c.norm_add_one || c.rope_interleaved || c.qkv_bias || c.attn_out_bias || !c.qk_norm ||
      c.partial_rotary_factor != 1.0f ||
      (c.rope_scaling.type != RopeScalingType::kNone &&
       c.rope_scaling.type != RopeScalingType::kLinear)) {
    throw Error(ErrorKind::kUnsupported,
                "gemma3: only transformers-layout Gemma-3 text models ((1 + w) norms, q/k norms, "
                "half-split RoPE, no or linear rope scaling, no attention bias) can be written "
                "as GGUF gemma3");
  }
  write_gguf_common_config(w, kArch, c);
  const std::string p = std::string(kArch) + ".";
  auto u32 = [](int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  w.set(p + "attention.key_length", u32(c.head_dim));
  w.set(p + "attention.value_length", u32(c.head_dim));
  w.set(p + "rope.dimension_count", u32(c.head_dim));
  w.set(p + "attention.sliding_window", u32(c.sliding_window));
  if (c.final_softcap != 0.0f)
    w.set(p + "final_logit_softcapping", GgufValue::f32(c.final_softcap));
  if (c.rope_scaling.type == RopeScalingType::kLinear) {
    w.set(p + "rope.scaling.type", GgufValue::str("linear"));
    w.set(p + "rope.scaling.factor", GgufValue::f32(c.rope_scaling.factor));
  }
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
    {"blk.{N}.post_attention_norm.weight", "model.layers.{N}.post_attention_layernorm.weight"},
    {"blk.{N}.ffn_norm.weight", "model.layers.{N}.pre_feedforward_layernorm.weight"},
    {"blk.{N}.ffn_gate.weight", "model.layers.{N}.mlp.gate_proj.weight"},
    {"blk.{N}.ffn_up.weight", "model.layers.{N}.mlp.up_proj.weight"},
    {"blk.{N}.ffn_down.weight", "model.layers.{N}.mlp.down_proj.weight"},
    {"blk.{N}.post_ffw_norm.weight", "model.layers.{N}.post_feedforward_layernorm.weight"},
};

void write_tensors(const ModelFile& model, GgufTensorList& out, std::vector<Tensor>& owned);

const GgufArchitecture kGemma3{kArch,    "gemma3", &read_layout,  &read_config,
                               kTensors, nullptr,  &write_config, &write_tensors};

// Gemma3Model.modify_tensors: every norm + 1 (in f32, as the runtime's 1 + w would be).
void write_tensors(const ModelFile& model, GgufTensorList& out, std::vector<Tensor>& owned) {
  write_gguf_tensors_by_table(kGemma3, model, out);
  add_one_to_gguf_norms(out, owned);
}

}  // namespace

KVCACHE_REGISTER_GGUF_ARCH(gemma3, kGemma3);

}  // namespace kvcache
