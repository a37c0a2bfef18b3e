// GGUF architecture gemma2 -> the gemma2 family (model/gemma2.cc, transformers names).
// llama.cpp facts used here:
//  - keys (src/llama-arch.cpp LLM_KV_NAMES; read in src/llama-model.cpp load_hparams,
//    LLM_ARCH_GEMMA2): attention.sliding_window, attn_logit_softcapping,
//    final_logit_softcapping; the attention scale is 1/sqrt(attention.key_length), except for
//    the 27B (46 layers), 1/sqrt(embedding_length / head_count);
//  - the sliding pattern: hparams.set_swa_pattern(2), i.e. layer il slides when il % 2 < 1 —
//    the even layers, as transformers' Gemma2Config layer_types;
//  - tensors (LLM_TENSOR_NAMES for LLM_ARCH_GEMMA2; gguf-py/gguf/tensor_mapping.py for the
//    transformers names): post_attention_layernorm is ATTN_POST_NORM, pre_feedforward_layernorm
//    FFN_NORM, post_feedforward_layernorm FFN_POST_NORM; no output.weight (tied);
//  - convert_hf_to_gguf.py Gemma2Model.modify_tensors stores every "norm.weight" as w + 1, so
//    a GGUF's norms are already (1 + w): the loaded config scales by w as stored.
//  - RoPE is NEOX (llama_model_rope_type): rows in transformers' half-split order, unpermuted.
#include <cmath>

#include "core/error.h"
#include "model/decoder_layout.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"

namespace kvcache {

namespace {

constexpr const char* kArch = "gemma2";

// Gemma2's alternation: even layers slide (llama.cpp set_swa_pattern(2)).
void read_layout(const GgufFile& g, DecoderLayout& d) {
  if (d.sliding_window <= 0) {
    throw Error(ErrorKind::kFormat,
                g.path() + ": gemma2 needs metadata 'gemma2.attention.sliding_window' > 0");
  }
  for (size_t l = 0; l < d.layer_types.size(); ++l)
    d.layer_types[l] = l % 2 == 0 ? "sliding_attention" : "full_attention";
}

float attention_scale(int64_t n_layers, int64_t dim, int64_t n_heads, int64_t head_dim) {
  const int64_t d = n_layers == 46 ? dim / n_heads : head_dim;
  return static_cast<float>(std::pow(static_cast<double>(d), -0.5));
}

void read_config(const GgufFile& g, ModelFile& mf) {
  ModelConfig& c = mf.mutable_config();
  const std::string p = std::string(kArch) + ".";
  check_gguf_value_length(g, kArch, c.head_dim);
  c.rope_interleaved = false;
  c.norm_add_one = false;  // the converter stored 1 + w
  c.embed_scale = static_cast<float>(std::sqrt(static_cast<double>(c.dim)));
  c.sandwich_norms = true;
  c.ffn_act = FfnActivation::kGeluTanh;
  c.query_scale = attention_scale(c.n_layers, c.dim, c.n_heads, c.head_dim);
  c.attn_softcap = static_cast<float>(g.get_float_or(p + "attn_logit_softcapping", 0.0));
  c.final_softcap = static_cast<float>(g.get_float_or(p + "final_logit_softcapping", 0.0));
  c.qkv_bias = false;
}

void write_config(GgufWriter& w, const ModelConfig& c) {
  if (c.query_scale != attention_scale(c.n_layers, c.dim, c.n_heads, c.head_dim)) {
    throw Error(ErrorKind::kUnsupported,
                "gemma2: llama.cpp derives the attention scale from attention.key_length (" +
                    std::to_string(c.head_dim) +
                    "); this model's query_pre_attn_scalar differs, so a GGUF cannot express it");
  }
  if (!c.norm_add_one || c.rope_interleaved || c.qkv_bias) {
    throw Error(ErrorKind::kUnsupported,
                "gemma2: only transformers-layout Gemma-2 models ((1 + w) norms, half-split RoPE, "
                "no q/k/v bias) can be written as GGUF gemma2");
  }
  write_gguf_common_config(w, kArch, c);
  const std::string p = std::string(kArch) + ".";
  auto u32 = [](int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  w.set(p + "attention.key_length", u32(c.head_dim));
  w.set(p + "attention.value_length", u32(c.head_dim));
  w.set(p + "rope.dimension_count", u32(c.head_dim));
  w.set(p + "attention.sliding_window", u32(c.sliding_window));
  w.set(p + "attn_logit_softcapping", GgufValue::f32(c.attn_softcap));
  w.set(p + "final_logit_softcapping", GgufValue::f32(c.final_softcap));
}

const std::vector<GgufTensorName> kTensors = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"blk.{N}.attn_norm.weight", "model.layers.{N}.input_layernorm.weight"},
    {"blk.{N}.attn_q.weight", "model.layers.{N}.self_attn.q_proj.weight"},
    {"blk.{N}.attn_k.weight", "model.layers.{N}.self_attn.k_proj.weight"},
    {"blk.{N}.attn_v.weight", "model.layers.{N}.self_attn.v_proj.weight"},
    {"blk.{N}.attn_output.weight", "model.layers.{N}.self_attn.o_proj.weight"},
    {"blk.{N}.post_attention_norm.weight", "model.layers.{N}.post_attention_layernorm.weight"},
    {"blk.{N}.ffn_norm.weight", "model.layers.{N}.pre_feedforward_layernorm.weight"},
    {"blk.{N}.ffn_gate.weight", "model.layers.{N}.mlp.gate_proj.weight"},
    {"blk.{N}.ffn_up.weight", "model.layers.{N}.mlp.up_proj.weight"},
    {"blk.{N}.ffn_down.weight", "model.layers.{N}.mlp.down_proj.weight"},
    {"blk.{N}.post_ffw_norm.weight", "model.layers.{N}.post_feedforward_layernorm.weight"},
};

// Gemma2Model.modify_tensors: norms + 1 (in f32, as the runtime's 1 + w would be).
void write_tensors(const ModelFile& model, GgufTensorList& out, std::vector<Tensor>& owned);

const GgufArchitecture kGemma2{kArch,    "gemma2", &read_layout,  &read_config,
                               kTensors, nullptr,  &write_config, &write_tensors};

void write_tensors(const ModelFile& model, GgufTensorList& out, std::vector<Tensor>& owned) {
  write_gguf_tensors_by_table(kGemma2, model, out);
  add_one_to_gguf_norms(out, owned);
}

}  // namespace

KVCACHE_REGISTER_GGUF_ARCH(gemma2, kGemma2);

}  // namespace kvcache
