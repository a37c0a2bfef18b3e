#include "model/gated_deltanet.h"

#include <cstring>
#include <string>

#include "cache/linear_state_layer.h"
#include "core/error.h"
#include "kernels/causal_conv.h"
#include "kernels/gated_delta.h"
#include "model/weight_spec.h"

namespace kvcache {

namespace {

// A float vector kept by the model as a 1-D view.
TensorView vector_view(const float* p, int64_t n) {
  return TensorView(const_cast<float*>(p), DType::kF32, {n});
}

// The rows of `m` in `order` (row i of the result = row order[i] of m), in m's dtype.
Tensor reorder_rows(const TensorView& m, const std::vector<int64_t>& order) {
  const int64_t rows = m.dim(0), cols = m.dim(1);
  KV_CHECK(static_cast<int64_t>(order.size()) == rows, "reorder_rows: order size");
  Tensor out = Tensor::empty(m.dtype(), {rows, cols});
  const size_t rb = dtype_bytes(m.dtype(), cols);
  const auto* src = static_cast<const std::byte*>(m.data());
  auto* dst = static_cast<std::byte*>(out.data());
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(dst + static_cast<size_t>(i) * rb,
                src + static_cast<size_t>(order[static_cast<size_t>(i)]) * rb, rb);
  }
  return out;
}

}  // namespace

std::vector<int64_t> qkvz_row_order(int64_t hk, int64_t hv, int64_t dk, int64_t dv) {
  // Qwen3NextGatedDeltaNet.fix_query_key_value_ordering: the checkpoint's rows are, per key
  // head g, [q_g (d_k), k_g (d_k), v_g (r d_v), z_g (r d_v)] with r = H_v / H_k; value head
  // g r + j is the j-th of group g.
  const int64_t r = hv / hk, group = 2 * dk + 2 * r * dv;
  const int64_t kd = hk * dk, vd = hv * dv;
  std::vector<int64_t> order(static_cast<size_t>(2 * kd + 2 * vd));
  for (int64_t g = 0; g < hk; ++g) {
    const int64_t src = g * group;
    for (int64_t i = 0; i < dk; ++i) {
      order[static_cast<size_t>(g * dk + i)] = src + i;
      order[static_cast<size_t>(kd + g * dk + i)] = src + dk + i;
    }
    for (int64_t j = 0; j < r * dv; ++j) {
      order[static_cast<size_t>(2 * kd + g * r * dv + j)] = src + 2 * dk + j;
      order[static_cast<size_t>(2 * kd + vd + g * r * dv + j)] = src + 2 * dk + r * dv + j;
    }
  }
  return order;
}

std::vector<int64_t> ba_row_order(int64_t hk, int64_t hv) {
  // Per key head g: [b (r), a (r)].
  const int64_t r = hv / hk;
  std::vector<int64_t> order(static_cast<size_t>(2 * hv));
  for (int64_t g = 0; g < hk; ++g) {
    for (int64_t j = 0; j < r; ++j) {
      order[static_cast<size_t>(g * r + j)] = g * 2 * r + j;
      order[static_cast<size_t>(hv + g * r + j)] = g * 2 * r + r + j;
    }
  }
  return order;
}

GatedDeltaNetWeights GatedDeltaNetWeights::hf(Weights& w, int64_t l) {
  const ModelConfig& c = w.config();
  const LinearAttentionConfig& a = c.linear_attn;
  auto name = [&](const char* suffix) {
    return hf_layer_tensor(l, std::string("linear_attn.") + suffix);
  };
  GatedDeltaNetWeights g;
  g.qkvz = w.keep(reorder_rows(
      w.matrix(name("in_proj_qkvz.weight")),
      qkvz_row_order(a.num_key_heads, a.num_value_heads, a.key_head_dim, a.value_head_dim)));
  g.ba = w.keep(reorder_rows(w.matrix(name("in_proj_ba.weight")),
                             ba_row_order(a.num_key_heads, a.num_value_heads)));
  // conv1d.weight [C, 1, K] -> [K, C].
  const int64_t C = a.conv_dim(), K = a.conv_kernel;
  const std::vector<float> conv = w.read(name("conv1d.weight"));
  Tensor t = Tensor::empty(DType::kF32, {K, C});
  float* tp = t.data_as<float>();
  for (int64_t ch = 0; ch < C; ++ch)
    for (int64_t j = 0; j < K; ++j) tp[j * C + ch] = conv[static_cast<size_t>(ch * K + j)];
  g.conv = w.keep(std::move(t));
  g.a_log = vector_view(w.vector(name("A_log")), a.num_value_heads);
  g.dt_bias = vector_view(w.vector(name("dt_bias")), a.num_value_heads);
  g.norm = vector_view(w.vector(name("norm.weight")), a.value_head_dim);
  g.out = w.matrix(name("out_proj.weight"));
  return g;
}

GatedDeltaNet::GatedDeltaNet(const ModelConfig& c, int64_t layer,
                             const GatedDeltaNetWeights& weights)
    : w_(weights),
      layer_(layer),
      Hk_(c.linear_attn.num_key_heads),
      Hv_(c.linear_attn.num_value_heads),
      dk_(c.linear_attn.key_head_dim),
      dv_(c.linear_attn.value_head_dim),
      K_(c.linear_attn.conv_kernel),
      C_(c.linear_attn.conv_dim()),
      eps_(c.rms_eps) {}

int64_t GatedDeltaNet::forward(Step& st, int64_t layer) const {
  const int64_t B = st.B, S = st.S, R = st.R;
  const int64_t kd = Hk_ * dk_, vd = Hv_ * dv_, W = C_ + vd;  // qkvz row: q | k | v | z
  Workspace& ws = *st.ws;
  float* xb = ws.data(kForwardScratch, kXb);
  float* qkvz = ws.data(kGatedDeltaNetScratch, kGdnQkvz);
  float* ba = ws.data(kGatedDeltaNetScratch, kGdnBa);
  float* g = ws.data(kGatedDeltaNetScratch, kGdnG);
  float* beta = ws.data(kGatedDeltaNetScratch, kGdnBeta);
  float* core = ws.data(kGatedDeltaNetScratch, kGdnCore);
  const MatmulParams proj[] = {linear_params(st.linear, xb, R, w_.qkvz, nullptr, qkvz),
                               linear_params(st.linear, xb, R, w_.ba, nullptr, ba)};
  matmul_group(proj);

  // The conv's inputs (q, k, v before the conv) enter the cache; the conv reads the window
  // before them and runs in place on the qkvz rows.
  Cache& cache = *st.cache;
  const int li = static_cast<int>(layer);
  const ConvStateUpdate cs =
      cache.update_conv_state(li, TensorView(qkvz, DType::kF32, {B, S, C_}, {S * W, W, 1, 0}));
  const TensorView& prev = cs.previous;  // [B, K-1, C]
  for (int64_t b = 0; b < B; ++b) {
    CausalConv1dParams p;
    p.x = TensorView(qkvz + b * S * W, DType::kF32, {S, C_}, {W, 1, 0, 0});
    p.y = p.x;
    p.weight = w_.conv;
    p.state =
        TensorView(prev.ptr(b), DType::kF32, {K_ - 1, C_}, {prev.stride(1), prev.stride(2), 0, 0});
    p.silu = true;
    causal_conv1d(p);
  }

  GatedDeltaGateParams gp;
  gp.b = TensorView(ba, DType::kF32, {R, Hv_}, {2 * Hv_, 1, 0, 0});
  gp.a = TensorView(ba + Hv_, DType::kF32, {R, Hv_}, {2 * Hv_, 1, 0, 0});
  gp.a_log = w_.a_log;
  gp.dt_bias = w_.dt_bias;
  gp.g = TensorView(g, DType::kF32, {R, Hv_});
  gp.beta = TensorView(beta, DType::kF32, {R, Hv_});
  gated_delta_gates(gp);

  // The stored recurrent state is updated in place by the kernel (zeros for a new sequence).
  const TensorView rec = cache.linear_layer(li).recurrent_state();  // [B, H_v, d_k, d_v]
  for (int64_t b = 0; b < B; ++b) {
    float* row = qkvz + b * S * W;
    GatedDeltaParams p;
    p.q = TensorView(row, DType::kF32, {S, Hk_, dk_}, {W, dk_, 1, 0});
    p.k = TensorView(row + kd, DType::kF32, {S, Hk_, dk_}, {W, dk_, 1, 0});
    p.v = TensorView(row + 2 * kd, DType::kF32, {S, Hv_, dv_}, {W, dv_, 1, 0});
    p.out = p.v;  // in place: the core output replaces v
    p.g = TensorView(g + b * S * Hv_, DType::kF32, {S, Hv_});
    p.beta = TensorView(beta + b * S * Hv_, DType::kF32, {S, Hv_});
    p.state = TensorView(rec.ptr(b), DType::kF32, {Hv_, dk_, dv_},
                         {rec.stride(1), rec.stride(2), rec.stride(3), 0});
    p.qk_l2norm = true;
    if (S > 1) {
      gated_delta_chunked(p);
    } else {
      gated_delta_recurrent(p);
    }
  }
  cache.update_recurrent_state(li, rec);

  RmsNormGatedParams np;
  np.x = TensorView(qkvz + 2 * kd, DType::kF32, {R, Hv_, dv_}, {W, dv_, 1, 0});
  np.z = TensorView(qkvz + C_, DType::kF32, {R, Hv_, dv_}, {W, dv_, 1, 0});
  np.weight = w_.norm;
  np.y = TensorView(core, DType::kF32, {R, Hv_, dv_});
  np.eps = eps_;
  rms_norm_gated(np);
  linear(st.linear, core, R, w_.out, nullptr, xb);
  return R;
}

std::unique_ptr<Attention> make_hf_gated_deltanet(Weights& w, int64_t layer) {
  return std::make_unique<GatedDeltaNet>(w.config(), layer, GatedDeltaNetWeights::hf(w, layer));
}

namespace {
std::vector<ScratchBuffer> gdn_buffers(const ModelConfig& c) {
  const LinearAttentionConfig& a = c.linear_attn;
  const int64_t vd = a.num_value_heads * a.value_head_dim;
  return {{a.conv_dim() + vd, 0},
          {2 * a.num_value_heads, 0},
          {a.num_value_heads, 0},
          {a.num_value_heads, 0},
          {vd, 0}};
}
int64_t gdn_widest_input(const ModelConfig& c) {
  return c.linear_attn.num_value_heads * c.linear_attn.value_head_dim;  // out_proj
}
}  // namespace

const ScratchKind kGatedDeltaNetScratch{"gated deltanet", &gdn_buffers, &gdn_widest_input};

}  // namespace kvcache
