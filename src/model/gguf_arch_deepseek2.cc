// GGUF architecture deepseek2 -> the deepseek family (model/deepseek.cc, transformers names:
// DeepseekV2ForCausalLM / DeepseekV3ForCausalLM).
// llama.cpp facts used here (src/models/deepseek2.cpp load_arch_hparams / load_arch_tensors and
// its graph, src/llama-arch.cpp LLM_KV_NAMES / LLM_TENSOR_NAMES, src/llama-context.cpp YaRN
// set-up, src/llama-graph.cpp build_moe_ffn, conversion/deepseek.py DeepseekV2Model and
// conversion/base.py TextModel.set_gguf_parameters):
//  - attention.kv_lora_rank, attention.q_lora_rank (absent or unused when the file has attn_q:
//    the graph takes the "lite" path whenever wq is loaded), rope.dimension_count = qk_rope;
//  - two layouts of the per-head widths. Files written since llama.cpp's MLA rework (what the
//    converter writes today, and what `kvcache convert` writes) store the compressed widths
//    under attention.key_length (kv_lora_rank + qk_rope) / value_length (kv_lora_rank) with
//    head_count_kv = 1, the per-head widths under attention.key_length_mla (qk_nope + qk_rope) /
//    value_length_mla (v_head_dim), and kv_b_proj split per head: attn_k_b = k part transposed,
//    [H, kv_lora, qk_nope] (ggml ne {qk_nope, kv_lora, H}), attn_v_b = [H, v_head, kv_lora].
//    Older files have no *_mla keys, the per-head widths under key_length / value_length and
//    one attn_kv_b = kv_b_proj as is. Both load; kv_b_proj is rebuilt from k_b / v_b;
//  - no row permutation (RoPE type NORM: pairs (2i, 2i+1), transformers' interleaved DeepSeek
//    RoPE on the weights as stored);
//  - MoE: leading_dense_block_count dense SwiGLU layers (ffn_gate/up/down), then ffn_gate_inp
//    (router), exp_probs_b.bias (V3's e_score_correction_bias, optional in llama.cpp: zero when
//    absent), stacked experts ffn_{gate,up,down}_exps [E, I, dim] / [E, dim, I] (or the fused
//    ffn_gate_up_exps, refused), shared experts ffn_{gate,up,down}_shexp of
//    expert_shared_count x expert_feed_forward_length rows; expert_count, expert_used_count,
//    expert_group_count / expert_group_used_count (V3's n_group / topk_group),
//    expert_weights_norm (norm_topk_prob), expert_weights_scale (routed_scaling_factor; 0 or
//    absent: 1), expert_gating_func 1 softmax (V2; also when absent) / 2 sigmoid (V3);
//  - the q_a / kv_a norms use attention.layer_norm_rms_epsilon in llama.cpp but eps 1e-6 in
//    transformers (DeepseekV3RMSNorm's default, model/mla_attention.h): files with another
//    epsilon are refused;
//  - YaRN: rope.scaling.type "yarn", rope.scaling.factor, original_context_length,
//    rope.scaling.yarn_log_multiplier = 0.1 * mscale_all_dim (the converter's factor 0.1,
//    undone at load), rope.scaling.attn_factor; beta_fast / beta_slow are 32 / 1 (llama.cpp
//    reads no key for them), the correction range is rounded outward (truncate). What the
//    graph computes from these (llama-context.cpp, the deepseek2 graph's kq_scale and ggml's
//    rope_yarn magnitude) is in llama_yarn() below.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "kernels/matmul.h"
#include "model/config_limits.h"
#include "model/decoder_layout.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"
#include "model/hf_config.h"

namespace kvcache {

namespace {

constexpr const char* kArch = "deepseek2";
const std::string kP = std::string(kArch) + ".";
// llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX / _SIGMOID (src/llama-hparams.h).
constexpr int64_t kGatingSoftmax = 1, kGatingSigmoid = 2;
// transformers' DeepseekV3RMSNorm default, which the MLA latent norms use (mla_attention.cc).
constexpr float kLatentNormEps = 1e-6f;

void read_layout(const GgufFile& g, DecoderLayout& d) {
  const std::string& path = g.path();
  if (d.kv_lora_rank <= 0) {
    throw Error(ErrorKind::kFormat,
                path + ": deepseek2 needs metadata 'deepseek2.attention.kv_lora_rank' > 0");
  }
  if (g.find("deepseek2.attention.key_length_mla") != nullptr) {
    const int64_t qk =
        check_config_count(path, "deepseek2.attention.key_length_mla",
                           g.get_int("deepseek2.attention.key_length_mla"), ConfigCount::kHeadDim);
    if (qk <= d.qk_rope_head_dim) {
      throw Error(ErrorKind::kFormat, path + ": deepseek2.attention.key_length_mla (" +
                                          std::to_string(qk) +
                                          ") must exceed rope.dimension_count");
    }
    d.head_dim = qk;
    d.qk_nope_head_dim = qk - d.qk_rope_head_dim;
    d.v_head_dim = check_config_count(path, "deepseek2.attention.value_length_mla",
                                      g.get_int_or("deepseek2.attention.value_length_mla", qk),
                                      ConfigCount::kHeadDim);
    d.n_kv_heads = d.n_heads;  // head_count_kv = 1 is the MQA form of the latent
  }
  if (d.qk_nope_head_dim <= 0) {
    throw Error(ErrorKind::kFormat, path +
                                        ": deepseek2.attention.key_length must exceed "
                                        "rope.dimension_count (qk_nope_head_dim >= 1)");
  }
}

// llama.cpp's YaRN keys for deepseek2.
struct LlamaYarn {
  double factor = 1.0;
  int64_t original = 0;
  double log_mul = 0.0;      // mscale_all_dim (the key / 0.1); 0: absent
  double attn_factor = 1.0;  // rope.scaling.attn_factor
};

// What llama.cpp computes from those keys, as our config holds it:
//  - llama-context.cpp: yarn_attn_factor = X / (1 + 0.1 ln f) * attn_factor, X = 1 with
//    yarn_log_multiplier (deepseek2 special case: mscale = mscale_all_dim, so the ratio of
//    get_mscale's is 1), else get_mscale(f, 1);
//  - ggml rope_yarn multiplies cos/sin by yarn_attn_factor * (1 + 0.1 ln f): X * attn_factor;
//  - the deepseek2 graph: kq_scale = (X * attn_factor * (1 + 0.1 log_mul ln f))^2 / sqrt(D_k).
void llama_yarn(const LlamaYarn& y, ModelConfig& c) {
  const double f = y.factor, lnf = std::log(f);
  const double x = y.log_mul != 0.0 ? 1.0 : yarn_get_mscale(f, 1.0);
  const double rope_mult = x * y.attn_factor;
  const double m = rope_mult * (1.0 + 0.1 * y.log_mul * lnf);
  YarnParams p;
  p.factor = f;
  p.beta_fast = 32.0;
  p.beta_slow = 1.0;
  p.truncate = true;  // ggml_rope_yarn_corr_dims: floor / ceil
  p.original_max_position_embeddings = y.original;
  p.attention_factor = rope_mult;
  const YarnResult r = yarn_rope(c.rope_theta, c.rope_dim(), p);
  c.rope_scaling.type = RopeScalingType::kYarn;
  c.rope_scaling.factor = static_cast<float>(f);
  c.rope_scaling.original_max_position_embeddings = y.original;
  c.rope_freq_factors = r.freq_factors;
  c.rope_attention_factor = static_cast<float>(r.attention_factor);
  c.query_scale = static_cast<float>(m * m / std::sqrt(static_cast<double>(c.qk_head_dim())));
}

void refuse_key(const GgufFile& g, const std::string& key, const std::string& why) {
  if (g.find(key) != nullptr)
    throw Error(ErrorKind::kUnsupported, g.path() + ": metadata '" + key + "' " + why);
}

void read_rope(const GgufFile& g, ModelConfig& c) {
  const std::string& path = g.path();
  const std::string scaling = g.get_string_or(kP + "rope.scaling.type", "none");
  LlamaYarn y;
  y.attn_factor = g.get_float_or(kP + "rope.scaling.attn_factor", 1.0);
  if (!(y.attn_factor > 0.0)) {
    throw Error(ErrorKind::kFormat, path + ": " + kP + "rope.scaling.attn_factor must be > 0");
  }
  // Keys llama.cpp reads for no architecture (beta 32 / 1 are fixed): a file giving other
  // values would run differently here and there.
  for (const char* k : {"rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor"})
    refuse_key(g, kP + k, "is not read by llama.cpp's deepseek2; remove it or convert again");
  if (g.get_float_or(kP + "rope.scaling.yarn_beta_fast", 32.0) != 32.0 ||
      g.get_float_or(kP + "rope.scaling.yarn_beta_slow", 1.0) != 1.0) {
    throw Error(ErrorKind::kUnsupported,
                path +
                    ": deepseek2 YaRN beta_fast / beta_slow other than 32 / 1 (llama.cpp "
                    "runs deepseek2 with 32 / 1 whatever the file says)");
  }
  if (scaling == "yarn") {
    y.factor = g.get_float(kP + "rope.scaling.factor");
    y.original =
        check_config_count(path, kP + "rope.scaling.original_context_length",
                           g.get_int_or(kP + "rope.scaling.original_context_length", c.max_seq_len),
                           ConfigCount::kContext);
    if (!(y.factor > 1.0) || y.original <= 0) {
      throw Error(ErrorKind::kFormat, path +
                                          ": deepseek2 yarn needs rope.scaling.factor > 1 and "
                                          "rope.scaling.original_context_length > 0");
    }
    y.log_mul = g.get_float_or(kP + "rope.scaling.yarn_log_multiplier", 0.0) / 0.1;
    llama_yarn(y, c);
  } else if (scaling == "none") {
    // No YaRN: cos/sin times attn_factor, kq_scale attn_factor^2 / sqrt(D_k).
    c.rope_attention_factor = static_cast<float>(y.attn_factor);
    c.query_scale = static_cast<float>(y.attn_factor * y.attn_factor /
                                       std::sqrt(static_cast<double>(c.qk_head_dim())));
  } else {
    throw Error(ErrorKind::kUnsupported, path + ": deepseek2 rope scaling type '" + scaling +
                                             "' is not supported (none, yarn)");
  }
}

void read_moe(const GgufFile& g, ModelFile& mf) {
  const std::string& path = g.path();
  ModelConfig& c = mf.mutable_config();
  MoeConfig& m = c.moe;
  auto count_or = [&](const std::string& key, int64_t fallback, ConfigCount kind) {
    return check_config_count(path, kP + key, g.get_int_or(kP + key, fallback), kind);
  };
  m.first_dense_layers = count_or("leading_dense_block_count", 0, ConfigCount::kLayers);
  m.n_experts = count_or("expert_count", 0, ConfigCount::kExperts);
  const int64_t gating = g.get_int_or(kP + "expert_gating_func", kGatingSoftmax);
  // V3's sigmoid router is the family's deepseek_v3, V2's softmax its deepseek_v2.
  c.architecture = gating == kGatingSigmoid ? "deepseek_v3" : "deepseek_v2";
  if (m.first_dense_layers >= c.n_layers || m.n_experts == 0) {
    if (m.n_experts == 0 && m.first_dense_layers < c.n_layers) {
      throw Error(ErrorKind::kFormat, path + ": deepseek2 layer " +
                                          std::to_string(m.first_dense_layers) +
                                          " is MoE (leading_dense_block_count) but " + kP +
                                          "expert_count is 0 or missing");
    }
    m.n_experts = 0;  // every layer dense
    return;
  }
  m.n_experts_used = check_config_count(path, kP + "expert_used_count",
                                        g.get_int(kP + "expert_used_count"), ConfigCount::kExperts);
  m.expert_hidden_dim =
      check_config_count(path, kP + "expert_feed_forward_length",
                         g.get_int(kP + "expert_feed_forward_length"), ConfigCount::kFfnSize);
  m.n_shared_experts = count_or("expert_shared_count", 0, ConfigCount::kExperts);
  m.norm_topk_prob = g.get_bool_or(kP + "expert_weights_norm", false);
  const double scale = g.get_float_or(kP + "expert_weights_scale", 0.0);
  m.routed_scaling_factor = scale == 0.0 ? 1.0f : static_cast<float>(scale);  // 0: not applied
  const int64_t groups = count_or("expert_group_count", 0, ConfigCount::kExperts);
  const int64_t groups_used = count_or("expert_group_used_count", 0, ConfigCount::kExperts);
  if (m.n_experts_used <= 0 || m.n_experts_used > m.n_experts) {
    throw Error(ErrorKind::kFormat,
                path + ": deepseek2 expert_used_count must be in [1, expert_count]");
  }
  if (gating == kGatingSigmoid) {
    m.router = MoeRouter::kDeepseekV3;
    m.n_group = groups > 1 ? groups : 1;
    m.topk_group = groups > 1 ? groups_used : 1;
    if (m.n_experts % m.n_group != 0 || m.topk_group < 1 || m.topk_group > m.n_group) {
      throw Error(ErrorKind::kFormat, path +
                                          ": deepseek2 expert_group_count must divide "
                                          "expert_count and expert_group_used_count be in "
                                          "[1, expert_group_count]");
    }
    // llama.cpp's exp_probs_b is optional (no bias added when absent); the family reads one
    // per MoE layer, so an absent one is the zeros llama.cpp's choice amounts to.
    for (int64_t l = m.first_dense_layers; l < c.n_layers; ++l) {
      const std::string name =
          "model.layers." + std::to_string(l) + ".mlp.gate.e_score_correction_bias";
      if (mf.find(name) != nullptr) continue;
      auto zeros = std::make_shared<Tensor>(Tensor::empty(DType::kF32, {m.n_experts}));
      std::memset(zeros->data(), 0, static_cast<size_t>(m.n_experts) * sizeof(float));
      mf.add_tensor(name, zeros->view());
      mf.keep_alive(zeros);
    }
  } else if (gating == kGatingSoftmax) {
    m.router = MoeRouter::kSoftmaxGreedy;
    if (groups > 1) {
      throw Error(ErrorKind::kUnsupported,
                  path +
                      ": deepseek2 softmax routing with expert_group_count > 1 is not "
                      "supported (DeepSeek-V2's group_limited_greedy); run the Hugging Face "
                      "folder");
    }
    for (int64_t l = m.first_dense_layers; l < c.n_layers; ++l) {
      if (g.find_tensor("blk." + std::to_string(l) + ".exp_probs_b.bias") != nullptr) {
        throw Error(ErrorKind::kUnsupported,
                    path + ": tensor 'blk." + std::to_string(l) +
                        ".exp_probs_b.bias' with softmax routing (expert_gating_func 1) is not "
                        "supported: only the sigmoid router (2) takes a selection bias");
      }
    }
  } else {
    throw Error(ErrorKind::kUnsupported, path + ": deepseek2 expert_gating_func " +
                                             std::to_string(gating) +
                                             " is not supported (1 softmax, 2 sigmoid)");
  }
}

void read_config(const GgufFile& g, ModelFile& mf) {
  const std::string& path = g.path();
  ModelConfig& c = mf.mutable_config();
  if (c.rms_eps != kLatentNormEps) {
    throw Error(ErrorKind::kUnsupported,
                path + ": deepseek2 with attention.layer_norm_rms_epsilon " +
                    std::to_string(c.rms_eps) +
                    ": llama.cpp applies it to the q_a / kv_a latent norms too, transformers (and "
                    "this runtime) uses 1e-6 there; only 1e-6 files are run");
  }
  MlaConfig& a = c.mla;
  a.rope_interleave = true;  // llama.cpp's LLAMA_ROPE_TYPE_NORM for deepseek2
  // The graph takes q_proj whenever attn_q is loaded, else q_a -> norm -> q_b.
  if (g.find_tensor("blk.0.attn_q.weight") != nullptr) {
    a.q_lora_rank = 0;
  } else {
    a.q_lora_rank =
        check_config_count(path, kP + "attention.q_lora_rank",
                           g.get_int_or(kP + "attention.q_lora_rank", 0), ConfigCount::kHeadDim);
    if (a.q_lora_rank <= 0) {
      throw Error(ErrorKind::kFormat,
                  path + ": deepseek2 without blk.0.attn_q.weight needs metadata '" + kP +
                      "attention.q_lora_rank' > 0 (attn_q_a / attn_q_b)");
    }
  }
  c.head_dim = a.qk_nope_head_dim + a.qk_rope_head_dim;
  c.n_kv_heads = c.n_heads;  // the cache holds the latent; the heads are expanded from it
  read_rope(g, c);
  read_moe(g, mf);
}

// ---- tensors ----

const std::vector<GgufTensorName> kTensors = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
    {"blk.{N}.attn_norm.weight", "model.layers.{N}.input_layernorm.weight"},
    {"blk.{N}.attn_q.weight", "model.layers.{N}.self_attn.q_proj.weight"},
    {"blk.{N}.attn_q_a.weight", "model.layers.{N}.self_attn.q_a_proj.weight"},
    {"blk.{N}.attn_q_a_norm.weight", "model.layers.{N}.self_attn.q_a_layernorm.weight"},
    {"blk.{N}.attn_q_b.weight", "model.layers.{N}.self_attn.q_b_proj.weight"},
    {"blk.{N}.attn_kv_a_mqa.weight", "model.layers.{N}.self_attn.kv_a_proj_with_mqa.weight"},
    {"blk.{N}.attn_kv_a_norm.weight", "model.layers.{N}.self_attn.kv_a_layernorm.weight"},
    {"blk.{N}.attn_kv_b.weight", "model.layers.{N}.self_attn.kv_b_proj.weight"},  // older files
    {"blk.{N}.attn_output.weight", "model.layers.{N}.self_attn.o_proj.weight"},
    {"blk.{N}.ffn_norm.weight", "model.layers.{N}.post_attention_layernorm.weight"},
    {"blk.{N}.ffn_gate.weight", "model.layers.{N}.mlp.gate_proj.weight"},
    {"blk.{N}.ffn_up.weight", "model.layers.{N}.mlp.up_proj.weight"},
    {"blk.{N}.ffn_down.weight", "model.layers.{N}.mlp.down_proj.weight"},
    {"blk.{N}.ffn_gate_inp.weight", "model.layers.{N}.mlp.gate.weight"},
    {"blk.{N}.exp_probs_b.bias", "model.layers.{N}.mlp.gate.e_score_correction_bias"},
    {"blk.{N}.ffn_gate_shexp.weight", "model.layers.{N}.mlp.shared_experts.gate_proj.weight"},
    {"blk.{N}.ffn_up_shexp.weight", "model.layers.{N}.mlp.shared_experts.up_proj.weight"},
    {"blk.{N}.ffn_down_shexp.weight", "model.layers.{N}.mlp.shared_experts.down_proj.weight"},
};

const GgufArchitecture& entry();

// The layer index of `name` = head + digits + tail ("" otherwise).
std::string layer_of(const std::string& name, const std::string& head, const std::string& tail) {
  if (name.size() <= head.size() + tail.size() || !name.starts_with(head) ||
      !name.ends_with(tail)) {
    return {};
  }
  std::string l = name.substr(head.size(), name.size() - head.size() - tail.size());
  for (char ch : l)
    if (ch < '0' || ch > '9') return {};
  return l;
}

void need_float(const std::string& path, const std::string& name, const TensorView& t) {
  if (!dtype_is_float(t.dtype())) {
    throw Error(ErrorKind::kUnsupported,
                path + ": tensor '" + name + "' has type " + dtype_name(t.dtype()) +
                    "; deepseek2's kv_b_proj is split into attn_k_b / attn_v_b by transposing, "
                    "from f32/f16/bf16 only");
  }
}

void need_shape(const std::string& path, const std::string& name, const TensorView& t,
                const Shape& want) {
  if (t.shape() != want) {
    throw Error(ErrorKind::kFormat, path + ": tensor '" + name + "' has shape " + t.shape().str() +
                                        ", expected " + want.str() +
                                        " from the deepseek2 metadata");
  }
}

// attn_k_b [H, d_c, d_kn] + attn_v_b [H, d_v, d_c] -> kv_b_proj [H * (d_kn + d_v), d_c]: per
// head the d_kn rows of k (k_b transposed back) then the d_v rows of v (the converter's split
// undone). Kept in their float type when both share it, else dequantised to f32 (`kvcache
// convert --dtype q8_0` quantises attn_v_b, whose rows are d_c long).
Tensor join_kv_b(const std::string& path, const std::string& kname, const TensorView& kb,
                 const std::string& vname, const TensorView& vb, const ModelConfig& c) {
  const MlaConfig& a = c.mla;
  const int64_t H = c.n_heads, dc = a.kv_lora_rank, dn = a.qk_nope_head_dim, dv = a.v_head_dim;
  need_shape(path, kname, kb, Shape{H, dc, dn});
  need_shape(path, vname, vb, Shape{H, dv, dc});
  const bool same_float = kb.dtype() == vb.dtype() && dtype_is_float(kb.dtype());
  const DType dt = same_float ? kb.dtype() : DType::kF32;
  const size_t es = dtype_bytes(dt, 1);
  Tensor k32, v32;  // the f32 copies when dequantised
  const std::byte* ks = static_cast<const std::byte*>(kb.data());
  const std::byte* vs = static_cast<const std::byte*>(vb.data());
  if (!same_float) {
    k32 = Tensor::empty(DType::kF32, kb.shape());
    v32 = Tensor::empty(DType::kF32, vb.shape());
    for (int64_t r = 0; r < H * dc; ++r)  // rows of d_kn
      dequantize_row(ks + dtype_bytes(kb.dtype(), r * dn), kb.dtype(),
                     static_cast<float*>(k32.data()) + r * dn, dn);
    for (int64_t r = 0; r < H * dv; ++r)  // rows of d_c
      dequantize_row(vs + dtype_bytes(vb.dtype(), r * dc), vb.dtype(),
                     static_cast<float*>(v32.data()) + r * dc, dc);
    ks = static_cast<const std::byte*>(k32.data());
    vs = static_cast<const std::byte*>(v32.data());
  }
  Tensor out = Tensor::empty(dt, {H * (dn + dv), dc});
  auto* dst = static_cast<std::byte*>(out.data());
  for (int64_t h = 0; h < H; ++h) {
    for (int64_t i = 0; i < dn; ++i)
      for (int64_t j = 0; j < dc; ++j)
        std::memcpy(dst + static_cast<size_t>((h * (dn + dv) + i) * dc + j) * es,
                    ks + static_cast<size_t>((h * dc + j) * dn + i) * es, es);
    std::memcpy(dst + static_cast<size_t>((h * (dn + dv) + dn) * dc) * es,
                vs + static_cast<size_t>(h * dv * dc) * es, static_cast<size_t>(dv * dc) * es);
  }
  return out;
}

// One expert of a stacked [E, rows, cols] tensor: a view (experts are whole rows, so any type,
// quantised included, slices at expert boundaries).
TensorView expert_slice(const TensorView& stacked, int64_t e) {
  const int64_t R = stacked.dim(1), C = stacked.dim(2);
  const size_t bytes = dtype_bytes(stacked.dtype(), R * C);
  return TensorView(static_cast<std::byte*>(stacked.data()) + static_cast<size_t>(e) * bytes,
                    stacked.dtype(), Shape{R, C});
}

void load_tensors(const GgufFile& g, ModelFile& mf) {
  const std::string& path = g.path();
  for (const GgufTensorInfo& info : g.tensor_infos()) {
    const std::string& n = info.name;
    std::string l;
    if (!(l = layer_of(n, "blk.", ".ffn_gate_up_exps.weight")).empty()) {
      throw Error(ErrorKind::kUnsupported,
                  path + ": tensor '" + n +
                      "' (fused gate/up experts) is not supported; convert the model with "
                      "separate ffn_gate_exps / ffn_up_exps");
    }
    bool stacked = false;
    for (const char* proj : {"gate", "up", "down"}) {
      if ((l = layer_of(n, "blk.", std::string(".ffn_") + proj + "_exps.weight")).empty()) continue;
      const TensorView t = g.tensor_view(info);
      if (t.ndim() != 3) {
        throw Error(ErrorKind::kFormat, path + ": tensor '" + n + "' is not [experts, rows, cols]");
      }
      for (int64_t e = 0; e < t.dim(0); ++e) {
        mf.add_tensor(
            "model.layers." + l + ".mlp.experts." + std::to_string(e) + "." + proj + "_proj.weight",
            expert_slice(t, e));
      }
      stacked = true;
    }
    if (stacked) continue;
    if (!(l = layer_of(n, "blk.", ".attn_k_b.weight")).empty()) {
      const std::string vname = "blk." + l + ".attn_v_b.weight";
      const GgufTensorInfo* v = g.find_tensor(vname);
      if (v == nullptr) throw Error(ErrorKind::kFormat, path + ": missing tensor '" + vname + "'");
      auto kv = std::make_shared<Tensor>(
          join_kv_b(path, n, g.tensor_view(info), vname, g.tensor_view(*v), mf.config()));
      mf.add_tensor("model.layers." + l + ".self_attn.kv_b_proj.weight", kv->view());
      mf.keep_alive(kv);
      continue;
    }
    if (!(l = layer_of(n, "blk.", ".attn_v_b.weight")).empty()) {
      if (g.find_tensor("blk." + l + ".attn_k_b.weight") == nullptr) {
        throw Error(ErrorKind::kFormat,
                    path + ": missing tensor 'blk." + l + ".attn_k_b.weight' (beside '" + n + "')");
      }
      continue;  // joined with its attn_k_b above
    }
    const std::string fam = gguf_to_family_name(entry(), n);
    if (fam.empty()) {
      throw Error(ErrorKind::kFormat, path + ": tensor '" + n +
                                          "' is not one of GGUF architecture deepseek2 "
                                          "(llama.cpp's LLM_TENSOR_NAMES)");
    }
    mf.add_tensor(fam, g.tensor_view(info));
  }
}

// ---- writer (`kvcache convert`) ----

void write_config(GgufWriter& w, const ModelConfig& c) {
  const MlaConfig& a = c.mla;
  const MoeConfig& m = c.moe;
  if (!a.enabled()) {
    throw Error(ErrorKind::kUnsupported,
                "deepseek2: only MLA models (kv_lora_rank > 0) can be "
                "written as GGUF deepseek2");
  }
  if (!a.rope_interleave) {
    throw Error(ErrorKind::kUnsupported,
                "deepseek2: llama.cpp rotates pairs (2i, 2i+1) (RoPE type NORM); this model's "
                "rope_interleave = false (halves) cannot be written as GGUF deepseek2");
  }
  if (c.rms_eps != kLatentNormEps) {
    throw Error(ErrorKind::kUnsupported,
                "deepseek2: llama.cpp applies rms_norm_eps to the q_a / kv_a latent norms too "
                "(transformers: 1e-6); only models with rms_norm_eps 1e-6 can be written");
  }
  if (m.n_experts > 0 && (m.sparse_step != 1 || !m.dense_layers.empty() ||
                          m.shared_expert_hidden_dim > 0 || m.shared_expert_gate)) {
    throw Error(ErrorKind::kUnsupported,
                "deepseek2: only leading dense layers then MoE on every layer (DeepSeek's "
                "first_k_dense_replace) can be written");
  }
  int64_t gating = 0;
  if (m.n_experts > 0) {
    if (m.router == MoeRouter::kDeepseekV3) {
      gating = kGatingSigmoid;
    } else if (m.router == MoeRouter::kSoftmaxGreedy) {
      gating = kGatingSoftmax;
    } else {
      throw Error(ErrorKind::kUnsupported,
                  "deepseek2: only DeepSeek's routers (V3 sigmoid, V2 softmax greedy) can be "
                  "written");
    }
  }
  write_gguf_common_config(w, kArch, c);
  auto u32 = [](int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  // The MQA form of the latent, as the converter writes it today (the *_mla keys and split
  // attn_k_b / attn_v_b, not the older attn_kv_b).
  w.set(kP + "attention.head_count_kv", u32(1));
  w.set(kP + "attention.kv_lora_rank", u32(a.kv_lora_rank));
  w.set(kP + "attention.key_length", u32(a.kv_lora_rank + a.qk_rope_head_dim));
  w.set(kP + "attention.value_length", u32(a.kv_lora_rank));
  w.set(kP + "attention.key_length_mla", u32(a.qk_nope_head_dim + a.qk_rope_head_dim));
  w.set(kP + "attention.value_length_mla", u32(a.v_head_dim));
  // The converter writes q_lora_rank only when set; llama.cpp requires the key unless the
  // layer count is a known "lite" one, so it is written as 0 too (the attn_q tensor decides).
  w.set(kP + "attention.q_lora_rank", u32(a.q_lora_rank));
  w.set(kP + "rope.dimension_count", u32(a.qk_rope_head_dim));
  w.set(kP + "leading_dense_block_count", u32(m.n_experts > 0 ? m.first_dense_layers : c.n_layers));
  w.set(kP + "expert_feed_forward_length",
        u32(m.n_experts > 0 ? m.expert_hidden_dim : c.hidden_dim));
  w.set(kP + "expert_shared_count", u32(m.n_experts > 0 ? m.n_shared_experts : 0));
  if (m.n_experts > 0) {
    w.set(kP + "expert_count", u32(m.n_experts));
    w.set(kP + "expert_used_count", u32(m.n_experts_used));
    w.set(kP + "expert_weights_scale", GgufValue::f32(m.routed_scaling_factor));
    if (m.norm_topk_prob) w.set(kP + "expert_weights_norm", GgufValue::boolean(true));
    w.set(kP + "expert_gating_func", u32(gating));
    if (gating == kGatingSigmoid && m.n_group > 1) {
      w.set(kP + "expert_group_count", u32(m.n_group));
      w.set(kP + "expert_group_used_count", u32(m.topk_group));
    }
  }

  // RoPE: write the keys, then check that what llama.cpp derives from them is this model's
  // table, rotation magnitude and query scale (llama_yarn / read_rope's reading).
  ModelConfig back = c;
  const double dk = static_cast<double>(c.qk_head_dim());
  if (c.rope_scaling.type == RopeScalingType::kYarn) {
    LlamaYarn y;
    y.factor = c.rope_scaling.factor;
    y.original = c.rope_scaling.original_max_position_embeddings;
    y.attn_factor = c.rope_attention_factor;
    // kq_scale = (attn_factor * (1 + 0.1 L ln f))^2 / sqrt(D_k) solved for L (mscale_all_dim).
    const double mq = std::sqrt(static_cast<double>(c.query_scale) * std::sqrt(dk));
    y.log_mul = (mq / y.attn_factor - 1.0) / (0.1 * std::log(y.factor));
    llama_yarn(y, back);
    w.set(kP + "rope.scaling.type", GgufValue::str("yarn"));
    w.set(kP + "rope.scaling.factor", GgufValue::f32(static_cast<float>(y.factor)));
    w.set(kP + "rope.scaling.original_context_length", u32(y.original));
    w.set(kP + "rope.scaling.yarn_log_multiplier",
          GgufValue::f32(static_cast<float>(0.1 * y.log_mul)));
    if (y.attn_factor != 1.0)
      w.set(kP + "rope.scaling.attn_factor", GgufValue::f32(static_cast<float>(y.attn_factor)));
    w.set(kP + "rope.scaling.yarn_beta_fast", GgufValue::f32(32.0f));
    w.set(kP + "rope.scaling.yarn_beta_slow", GgufValue::f32(1.0f));
  } else if (c.rope_scaling.type == RopeScalingType::kNone) {
    back.rope_attention_factor = c.rope_attention_factor;
    back.query_scale = static_cast<float>(static_cast<double>(c.rope_attention_factor) *
                                          c.rope_attention_factor / std::sqrt(dk));
    if (c.rope_attention_factor != 1.0f) {
      w.set(kP + "rope.scaling.attn_factor", GgufValue::f32(c.rope_attention_factor));
    }
  } else {
    throw Error(ErrorKind::kUnsupported, std::string("deepseek2: rope scaling ") +
                                             rope_scaling_name(c.rope_scaling.type) +
                                             " cannot be written (none, yarn)");
  }
  auto close = [](double x, double y) { return std::fabs(x - y) <= 1e-6 * std::fabs(y); };
  if (back.rope_freq_factors != c.rope_freq_factors ||
      !close(back.rope_attention_factor, c.rope_attention_factor) ||
      !close(back.query_scale, c.query_scale)) {
    throw Error(ErrorKind::kUnsupported,
                "deepseek2: this model's RoPE (YaRN beta_fast / beta_slow / truncate / mscale, or "
                "its attention scale) differs from what llama.cpp derives from rope.scaling.* "
                "(beta 32 / 1, truncated correction range, mscale = mscale_all_dim)");
  }
}

void write_tensors(const ModelFile& model, GgufTensorList& out, std::vector<Tensor>& owned) {
  const ModelConfig& c = model.config();
  const std::string& path = model.path();
  for (const auto& [name, view] : model.tensors()) {
    std::string l;
    if (!(l = layer_of(name, "model.layers.", ".self_attn.kv_b_proj.weight")).empty()) {
      // [H * (d_kn + d_v), d_c] -> attn_k_b [H, d_c, d_kn] (transposed), attn_v_b [H, d_v, d_c]
      // (conversion/deepseek.py DeepseekV2Model.modify_tensors).
      need_float(path, name, view);
      const MlaConfig& a = c.mla;
      const int64_t H = c.n_heads, dc = a.kv_lora_rank, dn = a.qk_nope_head_dim, dv = a.v_head_dim;
      need_shape(path, name, view, Shape{H * (dn + dv), dc});
      const size_t es = dtype_bytes(view.dtype(), 1);
      Tensor kb = Tensor::empty(view.dtype(), {H, dc, dn});
      Tensor vb = Tensor::empty(view.dtype(), {H, dv, dc});
      const auto* src = static_cast<const std::byte*>(view.data());
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t i = 0; i < dn; ++i)
          for (int64_t j = 0; j < dc; ++j)
            std::memcpy(static_cast<std::byte*>(kb.data()) +
                            static_cast<size_t>((h * dc + j) * dn + i) * es,
                        src + static_cast<size_t>((h * (dn + dv) + i) * dc + j) * es, es);
        std::memcpy(static_cast<std::byte*>(vb.data()) + static_cast<size_t>(h * dv * dc) * es,
                    src + static_cast<size_t>((h * (dn + dv) + dn) * dc) * es,
                    static_cast<size_t>(dv * dc) * es);
      }
      owned.push_back(std::move(kb));
      out.emplace_back("blk." + l + ".attn_k_b.weight", owned.back().view());
      owned.push_back(std::move(vb));
      out.emplace_back("blk." + l + ".attn_v_b.weight", owned.back().view());
      continue;
    }
    // mlp.experts.<e>.<proj>_proj.weight: stacked [E, rows, cols] once, at expert 0.
    bool expert = false;
    for (const char* proj : {"gate", "up", "down"}) {
      const std::string tail = std::string(".mlp.experts.0.") + proj + "_proj.weight";
      if (!(l = layer_of(name, "model.layers.", tail)).empty()) {
        const int64_t E = c.moe.n_experts;
        const size_t bytes = dtype_bytes(view.dtype(), view.numel());
        Tensor st = Tensor::empty(view.dtype(), {E, view.dim(0), view.dim(1)});
        for (int64_t e = 0; e < E; ++e) {
          const std::string en = "model.layers." + l + ".mlp.experts." + std::to_string(e) + "." +
                                 proj + "_proj.weight";
          const TensorView& t = model.tensor(en);
          if (t.dtype() != view.dtype() || t.shape() != view.shape() || !t.is_contiguous()) {
            throw Error(ErrorKind::kUnsupported,
                        path + ": tensor '" + en +
                            "' differs in type or shape from expert 0 (GGUF stacks them)");
          }
          std::memcpy(static_cast<std::byte*>(st.data()) + static_cast<size_t>(e) * bytes, t.data(),
                      bytes);
        }
        owned.push_back(std::move(st));
        out.emplace_back("blk." + l + ".ffn_" + proj + "_exps.weight", owned.back().view());
        expert = true;
      } else if (name.find(".mlp.experts.") != std::string::npos &&
                 name.ends_with(std::string(".") + proj + "_proj.weight")) {
        expert = true;  // stacked with expert 0
      }
    }
    if (expert) continue;
    const std::string gguf = family_to_gguf_name(entry(), name);
    if (gguf.empty()) {
      throw Error(ErrorKind::kUnsupported,
                  path + ": tensor '" + name + "' has no name in GGUF architecture deepseek2");
    }
    out.emplace_back(gguf, view);
  }
}

const GgufArchitecture kDeepseek2{kArch,    "deepseek_v2", &read_layout,  &read_config,
                                  kTensors, &load_tensors, &write_config, &write_tensors};
const GgufArchitecture& entry() {
  return kDeepseek2;
}

}  // namespace

KVCACHE_REGISTER_GGUF_ARCH(deepseek2, kDeepseek2);

}  // namespace kvcache
