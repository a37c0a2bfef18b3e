// DeepSeek-V4 (models/deepseek_v4/modeling_deepseek_v4.py, DeepseekV4ForCausalLM): every layer
// a DeepseekV4Attention (model/deepseek_v4_attention.h: sliding K==V MQA, plus the CSA / HCA
// compressed entries and CSA's indexer) and a DeepseekV4SparseMoeBlock, run by its own stack:
//   - manifold-constrained hyper-connections (DeepseekV4HyperConnection): the residual is
//     hc_mult streams; before each block a learned projection of the (unweighted-RMS-normed,
//     flattened) streams gives pre (collapse the streams into the block's input), post (spread
//     the block's output back) and comb (mix the streams, made doubly stochastic by Sinkhorn
//     iterations); new stream k = post_k * block_out + sum_j comb[j][k] * stream_j;
//   - DeepseekV4HyperHead collapses the streams before the final norm;
//   - the MoE: scores sqrtsoftplus / softmax / sigmoid of the router logits; experts chosen by
//     top-k of score + e_score_correction_bias, or on hash_moe layers by tid2eid[token]; their
//     scores renormalised and x routed_scaling_factor; experts stored as 3D gate_up_proj
//     [E, 2I, dim] (gate rows first, then up) and down_proj [E, dim, I]; plus one shared
//     expert; every SwiGLU clamps gate <= limit and |up| <= limit (swiglu_limit).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "kernels/rope.h"
#include "model/deepseek_v4_attention.h"
#include "model/family.h"
#include "model/weight_spec.h"

namespace kvcache {

namespace {

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

// silu(min(gate, limit)) * clamp(up, -limit, limit) (DeepseekV4Experts._apply_gate,
// DeepseekV4MLP.forward); limit <= 0: no clamp.
void clamped_swiglu(const float* gate, const float* up, float* out, int64_t n, float limit) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i], u = up[i];
    if (limit > 0.0f) {
      g = std::min(g, limit);
      u = std::clamp(u, -limit, limit);
    }
    out[i] = g * sigmoid(g) * u;
  }
}

// A view of expert e's [rows, cols] matrix in a stacked [E, rows, cols] tensor.
TensorView expert_matrix(const TensorView& t, int64_t e) {
  const int64_t rows = t.dim(1), cols = t.dim(2);
  auto* p = static_cast<std::byte*>(t.data()) + dtype_bytes(t.dtype(), e * rows * cols);
  return TensorView(p, t.dtype(), {rows, cols});
}

struct V4MoeWeights {
  TensorView router;                  // [E, dim]
  const float* score_bias = nullptr;  // [E] (top-k layers)
  std::vector<int32_t> tid2eid;       // [vocab * K] (hash layers)
  TensorView gate_up;                 // [E, 2I, dim]
  TensorView down;                    // [E, dim, I]
  TensorView shared_gate, shared_up;  // [I, dim]
  TensorView shared_down;             // [dim, I]
};

V4MoeWeights load_moe(Weights& w, int64_t l) {
  const ModelConfig& c = w.config();
  auto name = [&](const char* suffix) { return hf_layer_tensor(l, suffix); };
  V4MoeWeights m;
  m.router = w.matrix(name("mlp.gate.weight"));
  if (c.deepseek_v4.hash_layers[static_cast<size_t>(l)]) {
    const std::vector<float> ids = w.read(name("mlp.gate.tid2eid"));
    for (float f : ids) {
      if (!(f >= 0.0f && f < static_cast<float>(c.moe.n_experts)) || f != std::floor(f)) {
        throw Error(ErrorKind::kFormat, w.file().path() + ": tensor '" + name("mlp.gate.tid2eid") +
                                            "' holds " + std::to_string(f) +
                                            ", not an expert id in [0, " +
                                            std::to_string(c.moe.n_experts) + ")");
      }
      m.tid2eid.push_back(static_cast<int32_t>(f));
    }
  } else {
    m.score_bias = w.vector(name("mlp.gate.e_score_correction_bias"));
  }
  m.gate_up = w.matrix(name("mlp.experts.gate_up_proj"));
  m.down = w.matrix(name("mlp.experts.down_proj"));
  m.shared_gate = w.matrix(name("mlp.shared_experts.gate_proj.weight"));
  m.shared_up = w.matrix(name("mlp.shared_experts.up_proj.weight"));
  m.shared_down = w.matrix(name("mlp.shared_experts.down_proj.weight"));
  return m;
}

// DeepseekV4SparseMoeBlock: routed experts (one row at a time) + the shared expert.
class DeepseekV4Moe final : public Mlp {
 public:
  DeepseekV4Moe(const ModelConfig& c, V4MoeWeights w) : c_(c), w_(std::move(w)) {}

  // The hash router needs the tokens: the stack calls run() instead.
  void forward(Step&, int64_t) const override {
    KV_CHECK(false, "deepseek_v4: the MoE runs through its stack (it needs the token ids)");
  }

  // xb rows [0, rows) (normed input) replaced by the block's output; tokens[r] is row r's id.
  void run(Step& st, int64_t rows, const int32_t* tokens) const {
    const MoeConfig& m = c_.moe;
    const DeepseekV4Config& v = c_.deepseek_v4;
    const int64_t dim = c_.dim, E = m.n_experts, K = m.n_experts_used, I = m.expert_hidden_dim;
    Workspace& ws = *st.ws;
    float* xb = ws.data(kForwardScratch, kXb);
    float* acc = ws.data(kForwardScratch, kAtt);
    float* logits = ws.data(kDeepseekV4Scratch, kV4Moe);
    float* scores = logits + E;
    float* gu = scores + E;
    float* act = gu + 2 * I;
    float* eout = act + I;
    std::vector<int64_t> idx(static_cast<size_t>(E));
    std::vector<float> choice(static_cast<size_t>(E));
    for (int64_t r = 0; r < rows; ++r) {
      const float* x = xb + r * dim;
      float* o = acc + r * dim;
      std::fill(o, o + dim, 0.0f);
      linear(st.linear, x, 1, w_.router, nullptr, logits);
      score(logits, scores);
      // Experts: tid2eid[token] (hash), else the top K of score + correction bias (ties to
      // the lower id).
      if (!w_.tid2eid.empty()) {
        for (int64_t k = 0; k < K; ++k)
          idx[static_cast<size_t>(k)] = w_.tid2eid[static_cast<size_t>(tokens[r] * K + k)];
      } else {
        for (int64_t e = 0; e < E; ++e)
          choice[static_cast<size_t>(e)] = scores[e] + w_.score_bias[e];
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + K, idx.end(), [&](int64_t a, int64_t b) {
          const float ca = choice[static_cast<size_t>(a)], cb = choice[static_cast<size_t>(b)];
          return ca > cb || (ca == cb && a < b);
        });
      }
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum += scores[idx[static_cast<size_t>(k)]];
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = idx[static_cast<size_t>(k)];
        const float weight = scores[e] / (sum + 1e-20f) * m.routed_scaling_factor;
        linear(st.linear, x, 1, expert_matrix(w_.gate_up, e), nullptr, gu);
        clamped_swiglu(gu, gu + I, act, I, v.swiglu_limit);
        linear(st.linear, act, 1, expert_matrix(w_.down, e), nullptr, eout);
        for (int64_t d = 0; d < dim; ++d) o[d] += weight * eout[d];
      }
    }
    // The shared expert over all rows at once, then + the routed sum.
    float* sh = ws.data(kDeepseekV4Scratch, kV4Shared);  // [rows, I] gate | [rows, I] up
    float* sg = sh;
    float* su = sh + rows * I;
    const LinearOptions lo = st.linear.as_rows(st.R);
    const MatmulParams gate_up[] = {linear_params(lo, xb, rows, w_.shared_gate, nullptr, sg),
                                    linear_params(lo, xb, rows, w_.shared_up, nullptr, su)};
    matmul_group(gate_up);
    clamped_swiglu(sg, su, sg, rows * I, v.swiglu_limit);
    linear(lo, sg, rows, w_.shared_down, nullptr, xb);
    for (int64_t i = 0; i < rows * dim; ++i) xb[i] += acc[i];
  }

 private:
  // ACT2FN[scoring_func] of the router logits.
  void score(const float* logits, float* scores) const {
    const int64_t E = c_.moe.n_experts;
    switch (c_.deepseek_v4.scoring) {
      case V4Scoring::kSqrtSoftplus:
        // softplus with torch's threshold 20 (linear above it), then sqrt.
        for (int64_t e = 0; e < E; ++e) {
          const float x = logits[e];
          scores[e] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
        }
        break;
      case V4Scoring::kSigmoid:
        for (int64_t e = 0; e < E; ++e) scores[e] = sigmoid(logits[e]);
        break;
      case V4Scoring::kSoftmax: {
        const float mx = *std::max_element(logits, logits + E);
        float den = 0.0f;
        for (int64_t e = 0; e < E; ++e) den += scores[e] = std::exp(logits[e] - mx);
        for (int64_t e = 0; e < E; ++e) scores[e] /= den;
        break;
      }
    }
  }

  const ModelConfig& c_;
  V4MoeWeights w_;
};

// One DeepseekV4HyperConnection's parameters.
struct HyperConnection {
  TensorView fn;                 // [(2+hc)*hc, hc*dim]
  const float* base = nullptr;   // [(2+hc)*hc]
  const float* scale = nullptr;  // [3]: pre, post, comb
};

class DeepseekV4Stack final : public Stack {
 public:
  DeepseekV4Stack(const ModelConfig& c, std::vector<HyperConnection> attn_hc,
                  std::vector<HyperConnection> ffn_hc, TensorView head_fn, const float* head_base,
                  const float* head_scale, const float* ones)
      : c_(c),
        v_(c.deepseek_v4),
        attn_hc_(std::move(attn_hc)),
        ffn_hc_(std::move(ffn_hc)),
        head_fn_(head_fn),
        head_base_(head_base),
        head_scale_(head_scale),
        ones_(ones) {}

  // Every row goes through every layer (the streams mix in every layer; no last-rows
  // shortcut). Returns R.
  int64_t run(Step& st, const std::vector<Block>& blocks, const int32_t* tokens, bool,
              bool) const override {
    const int64_t R = st.R, dim = c_.dim, hc = v_.hc_mult;
    Workspace& ws = *st.ws;
    float* x = ws.data(kForwardScratch, kX);
    float* xb = ws.data(kForwardScratch, kXb);
    float* streams = ws.data(kDeepseekV4Scratch, kV4Streams);
    st.rows = Step::Rows::kAll;
    // DeepseekV4Model: the embedding copied into every stream.
    for (int64_t r = 0; r < R; ++r)
      for (int64_t k = 0; k < hc; ++k)
        std::memcpy(streams + (r * hc + k) * dim, x + r * dim,
                    static_cast<size_t>(dim) * sizeof(float));
    for (size_t l = 0; l < blocks.size(); ++l) {
      const Block& block = blocks[l];
      collapse(st, attn_hc_[l], block.norms.attn);
      block.attention->forward(st, static_cast<int64_t>(l));
      expand(st, xb);
      collapse(st, ffn_hc_[l], block.norms.ffn);
      static_cast<const DeepseekV4Moe&>(*block.mlp).run(st, R, tokens);
      expand(st, xb);
    }
    head(st);
    return R;
  }

 private:
  // flat [R, hc*dim] = the streams normed without weight; mix [R, out] = fn . flat.
  void project(Step& st, const TensorView& fn, float* mix) const {
    const int64_t R = st.R, width = v_.hc_mult * c_.dim;
    float* streams = st.ws->data(kDeepseekV4Scratch, kV4Streams);
    float* flat = st.ws->data(kDeepseekV4Scratch, kV4Flat);
    norm_rows(streams, flat, R, width, c_.rms_eps, ones_);
    linear(st.linear, flat, R, fn, nullptr, mix);
  }

  // DeepseekV4HyperConnection.forward: pre, post and comb per row (post and comb kept in the
  // mix buffer for expand()), xb = norm(sum_j pre_j * stream_j).
  void collapse(Step& st, const HyperConnection& h, const float* norm) const {
    const int64_t R = st.R, dim = c_.dim, hc = v_.hc_mult, mw = (2 + hc) * hc;
    Workspace& ws = *st.ws;
    float* mix = ws.data(kDeepseekV4Scratch, kV4Mix);
    float* streams = ws.data(kDeepseekV4Scratch, kV4Streams);
    float* collapsed = ws.data(kForwardScratch, kAtt);
    project(st, h.fn, mix);
    const float eps = v_.hc_eps;
    for (int64_t r = 0; r < R; ++r) {
      float* m = mix + r * mw;
      float* pre = m;
      float* post = m + hc;
      float* comb = m + 2 * hc;
      for (int64_t k = 0; k < hc; ++k) {
        pre[k] = sigmoid(pre[k] * h.scale[0] + h.base[k]) + eps;
        post[k] = 2.0f * sigmoid(post[k] * h.scale[1] + h.base[hc + k]);
      }
      // comb: softmax over each row of [hc, hc], + eps, then Sinkhorn: columns first, then
      // (rows, columns) hc_sinkhorn_iters - 1 more times.
      for (int64_t i = 0; i < hc; ++i) {
        float* row = comb + i * hc;
        float mx = -INFINITY;
        for (int64_t j = 0; j < hc; ++j) {
          row[j] = row[j] * h.scale[2] + h.base[2 * hc + i * hc + j];
          mx = std::max(mx, row[j]);
        }
        float den = 0.0f;
        for (int64_t j = 0; j < hc; ++j) den += row[j] = std::exp(row[j] - mx);
        for (int64_t j = 0; j < hc; ++j) row[j] = row[j] / den + eps;
      }
      normalize_columns(comb, hc, eps);
      for (int64_t it = 1; it < v_.hc_sinkhorn_iters; ++it) {
        for (int64_t i = 0; i < hc; ++i) {
          float s = 0.0f;
          for (int64_t j = 0; j < hc; ++j) s += comb[i * hc + j];
          for (int64_t j = 0; j < hc; ++j) comb[i * hc + j] /= s + eps;
        }
        normalize_columns(comb, hc, eps);
      }
      float* out = collapsed + r * dim;
      const float* s = streams + r * hc * dim;
      for (int64_t d = 0; d < dim; ++d) {
        float acc = 0.0f;
        for (int64_t k = 0; k < hc; ++k) acc += pre[k] * s[k * dim + d];
        out[d] = acc;
      }
    }
    norm_rows(collapsed, ws.data(kForwardScratch, kXb), R, dim, c_.rms_eps, norm);
  }

  static void normalize_columns(float* comb, int64_t hc, float eps) {
    for (int64_t j = 0; j < hc; ++j) {
      float s = 0.0f;
      for (int64_t i = 0; i < hc; ++i) s += comb[i * hc + j];
      for (int64_t i = 0; i < hc; ++i) comb[i * hc + j] /= s + eps;
    }
  }

  // DeepseekV4DecoderLayer: stream k = post_k * out + sum_j comb[j][k] * stream_j.
  void expand(Step& st, const float* out) const {
    const int64_t R = st.R, dim = c_.dim, hc = v_.hc_mult, mw = (2 + hc) * hc;
    Workspace& ws = *st.ws;
    const float* mix = ws.data(kDeepseekV4Scratch, kV4Mix);
    float* streams = ws.data(kDeepseekV4Scratch, kV4Streams);
    float* old = ws.data(kDeepseekV4Scratch, kV4Flat);  // free once the mix was projected
    std::memcpy(old, streams, static_cast<size_t>(R * hc * dim) * sizeof(float));
    for (int64_t r = 0; r < R; ++r) {
      const float* post = mix + r * mw + hc;
      const float* comb = mix + r * mw + 2 * hc;
      const float* o = out + r * dim;
      const float* s = old + r * hc * dim;
      for (int64_t k = 0; k < hc; ++k) {
        float* dst = streams + (r * hc + k) * dim;
        for (int64_t d = 0; d < dim; ++d) {
          float acc = 0.0f;
          for (int64_t j = 0; j < hc; ++j) acc += comb[j * hc + k] * s[j * dim + d];
          dst[d] = post[k] * o[d] + acc;
        }
      }
    }
  }

  // DeepseekV4HyperHead: x = sum_k (sigmoid(mix_k * scale + base_k) + eps) * stream_k.
  void head(Step& st) const {
    const int64_t R = st.R, dim = c_.dim, hc = v_.hc_mult;
    Workspace& ws = *st.ws;
    float* mix = ws.data(kDeepseekV4Scratch, kV4Mix);
    float* streams = ws.data(kDeepseekV4Scratch, kV4Streams);
    float* x = ws.data(kForwardScratch, kX);
    project(st, head_fn_, mix);
    for (int64_t r = 0; r < R; ++r) {
      float* pre = mix + r * hc;
      for (int64_t k = 0; k < hc; ++k)
        pre[k] = sigmoid(pre[k] * head_scale_[0] + head_base_[k]) + v_.hc_eps;
      const float* s = streams + r * hc * dim;
      for (int64_t d = 0; d < dim; ++d) {
        float acc = 0.0f;
        for (int64_t k = 0; k < hc; ++k) acc += pre[k] * s[k * dim + d];
        x[r * dim + d] = acc;
      }
    }
  }

  const ModelConfig& c_;
  const DeepseekV4Config& v_;
  std::vector<HyperConnection> attn_hc_, ffn_hc_;
  TensorView head_fn_;
  const float* head_base_;
  const float* head_scale_;
  const float* ones_;
};

HyperConnection load_hc(Weights& w, int64_t l, const char* prefix) {
  auto name = [&](const char* suffix) { return hf_layer_tensor(l, std::string(prefix) + suffix); };
  return {w.matrix(name("fn")), w.vector(name("base")), w.vector(name("scale"))};
}

void build(Weights& w, ModelParts& parts) {
  const ModelConfig& c = w.config();
  const DeepseekV4Config& v = c.deepseek_v4;
  load_hf_embeddings(w, parts);
  const int64_t rd = c.rope_dim();
  const float* main_rope = w.keep(rope_inv_freq(rd, c.rope_theta, nullptr));
  const float* compress_rope = w.keep(
      rope_inv_freq(rd, v.compress_rope_theta,
                    v.compress_freq_factors.empty() ? nullptr : v.compress_freq_factors.data()));
  const int64_t n_ones = std::max({c.head_dim, v.index_head_dim, v.hc_mult * c.dim});
  const float* ones = w.keep(std::vector<float>(static_cast<size_t>(n_ones), 1.0f));
  std::vector<HyperConnection> attn_hc, ffn_hc;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    Block& block = parts.blocks.emplace_back();
    block.norms.attn = w.norm(hf_layer_tensor(l, "input_layernorm.weight"));
    block.norms.ffn = w.norm(hf_layer_tensor(l, "post_attention_layernorm.weight"));
    block.attention = std::make_unique<DeepseekV4Attention>(c, l, V4AttentionWeights::hf(w, l),
                                                            main_rope, compress_rope, ones);
    block.mlp = std::make_unique<DeepseekV4Moe>(c, load_moe(w, l));
    attn_hc.push_back(load_hc(w, l, "attn_hc."));
    ffn_hc.push_back(load_hc(w, l, "ffn_hc."));
  }
  parts.stack = std::make_unique<DeepseekV4Stack>(
      c, std::move(attn_hc), std::move(ffn_hc), w.matrix("model.hc_head.hc_fn"),
      w.vector("model.hc_head.hc_base"), w.vector("model.hc_head.hc_scale"), ones);
}

std::vector<const ScratchKind*> scratch(const ModelConfig&) {
  return {&kDeepseekV4Scratch};
}

}  // namespace

KVCACHE_REGISTER_FAMILY(deepseek_v4, Family{"deepseek_v4", {"deepseek_v4"}, &build, &scratch});

}  // namespace kvcache
