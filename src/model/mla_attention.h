// Multi-head latent attention (DeepSeek-V2/V3), models/deepseek_v3/modeling_deepseek_v3.py.
//
// The cache stores c_kv = norm(kv_a(x)[:d_c]) and k_rot = RoPE(kv_a(x)[d_c:]) as two one-head
// tensors (K slot: [B, 1, S, d_c], V slot: [B, 1, S, d_r]) — d_c + d_r elements per token and
// layer, no factor 2. The per-head keys and values are expanded AFTER the cache call: kv_b(c_kv)
// gives k_nope [H, d_kn] and v [H, d_v] per visible token, k = [k_nope, k_rot] (k_rot shared by
// every head), and the kernel runs with D_k = d_kn + d_r, D_v = d_v. Why not absorb kv_b into
// the query and output projections (attention over the latent directly, MQA with D_k = d_c +
// d_r): that changes the arithmetic (q·W_kb·c instead of q·(W_kb·c)), so it could not be checked
// against transformers' eager code at 1e-5 term by term, and it needs a kernel reading K as two
// spans (latent | rope); expansion is exact and uses the kernels as they are. The price is
// recomputing kv_b over the whole visible history every step — O(S·d_c·H·(d_kn+d_v)) per layer.
//
// The expansion reads the cached rows through the span (kernels/kv_span_rows.h: dense strides
// or the page table, the same values either way, so paged equals dense bit for bit; a quantized
// span's packed blocks dequantized, cache/quantized_layer.h "MLA latents") and runs
// per batch row — rows of a varlen batch see different histories, and the expansion buffers
// stay one row's history long. Each row then makes one attend() over its expanded dense span.
// Queries: q_proj, or q_a_proj -> norm -> q_b_proj (q_lora); RoPE on the last d_r dims of each
// head only. The q_a and kv_a norms use eps 1e-6 (DeepseekV3RMSNorm's default), not rms_eps.
#pragma once

#include <cstdint>
#include <memory>

#include "kernels/attention.h"
#include "kernels/rope.h"
#include "model/block.h"
#include "model/weights.h"

namespace kvcache {

struct MlaWeights {
  TensorView wq;                     // [H*D_qk, dim] without q_lora, else empty
  TensorView wq_a;                   // [q_lora, dim] with q_lora
  const float* q_a_norm = nullptr;   // [q_lora]
  TensorView wq_b;                   // [H*D_qk, q_lora]
  TensorView wkv_a;                  // [d_c + d_r, dim]
  const float* kv_a_norm = nullptr;  // [d_c]
  TensorView wkv_b;                  // [H*(d_kn + d_v), d_c]
  TensorView wo;                     // [dim, H*d_v]

  static MlaWeights hf(Weights& w, int64_t layer);
};

// A DeepSeek layer's MLA: its weights, the RoPE table (rope: [d_r / 2]) and the config's pair
// order for the rotated part.
std::unique_ptr<Attention> make_hf_mla(Weights& w, int64_t layer, const float* rope);

class MlaAttention final : public Attention {
 public:
  // rope: [d_r / 2] frequencies. Error(kFormat) for a layer the config makes KV-shared.
  MlaAttention(const ModelFile& file, int64_t layer, const MlaWeights& weights,
               const RopeTable& rope);

  // Attends every row (Rows::kLast and kKvOnly are not specialised): returns st.R.
  int64_t forward(Step& st, int64_t layer) const override;
  int64_t kv_source() const override { return layer_; }

 private:
  void project_q(Step& st, const float* xb, float* q) const;
  // xb -> ckv [R, d_c + d_r]: the normed latent, then the (not yet rotated) rope key.
  void compress_kv(Step& st, const float* xb, float* ckv) const;
  void rotate(const Step& st, float* q, float* ckv) const;
  // Batch row b's visible keys [S_kv, H, D_qk] and values [S_kv, H, d_v] expanded from the span
  // into the workspace; returns them as a dense span.
  KVSpan expand(Step& st, const KVSpan& span, int64_t b) const;

  MlaWeights w_;
  int64_t layer_;
  MlaConfig m_;
  int64_t H_;
  RopeTable rope_;
  AttentionOptions options_;  // scale, causal
};

// q [R, H*D_qk], ckv [R, d_c + d_r], qa [R, q_lora]; grown per call to the visible history:
// latent [S_kv, d_c] f32, kv_b output [S_kv, H*(d_kn + d_v)], keys [S_kv, H, D_qk].
extern const ScratchKind kMlaScratch;
enum MlaBuffer : size_t { kMlaQ, kMlaCkv, kMlaQa, kMlaLatent, kMlaKvb, kMlaKeys };

}  // namespace kvcache
