// Gated DeltaNet: the "linear_attention" layers of Qwen3-Next (models/qwen3_next/
// modeling_qwen3_next.py, Qwen3NextGatedDeltaNet.forward). No keys or values: the cache holds,
// per batch row, the causal conv's window and the recurrent state (cache/linear_state_layer.h).
//
//   x -> in_proj_qkvz -> [q | k | v | z],  in_proj_ba -> [b | a]
//     -> causal conv1d + SiLU over (q, k, v), its window from/to the cache
//     -> g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b)
//     -> gated delta rule (q, k l2-normalised in the kernel; key heads shared by H_v / H_k
//        value heads), the state from/to the cache: chunked for T > 1, recurrent for T = 1
//     -> gated RMSNorm per value head (w as is, times silu(z)) -> out_proj
//
// Loading: transformers' checkpoints lay in_proj_qkvz and in_proj_ba out per key head
// ([q_g, k_g, v_g, z_g] for each key head g; fix_query_key_value_ordering splits them at run
// time). Their rows are reordered once here so that the runtime sees contiguous q | k | v | z
// and b | a; conv1d.weight [C, 1, K] is transposed to the kernel's tap-major [K, C].
#pragma once

#include <cstdint>
#include <memory>

#include "model/block.h"
#include "model/weights.h"

namespace kvcache {

struct GatedDeltaNetWeights {
  TensorView qkvz;            // [2 H_k d_k + 2 H_v d_v, dim], rows q | k | v | z
  TensorView ba;              // [2 H_v, dim], rows b | a
  TensorView conv;            // [K, C] f32, C = 2 H_k d_k + H_v d_v
  TensorView a_log, dt_bias;  // [H_v] f32
  TensorView norm;            // [d_v] f32 (w as is)
  TensorView out;             // [dim, H_v d_v]

  // model.layers.<l>.linear_attn.*, rows reordered and conv transposed (see the header).
  static GatedDeltaNetWeights hf(Weights& w, int64_t layer);
};

// The row order a per-key-head checkpoint's in_proj_qkvz / in_proj_ba rows take at load:
// result[i] is the checkpoint row that becomes row i (q | k | v | z, and b | a).
std::vector<int64_t> qkvz_row_order(int64_t h_k, int64_t h_v, int64_t d_k, int64_t d_v);
std::vector<int64_t> ba_row_order(int64_t h_k, int64_t h_v);

class GatedDeltaNet final : public Attention {
 public:
  GatedDeltaNet(const ModelConfig& config, int64_t layer, const GatedDeltaNetWeights& weights);

  // Produces every row (ignores Rows::kLast / kKvOnly: the state needs every token anyway).
  int64_t forward(Step& st, int64_t layer) const override;
  int64_t kv_source() const override { return layer_; }

 private:
  GatedDeltaNetWeights w_;
  int64_t layer_, Hk_, Hv_, dk_, dv_, K_, C_;
  float eps_;
};

std::unique_ptr<Attention> make_hf_gated_deltanet(Weights& w, int64_t layer);

// qkvz [R, C + H_v d_v] (conv output in place), ba [R, 2 H_v], g and beta [R, H_v], the
// normed core output [R, H_v d_v].
extern const ScratchKind kGatedDeltaNetScratch;
enum GatedDeltaNetBuffer : size_t { kGdnQkvz, kGdnBa, kGdnG, kGdnBeta, kGdnCore };

}  // namespace kvcache
