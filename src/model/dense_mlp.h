// The gated MLP: out = down(act(gate(x)) * up(x)), act SiLU (SwiGLU: Llama, DeepSeek's dense
// layers and experts) or tanh-approximated GELU (GeGLU: Gemma). Gemma-3n's activation sparsity
// first keeps only the gate values above mean + z·std of their row (Gemma3nTextMLP's
// _gaussian_topk), z > 0 given by the family.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/block.h"
#include "model/model_file.h"
#include "model/weights.h"

namespace kvcache {

struct DenseMlpWeights {
  TensorView gate, up;  // [hidden, dim]
  TensorView down;      // [dim, hidden]

  // blk.<l>.ffn_gate / ffn_up / ffn_down (llama.cpp's canonical names).
  static DenseMlpWeights canonical(Weights& w, int64_t layer);
  // model.layers.<l>.<prefix>gate_proj / up_proj / down_proj: prefix "mlp.", or an expert's.
  static DenseMlpWeights hf(Weights& w, int64_t layer, const std::string& prefix);
};

class DenseMlp final : public Mlp {
 public:
  DenseMlp(const DenseMlpWeights& weights, FfnActivation act, float sparsity_z = 0.0f)
      : w_(weights), gelu_(act == FfnActivation::kGeluTanh), sparsity_z_(sparsity_z) {}

  // The block's MLP on xb; the products take the kernel a product over all st.R rows takes.
  void forward(Step& st, int64_t rows) const override;
  // The product itself on `rows` rows: out [rows, dim] from in [rows, dim] (may alias), through
  // the workspace's hidden buffers (MoE experts run it one row at a time).
  void run(const LinearOptions& linear, Workspace& ws, int64_t rows, const float* in,
           float* out) const;

 private:
  void sparsify(float* gate, int64_t rows, int64_t hidden) const;

  DenseMlpWeights w_;
  bool gelu_;
  float sparsity_z_;
};

// A transformers-named layer's mlp.gate_proj / up_proj / down_proj, the config's activation.
std::unique_ptr<Mlp> make_hf_dense_mlp(Weights& w, int64_t layer);

// hb, hb2 [R, hidden]: the gate and up outputs (hidden: the widest dense MLP of the config,
// shared experts included).
extern const ScratchKind kDenseMlpScratch;

}  // namespace kvcache
