#include "model/gqa_attention.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "model/weight_spec.h"

namespace kvcache {

GqaWeights GqaWeights::load(Weights& w, int64_t l, TensorNames names) {
  const ModelConfig& c = w.config();
  const bool canonical = names == TensorNames::kCanonical;
  // "<projection>.weight" and "<projection>.bias" in either naming.
  auto name = [&](const char* canonical_base, const char* hf_base, const char* what) {
    return canonical ? layer_tensor(l, (std::string(canonical_base) + what).c_str())
                     : hf_layer_tensor(l, std::string(hf_base) + what);
  };
  GqaWeights g;
  g.wq = w.matrix(name("attn_q", "self_attn.q_proj", ".weight"));
  g.wk = w.matrix(name("attn_k", "self_attn.k_proj", ".weight"));
  g.wv = w.matrix(name("attn_v", "self_attn.v_proj", ".weight"));
  g.wo = w.matrix(name("attn_output", "self_attn.o_proj", ".weight"));
  if (c.qkv_bias) {
    g.bq = w.vector(name("attn_q", "self_attn.q_proj", ".bias"));
    g.bk = w.vector(name("attn_k", "self_attn.k_proj", ".bias"));
    g.bv = w.vector(name("attn_v", "self_attn.v_proj", ".bias"));
  }
  // Only transformers-named families have these (the llama family's configs never ask).
  if (c.attn_out_bias) g.bo = w.vector(hf_layer_tensor(l, "self_attn.o_proj.bias"));
  if (c.attn_sinks) g.sinks = w.vector(hf_layer_tensor(l, "self_attn.sinks"));
  if (c.qkv_norm || c.qk_norm) {
    // w.norm: Qwen3-Next's zero-centred norms scale by (1 + w) (norm_add_one).
    g.q_norm = w.norm(hf_layer_tensor(l, "self_attn.q_norm.weight"));
    g.k_norm = w.norm(hf_layer_tensor(l, "self_attn.k_norm.weight"));
  }
  if (c.qkv_norm) g.v_norm = w.keep(std::vector<float>(static_cast<size_t>(c.head_dim), 1.0f));
  return g;
}

std::unique_ptr<Attention> make_hf_gqa(Weights& w, int64_t l, const float* rope,
                                       const float* local_rope) {
  const ModelConfig& c = w.config();
  const bool sliding = c.layer_types[static_cast<size_t>(l)] == "sliding_attention";
  const RopeTable table{sliding && local_rope != nullptr ? local_rope : rope,
                        c.rope_interleaved ? RopeStyle::kInterleaved : RopeStyle::kHalf,
                        c.rope_attention_factor};
  return std::make_unique<GqaAttention>(w.file(), l, GqaWeights::load(w, l, TensorNames::kHf),
                                        table);
}

void refuse_kv_sharing(const ModelFile& file, int64_t l) {
  const ModelConfig& c = file.config();
  throw Error(ErrorKind::kFormat,
              file.path() + ": layer " + std::to_string(l) +
                  " shares KV (num_kv_shared_layers = " + std::to_string(c.num_kv_shared_layers) +
                  ") but no earlier non-shared " + (c.mla.enabled() ? "GQA " : "") +
                  "layer of type '" + c.layer_types[static_cast<size_t>(l)] + "' exists");
}

int64_t kv_source_layer(const ModelFile& file, int64_t l) {
  // models/gemma3n/modeling_gemma3n.py, Gemma3nTextAttention.__init__: layers from
  // L - num_kv_shared_layers on read the last earlier non-shared layer of their own type.
  const ModelConfig& c = file.config();
  const int64_t first_shared = c.n_layers - c.num_kv_shared_layers;
  if (l < first_shared) return l;
  for (int64_t j = first_shared - 1; j >= 0; --j)
    if (c.layer_types[static_cast<size_t>(j)] == c.layer_types[static_cast<size_t>(l)]) return j;
  refuse_kv_sharing(file, l);
}

GqaAttention::GqaAttention(const ModelFile& file, int64_t layer, const GqaWeights& weights,
                           const RopeTable& rope)
    : w_(weights),
      H_(file.config().n_heads),
      Hkv_(file.config().n_kv_heads),
      D_(file.config().head_dim),
      eps_(file.config().rms_eps),
      rope_(rope),
      kv_source_(kv_source_layer(file, layer)),
      kv_shared_(kv_source_ != layer),
      gated_(file.config().attn_output_gate),
      rot_dim_(file.config().rope_dim()) {
  const ModelConfig& c = file.config();
  const std::string& type = c.layer_types[static_cast<size_t>(layer)];
  options_.scale = c.query_scale > 0 ? c.query_scale : 1.0f / std::sqrt(static_cast<float>(D_));
  options_.causal = true;
  options_.sliding_window = type == "sliding_attention" ? c.sliding_window : 0;
  options_.chunk_size = type == "chunked_attention" ? c.attention_chunk_size : 0;
  options_.softcap = c.attn_softcap;
  options_.sinks = w_.sinks;
}

void GqaAttention::project(Step& st, const float* xb, float* q, float* k, float* v) const {
  if (kv_shared_) {
    linear(st.linear, xb, st.R, w_.wq, w_.bq, q);
    return;
  }
  // Q, K and V read the same input: one pass over the thread pool for the three (decode).
  const MatmulParams qkv[] = {linear_params(st.linear, xb, st.R, w_.wq, w_.bq, q),
                              linear_params(st.linear, xb, st.R, w_.wk, w_.bk, k),
                              linear_params(st.linear, xb, st.R, w_.wv, w_.bv, v)};
  matmul_group(qkv);
}

void GqaAttention::norm_heads(const Step& st, float* q, float* k, float* v) const {
  // Gemma3nTextAttention: q_norm, k_norm (weighted) and v_norm (unweighted) over each head,
  // before RoPE.
  norm_rows(q, q, st.R * H_, D_, eps_, w_.q_norm);
  if (kv_shared_) return;
  norm_rows(k, k, st.R * Hkv_, D_, eps_, w_.k_norm);
  if (w_.v_norm != nullptr) norm_rows(v, v, st.R * Hkv_, D_, eps_, w_.v_norm);
}

void GqaAttention::split_gate(const Step& st, float* q, float* gate) const {
  // Qwen3NextAttention: q_proj(x).view(.., H, 2D) chunked into query and gate per head. Rows
  // [R, H, 2D] -> q [R, H*D] (compacted in place, moving down) and gate [R, H*D].
  const int64_t H = H_, D = D_;
  for (int64_t r = 0; r < st.R; ++r) {
    for (int64_t h = 0; h < H; ++h) {
      const float* src = q + (r * H + h) * 2 * D;
      std::memcpy(gate + (r * H + h) * D, src + D, static_cast<size_t>(D) * sizeof(float));
      std::memmove(q + (r * H + h) * D, src, static_cast<size_t>(D) * sizeof(float));
    }
  }
}

void GqaAttention::apply_gate(float* att, const float* gate, int64_t rows, int64_t S,
                              bool last_rows) const {
  // attn_output * sigmoid(gate); with last_rows, att row b is the chunk's row b*S + S-1.
  const int64_t n = H_ * D_;
  for (int64_t r = 0; r < rows; ++r) {
    const float* g = gate + (last_rows ? r * S + S - 1 : r) * n;
    float* a = att + r * n;
    for (int64_t i = 0; i < n; ++i) a[i] *= 1.0f / (1.0f + std::exp(-g[i]));
  }
}

void GqaAttention::rotate(const Step& st, float* q, float* k) const {
  const int64_t S = st.S, qd = H_ * D_, kvd = Hkv_ * D_;
  RopeParams rope = rope_.params(S, rot_dim_);
  rope.head_dim = D_;
  for (int64_t b = 0; b < st.B; ++b) {
    rope.pos0 = st.row_pos(b);
    rope.x = q + b * S * qd;
    rope.n_heads = H_;
    rope_apply(rope);
    if (kv_shared_) continue;
    rope.x = k + b * S * kvd;
    rope.n_heads = Hkv_;
    rope_apply(rope);
  }
}

int64_t GqaAttention::forward(Step& st, int64_t layer) const {
  const int64_t B = st.B, S = st.S, R = st.R, H = H_, Hkv = Hkv_, D = D_;
  const int64_t qd = H * D, kvd = Hkv * D;
  Workspace& ws = *st.ws;
  float* xb = ws.data(kForwardScratch, kXb);
  float* att = ws.data(kForwardScratch, kAtt);
  float* q = ws.data(kGqaScratch, kGqaQ);
  float* k = ws.data(kGqaScratch, kGqaK);
  float* v = ws.data(kGqaScratch, kGqaV);
  project(st, xb, q, k, v);
  float* gate = gated_ ? ws.data(kGqaScratch, kGqaGate) : nullptr;
  if (gated_) split_gate(st, q, gate);
  if (w_.q_norm != nullptr) norm_heads(st, q, k, v);
  rotate(st, q, k);

  // Views over the row-major [B*S, heads*D] buffers as [B, heads, S, D]: no transposes.
  const TensorView q_view(q, DType::kF32, {B, H, S, D}, {S * qd, D, qd, 1});
  const TensorView k_view(k, DType::kF32, {B, Hkv, S, D}, {S * kvd, D, kvd, 1});
  const TensorView v_view(v, DType::kF32, {B, Hkv, S, D}, {S * kvd, D, kvd, 1});
  const TensorView out_view(att, DType::kF32, {B, H, S, D}, {S * qd, D, qd, 1});
  const KVSpan span = st.cache->update_or_share(static_cast<int>(layer), k_view, v_view);

  // Eviction policies that score keys by attention (H2O, SnapKV) read this step's queries; a
  // cheap no-op for every other container. After the attention: the scores are the ones the
  // step's queries gave the span it read.
  const bool observe = !kv_shared_;
  switch (st.rows) {
    case Step::Rows::kKvOnly:
      if (observe) st.cache->observe_queries(static_cast<int>(layer), q_view, options_);
      return 0;
    case Step::Rows::kLast: {
      // Rows 0..B-1 of att: the last query of each batch row, with the bits it has in the
      // whole chunk; o_proj on them takes the kernel the whole chunk's product would.
      const TensorView out_last(att, DType::kF32, {B, H, 1, D}, {qd, D, qd, 1});
      st.kernel->attend_last(q_view, span, out_view, out_last, options_, st.positions());
      if (observe) st.cache->observe_queries(static_cast<int>(layer), q_view, options_);
      if (gated_) apply_gate(att, gate, B, S, /*last_rows=*/true);
      linear(st.linear.as_rows(R), att, B, w_.wo, w_.bo, xb);
      return B;
    }
    case Step::Rows::kAll:
      break;
  }
  st.kernel->attend(q_view, span, out_view, options_, st.positions());
  if (observe) st.cache->observe_queries(static_cast<int>(layer), q_view, options_);
  if (gated_) apply_gate(att, gate, R, S, /*last_rows=*/false);
  linear(st.linear, att, R, w_.wo, w_.bo, xb);
  return R;
}

namespace {
std::vector<ScratchBuffer> gqa_buffers(const ModelConfig& c) {
  const int64_t kvd = c.n_kv_heads * c.head_dim;
  // Gated attention: q_proj writes [query, gate] per head (2x), the gate is kept apart.
  const int64_t gate = c.attn_output_gate ? c.n_heads * c.head_dim : 0;
  return {{c.n_heads * c.qk_head_dim() + gate, 0}, {kvd, 0}, {kvd, 0}, {gate, 0}};
}
int64_t gqa_widest_input(const ModelConfig&) {
  return 0;
}  // dim and H*D: the forward's
}  // namespace

const ScratchKind kGqaScratch{"gqa attention", &gqa_buffers, &gqa_widest_input};

}  // namespace kvcache
