// GGUF architecture phi3 -> the phi3 family (model/phi3.cc, transformers names).
// llama.cpp facts used here:
//  - tensors (src/llama-arch.cpp LLM_TENSOR_NAMES for LLM_ARCH_PHI3; gguf-py/gguf/
//    tensor_mapping.py): attn_qkv is transformers' fused self_attn.qkv_proj (rows [q; k; v]),
//    ffn_up is the fused mlp.gate_up_proj, stored unsplit by convert_hf_to_gguf.py's
//    Phi3MiniModel; llama.cpp's phi3 graph (src/models/phi3.cpp) runs it through
//    LLM_FFN_SWIGLU, whose ggml_swiglu applies SiLU to the first half of the rows — gate
//    first, as Phi3MLP's chunk(2). post_attention_layernorm is ffn_norm;
//  - keys: rope.dimension_count is the rotated part of each head (Phi3MiniModel writes
//    int(head_dim * partial_rotary_factor)); attention.sliding_window is written by the
//    converter from the config. llama.cpp's load_hparams for LLM_ARCH_PHI3 currently
//    disables it ("Phi SWA is currently disabled", llama.cpp PR 13676) and runs every layer
//    full; transformers' Phi3Attention applies it to every layer, and so do we (the common
//    reading: a window key makes every layer sliding), so the GGUF runs and is billed like the
//    Hugging Face folder it came from;
//  - RoPE is NEOX (llama_model_rope_type: LLM_ARCH_PHI3 -> LLAMA_ROPE_TYPE_NEOX): half-split
//    rows, unpermuted; the LongRoPE tensors rope_factors_long / rope_factors_short are not
//    read (the Hugging Face reader refuses LongRoPE too), so such a file is refused naming
//    the tensor.
#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"

namespace kvcache {

namespace {

constexpr const char* kArch = "phi3";

void read_config(const GgufFile& g, ModelFile& mf) {
  ModelConfig& c = mf.mutable_config();
  const std::string p = std::string(kArch) + ".";
  check_gguf_value_length(g, kArch, c.head_dim);
  const int64_t rope_dims = g.get_int_or(p + "rope.dimension_count", c.head_dim);
  if (rope_dims <= 0 || rope_dims > c.head_dim || rope_dims % 2 != 0) {
    throw Error(ErrorKind::kFormat,
                g.path() + ": 'phi3.rope.dimension_count' " + std::to_string(rope_dims) +
                    " must be even and in (0, head_dim " + std::to_string(c.head_dim) + "]");
  }
  c.partial_rotary_factor =
      static_cast<float>(static_cast<double>(rope_dims) / static_cast<double>(c.head_dim));
  if (c.rope_dim() != rope_dims) {
    throw Error(ErrorKind::kUnsupported,
                g.path() + ": phi3 rope.dimension_count " + std::to_string(rope_dims) +
                    " is not representable as a partial_rotary_factor of head_dim " +
                    std::to_string(c.head_dim));
  }
  const std::string scaling = g.get_string_or(p + "rope.scaling.type", "none");
  if (scaling != "none") {
    throw Error(ErrorKind::kUnsupported,
                g.path() + ": phi3 rope scaling type '" + scaling + "' is not supported (none)");
  }
  c.rope_interleaved = false;
  c.qkv_bias = false;
}

void write_config(GgufWriter& w, const ModelConfig& c) {
  for (size_t l = 0; l < c.layer_types.size(); ++l) {
    const std::string want = c.sliding_window > 0 ? "sliding_attention" : "full_attention";
    if (c.layer_types[l] != want) {
      throw Error(ErrorKind::kUnsupported,
                  "phi3: layer " + std::to_string(l) + " is '" + c.layer_types[l] +
                      "', but a phi3 GGUF's attention.sliding_window applies to every layer, "
                      "so it cannot express mixed layer types");
    }
  }
  if (c.qkv_bias || c.attn_out_bias || c.rope_interleaved ||
      c.rope_scaling.type != RopeScalingType::kNone || c.ffn_act != FfnActivation::kSilu) {
    throw Error(ErrorKind::kUnsupported,
                "phi3: only transformers-layout Phi-3 models (half-split RoPE, no rope "
                "scaling, SiLU, no attention bias) can be written as GGUF phi3");
  }
  write_gguf_common_config(w, kArch, c);
  const std::string p = std::string(kArch) + ".";
  auto u32 = [](int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  w.set(p + "attention.key_length", u32(c.head_dim));
  w.set(p + "attention.value_length", u32(c.head_dim));
  w.set(p + "rope.dimension_count", u32(c.rope_dim()));
  if (c.sliding_window > 0) w.set(p + "attention.sliding_window", u32(c.sliding_window));
}

const std::vector<GgufTensorName> kTensors = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"blk.{N}.attn_norm.weight", "model.layers.{N}.input_layernorm.weight"},
    {"blk.{N}.attn_qkv.weight", "model.layers.{N}.self_attn.qkv_proj.weight"},
    {"blk.{N}.attn_output.weight", "model.layers.{N}.self_attn.o_proj.weight"},
    {"blk.{N}.ffn_norm.weight", "model.layers.{N}.post_attention_layernorm.weight"},
    {"blk.{N}.ffn_up.weight", "model.layers.{N}.mlp.gate_up_proj.weight"},
    {"blk.{N}.ffn_down.weight", "model.layers.{N}.mlp.down_proj.weight"},
};

}  // namespace

KVCACHE_REGISTER_GGUF_ARCH(phi3, GgufArchitecture{kArch, "phi3", nullptr, &read_config, kTensors,
                                                  nullptr, &write_config, nullptr});

}  // namespace kvcache
