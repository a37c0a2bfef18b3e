// The decoder forward pass over any ModelFile (llama2.c, GGUF, safetensors), with the KV cache
// behind its one protocol call. One block serves every family; a per-layer plan built from the
// config at load picks the variant of each step (no copy of the forward per family):
//
//   embed (x embed_scale) -> per layer:
//     norm -> attention -> [post-attention norm] -> residual
//     norm -> FFN (dense SwiGLU/GeGLU, or MoE) -> [post-FFN norm] -> residual
//   -> final norm -> LM head (the embedding table when tied) -> [final softcap]
//
// attention, GQA (Llama, Mistral, Qwen2, Gemma-2, GPT-OSS):
//   Q,K,V (+bias) -> RoPE(Q, K) -> cache.update(layer, K, V) -> kernel(scale, window or
//   chunk of the layer type, softcap, sinks) -> O (+bias)
// attention, MLA (DeepSeek-V2/V3): the cache stores c_kv = norm(kv_a(x)[:d_c]) and
//   k_rot = RoPE(kv_a(x)[d_c:]) as two one-head tensors (K slot: [B, 1, S, d_c], V slot:
//   [B, 1, S, d_r]) — L·(d_c + d_r) elements per token, no factor 2. The per-head keys and
//   values are expanded AFTER update, inside the attention step: kv_b(c_kv) gives k_nope [H, d_kn]
//   and v [H, d_v] per cached token, k = [k_nope, k_rot] (k_rot shared by all heads), then the
//   kernel runs with D_k = d_kn + d_r and D_v = d_v. Why not absorb kv_b into the query and
//   output projections (attention over the latent directly, MQA with D_k = d_c + d_r): that
//   form changes the arithmetic (q·W_kb·c instead of q·(W_kb·c)) so it cannot be checked
//   against transformers' eager code at 1e-5 term by term, and it needs a kernel that reads
//   K as two spans (latent | rope); expansion is exact and uses the kernels as they are. The
//   price is recomputing kv_b over the whole visible history every step — O(S·d_c·H·(d_kn+d_v))
//   per layer — which absorption would remove for long decodes. A paged cache keeps the pair in
//   its K pages ([blocks, 1, bt, d_c]) and V pages ([blocks, 1, bt, d_r]); each batch row's
//   latent is read through the page table into the same expansion buffers, so paged equals
//   dense bit for bit and varlen batches (rows at different positions) work as for GQA.
//
// Norms: RMSNorm (x * rsqrt(mean(x^2) + eps)) * w, Gemma's variant multiplies by (1 + w),
// precomputed at load. Families and the transformers files followed:
//   llama/mistral/qwen2  models/llama/modeling_llama.py (and mistral, qwen2)
//   gemma2               models/gemma2/modeling_gemma2.py: (1+w) norms, sqrt(dim) embedding
//                        scale, query_pre_attn_scalar^-0.5, tanh softcaps (attention logits and
//                        final logits), sandwich norms, GeGLU(tanh), even layers slide
//   gpt_oss              models/gpt_oss/modeling_gpt_oss.py: q/k/v/o biases, sinks in the
//                        softmax denominator, MoE (top-k logits -> softmax, clamped SwiGLU)
//   deepseek_v2/v3       models/deepseek_v3/modeling_deepseek_v3.py (and deepseek_v2): MLA with
//                        q_lora optional, kv_a_layernorm/q_a_layernorm at eps 1e-6, RoPE on the
//                        rotated part only, softmax scale (qk_head_dim^-0.5 * mscale^2 with
//                        yarn), first_k_dense_replace dense layers then MoE with shared experts
//
// LlamaModel is immutable after construction (weights borrowed from its ModelFile, shared by
// any number of LlamaForward). LlamaForward owns the activation workspaces of one sequence
// batch and is not thread-safe; the Cache is owned by the caller (runtime) and only borrowed.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/kv_span.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/attention_workspace.h"
#include "kernels/rope.h"
#include "model/model_file.h"

namespace kvcache {

class Cache;

class LlamaModel {
 public:
  // Validates the weights against the config (Error(kFormat) naming the file and tensor) and
  // resolves every per-layer view once; norms and biases stored as f16/bf16 are converted to
  // f32 copies (tiny), matrices stay where they are (mapped).
  explicit LlamaModel(std::unique_ptr<ModelFile> file);

  // What a layer's attention sees: the layer type of the config.
  enum class AttentionSpan { kFull, kSliding, kChunked };

  struct Expert {              // one DeepSeek routed expert (a SwiGLU MLP)
    TensorView w_gate, w_up;   // [I, dim]
    TensorView w_down;         // [dim, I]
  };

  struct Layer {
    const float* attn_norm;      // [dim]
    // GQA attention
    TensorView wq, wk, wv;       // [H*D, dim], [Hkv*D, dim], [Hkv*D, dim]; MLA: wq only
    const float* bq = nullptr;   // [H*D] (qkv_bias) or nullptr
    const float* bk = nullptr;   // [Hkv*D]
    const float* bv = nullptr;   // [Hkv*D]
    TensorView wo;               // [dim, H*D_v]
    const float* bo = nullptr;   // [dim] (attention_bias) or nullptr
    const float* sinks = nullptr;  // [H] GPT-OSS sink logits or nullptr
    // MLA (DeepSeek). wq is q_proj ([H*D_qk, dim]) when there is no q_lora.
    TensorView wq_a;                      // [q_lora, dim] or empty
    const float* q_a_norm = nullptr;      // [q_lora]
    TensorView wq_b;                      // [H*D_qk, q_lora]
    TensorView wkv_a;                     // [d_c + d_r, dim]
    const float* kv_a_norm = nullptr;     // [d_c]
    TensorView wkv_b;                     // [H*(d_kn + d_v), d_c]
    // norms around the blocks
    const float* post_attn_norm = nullptr;  // [dim] Gemma-2: on the attention output
    const float* ffn_norm;                  // [dim] before the FFN
    const float* post_ffn_norm = nullptr;   // [dim] Gemma-2: on the FFN output
    // dense FFN (also DeepSeek's shared experts when moe)
    TensorView w_gate, w_up;     // [hidden, dim]
    TensorView w_down;           // [dim, hidden]
    // MoE
    bool moe = false;
    TensorView router;                     // [E, dim]
    const float* router_bias = nullptr;    // [E] GPT-OSS router bias
    const float* score_bias = nullptr;     // [E] DeepSeek-V3 e_score_correction_bias
    TensorView gate_up;                    // GPT-OSS [E, dim, 2I] (in, out layout)
    const float* gate_up_bias = nullptr;   // [E, 2I]
    TensorView down;                       // GPT-OSS [E, I, dim]
    const float* down_bias = nullptr;      // [E, dim]
    std::vector<Expert> experts;           // DeepSeek routed experts
    bool shared_expert = false;            // DeepSeek: w_gate/w_up/w_down hold the shared experts
    // Gemma-3n
    const float* q_norm = nullptr;         // [D] per-head norm of queries (weighted)
    const float* k_norm = nullptr;         // [D] per-head norm of keys (weighted); values: unweighted
    const float* rope_inv_freq = nullptr;  // [rope_dim / 2] this layer's frequencies
    int64_t ffn_hidden = 0;                // this layer's FFN size
    float sparsity_z = 0.0f;               // > 0: keep gate values above mean + z * std
    TensorView altup_router;               // [A, dim]
    const float* altup_router_norm = nullptr;   // [dim]
    const float* altup_prediction = nullptr;    // [A*A, A]
    const float* altup_correction = nullptr;    // [A, A], clipped to +-altup_coef_clip
    const float* altup_out_scale = nullptr;     // [dim] correct_output_scale
    TensorView laurel_left, laurel_right;       // [rank, dim], [dim, rank]
    const float* laurel_norm = nullptr;         // [dim]
    TensorView ple_gate, ple_proj;              // [P, dim], [dim, P]
    const float* ple_norm = nullptr;            // [dim] post_per_layer_input_norm
    AttentionSpan span = AttentionSpan::kFull;
    int64_t window = 0;          // sliding window W or chunk size C of the layer (0: full)
    bool sliding = false;        // layer type "sliding_attention"
    // Cross-layer KV sharing (num_kv_shared_layers, Gemma-3n): a shared layer projects only
    // its queries and attends over the K/V of kv_source — the last non-shared layer of the
    // same type (Gemma3nTextAttention.kv_shared_layer_index; the Cache applies the same rule).
    // kv_source == own index for every other layer.
    int64_t kv_source = 0;
    bool kv_shared = false;
    bool kv_source_of_shared = false;  // some shared layer reads this layer's K/V
  };

  const ModelConfig& config() const { return file_->config(); }
  const ModelFile& file() const { return *file_; }
  const std::vector<Layer>& layers() const { return layers_; }
  const TensorView& tok_embeddings() const { return tok_embeddings_; }  // [vocab, dim]
  const TensorView& output() const { return output_; }  // [vocab, dim] (== tok_embeddings if tied)
  const float* output_norm() const { return output_norm_; }             // [dim]
  const std::vector<float>& rope_inv_freq() const { return inv_freq_; }  // [rope_dim / 2]
  RopeStyle rope_style() const { return rope_style_; }
  // Gemma-3n model-level tensors.
  struct Gemma3nWeights {
    TensorView embed_per_layer;        // [vocab_pl, L*P]
    TensorView per_layer_projection;   // [L*P, dim]
    const float* per_layer_norm = nullptr;  // [P]
    std::vector<TensorView> altup_proj, altup_unembed;  // A-1 of [dim, dim]
  };
  const Gemma3nWeights& gemma3n() const { return g3n_; }
  const float* unit_norm_weight() const { return ones_.data(); }  // [head_dim] of 1 (v_norm)
  size_t weight_bytes() const { return file_->weight_bytes(); }

 private:
  const float* as_f32(const TensorView& t);
  const float* norm_weight(const TensorView& t);  // as_f32, plus 1 for Gemma's (1 + w)
  void load_llama_layer(int64_t l, Layer& L);
  void load_hf_layer(int64_t l, Layer& L);

  std::unique_ptr<ModelFile> file_;
  std::vector<Layer> layers_;
  TensorView tok_embeddings_, output_;
  const float* output_norm_ = nullptr;
  std::vector<float> inv_freq_;
  std::vector<float> inv_freq_local_;  // Gemma-3n sliding layers (rope_local_theta)
  std::vector<float> ones_;            // [head_dim] weight of the unweighted v_norm
  Gemma3nWeights g3n_;
  RopeStyle rope_style_ = RopeStyle::kInterleaved;
  std::vector<Tensor> converted_;  // f32 copies of non-f32 norms/biases
};

enum class LogitsMode {
  kLast,  // next-token logits of the last position of each batch row: [B, vocab]
  kAll,   // every position: [B, S, vocab] (llama.cpp's logits_all)
  kNone,  // fill the cache only
};

struct ForwardParams {
  const int32_t* tokens = nullptr;  // [batch, n_tokens], row-major
  int64_t batch = 1;
  int64_t n_tokens = 0;             // S: a prefill chunk, or 1 for decode
  int64_t pos0 = 0;                 // absolute position of tokens[:, 0]
  // [batch] absolute position of tokens[b, 0] when rows are at different positions (a varlen
  // batch through a paged cache); nullptr: every row starts at pos0.
  const int64_t* row_pos0 = nullptr;
  // The KV store. nullptr: no cache — the chunk attends only to its own keys (pos0 must be 0);
  // the "full recompute" oracle that --verify compares against.
  Cache* cache = nullptr;
  LogitsMode logits = LogitsMode::kLast;
  // Linears use only the row-wise kernels (no BLAS): each row's result is then independent of
  // how many rows the call carries, so a batched or re-chunked sequence is bit-identical to the
  // sequence run alone (the serving engine's guarantee). Slower prefill.
  bool batch_invariant = false;
};

class LlamaForward {
 public:
  // kernel: an attention kernel name ("eager", "fused"). Workspaces are sized for
  // batch * max_chunk_tokens rows up front and grow only when a larger chunk arrives.
  LlamaForward(const LlamaModel& model, std::string_view kernel, int64_t max_rows = 1);

  // Runs one chunk; returns the logits (see LogitsMode), valid until the next call.
  // Throws Error(kInvalidArgument) for token ids outside the vocabulary and whatever the cache
  // throws (e.g. a static cache's capacity) — before anything is written for that layer.
  std::span<const float> forward(const ForwardParams& p);

  const LlamaModel& model() const { return model_; }
  size_t workspace_bytes() const;
  // What workspace_bytes() is after reserving `rows` rows for `config` (the memory planner's
  // activation peak).
  static size_t workspace_bytes_for(const ModelConfig& config, int64_t rows);

 private:
  struct Step {  // the batch geometry of one forward call
    int64_t B, S, R, pos0;
    Cache* cache;
    const int64_t* row_pos0 = nullptr;  // [B] per-row start positions (varlen, paged) or null
    bool rows_differ = false;           // row_pos0 not all equal: only paged spans can serve it
    // The last layer of a forward whose logits are only the next-token ones (or none): every
    // row's K/V enters the cache, then attention_gqa stops (kKvOnly) or attends and projects
    // the last row of each batch row only, into rows 0..B-1 (kLast).
    enum class Rows { kAll, kLast, kKvOnly } rows = Rows::kAll;
    int64_t row_pos(int64_t b) const { return row_pos0 != nullptr ? row_pos0[b] : pos0; }
  };
  // Attention of one layer: the dense kernel, or paged_attention for a kPaged span.
  void run_attention(const Step& st, const KVSpan& span, const TensorView& q_view, const TensorView& out_view,
                     AttentionOptions opts);
  void reserve(int64_t rows);
  // Attention of layer l on the normed input xb_; writes the o_proj output into xb_.
  void attention_gqa(const Step& st, int64_t l);
  void attention_mla(const Step& st, int64_t l);
  // FFN of layer l on the normed input xb_; writes the output into xb_.
  void ffn_dense(const Step& st, const LlamaModel::Layer& L, const TensorView& gate, const TensorView& up,
                 const TensorView& down, int64_t rows, const float* in, float* out);
  // MoE FFN on rows [0, rows) of xb_ (rows < st.R: the last layer's kept rows).
  void ffn_moe(const Step& st, const LlamaModel::Layer& L, int64_t rows);
  // Gemma-3n's decoder (AltUp streams, Laurel, per-layer inputs) around the same steps.
  void gemma3n_layers(const Step& st, const int32_t* tokens);
  KVSpan update_or_share(const Step& st, int64_t l, const TensorView& k, const TensorView& v);
  // Grows a workspace to at least n floats (geometric; MLA's expansion buffers follow the
  // visible history, which grows by one token per decode step).
  static float* grow(Tensor& t, int64_t n);

  const LlamaModel& model_;
  std::string kernel_;     // for paged spans: paged_attention(kernel_, ...)
  AttentionFn attention_;  // for dense spans
  AttentionWorkspace attention_ws_;    // the kernels' scratch, grown to the largest call's need
  std::vector<int32_t> cu_seqlens_q_;  // [batch + 1] query rows per sequence (paged spans)
  int64_t rows_ = 0;  // capacity in rows (batch * tokens)
  // Activations, row-major over rows = batch * tokens.
  Tensor x_;       // [rows, dim] residual stream
  Tensor xb_;      // [rows, max(dim, H*D)] normed input / branch output
  Tensor q_;       // [rows, H*D]
  Tensor k_, v_;   // [rows, Hkv*D]
  Tensor att_;     // [rows, H*D] attention output
  Tensor hb_, hb2_;  // [rows, max(hidden, expert FFN sizes)]
  Tensor logits_;  // [rows, vocab]
  // MLA: [rows, d_c + d_r] compressed kv, [rows, q_lora] q latent; per-step expansion of the
  // visible history: latent in f32 [S_kv, d_c], kv_b output [S_kv, H*(d_kn+d_v)], full keys
  // [S_kv, H, D_qk] (k_nope | shared k_rot).
  Tensor ckv_, qa_, lat32_, kvb_, kfull_;
  // MoE: router logits [E] scratch, expert output [dim] and GPT-OSS gate_up [2I], weight row.
  Tensor moe_scratch_;
  // No-cache forward of a KV-sharing model: the post-RoPE K/V of each source layer, [rows,
  // Hkv*D] per layer (empty for layers no one reads), so shared layers see what a cache
  // would hand them.
  std::vector<Tensor> src_k_, src_v_;
  // Gemma-3n: AltUp streams and predictions [A, rows, dim], per-layer inputs [rows, L*P],
  // branch scratch [rows, max(dim, rank, P)] x2.
  Tensor streams_, preds_, ple_, g1_, g2_;
  // The prefill GEMM's packed copy of a linear's input (gemm_packed_scratch_floats of the rows
  // and the widest linear input); empty while at most kBlasMinRows - 1 rows are reserved.
  Tensor xpack_;
};

}  // namespace kvcache
