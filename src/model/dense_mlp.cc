#include "model/dense_mlp.h"

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "kernels/activation.h"
#include "model/weight_spec.h"

namespace kvcache {

namespace {
enum DenseMlpBuffer : size_t { kHb, kHb2 };
}  // namespace

DenseMlpWeights DenseMlpWeights::canonical(Weights& w, int64_t l) {
  return {w.matrix(layer_tensor(l, "ffn_gate.weight")), w.matrix(layer_tensor(l, "ffn_up.weight")),
          w.matrix(layer_tensor(l, "ffn_down.weight"))};
}

DenseMlpWeights DenseMlpWeights::hf(Weights& w, int64_t l, const std::string& prefix) {
  return {w.matrix(hf_layer_tensor(l, prefix + "gate_proj.weight")),
          w.matrix(hf_layer_tensor(l, prefix + "up_proj.weight")),
          w.matrix(hf_layer_tensor(l, prefix + "down_proj.weight"))};
}

std::unique_ptr<Mlp> make_hf_dense_mlp(Weights& w, int64_t l) {
  return std::make_unique<DenseMlp>(DenseMlpWeights::hf(w, l, "mlp."), w.config().ffn_act);
}

void DenseMlp::forward(Step& st, int64_t rows) const {
  float* xb = st.ws->data(kForwardScratch, kXb);
  run(st.linear.as_rows(st.R), *st.ws, rows, xb, xb);
}

void DenseMlp::sparsify(float* hb, int64_t rows, int64_t hidden) const {
  // Gemma3nTextMLP._gaussian_topk: relu(gate - (mean + std * z)), std without Bessel's
  // correction, per row.
  for (int64_t r = 0; r < rows; ++r) {
    float* g = hb + r * hidden;
    float mean = 0.0f;
    for (int64_t i = 0; i < hidden; ++i) mean += g[i];
    mean /= static_cast<float>(hidden);
    float var = 0.0f;
    for (int64_t i = 0; i < hidden; ++i) var += (g[i] - mean) * (g[i] - mean);
    const float cutoff = mean + std::sqrt(var / static_cast<float>(hidden)) * sparsity_z_;
    for (int64_t i = 0; i < hidden; ++i) g[i] = std::max(g[i] - cutoff, 0.0f);
  }
}

void DenseMlp::run(const LinearOptions& linear_options, Workspace& ws, int64_t rows,
                   const float* in, float* out) const {
  const int64_t hidden = w_.gate.dim(0);
  float* hb = ws.data(kDenseMlpScratch, kHb);
  float* hb2 = ws.data(kDenseMlpScratch, kHb2);
  // gate and up read the same input: one pass over the thread pool for both (decode).
  const MatmulParams gate_up[] = {linear_params(linear_options, in, rows, w_.gate, nullptr, hb),
                                  linear_params(linear_options, in, rows, w_.up, nullptr, hb2)};
  matmul_group(gate_up);
  if (sparsity_z_ > 0.0f) sparsify(hb, rows, hidden);
  auto act = [&](int64_t r0, int64_t r1) {
    float* g = hb + r0 * hidden;
    const float* u = hb2 + r0 * hidden;
    if (gelu_) {
      geglu_tanh(g, u, g, (r1 - r0) * hidden);
    } else {
      swiglu(g, u, g, (r1 - r0) * hidden);
    }
  };
  if (rows >= 16) {
    // Prefill: ~1M exp/tanh per layer at 512 tokens, worth splitting; bit-identical per element.
    default_pool().parallel_for((rows + 7) / 8,
                                [&](int64_t t) { act(t * 8, std::min(rows, t * 8 + 8)); });
  } else {
    act(0, rows);
  }
  linear(linear_options, hb, rows, w_.down, nullptr, out);
}

namespace {
// The widest dense MLP of the config: its own layers', or DeepSeek's shared experts.
int64_t widest_hidden(const ModelConfig& c) {
  return std::max({c.hidden_dim,
                   c.moe.expert_hidden_dim * std::max<int64_t>(1, c.moe.n_shared_experts),
                   c.moe.shared_expert_hidden_dim});
}
std::vector<ScratchBuffer> dense_buffers(const ModelConfig& c) {
  return {{widest_hidden(c), 0}, {widest_hidden(c), 0}};
}
}  // namespace

const ScratchKind kDenseMlpScratch{"dense mlp", &dense_buffers, &widest_hidden};

}  // namespace kvcache
