// Mixture-of-experts MLPs. Per row: router logits -> the top-k experts and their weights -> the
// weighted sum of those experts' outputs (routed experts run one row at a time: a GEMV each).
// Two flavours, by how experts are stored and routed (transformers' files):
//   GptOssMoe    models/gpt_oss/modeling_gpt_oss.py: router with a bias; top-k of the logits,
//                softmax over the k kept; experts stacked input-major ([E, in, out]) with biases
//                and the clamped SwiGLU (alpha, limit).
//   DeepseekMoe  models/deepseek_v3/modeling_deepseek_v3.py (and deepseek_v2): V3's sigmoid
//                scores with e_score_correction_bias for the choice, group-limited top-k,
//                optional renormalisation, x routed_scaling_factor; or V2's greedy softmax
//                (MoEGate). Experts are SwiGLU MLPs, plus shared experts over every row.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "model/block.h"
#include "model/dense_mlp.h"
#include "model/model_file.h"
#include "model/weights.h"

namespace kvcache {

// The expert choices of one row: (expert, weight) in the order they are summed.
using Routing = std::vector<std::pair<int64_t, float>>;

// Routing bookkeeping, sized once per call (not per row).
struct RouteScratch {
  std::vector<int64_t> idx;     // [E] experts ranked
  std::vector<float> choice;    // [E] what experts are ranked by
  std::vector<float> scores;    // [E] what their weights come from
  std::vector<int64_t> groups;  // [n_group] groups ranked
  std::vector<float> gscore;    // [n_group]
  std::vector<char> keep;       // [n_group]
};

// The per-row loop both flavours share; a flavour routes one row and runs one expert.
class RoutedMoe : public Mlp {
 public:
  // xb rows [0, rows): routed sum into att (free once o_proj has run), then finish().
  void forward(Step& st, int64_t rows) const override;

 protected:
  RoutedMoe(const MoeConfig& config, int64_t dim, TensorView router, const float* router_bias)
      : m_(config), dim_(dim), router_(router), router_bias_(router_bias) {}
  // The experts and weights of the row whose router logits are `logits` ([E]).
  virtual void route(const float* logits, RouteScratch& rs, Routing& picked) const = 0;
  // out [dim] = expert e on one row x [dim].
  virtual void expert(Step& st, int64_t e, const float* x, float* out) const = 0;
  // xb [rows, dim] <- the MLP's output, from the routed sum `routed` [rows, dim].
  virtual void finish(Step& st, int64_t rows, const float* routed) const = 0;

  MoeConfig m_;
  int64_t dim_;
  TensorView router_;         // [E, dim]
  const float* router_bias_;  // [E] or null
};

struct GptOssExperts {
  TensorView router;                    // [E, dim]
  const float* router_bias = nullptr;   // [E]
  TensorView gate_up;                   // [E, dim, 2I] (input-major: gate and up interleaved)
  const float* gate_up_bias = nullptr;  // [E, 2I]
  TensorView down;                      // [E, I, dim]
  const float* down_bias = nullptr;     // [E, dim]

  static GptOssExperts hf(Weights& w, int64_t layer);
};

class GptOssMoe final : public RoutedMoe {
 public:
  GptOssMoe(const ModelConfig& config, const GptOssExperts& experts);

 private:
  void route(const float* logits, RouteScratch& rs, Routing& picked) const override;
  void expert(Step& st, int64_t e, const float* x, float* out) const override;
  void finish(Step& st, int64_t rows, const float* routed) const override;

  GptOssExperts w_;
};

class DeepseekMoe final : public RoutedMoe {
 public:
  // shared: the shared experts as one MLP (n_shared_experts x expert size), if any.
  DeepseekMoe(const ModelConfig& config, TensorView router, const float* score_bias,
              std::vector<DenseMlp> experts, std::optional<DenseMlp> shared);
  // mlp.gate (+ e_score_correction_bias for V3), mlp.experts.<e>.*, mlp.shared_experts.*.
  static std::unique_ptr<DeepseekMoe> hf(Weights& w, int64_t layer);

 private:
  void route(const float* logits, RouteScratch& rs, Routing& picked) const override;
  void expert(Step& st, int64_t e, const float* x, float* out) const override;
  void finish(Step& st, int64_t rows, const float* routed) const override;

  const float* score_bias_;  // [E] DeepSeek-V3 e_score_correction_bias, or null (V2)
  std::vector<DenseMlp> experts_;
  std::optional<DenseMlp> shared_;
};

// Qwen2-MoE / Qwen3-Next (models/qwen2_moe/modeling_qwen2_moe.py Qwen2MoeTopKRouter and
// Qwen2MoeSparseMoeBlock, used by models/qwen3_next): softmax over every expert's logit in
// float, top-k, renormalised when norm_topk_prob; the routed sum plus
// sigmoid(shared_expert_gate(x)) * shared_expert(x).
class QwenMoe final : public RoutedMoe {
 public:
  QwenMoe(const ModelConfig& config, TensorView router, std::vector<DenseMlp> experts,
          std::optional<DenseMlp> shared, TensorView shared_gate);
  // mlp.gate, mlp.experts.<e>.*, mlp.shared_expert.*, mlp.shared_expert_gate.
  static std::unique_ptr<QwenMoe> hf(Weights& w, int64_t layer);

 private:
  void route(const float* logits, RouteScratch& rs, Routing& picked) const override;
  void expert(Step& st, int64_t e, const float* x, float* out) const override;
  void finish(Step& st, int64_t rows, const float* routed) const override;

  std::vector<DenseMlp> experts_;
  std::optional<DenseMlp> shared_;
  TensorView shared_gate_;  // [1, dim]
};

// [2E + dim + 2I + max(dim, 2I)]: router logits and ranking, one expert's output, GPT-OSS's
// gate_up row and a widened weight row.
extern const ScratchKind kMoeScratch;

}  // namespace kvcache
