// DeepSeek-V4's attention (models/deepseek_v4/modeling_deepseek_v4.py, DeepseekV4Attention and
// its compressors DeepseekV4CSACompressor / DeepseekV4HCACompressor / DeepseekV4Indexer):
//
//   q   = unweighted_rms_per_head(q_b_proj(q_res)),  q_res = q_a_norm(q_a_proj(x))
//   kv  = kv_norm(kv_proj(x))                         one head, K == V (MQA)
//   RoPE (interleaved pairs) on the TRAILING rope_dim() dims of each head of q and kv: the
//   "main" theta on sliding layers, the "compress" theta (maybe YaRN) on CSA / HCA layers;
//   cache.update(kv, kv)                              the sliding-window branch
//   CSA / HCA: per batch row, the compressor's (kv, gate) rows go through the cache's
//   store_compression_weights; each whole window of `rate` tokens folds into one entry,
//   sum_j softmax_j(gate_j + position_bias_j) * kv_j per channel (f32), then kv_norm and RoPE
//   at the window's first position. CSA folds 2 * rate slots: the previous window's Ca half
//   ([..., :D]) and its own Cb half ([..., D:]), the previous window coming from the cache's
//   overlap state across calls. CSA's lightning indexer keeps its own such series at
//   index_head_dim and picks, per query, the top index_topk entries by
//   sum_h w_h relu(q_I,h . k_I) (kernels/sparse_attention.h indexer_topk);
//   attention over the window plus the (selected) entries with per-head sinks, scale D^-0.5
//   (kernels/sparse_attention.h sparse_attention);
//   the output's trailing rope dims rotated back (RoPE at -position: K == V carried the
//   keys' rotation into the values); o_a_proj per group of heads (block diagonal, o_groups),
//   then o_b_proj.
// Everything goes through the Cache's interfaces (cache/compressed_cache_layer.h), so the
// dense, recompute and paged containers are interchangeable.
#pragma once

#include <cstdint>
#include <memory>

#include "model/block.h"
#include "model/weights.h"

namespace kvcache {

// One compressor (the attention's, or CSA's indexer's): width = 2 * d (CSA) or d (HCA).
struct V4CompressorWeights {
  TensorView kv_proj, gate_proj;         // [width, dim]
  const float* position_bias = nullptr;  // [rate, width]
  const float* kv_norm = nullptr;        // [d]
  int64_t width = 0, d = 0;
};

struct V4AttentionWeights {
  TensorView q_a, q_b;              // [q_lora, dim], [H*D, q_lora]
  const float* q_a_norm = nullptr;  // [q_lora]
  TensorView kv_proj;               // [D, dim]
  const float* kv_norm = nullptr;   // [D]
  TensorView o_a, o_b;              // [G*o_lora, H*D/G], [dim, G*o_lora]
  const float* sinks = nullptr;     // [H]
  V4CompressorWeights compressor;   // CSA / HCA layers
  V4CompressorWeights indexer;      // CSA layers
  TensorView index_q_b;             // [H_I*c, q_lora]
  TensorView index_weights;         // [H_I, dim] (scorer.weights_proj)

  static V4AttentionWeights hf(Weights& w, int64_t layer);
};

class DeepseekV4Attention final : public Attention {
 public:
  // main_rope / compress_rope: [rope_dim / 2] frequencies of the two rotary embeddings; ones:
  // a vector of 1s at least max(head_dim, index_head_dim) long (the unweighted norm).
  DeepseekV4Attention(const ModelConfig& config, int64_t layer, const V4AttentionWeights& w,
                      const float* main_rope, const float* compress_rope, const float* ones);

  int64_t forward(Step& st, int64_t layer) const override;
  int64_t kv_source() const override { return layer_; }

 private:
  // Rotates the trailing rope dims of n_heads heads of `head_dim` for tokens at positions
  // first, first + step, ... (n tokens, rows ld floats apart).
  void rope_trailing(float* x, int64_t n, int64_t n_heads, int64_t head_dim, int64_t ld,
                     int64_t first, int64_t step, bool compress_rope, bool inverse) const;
  // One compressed series of every batch row through the cache: project, buffer, fold, norm,
  // RoPE, store.
  void compress(Step& st, int64_t layer, int stream, const V4CompressorWeights& c, const float* xb,
                float* kv, float* gate, float* entries) const;
  // entries [n_windows, d] from the window-aligned chunk (CSA: with the previous Ca half).
  void fold(const V4CompressorWeights& c, const float* kv, int64_t kv_ld, const float* gate,
            int64_t gate_ld, const float* prior_kv, int64_t prior_kv_ld, const float* prior_gate,
            int64_t prior_gate_ld, int64_t n_windows, float* entries) const;

  const ModelConfig& c_;
  int64_t layer_;
  V4AttentionWeights w_;
  int64_t H_, D_, rd_, rate_;
  bool csa_, compressed_;
  const float* main_rope_;
  const float* compress_rope_;
  const float* ones_;
};

// The DeepSeek-V4 scratch (per row unless said): hyper-connection streams [hc*dim], their
// normed flat copy [hc*dim], the mix coefficients [(2+hc)*hc]; q_res [q_lora], q [H*D],
// kv [D], attention output [H*D], o_a output [G*o_lora]; compressor kv and gate [2*D] each,
// indexer kv and gate [2*c] each, indexer queries [H_I*c] and weights [H_I], selected entries
// [top_k] (int32), folded entries [max(D, c)]; the MoE's router and expert rows (fixed) and
// the shared expert's gate and up [2*I].
extern const ScratchKind kDeepseekV4Scratch;
enum V4Buffer : size_t {
  kV4Streams,
  kV4Flat,
  kV4Mix,
  kV4QRes,
  kV4Q,
  kV4Kv,
  kV4Out,
  kV4OA,
  kV4CompKv,
  kV4CompGate,
  kV4IdxKv,
  kV4IdxGate,
  kV4QIdx,
  kV4IdxW,
  kV4Selected,
  kV4Entries,
  kV4Moe,
  kV4Shared,
};

}  // namespace kvcache
