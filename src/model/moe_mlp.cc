#include "model/moe_mlp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "kernels/activation.h"
#include "model/weight_spec.h"

namespace kvcache {

namespace {

// The forward's att buffer holds the routed sum ([R, dim]; att is free once o_proj has run).
// The MoE scratch: logits [E] | ranking [E] | one expert's output [dim] | gate_up [2I] | a
// widened weight row [max(dim, 2I)].
struct MoeBuffers {
  float* logits;
  float* eout;
  float* gu;
  float* row;
  MoeBuffers(Workspace& ws, const MoeConfig& m, int64_t dim) {
    float* s = ws.data(kMoeScratch, 0);
    logits = s;
    eout = s + 2 * m.n_experts;
    gu = eout + dim;
    row = gu + 2 * m.expert_hidden_dim;
  }
};

// The top k experts by `by` into rs.idx[0, k), ties to the lower expert id.
void top_k(const float* by, int64_t k, std::vector<int64_t>& idx) {
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
    return by[a] > by[b] || (by[a] == by[b] && a < b);
  });
}

// y[out] = x[in] @ W[in, out] (+ bias): GPT-OSS experts store weights input-major. Each W row
// is widened into `row` ([out] scratch) and accumulated, so any weight dtype works.
void linear_in_out(const float* x, int64_t in, const std::byte* w, DType t, int64_t out,
                   const float* bias, float* y, float* row) {
  const size_t row_bytes = dtype_bytes(t, out);
  if (bias) {
    std::memcpy(y, bias, static_cast<size_t>(out) * sizeof(float));
  } else {
    std::fill(y, y + out, 0.0f);
  }
  for (int64_t i = 0; i < in; ++i) {
    dequantize_row(w + static_cast<size_t>(i) * row_bytes, t, row, out);
    const float xi = x[i];
    for (int64_t j = 0; j < out; ++j) y[j] += xi * row[j];
  }
}

}  // namespace

void RoutedMoe::forward(Step& st, int64_t rows) const {
  const int64_t dim = dim_, E = m_.n_experts;
  float* xb = st.ws->data(kForwardScratch, kXb);
  float* acc = st.ws->data(kForwardScratch, kAtt);
  const MoeBuffers buf(*st.ws, m_, dim);
  RouteScratch rs{std::vector<int64_t>(static_cast<size_t>(E)),
                  std::vector<float>(static_cast<size_t>(E)),
                  std::vector<float>(static_cast<size_t>(E)),
                  std::vector<int64_t>(static_cast<size_t>(m_.n_group)),
                  std::vector<float>(static_cast<size_t>(m_.n_group)),
                  std::vector<char>(static_cast<size_t>(m_.n_group))};
  Routing picked(static_cast<size_t>(m_.n_experts_used));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xb + r * dim;
    float* out = acc + r * dim;
    std::fill(out, out + dim, 0.0f);
    // The router and the routed experts are one-row GEMVs whatever the chunk.
    linear(st.linear, xr, 1, router_, router_bias_, buf.logits);
    route(buf.logits, rs, picked);
    for (const auto& [e, w] : picked) {
      expert(st, e, xr, buf.eout);
      for (int64_t d = 0; d < dim; ++d) out[d] += w * buf.eout[d];
    }
  }
  finish(st, rows, acc);
}

// ---- GPT-OSS ----

GptOssExperts GptOssExperts::hf(Weights& w, int64_t l) {
  auto name = [&](const char* suffix) { return hf_layer_tensor(l, suffix); };
  GptOssExperts x;
  x.router = w.matrix(name("mlp.router.weight"));
  x.router_bias = w.vector(name("mlp.router.bias"));
  x.gate_up = w.matrix(name("mlp.experts.gate_up_proj"));
  x.gate_up_bias = w.vector(name("mlp.experts.gate_up_proj_bias"));
  x.down = w.matrix(name("mlp.experts.down_proj"));
  x.down_bias = w.vector(name("mlp.experts.down_proj_bias"));
  return x;
}

GptOssMoe::GptOssMoe(const ModelConfig& c, const GptOssExperts& experts)
    : RoutedMoe(c.moe, c.dim, experts.router, experts.router_bias), w_(experts) {}

void GptOssMoe::route(const float* logits, RouteScratch& rs, Routing& picked) const {
  // GptOssTopKRouter: topk of the logits, softmax over the k values.
  const int64_t K = m_.n_experts_used;
  top_k(logits, K, rs.idx);
  const float mx = logits[rs.idx[0]];
  float den = 0.0f;
  for (int64_t i = 0; i < K; ++i) {
    const int64_t e = rs.idx[static_cast<size_t>(i)];
    picked[static_cast<size_t>(i)] = {e, std::exp(logits[e] - mx)};
    den += picked[static_cast<size_t>(i)].second;
  }
  for (auto& p : picked) p.second /= den;
}

void GptOssMoe::expert(Step& st, int64_t e, const float* x, float* out) const {
  const int64_t dim = dim_, I = m_.expert_hidden_dim;
  const MoeBuffers buf(*st.ws, m_, dim);
  const size_t gu_bytes = dtype_bytes(w_.gate_up.dtype(), dim * 2 * I);
  const size_t dn_bytes = dtype_bytes(w_.down.dtype(), I * dim);
  linear_in_out(
      x, dim, static_cast<const std::byte*>(w_.gate_up.data()) + static_cast<size_t>(e) * gu_bytes,
      w_.gate_up.dtype(), 2 * I, w_.gate_up_bias + e * 2 * I, buf.gu, buf.row);
  swiglu_oss(buf.gu, buf.gu, I, m_.swiglu_alpha,
             m_.swiglu_limit);  // in place: out[i] reads [2i, 2i+1] first
  linear_in_out(buf.gu, I,
                static_cast<const std::byte*>(w_.down.data()) + static_cast<size_t>(e) * dn_bytes,
                w_.down.dtype(), dim, w_.down_bias + e * dim, out, buf.row);
}

void GptOssMoe::finish(Step& st, int64_t rows, const float* routed) const {
  std::memcpy(st.ws->data(kForwardScratch, kXb), routed,
              static_cast<size_t>(rows * dim_) * sizeof(float));
}

// ---- DeepSeek ----

DeepseekMoe::DeepseekMoe(const ModelConfig& c, TensorView router, const float* score_bias,
                         std::vector<DenseMlp> experts, std::optional<DenseMlp> shared)
    : RoutedMoe(c.moe, c.dim, router, nullptr),
      score_bias_(score_bias),
      experts_(std::move(experts)),
      shared_(std::move(shared)) {}

std::unique_ptr<DeepseekMoe> DeepseekMoe::hf(Weights& w, int64_t l) {
  const ModelConfig& c = w.config();
  const MoeConfig& m = c.moe;
  const TensorView router = w.matrix(hf_layer_tensor(l, "mlp.gate.weight"));
  const float* score_bias = m.router == MoeRouter::kDeepseekV3
                                ? w.vector(hf_layer_tensor(l, "mlp.gate.e_score_correction_bias"))
                                : nullptr;
  std::vector<DenseMlp> experts;
  for (int64_t e = 0; e < m.n_experts; ++e)
    experts.emplace_back(DenseMlpWeights::hf(w, l, "mlp.experts." + std::to_string(e) + "."),
                         c.ffn_act);
  std::optional<DenseMlp> shared;
  if (m.n_shared_experts > 0)
    shared.emplace(DenseMlpWeights::hf(w, l, "mlp.shared_experts."), c.ffn_act);
  return std::make_unique<DeepseekMoe>(c, router, score_bias, std::move(experts),
                                       std::move(shared));
}

void DeepseekMoe::route(const float* logits, RouteScratch& rs, Routing& picked) const {
  const int64_t E = m_.n_experts, K = m_.n_experts_used;
  std::vector<float>& scores = rs.scores;
  std::vector<float>& choice = rs.choice;
  if (m_.router == MoeRouter::kDeepseekV3) {
    // DeepseekV3TopkRouter: sigmoid scores; the choice adds e_score_correction_bias, keeps the
    // topk_group groups with the largest sum of their top-2 choices, zeroes the rest.
    for (int64_t e = 0; e < E; ++e) {
      scores[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-logits[e]));
      choice[static_cast<size_t>(e)] = scores[static_cast<size_t>(e)] + score_bias_[e];
    }
    const int64_t G = m_.n_group, per = E / G;
    if (G > 1) {
      for (int64_t g = 0; g < G; ++g) {  // sum of the group's two best choices
        float b1 = -std::numeric_limits<float>::infinity(), b2 = b1;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          const float v = choice[static_cast<size_t>(e)];
          if (v > b1) {
            b2 = b1;
            b1 = v;
          } else if (v > b2) {
            b2 = v;
          }
        }
        rs.gscore[static_cast<size_t>(g)] = b1 + (per > 1 ? b2 : 0.0f);
      }
      top_k(rs.gscore.data(), m_.topk_group, rs.groups);
      std::fill(rs.keep.begin(), rs.keep.end(), 0);
      for (int64_t i = 0; i < m_.topk_group; ++i)
        rs.keep[static_cast<size_t>(rs.groups[static_cast<size_t>(i)])] = true;
      for (int64_t e = 0; e < E; ++e) {
        if (!rs.keep[static_cast<size_t>(e / per)])
          choice[static_cast<size_t>(e)] = 0.0f;  // masked_fill(.., 0.0)
      }
    }
  } else {
    // DeepSeek-V2 greedy: softmax scores, chosen by themselves.
    const float mx = *std::max_element(logits, logits + E);
    float den = 0.0f;
    for (int64_t e = 0; e < E; ++e)
      den += scores[static_cast<size_t>(e)] = std::exp(logits[e] - mx);
    for (int64_t e = 0; e < E; ++e)
      choice[static_cast<size_t>(e)] = scores[static_cast<size_t>(e)] /= den;
  }
  top_k(choice.data(), K, rs.idx);
  float sum = 0.0f;
  for (int64_t i = 0; i < K; ++i) {
    const int64_t e = rs.idx[static_cast<size_t>(i)];
    picked[static_cast<size_t>(i)] = {e, scores[static_cast<size_t>(e)]};
    sum += scores[static_cast<size_t>(e)];
  }
  for (auto& p : picked) {
    if (m_.router == MoeRouter::kDeepseekV3) {
      // DeepseekV3TopkRouter: optional renormalisation, then always the scaling factor.
      if (m_.norm_topk_prob) p.second /= (sum + 1e-20f);
      p.second *= m_.routed_scaling_factor;
    } else if (K > 1 && m_.norm_topk_prob) {
      // DeepSeek-V2's MoEGate: renormalised weights are NOT scaled; otherwise scaled.
      p.second /= (sum + 1e-20f);
    } else {
      p.second *= m_.routed_scaling_factor;
    }
  }
}

void DeepseekMoe::expert(Step& st, int64_t e, const float* x, float* out) const {
  experts_[static_cast<size_t>(e)].run(st.linear, *st.ws, 1, x, out);
}

void DeepseekMoe::finish(Step& st, int64_t rows, const float* routed) const {
  float* xb = st.ws->data(kForwardScratch, kXb);
  if (!shared_) {
    std::memcpy(xb, routed, static_cast<size_t>(rows * dim_) * sizeof(float));
    return;
  }
  // DeepseekV3MoE: routed output + shared_experts(input), the shared MLP over all rows at once
  // (the kernel the whole chunk takes; the routed experts kept their one-row GEMV).
  shared_->run(st.linear.as_rows(st.R), *st.ws, rows, xb, xb);
  add_inplace(xb, routed, rows * dim_);
}

// ---- Qwen2-MoE / Qwen3-Next ----

QwenMoe::QwenMoe(const ModelConfig& c, TensorView router, std::vector<DenseMlp> experts,
                 std::optional<DenseMlp> shared, TensorView shared_gate)
    : RoutedMoe(c.moe, c.dim, router, nullptr),
      experts_(std::move(experts)),
      shared_(std::move(shared)),
      shared_gate_(shared_gate) {}

std::unique_ptr<QwenMoe> QwenMoe::hf(Weights& w, int64_t l) {
  const ModelConfig& c = w.config();
  const MoeConfig& m = c.moe;
  const TensorView router = w.matrix(hf_layer_tensor(l, "mlp.gate.weight"));
  std::vector<DenseMlp> experts;
  for (int64_t e = 0; e < m.n_experts; ++e)
    experts.emplace_back(DenseMlpWeights::hf(w, l, "mlp.experts." + std::to_string(e) + "."),
                         c.ffn_act);
  std::optional<DenseMlp> shared;
  TensorView gate;
  if (m.shared_expert_hidden_dim > 0) {
    shared.emplace(DenseMlpWeights::hf(w, l, "mlp.shared_expert."), c.ffn_act);
    gate = w.matrix(hf_layer_tensor(l, "mlp.shared_expert_gate.weight"));
  }
  return std::make_unique<QwenMoe>(c, router, std::move(experts), std::move(shared), gate);
}

void QwenMoe::route(const float* logits, RouteScratch& rs, Routing& picked) const {
  // Qwen2MoeTopKRouter: softmax over all experts (float), top-k of the probabilities, then
  // divided by their sum when norm_topk_prob.
  const int64_t E = m_.n_experts, K = m_.n_experts_used;
  std::vector<float>& p = rs.scores;
  const float mx = *std::max_element(logits, logits + E);
  float den = 0.0f;
  for (int64_t e = 0; e < E; ++e) den += p[static_cast<size_t>(e)] = std::exp(logits[e] - mx);
  for (int64_t e = 0; e < E; ++e) p[static_cast<size_t>(e)] /= den;
  top_k(p.data(), K, rs.idx);
  float sum = 0.0f;
  for (int64_t i = 0; i < K; ++i) {
    const int64_t e = rs.idx[static_cast<size_t>(i)];
    picked[static_cast<size_t>(i)] = {e, p[static_cast<size_t>(e)]};
    sum += p[static_cast<size_t>(e)];
  }
  if (m_.norm_topk_prob)
    for (auto& q : picked) q.second /= sum;
}

void QwenMoe::expert(Step& st, int64_t e, const float* x, float* out) const {
  experts_[static_cast<size_t>(e)].run(st.linear, *st.ws, 1, x, out);
}

void QwenMoe::finish(Step& st, int64_t rows, const float* routed) const {
  float* xb = st.ws->data(kForwardScratch, kXb);
  if (!shared_) {
    std::memcpy(xb, routed, static_cast<size_t>(rows * dim_) * sizeof(float));
    return;
  }
  // Qwen2MoeSparseMoeBlock: routed + sigmoid(shared_expert_gate(x)) * shared_expert(x). The
  // gate logits ([rows, 1]) are taken before the shared expert overwrites xb.
  float* gates = st.ws->data(kMoeScratch, 1);
  linear(st.linear.as_rows(st.R), xb, rows, shared_gate_, nullptr, gates);
  shared_->run(st.linear.as_rows(st.R), *st.ws, rows, xb, xb);
  for (int64_t r = 0; r < rows; ++r) {
    const float s = 1.0f / (1.0f + std::exp(-gates[r]));
    float* o = xb + r * dim_;
    const float* a = routed + r * dim_;
    for (int64_t d = 0; d < dim_; ++d) o[d] = a[d] + s * o[d];
  }
}

namespace {
std::vector<ScratchBuffer> moe_buffers(const ModelConfig& c) {
  const int64_t I = c.moe.expert_hidden_dim;
  // Buffer 1: QwenMoe's shared-expert gate logit per row.
  return {{0, 2 * c.moe.n_experts + c.dim + 2 * I + std::max(c.dim, 2 * I)},
          {c.moe.shared_expert_gate ? 1 : 0, 0}};
}
int64_t moe_widest_input(const ModelConfig&) {
  return 0;
}  // router: dim; experts: one-row GEMVs
}  // namespace

const ScratchKind kMoeScratch{"moe", &moe_buffers, &moe_widest_input};

}  // namespace kvcache
