// GGUF architecture gpt-oss -> the gpt_oss family (model/gpt_oss.cc, transformers names).
// llama.cpp facts used here:
//  - the name "gpt-oss" is LLM_ARCH_OPENAI_MOE (src/llama-arch.cpp LLM_ARCH_NAMES); its
//    load_hparams (src/llama-model.cpp) reads expert_feed_forward_length and
//    attention.sliding_window and sets set_swa_pattern(2): the even layers slide, as
//    transformers' GptOssConfig layer_types; expert_count / expert_used_count are the generic
//    LLM_KV_EXPERT_COUNT / LLM_KV_EXPERT_USED_COUNT; YaRN from rope.scaling.type "yarn",
//    rope.scaling.factor, rope.scaling.original_context_length, rope.scaling.yarn_beta_fast/slow;
//  - ggml's YaRN rounds the correction range outward (ggml_rope_yarn_corr_dims: floor/ceil),
//    transformers' truncate = true; the clamped SwiGLU uses alpha 1.702 and limit 7.0
//    (ggml_swiglu_oai in the graph), which are therefore not in the file;
//  - tensors (LLM_TENSOR_NAMES for LLM_ARCH_OPENAI_MOE): attn_sinks.weight, post_attention_norm
//    (the pre-FFN norm, transformers' post_attention_layernorm), ffn_gate_inp (router, with a
//    bias), ffn_gate_exps / ffn_up_exps / ffn_down_exps (.weight, .bias);
//  - convert_hf_to_gguf.py GptOssModel splits transformers' interleaved gate_up_proj
//    [E, dim, 2I] (in, out) into gate = [..., ::2] and up = [..., 1::2] and transposes every
//    expert matrix to ggml's (out, in): ffn_gate_exps [E, I, dim], ffn_down_exps [E, dim, I].
//    The loader undoes this (a copy per expert tensor, float types only; released gpt-oss
//    GGUFs hold MXFP4 experts, a type we refuse naming the tensor).
#include <cstring>

#include "core/error.h"
#include "model/config_limits.h"
#include "model/decoder_layout.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"
#include "model/hf_config.h"

namespace kvcache {

namespace {

constexpr const char* kArch = "gpt-oss";
const std::string kP = std::string(kArch) + ".";

void read_layout(const GgufFile& g, DecoderLayout& d) {
  if (d.sliding_window <= 0) {
    throw Error(ErrorKind::kFormat,
                g.path() + ": gpt-oss needs metadata 'gpt-oss.attention.sliding_window' > 0");
  }
  for (size_t l = 0; l < d.layer_types.size(); ++l)
    d.layer_types[l] = l % 2 == 0 ? "sliding_attention" : "full_attention";
}

YarnParams yarn_of(double factor, int64_t original, double beta_fast, double beta_slow) {
  YarnParams y;
  y.factor = factor;
  y.beta_fast = beta_fast;
  y.beta_slow = beta_slow;
  y.truncate = true;  // ggml_rope_yarn_corr_dims
  y.original_max_position_embeddings = original;
  return y;
}

void read_config(const GgufFile& g, ModelFile& mf) {
  const std::string& path = g.path();
  ModelConfig& c = mf.mutable_config();
  check_gguf_value_length(g, kArch, c.head_dim);
  c.rope_interleaved = false;  // NEOX
  c.qkv_bias = true;
  c.attn_out_bias = true;
  c.attn_sinks = true;
  c.query_scale = 0.0f;
  MoeConfig& m = c.moe;
  m.router = MoeRouter::kGptOss;
  m.n_experts = check_config_count(path, kP + "expert_count", g.get_int(kP + "expert_count"),
                                   ConfigCount::kExperts);
  m.n_experts_used = check_config_count(path, kP + "expert_used_count",
                                        g.get_int(kP + "expert_used_count"), ConfigCount::kExperts);
  m.expert_hidden_dim = check_config_count(
      path, kP + "expert_feed_forward_length",
      g.get_int_or(kP + "expert_feed_forward_length", c.hidden_dim), ConfigCount::kFfnSize);
  c.hidden_dim = m.expert_hidden_dim;
  const std::string scaling = g.get_string_or(kP + "rope.scaling.type", "none");
  if (scaling == "yarn") {
    const double factor = g.get_float(kP + "rope.scaling.factor");
    const int64_t original = check_config_count(
        path, kP + "rope.scaling.original_context_length",
        g.get_int(kP + "rope.scaling.original_context_length"), ConfigCount::kContext);
    if (!(factor > 0.0) || original <= 0) {
      throw Error(ErrorKind::kFormat, path +
                                          ": gpt-oss yarn needs rope.scaling.factor > 0 and "
                                          "rope.scaling.original_context_length > 0");
    }
    const YarnParams y =
        yarn_of(factor, original, g.get_float_or(kP + "rope.scaling.yarn_beta_fast", 32.0),
                g.get_float_or(kP + "rope.scaling.yarn_beta_slow", 1.0));
    const YarnResult r = yarn_rope(c.rope_theta, c.rope_dim(), y);
    c.rope_scaling.type = RopeScalingType::kYarn;
    c.rope_scaling.factor = static_cast<float>(factor);
    c.rope_scaling.original_max_position_embeddings = original;
    c.rope_freq_factors = r.freq_factors;
    c.rope_attention_factor = static_cast<float>(r.attention_factor);
  } else if (scaling != "none") {
    throw Error(ErrorKind::kUnsupported, path + ": gpt-oss rope scaling type '" + scaling +
                                             "' is not supported (none, yarn)");
  }
}

// [E, rows, cols] -> [E, cols, rows] of 2- or 4-byte elements.
Tensor transpose_experts(const TensorView& t) {
  const int64_t E = t.dim(0), R = t.dim(1), C = t.dim(2);
  const size_t es = dtype_bytes(t.dtype(), 1);
  Tensor out = Tensor::empty(t.dtype(), {E, C, R});
  const auto* src = static_cast<const std::byte*>(t.data());
  auto* dst = static_cast<std::byte*>(out.data());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c)
        std::memcpy(dst + static_cast<size_t>((e * C + c) * R + r) * es,
                    src + static_cast<size_t>((e * R + r) * C + c) * es, es);
  return out;
}

void need_float(const std::string& path, const std::string& name, const TensorView& t) {
  if (!dtype_is_float(t.dtype()) || t.ndim() < 2) {
    throw Error(ErrorKind::kUnsupported,
                path + ": tensor '" + name + "' has type " + dtype_name(t.dtype()) +
                    "; gpt-oss experts are read as f32/f16/bf16 (they are re-laid out at load)");
  }
}

const std::vector<GgufTensorName> kTensors = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"blk.{N}.attn_norm.weight", "model.layers.{N}.input_layernorm.weight"},
    {"blk.{N}.attn_q.weight", "model.layers.{N}.self_attn.q_proj.weight"},
    {"blk.{N}.attn_q.bias", "model.layers.{N}.self_attn.q_proj.bias"},
    {"blk.{N}.attn_k.weight", "model.layers.{N}.self_attn.k_proj.weight"},
    {"blk.{N}.attn_k.bias", "model.layers.{N}.self_attn.k_proj.bias"},
    {"blk.{N}.attn_v.weight", "model.layers.{N}.self_attn.v_proj.weight"},
    {"blk.{N}.attn_v.bias", "model.layers.{N}.self_attn.v_proj.bias"},
    {"blk.{N}.attn_output.weight", "model.layers.{N}.self_attn.o_proj.weight"},
    {"blk.{N}.attn_output.bias", "model.layers.{N}.self_attn.o_proj.bias"},
    {"blk.{N}.attn_sinks.weight", "model.layers.{N}.self_attn.sinks"},
    {"blk.{N}.post_attention_norm.weight", "model.layers.{N}.post_attention_layernorm.weight"},
    {"blk.{N}.ffn_gate_inp.weight", "model.layers.{N}.mlp.router.weight"},
    {"blk.{N}.ffn_gate_inp.bias", "model.layers.{N}.mlp.router.bias"},
    {"blk.{N}.ffn_down_exps.bias", "model.layers.{N}.mlp.experts.down_proj_bias"},
};

const GgufArchitecture& entry();

std::string layer_of(const std::string& name, const char* head, const char* tail) {
  if (!name.starts_with(head) || !name.ends_with(tail)) return {};
  return name.substr(std::strlen(head), name.size() - std::strlen(head) - std::strlen(tail));
}

void load_tensors(const GgufFile& g, ModelFile& mf) {
  const std::string& path = g.path();
  // gate/up pairs, joined per layer once both are seen.
  for (const GgufTensorInfo& info : g.tensor_infos()) {
    const std::string& n = info.name;
    std::string l;
    if (!(l = layer_of(n, "blk.", ".ffn_gate_exps.weight")).empty()) {
      const std::string up_name = "blk." + l + ".ffn_up_exps.weight";
      const GgufTensorInfo* up_info = g.find_tensor(up_name);
      if (up_info == nullptr)
        throw Error(ErrorKind::kFormat, path + ": missing tensor '" + up_name + "'");
      const TensorView gate = g.tensor_view(info), up = g.tensor_view(*up_info);
      need_float(path, n, gate);
      need_float(path, up_name, up);
      if (gate.shape() != up.shape() || gate.dtype() != up.dtype()) {
        throw Error(ErrorKind::kFormat,
                    path + ": '" + n + "' and '" + up_name + "' differ in shape or type");
      }
      // [E, I, dim] x2 -> [E, dim, 2I] with gate at even, up at odd columns.
      const int64_t E = gate.dim(0), I = gate.dim(1), D = gate.dim(2);
      const size_t es = dtype_bytes(gate.dtype(), 1);
      Tensor gu = Tensor::empty(gate.dtype(), {E, D, 2 * I});
      const auto* gs = static_cast<const std::byte*>(gate.data());
      const auto* us = static_cast<const std::byte*>(up.data());
      auto* dst = static_cast<std::byte*>(gu.data());
      for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < I; ++i)
          for (int64_t d = 0; d < D; ++d) {
            const size_t from = static_cast<size_t>((e * I + i) * D + d) * es;
            const size_t to = static_cast<size_t>((e * D + d) * 2 * I + 2 * i) * es;
            std::memcpy(dst + to, gs + from, es);
            std::memcpy(dst + to + es, us + from, es);
          }
      mf.add_tensor("model.layers." + l + ".mlp.experts.gate_up_proj", gu.view());
      mf.keep_alive(std::make_shared<Tensor>(std::move(gu)));
    } else if (!(l = layer_of(n, "blk.", ".ffn_gate_exps.bias")).empty()) {
      const std::string up_name = "blk." + l + ".ffn_up_exps.bias";
      const GgufTensorInfo* up_info = g.find_tensor(up_name);
      if (up_info == nullptr)
        throw Error(ErrorKind::kFormat, path + ": missing tensor '" + up_name + "'");
      const TensorView gate = g.tensor_view(info), up = g.tensor_view(*up_info);
      need_float(path, n, gate);
      if (gate.shape() != up.shape() || gate.dtype() != up.dtype()) {
        throw Error(ErrorKind::kFormat,
                    path + ": '" + n + "' and '" + up_name + "' differ in shape or type");
      }
      const int64_t E = gate.dim(0), I = gate.dim(1);
      const size_t es = dtype_bytes(gate.dtype(), 1);
      Tensor gu = Tensor::empty(gate.dtype(), {E, 2 * I});
      auto* dst = static_cast<std::byte*>(gu.data());
      for (int64_t k = 0; k < E * I; ++k) {
        std::memcpy(dst + static_cast<size_t>(2 * k) * es,
                    static_cast<const std::byte*>(gate.data()) + static_cast<size_t>(k) * es, es);
        std::memcpy(dst + static_cast<size_t>(2 * k + 1) * es,
                    static_cast<const std::byte*>(up.data()) + static_cast<size_t>(k) * es, es);
      }
      mf.add_tensor("model.layers." + l + ".mlp.experts.gate_up_proj_bias", gu.view());
      mf.keep_alive(std::make_shared<Tensor>(std::move(gu)));
    } else if (n.ends_with(".ffn_up_exps.weight") || n.ends_with(".ffn_up_exps.bias")) {
      continue;  // joined with its gate above
    } else if (!(l = layer_of(n, "blk.", ".ffn_down_exps.weight")).empty()) {
      const TensorView down = g.tensor_view(info);
      need_float(path, n, down);
      Tensor t = transpose_experts(down);  // [E, dim, I] -> [E, I, dim]
      mf.add_tensor("model.layers." + l + ".mlp.experts.down_proj", t.view());
      mf.keep_alive(std::make_shared<Tensor>(std::move(t)));
    } else {
      const std::string fam = gguf_to_family_name(entry(), n);
      if (fam.empty()) {
        throw Error(ErrorKind::kFormat,
                    path + ": tensor '" + n + "' is not one of GGUF architecture gpt-oss");
      }
      mf.add_tensor(fam, g.tensor_view(info));
    }
  }
}

void write_config(GgufWriter& w, const ModelConfig& c) {
  const MoeConfig& m = c.moe;
  if (m.swiglu_alpha != 1.702f || m.swiglu_limit != 7.0f) {
    throw Error(ErrorKind::kUnsupported,
                "gpt-oss: llama.cpp fixes the experts' SwiGLU at alpha 1.702, limit 7; this model "
                "uses other values, which a GGUF cannot express");
  }
  write_gguf_common_config(w, kArch, c);
  auto u32 = [](int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  w.set(kP + "attention.key_length", u32(c.head_dim));
  w.set(kP + "attention.value_length", u32(c.head_dim));
  w.set(kP + "rope.dimension_count", u32(c.head_dim));
  w.set(kP + "attention.sliding_window", u32(c.sliding_window));
  w.set(kP + "expert_count", u32(m.n_experts));
  w.set(kP + "expert_used_count", u32(m.n_experts_used));
  w.set(kP + "expert_feed_forward_length", u32(m.expert_hidden_dim));
  if (c.rope_scaling.type == RopeScalingType::kYarn) {
    // What ggml computes from these keys must be what the model uses (transformers'
    // truncate = false, for one, differs).
    const YarnResult r = yarn_rope(
        c.rope_theta, c.rope_dim(),
        yarn_of(c.rope_scaling.factor, c.rope_scaling.original_max_position_embeddings, 32.0, 1.0));
    if (r.freq_factors != c.rope_freq_factors ||
        static_cast<float>(r.attention_factor) != c.rope_attention_factor) {
      throw Error(ErrorKind::kUnsupported,
                  "gpt-oss: this model's YaRN (beta_fast/beta_slow/truncate/attention_factor) "
                  "differs from what ggml derives from rope.scaling.factor and "
                  "original_context_length (beta 32/1, truncated correction range)");
    }
    w.set(kP + "rope.scaling.type", GgufValue::str("yarn"));
    w.set(kP + "rope.scaling.factor", GgufValue::f32(c.rope_scaling.factor));
    w.set(kP + "rope.scaling.original_context_length",
          u32(c.rope_scaling.original_max_position_embeddings));
  } else if (c.rope_scaling.type != RopeScalingType::kNone) {
    throw Error(ErrorKind::kUnsupported, std::string("gpt-oss: rope scaling ") +
                                             rope_scaling_name(c.rope_scaling.type) +
                                             " cannot be written (none, yarn)");
  }
}

void write_tensors(const ModelFile& model, GgufTensorList& out, std::vector<Tensor>& owned) {
  for (const auto& [name, view] : model.tensors()) {
    std::string l;
    if (!(l = layer_of(name, "model.layers.", ".mlp.experts.gate_up_proj")).empty()) {
      need_float(model.path(), name, view);
      // [E, dim, 2I] interleaved -> gate/up [E, I, dim].
      const int64_t E = view.dim(0), D = view.dim(1), I = view.dim(2) / 2;
      const size_t es = dtype_bytes(view.dtype(), 1);
      Tensor gate = Tensor::empty(view.dtype(), {E, I, D}),
             up = Tensor::empty(view.dtype(), {E, I, D});
      const auto* src = static_cast<const std::byte*>(view.data());
      for (int64_t e = 0; e < E; ++e)
        for (int64_t i = 0; i < I; ++i)
          for (int64_t d = 0; d < D; ++d) {
            const size_t from = static_cast<size_t>((e * D + d) * 2 * I + 2 * i) * es;
            const size_t to = static_cast<size_t>((e * I + i) * D + d) * es;
            std::memcpy(static_cast<std::byte*>(gate.data()) + to, src + from, es);
            std::memcpy(static_cast<std::byte*>(up.data()) + to, src + from + es, es);
          }
      owned.push_back(std::move(gate));
      out.emplace_back("blk." + l + ".ffn_gate_exps.weight", owned.back().view());
      owned.push_back(std::move(up));
      out.emplace_back("blk." + l + ".ffn_up_exps.weight", owned.back().view());
    } else if (!(l = layer_of(name, "model.layers.", ".mlp.experts.gate_up_proj_bias")).empty()) {
      const int64_t E = view.dim(0), I = view.dim(1) / 2;
      const size_t es = dtype_bytes(view.dtype(), 1);
      Tensor gate = Tensor::empty(view.dtype(), {E, I}), up = Tensor::empty(view.dtype(), {E, I});
      const auto* src = static_cast<const std::byte*>(view.data());
      for (int64_t k = 0; k < E * I; ++k) {
        std::memcpy(static_cast<std::byte*>(gate.data()) + static_cast<size_t>(k) * es,
                    src + static_cast<size_t>(2 * k) * es, es);
        std::memcpy(static_cast<std::byte*>(up.data()) + static_cast<size_t>(k) * es,
                    src + static_cast<size_t>(2 * k + 1) * es, es);
      }
      owned.push_back(std::move(gate));
      out.emplace_back("blk." + l + ".ffn_gate_exps.bias", owned.back().view());
      owned.push_back(std::move(up));
      out.emplace_back("blk." + l + ".ffn_up_exps.bias", owned.back().view());
    } else if (!(l = layer_of(name, "model.layers.", ".mlp.experts.down_proj")).empty()) {
      need_float(model.path(), name, view);
      owned.push_back(transpose_experts(view));  // [E, I, dim] -> [E, dim, I]
      out.emplace_back("blk." + l + ".ffn_down_exps.weight", owned.back().view());
    } else {
      const std::string gguf = family_to_gguf_name(entry(), name);
      if (gguf.empty()) {
        throw Error(ErrorKind::kUnsupported, model.path() + ": tensor '" + name +
                                                 "' has no name in GGUF architecture gpt-oss");
      }
      out.emplace_back(gguf, view);
    }
  }
}

const GgufArchitecture kGptOss{kArch,    "gpt_oss",     &read_layout,  &read_config,
                               kTensors, &load_tensors, &write_config, &write_tensors};
const GgufArchitecture& entry() {
  return kGptOss;
}

}  // namespace

KVCACHE_REGISTER_GGUF_ARCH(gpt_oss, kGptOss);

}  // namespace kvcache
