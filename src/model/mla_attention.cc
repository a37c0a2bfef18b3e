#include "model/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/kv_span_rows.h"
#include "model/gqa_attention.h"
#include "model/weight_spec.h"

namespace kvcache {

namespace {
// DeepseekV3RMSNorm(q_lora_rank) and (kv_lora_rank) are built with the default eps 1e-6, not
// config.rms_norm_eps.
constexpr float kLoraNormEps = 1e-6f;
}  // namespace

MlaWeights MlaWeights::hf(Weights& w, int64_t l) {
  auto name = [&](const char* suffix) { return hf_layer_tensor(l, suffix); };
  MlaWeights m;
  if (w.config().mla.q_lora_rank > 0) {
    m.wq_a = w.matrix(name("self_attn.q_a_proj.weight"));
    m.q_a_norm = w.vector(name("self_attn.q_a_layernorm.weight"));
    m.wq_b = w.matrix(name("self_attn.q_b_proj.weight"));
  } else {
    m.wq = w.matrix(name("self_attn.q_proj.weight"));
  }
  m.wkv_a = w.matrix(name("self_attn.kv_a_proj_with_mqa.weight"));
  m.kv_a_norm = w.vector(name("self_attn.kv_a_layernorm.weight"));
  m.wkv_b = w.matrix(name("self_attn.kv_b_proj.weight"));
  m.wo = w.matrix(name("self_attn.o_proj.weight"));
  return m;
}

std::unique_ptr<Attention> make_hf_mla(Weights& w, int64_t l, const float* rope) {
  // DeepSeek-V2 (view_as_complex on pairs) and V3 with rope_interleave rotate pairs (2i,
  // 2i+1). V3 first permutes them to halves (apply_rotary_pos_emb_interleave) and leaves
  // q_rot/k_rot in that permuted order — the same permutation on both sides, so the scores
  // equal those of interleaved RoPE applied in place, which is what runs.
  const RopeTable table{rope,
                        w.config().mla.rope_interleave ? RopeStyle::kInterleaved : RopeStyle::kHalf,
                        w.config().rope_attention_factor};
  return std::make_unique<MlaAttention>(w.file(), l, MlaWeights::hf(w, l), table);
}

MlaAttention::MlaAttention(const ModelFile& file, int64_t layer, const MlaWeights& weights,
                           const RopeTable& rope)
    : w_(weights), layer_(layer), m_(file.config().mla), H_(file.config().n_heads), rope_(rope) {
  if (kv_source_layer(file, layer) != layer) refuse_kv_sharing(file, layer);
  const ModelConfig& c = file.config();
  options_.scale =
      c.query_scale > 0
          ? c.query_scale
          : 1.0f / std::sqrt(static_cast<float>(m_.qk_nope_head_dim + m_.qk_rope_head_dim));
  options_.causal = true;
}

void MlaAttention::project_q(Step& st, const float* xb, float* q) const {
  if (m_.q_lora_rank == 0) {
    linear(st.linear, xb, st.R, w_.wq, nullptr, q);
    return;
  }
  float* qa = st.ws->data(kMlaScratch, kMlaQa);
  linear(st.linear, xb, st.R, w_.wq_a, nullptr, qa);
  norm_rows(qa, qa, st.R, m_.q_lora_rank, kLoraNormEps, w_.q_a_norm);
  linear(st.linear, qa, st.R, w_.wq_b, nullptr, q);
}

void MlaAttention::compress_kv(Step& st, const float* xb, float* ckv) const {
  const int64_t dc = m_.kv_lora_rank, ckd = dc + m_.qk_rope_head_dim;
  linear(st.linear, xb, st.R, w_.wkv_a, nullptr, ckv);             // [R, d_c + d_r]: latent | k_rot
  norm_rows(ckv, ckv, st.R, dc, kLoraNormEps, w_.kv_a_norm, ckd);  // the latent part of each row
}

void MlaAttention::rotate(const Step& st, float* q, float* ckv) const {
  const int64_t S = st.S, dc = m_.kv_lora_rank, dr = m_.qk_rope_head_dim, dn = m_.qk_nope_head_dim;
  const int64_t dqk = dn + dr, qd = H_ * dqk, ckd = dc + dr;
  RopeParams rope = rope_.params(S, dr);
  for (int64_t b = 0; b < st.B; ++b) {
    rope.pos0 = st.row_pos(b);
    rope.x = q + b * S * qd + dn;  // the rotated part of each head: dims [d_kn, d_kn + d_r)
    rope.n_heads = H_;
    rope.head_dim = dqk;
    rope.ld_token = qd;
    rope_apply(rope);
    rope.x = ckv + b * S * ckd + dc;  // k_rot: one head
    rope.n_heads = 1;
    rope.head_dim = dr;
    rope.ld_token = ckd;
    rope_apply(rope);
  }
}

KVSpan MlaAttention::expand(Step& st, const KVSpan& span, int64_t b) const {
  const int64_t H = H_, dc = m_.kv_lora_rank, dn = m_.qk_nope_head_dim, dv = m_.v_head_dim;
  const int64_t dr = m_.qk_rope_head_dim, dqk = dn + dr, qd = H * dqk, kvbd = dn + dv;
  const int64_t Skv = kv_span_length(span, b);
  float* lat32 = st.ws->data(kMlaScratch, kMlaLatent);
  float* kvb = st.ws->data(kMlaScratch, kMlaKvb);
  float* kfull = st.ws->data(kMlaScratch, kMlaKeys);
  read_kv_rows(span, KVPart::kK, b, 0, Skv, lat32, dc);
  linear(st.linear, lat32, Skv, w_.wkv_b, nullptr, kvb);  // [S_kv, H * (d_kn + d_v)]
  for (int64_t j = 0; j < Skv; ++j)
    for (int64_t h = 0; h < H; ++h)
      std::memcpy(kfull + j * qd + h * dqk, kvb + j * H * kvbd + h * kvbd,
                  static_cast<size_t>(dn) * sizeof(float));
  read_kv_rows(span, KVPart::kV, b, 0, Skv, kfull + dn, qd);  // k_rot into head 0, then every head
  for (int64_t j = 0; j < Skv; ++j) {
    float* kj = kfull + j * qd;
    for (int64_t h = 1; h < H; ++h)
      std::memcpy(kj + h * dqk + dn, kj + dn, static_cast<size_t>(dr) * sizeof(float));
  }
  KVSpan dense;
  dense.k = TensorView(kfull, DType::kF32, {1, H, Skv, dqk}, {Skv * qd, dqk, qd, 1});
  dense.v = TensorView(kvb + dn, DType::kF32, {1, H, Skv, dv}, {Skv * H * kvbd, kvbd, H * kvbd, 1});
  // A streaming row's compacted table (core/kv_span.h PagedKV::row_offset) ends at its queries.
  dense.kv_offset = span.kv_offset + (span.kind == KVSpanKind::kPaged ? span.paged.offset(b) : 0);
  return dense;
}

int64_t MlaAttention::forward(Step& st, int64_t layer) const {
  const int64_t B = st.B, S = st.S, R = st.R, H = H_;
  const int64_t dc = m_.kv_lora_rank, dr = m_.qk_rope_head_dim, dn = m_.qk_nope_head_dim,
                dv = m_.v_head_dim;
  const int64_t dqk = dn + dr, qd = H * dqk, ckd = dc + dr, kvbd = dn + dv;
  Workspace& ws = *st.ws;
  float* xb = ws.data(kForwardScratch, kXb);
  float* att = ws.data(kForwardScratch, kAtt);
  float* q = ws.data(kMlaScratch, kMlaQ);
  float* ckv = ws.data(kMlaScratch, kMlaCkv);
  project_q(st, xb, q);
  compress_kv(st, xb, ckv);
  rotate(st, q, ckv);
  // The cache's two one-head slots: K <- latent [B, 1, S, d_c], V <- k_rot [B, 1, S, d_r].
  const TensorView lat_view(ckv, DType::kF32, {B, 1, S, dc}, {S * ckd, S * ckd, ckd, 1});
  const TensorView rot_view(ckv + dc, DType::kF32, {B, 1, S, dr}, {S * ckd, S * ckd, ckd, 1});
  const KVSpan span = st.cache->update_or_share(static_cast<int>(layer), lat_view, rot_view);

  int64_t max_skv = 0;
  for (int64_t b = 0; b < B; ++b) max_skv = std::max(max_skv, kv_span_length(span, b));
  ws.grow(kMlaScratch, kMlaLatent, max_skv * dc);
  ws.grow(kMlaScratch, kMlaKvb, max_skv * H * kvbd);
  ws.grow(kMlaScratch, kMlaKeys, max_skv * qd);
  for (int64_t b = 0; b < B; ++b) {
    const KVSpan expanded = expand(st, span, b);
    const TensorView q_view(q + b * S * qd, DType::kF32, {1, H, S, dqk}, {S * qd, dqk, qd, 1});
    const TensorView out_view(att + b * S * H * dv, DType::kF32, {1, H, S, dv},
                              {S * H * dv, dv, H * dv, 1});
    st.kernel->attend(q_view, expanded, out_view, options_,
                      QueryPositions{st.row_pos(b), nullptr, 0});
  }
  linear(st.linear, att, R, w_.wo, nullptr, xb);
  return R;
}

namespace {
std::vector<ScratchBuffer> mla_buffers(const ModelConfig& c) {
  const MlaConfig& m = c.mla;
  return {{c.n_heads * c.qk_head_dim(), 0},
          {m.kv_lora_rank + m.qk_rope_head_dim, 0},
          {m.q_lora_rank, 0},
          {},
          {},
          {}};
}
int64_t mla_widest_input(const ModelConfig& c) {
  return std::max(c.mla.q_lora_rank, c.mla.kv_lora_rank);
}
}  // namespace

const ScratchKind kMlaScratch{"mla attention", &mla_buffers, &mla_widest_input};

}  // namespace kvcache
