#include "model/weight_spec.h"

#include "core/error.h"

namespace kvcache {

std::string hf_layer_tensor(int64_t layer, const std::string& suffix) {
  return "model.layers." + std::to_string(layer) + "." + suffix;
}

namespace {

// Appends specs by role.
struct SpecList {
  std::vector<WeightSpec>& out;
  void matrix(const std::string& name, Shape s) {
    out.push_back({name, s, true, WeightRole::kMatrix});
  }
  void norm(const std::string& name, int64_t n) {
    out.push_back({name, Shape{n}, false, WeightRole::kNorm});
  }
  void bias(const std::string& name, Shape s) {
    out.push_back({name, s, false, WeightRole::kBias});
  }
};

// models/deepseek_v4/modeling_deepseek_v4.py: DeepseekV4Model (embed_tokens, layers, norm,
// hc_head), DeepseekV4DecoderLayer (attn_hc, ffn_hc, the two norms), DeepseekV4Attention
// (q_a/q_b, kv_proj/kv_norm, o_a/o_b, sinks, compressor), DeepseekV4CSACompressor /
// DeepseekV4HCACompressor / DeepseekV4Indexer, DeepseekV4SparseMoeBlock (gate: TopKRouter or
// HashRouter, experts as 3D gate_up_proj / down_proj, shared_experts).
void deepseek_v4_weight_specs(const ModelConfig& c, SpecList& list) {
  auto matrix = [&](const std::string& name, Shape s) { list.matrix(name, s); };
  auto norm = [&](const std::string& name, int64_t n) { list.norm(name, n); };
  auto bias = [&](const std::string& name, Shape s) { list.bias(name, s); };
  const DeepseekV4Config& v = c.deepseek_v4;
  const int64_t dim = c.dim, H = c.n_heads, D = c.head_dim, hc = v.hc_mult;
  const int64_t E = c.moe.n_experts, I = c.moe.expert_hidden_dim, K = c.moe.n_experts_used;
  const int64_t ci = v.index_head_dim, G = v.o_groups;
  const int64_t mix = (2 + hc) * hc;  // pre (hc) | post (hc) | comb (hc * hc)
  // (model.embed_tokens.weight: listed by hf_weight_specs before)
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto L = [&](const std::string& suffix) { return hf_layer_tensor(l, suffix); };
    const std::string& type = c.layer_types[static_cast<size_t>(l)];
    norm(L("input_layernorm.weight"), dim);
    norm(L("post_attention_layernorm.weight"), dim);
    for (const char* h : {"attn_hc.", "ffn_hc."}) {
      matrix(L(std::string(h) + "fn"), {mix, hc * dim});
      bias(L(std::string(h) + "base"), {mix});
      bias(L(std::string(h) + "scale"), {3});
    }
    matrix(L("self_attn.q_a_proj.weight"), {v.q_lora_rank, dim});
    norm(L("self_attn.q_a_norm.weight"), v.q_lora_rank);
    matrix(L("self_attn.q_b_proj.weight"), {H * D, v.q_lora_rank});
    matrix(L("self_attn.kv_proj.weight"), {D, dim});
    norm(L("self_attn.kv_norm.weight"), D);
    matrix(L("self_attn.o_a_proj.weight"), {G * v.o_lora_rank, H * D / G});
    matrix(L("self_attn.o_b_proj.weight"), {dim, G * v.o_lora_rank});
    bias(L("self_attn.sinks"), {H});
    if (const int64_t rate = v.rate_of(type); rate > 0) {
      // CSA: two series (Ca | Cb) per token, 2 * head_dim wide; HCA: head_dim.
      const int64_t w = type == "compressed_sparse_attention" ? 2 * D : D;
      matrix(L("self_attn.compressor.kv_proj.weight"), {w, dim});
      matrix(L("self_attn.compressor.gate_proj.weight"), {w, dim});
      bias(L("self_attn.compressor.position_bias"), {rate, w});
      norm(L("self_attn.compressor.kv_norm.weight"), D);
      if (type == "compressed_sparse_attention") {
        matrix(L("self_attn.compressor.indexer.kv_proj.weight"), {2 * ci, dim});
        matrix(L("self_attn.compressor.indexer.gate_proj.weight"), {2 * ci, dim});
        bias(L("self_attn.compressor.indexer.position_bias"), {rate, 2 * ci});
        norm(L("self_attn.compressor.indexer.kv_norm.weight"), ci);
        matrix(L("self_attn.compressor.indexer.q_b_proj.weight"),
               {v.index_n_heads * ci, v.q_lora_rank});
        matrix(L("self_attn.compressor.indexer.scorer.weights_proj.weight"),
               {v.index_n_heads, dim});
      }
    }
    matrix(L("mlp.gate.weight"), {E, dim});
    if (v.hash_layers[static_cast<size_t>(l)]) {
      // tid2eid: int64 in checkpoints (the loader reads integer tensors as exact floats).
      bias(L("mlp.gate.tid2eid"), {c.vocab_size, K});
    } else {
      bias(L("mlp.gate.e_score_correction_bias"), {E});
    }
    matrix(L("mlp.experts.gate_up_proj"), {E, 2 * I, dim});
    matrix(L("mlp.experts.down_proj"), {E, dim, I});
    matrix(L("mlp.shared_experts.gate_proj.weight"), {I, dim});
    matrix(L("mlp.shared_experts.up_proj.weight"), {I, dim});
    matrix(L("mlp.shared_experts.down_proj.weight"), {dim, I});
  }
  matrix("model.hc_head.hc_fn", {hc, hc * dim});
  bias("model.hc_head.hc_base", {hc});
  bias("model.hc_head.hc_scale", {1});
  norm("model.norm.weight", dim);
  if (!c.tie_word_embeddings) matrix("lm_head.weight", {c.vocab_size, dim});
}

}  // namespace

std::vector<WeightSpec> hf_weight_specs(const ModelConfig& c) {
  if (c.is_llama_family()) {
    throw Error(ErrorKind::kUnsupported,
                "hf_weight_specs: " + c.architecture + " files use the canonical llama names");
  }
  std::vector<WeightSpec> out;
  SpecList list{out};
  auto matrix = [&](const std::string& name, Shape s) { list.matrix(name, s); };
  auto norm = [&](const std::string& name, int64_t n) { list.norm(name, n); };
  auto bias = [&](const std::string& name, Shape s) { list.bias(name, s); };
  const int64_t dim = c.dim, H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim;
  matrix("model.embed_tokens.weight", {c.vocab_size, dim});
  const Gemma3nConfig& g = c.gemma3n;
  if (g.enabled()) {
    // Gemma3nTextModel.__init__
    const int64_t P = g.hidden_size_per_layer_input, A = g.altup_num_inputs;
    matrix("model.embed_tokens_per_layer.weight", {g.vocab_size_per_layer_input, c.n_layers * P});
    matrix("model.per_layer_model_projection.weight", {c.n_layers * P, dim});
    norm("model.per_layer_projection_norm.weight", P);
    for (int64_t i = 0; i + 1 < A; ++i) {
      matrix("model.altup_projections." + std::to_string(i) + ".weight", {dim, dim});
      matrix("model.altup_unembed_projections." + std::to_string(i) + ".weight", {dim, dim});
    }
  }
  if (c.deepseek_v4.enabled()) {
    deepseek_v4_weight_specs(c, list);
    return out;
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    auto L = [&](const std::string& suffix) { return hf_layer_tensor(l, suffix); };
    norm(L("input_layernorm.weight"), dim);
    if (g.enabled()) {
      // Gemma3nTextDecoderLayer: AltUp, Laurel, per-layer input gate/projection, q/k norms.
      const int64_t A = g.altup_num_inputs, P = g.hidden_size_per_layer_input;
      bias(L("altup.correct_output_scale"), {dim});
      bias(L("altup.correction_coefs.weight"), {A, A});  // tiny: read as f32
      bias(L("altup.prediction_coefs.weight"), {A * A, A});
      matrix(L("altup.modality_router.weight"), {A, dim});
      norm(L("altup.router_norm.weight"), dim);
      matrix(L("laurel.linear_left.weight"), {g.laurel_rank, dim});
      matrix(L("laurel.linear_right.weight"), {dim, g.laurel_rank});
      norm(L("laurel.post_laurel_norm.weight"), dim);
      matrix(L("per_layer_input_gate.weight"), {P, dim});
      matrix(L("per_layer_projection.weight"), {dim, P});
      norm(L("post_per_layer_input_norm.weight"), dim);
    }
    const bool linear = c.layer_types[static_cast<size_t>(l)] == "linear_attention";
    if ((c.qkv_norm || c.qk_norm) && !linear) {
      norm(L("self_attn.q_norm.weight"), D);
      norm(L("self_attn.k_norm.weight"), D);
    }
    if (linear) {
      // models/qwen3_next/modeling_qwen3_next.py, Qwen3NextGatedDeltaNet.__init__: in_proj_qkvz
      // and in_proj_ba rows grouped per key head (the loader reorders them), conv1d [C, 1, K]
      // (read as floats and transposed at load), A_log, dt_bias, the gated norm (w as is).
      const LinearAttentionConfig& a = c.linear_attn;
      const int64_t Hk = a.num_key_heads, Hv = a.num_value_heads;
      const int64_t kd = Hk * a.key_head_dim, vd = Hv * a.value_head_dim;
      matrix(L("linear_attn.in_proj_qkvz.weight"), {2 * kd + 2 * vd, dim});
      matrix(L("linear_attn.in_proj_ba.weight"), {2 * Hv, dim});
      bias(L("linear_attn.conv1d.weight"), {a.conv_dim(), 1, a.conv_kernel});
      bias(L("linear_attn.A_log"), {Hv});
      bias(L("linear_attn.dt_bias"), {Hv});
      norm(L("linear_attn.norm.weight"), a.value_head_dim);
      matrix(L("linear_attn.out_proj.weight"), {dim, vd});
    } else if (c.mla.enabled()) {
      // models/deepseek_v3/modeling_deepseek_v3.py, DeepseekV3Attention.__init__
      const MlaConfig& m = c.mla;
      const int64_t qk = c.qk_head_dim();
      if (m.q_lora_rank > 0) {
        matrix(L("self_attn.q_a_proj.weight"), {m.q_lora_rank, dim});
        norm(L("self_attn.q_a_layernorm.weight"), m.q_lora_rank);
        matrix(L("self_attn.q_b_proj.weight"), {H * qk, m.q_lora_rank});
      } else {
        matrix(L("self_attn.q_proj.weight"), {H * qk, dim});
      }
      matrix(L("self_attn.kv_a_proj_with_mqa.weight"), {m.kv_lora_rank + m.qk_rope_head_dim, dim});
      norm(L("self_attn.kv_a_layernorm.weight"), m.kv_lora_rank);
      matrix(L("self_attn.kv_b_proj.weight"),
             {H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank});
      matrix(L("self_attn.o_proj.weight"), {dim, H * m.v_head_dim});
    } else if (c.architecture == "phi3") {
      // models/phi3/modeling_phi3.py, Phi3Attention.__init__: qkv_proj rows [q; k; v].
      matrix(L("self_attn.qkv_proj.weight"), {(H + 2 * Hkv) * D, dim});
      matrix(L("self_attn.o_proj.weight"), {dim, H * D});
    } else {
      // Qwen3-Next's gated attention: q_proj yields [query, gate] per head.
      matrix(L("self_attn.q_proj.weight"), {H * D * (c.attn_output_gate ? 2 : 1), dim});
      matrix(L("self_attn.k_proj.weight"), {Hkv * D, dim});
      matrix(L("self_attn.v_proj.weight"), {Hkv * D, dim});
      matrix(L("self_attn.o_proj.weight"), {dim, H * D});
      if (c.qkv_bias) {
        bias(L("self_attn.q_proj.bias"), {H * D});
        bias(L("self_attn.k_proj.bias"), {Hkv * D});
        bias(L("self_attn.v_proj.bias"), {Hkv * D});
      }
      if (c.attn_out_bias) bias(L("self_attn.o_proj.bias"), {dim});
      if (c.attn_sinks) bias(L("self_attn.sinks"), {H});
    }
    norm(L("post_attention_layernorm.weight"), dim);
    if (c.sandwich_norms) {
      norm(L("pre_feedforward_layernorm.weight"), dim);
      norm(L("post_feedforward_layernorm.weight"), dim);
    }
    const MoeConfig& moe = c.moe;
    if (c.architecture == "phi3") {
      // Phi3MLP: gate_up_proj rows [gate; up].
      matrix(L("mlp.gate_up_proj.weight"), {2 * c.hidden_dim, dim});
      matrix(L("mlp.down_proj.weight"), {dim, c.hidden_dim});
    } else if (!moe.is_moe_layer(l)) {
      const int64_t I = g.intermediate_sizes.empty() ? c.hidden_dim
                                                     : g.intermediate_sizes[static_cast<size_t>(l)];
      matrix(L("mlp.gate_proj.weight"), {I, dim});
      matrix(L("mlp.up_proj.weight"), {I, dim});
      matrix(L("mlp.down_proj.weight"), {dim, I});
    } else if (moe.router == MoeRouter::kGptOss) {
      // models/gpt_oss/modeling_gpt_oss.py: GptOssTopKRouter, GptOssExperts ([E, in, out]).
      const int64_t E = moe.n_experts, I = moe.expert_hidden_dim;
      matrix(L("mlp.router.weight"), {E, dim});
      bias(L("mlp.router.bias"), {E});
      matrix(L("mlp.experts.gate_up_proj"), {E, dim, 2 * I});
      bias(L("mlp.experts.gate_up_proj_bias"), {E, 2 * I});
      matrix(L("mlp.experts.down_proj"), {E, I, dim});
      bias(L("mlp.experts.down_proj_bias"), {E, dim});
    } else {
      // models/deepseek_v3/modeling_deepseek_v3.py: DeepseekV3MoE (gate, experts, shared_experts).
      const int64_t E = moe.n_experts, I = moe.expert_hidden_dim;
      matrix(L("mlp.gate.weight"), {E, dim});
      if (moe.router == MoeRouter::kDeepseekV3) bias(L("mlp.gate.e_score_correction_bias"), {E});
      for (int64_t e = 0; e < E; ++e) {
        const std::string p = "mlp.experts." + std::to_string(e) + ".";
        matrix(L(p + "gate_proj.weight"), {I, dim});
        matrix(L(p + "up_proj.weight"), {I, dim});
        matrix(L(p + "down_proj.weight"), {dim, I});
      }
      if (moe.router == MoeRouter::kSoftmaxTopK && moe.shared_expert_hidden_dim > 0) {
        // models/qwen2_moe (Qwen3-Next's Qwen2MoeSparseMoeBlock): shared_expert,
        // shared_expert_gate [1, dim].
        const int64_t Is = moe.shared_expert_hidden_dim;
        matrix(L("mlp.shared_expert.gate_proj.weight"), {Is, dim});
        matrix(L("mlp.shared_expert.up_proj.weight"), {Is, dim});
        matrix(L("mlp.shared_expert.down_proj.weight"), {dim, Is});
        matrix(L("mlp.shared_expert_gate.weight"), {1, dim});
      } else if (moe.n_shared_experts > 0) {
        const int64_t Is = I * moe.n_shared_experts;
        matrix(L("mlp.shared_experts.gate_proj.weight"), {Is, dim});
        matrix(L("mlp.shared_experts.up_proj.weight"), {Is, dim});
        matrix(L("mlp.shared_experts.down_proj.weight"), {dim, Is});
      }
    }
  }
  norm("model.norm.weight", dim);
  if (!c.tie_word_embeddings) matrix("lm_head.weight", {c.vocab_size, dim});
  return out;
}

}  // namespace kvcache
