// The format-neutral view of a model on disk: a ModelConfig (hyper-parameters) plus named weight
// tensors that point into memory-mapped files (no copy at load). Loaders (GGUF, safetensors +
// config.json, llama2.c) each fill one ModelFile; the runtime reads only this interface.
// A ModelFile owns its mappings (and any converted buffers); its TensorViews die with it.
//
// Canonical tensor names of the llama family (llama/mistral/qwen2) are llama.cpp's GGUF names,
// whatever the file format (other families keep their transformers names: model/weight_spec.h):
//   token_embd.weight        [vocab, dim]
//   blk.N.attn_norm.weight   [dim]
//   blk.N.attn_q.weight      [n_heads * head_dim, dim]      (+ blk.N.attn_q.bias
//   [n_heads*head_dim]) blk.N.attn_k.weight      [n_kv_heads * head_dim, dim]   (+ .bias when
//   qkv_bias, Qwen2) blk.N.attn_v.weight      [n_kv_heads * head_dim, dim]   (+ .bias when
//   qkv_bias) blk.N.attn_output.weight [dim, n_heads * head_dim] blk.N.ffn_norm.weight    [dim]
//   blk.N.ffn_gate.weight    [hidden_dim, dim]   (w1; SwiGLU: down(silu(gate x) * up x))
//   blk.N.ffn_up.weight      [hidden_dim, dim]   (w3)
//   blk.N.ffn_down.weight    [dim, hidden_dim]   (w2)
//   output_norm.weight       [dim]
//   output.weight            [vocab, dim]        (absent when tie_word_embeddings: use token_embd)
//
// Layout convention of weight matrices: TensorView shapes are row-major [out_features,
// in_features] with in_features contiguous — the order HF/PyTorch print (`[out, in]`). GGUF
// lists dims fastest-first (ne[0] = in_features), so the GGUF loader reverses ne into the view's
// shape; the bytes are identical. A row of a q8_0 matrix is in_features/32 blocks of 34 bytes.
// y = W x is therefore y[o] = sum_i W[o][i] * x[i] for every format.
//
// RoPE convention (the one thing formats disagree on): ModelConfig::rope_interleaved tells the
// runtime which dimension pairs RoPE rotates inside each head of Q and K:
//   true  -> pairs (2i, 2i+1)                      llama2.c; GGUF `llama` (llama.cpp's converter
//            permutes HF q_proj/k_proj rows so that "normal" RoPE applies; ggml's ROPE_TYPE_NORM)
//   false -> pairs (i, i + head_dim/2), rotate_half  HF safetensors; GGUF `qwen2` (ROPE_TYPE_NEOX)
// Both use frequency theta^(-2i/head_dim) for pair i. We expose the flag instead of permuting
// rows at load, so weights stay zero-copy.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/mapped_file.h"

namespace kvcache {

enum class RopeScalingType { kNone, kLinear, kLlama3, kYarn };
const char* rope_scaling_name(RopeScalingType t);

// HF `rope_scaling` / GGUF `{arch}.rope.scaling.*`. linear: positions divided by `factor`.
// llama3: per-frequency smoothing between low_freq_factor and high_freq_factor wavelengths
// relative to original_max_position_embeddings (Llama 3.1's rope_type "llama3").
struct RopeScaling {
  RopeScalingType type = RopeScalingType::kNone;
  float factor = 1.0f;
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int64_t original_max_position_embeddings = 0;  // 0: not given
};

enum class FfnActivation {
  kSilu,      // SwiGLU: down(silu(gate x) * up x)  (Llama, DeepSeek)
  kGeluTanh,  // GeGLU with gelu_pytorch_tanh       (Gemma)
};

// Mixture of experts (feed-forward of MoE layers). Routers follow transformers:
//   kGptOss:     top-k of router logits (with bias), softmax over the k kept logits;
//                experts use the clamped SwiGLU (alpha, limit) with biases
//                (models/gpt_oss/modeling_gpt_oss.py, GptOssTopKRouter / GptOssExperts)
//   kDeepseekV3: sigmoid scores, + e_score_correction_bias for the choice only, group-limited
//                top-k (n_group / topk_group), optional renormalisation, x routed_scaling_factor,
//                plus shared experts (models/deepseek_v3/modeling_deepseek_v3.py)
//   kSoftmaxGreedy: DeepSeek-V2's topk_method "greedy" (its MoEGate): softmax scores, top-k,
//                then either renormalised (top_k > 1 and norm_topk_prob) or x
//                routed_scaling_factor, plus shared experts
//   kSoftmaxTopK: Qwen2-MoE / Qwen3-Next (Qwen2MoeTopKRouter): softmax over every expert in
//                float, top-k, renormalised when norm_topk_prob; plus one shared expert of
//                shared_expert_hidden_dim scaled by sigmoid(shared_expert_gate(x))
enum class MoeRouter { kGptOss, kDeepseekV3, kSoftmaxGreedy, kSoftmaxTopK };
struct MoeConfig {
  int64_t n_experts = 0;           // routed experts; 0: no MoE
  int64_t n_experts_used = 0;      // top-k per token
  int64_t expert_hidden_dim = 0;   // FFN size of one expert
  int64_t n_shared_experts = 0;    // DeepSeek: always-on experts of n_shared * expert_hidden_dim
  int64_t first_dense_layers = 0;  // DeepSeek first_k_dense_replace: layers before it are dense
  MoeRouter router = MoeRouter::kGptOss;
  int64_t n_group = 1, topk_group = 1;  // DeepSeek-V3 group-limited routing
  bool norm_topk_prob = false;
  float routed_scaling_factor = 1.0f;
  float swiglu_alpha = 1.702f, swiglu_limit = 7.0f;  // GPT-OSS experts
  // Qwen2-MoE / Qwen3-Next: one shared expert of this FFN size (0: n_shared_experts x
  // expert_hidden_dim, DeepSeek's), gated by sigmoid(shared_expert_gate(x)) when set.
  int64_t shared_expert_hidden_dim = 0;
  bool shared_expert_gate = false;
  // Qwen2-MoE / Qwen3-Next: MoE only on layers with (layer + 1) % sparse_step == 0 and not in
  // dense_layers (decoder_sparse_step, mlp_only_layers).
  int64_t sparse_step = 1;
  std::vector<int64_t> dense_layers;
  bool is_moe_layer(int64_t layer) const {
    if (n_experts <= 0 || layer < first_dense_layers || (layer + 1) % sparse_step != 0)
      return false;
    for (int64_t d : dense_layers)
      if (d == layer) return false;
    return true;
  }
  // The shared experts' FFN size (0: none).
  int64_t shared_hidden_dim() const {
    return shared_expert_hidden_dim > 0 ? shared_expert_hidden_dim
                                        : n_shared_experts * expert_hidden_dim;
  }
};

// Multi-head latent attention (DeepSeek-V2/V3). The cache stores, per token, the normalised
// latent c_kv [kv_lora_rank] and the rotated key k_rot [qk_rope_head_dim] as one "head" each
// (model/mla_attention.h expands them).
struct MlaConfig {
  int64_t kv_lora_rank = 0;      // d_c; 0: no MLA
  int64_t q_lora_rank = 0;       // 0: q_proj directly, else q_a_proj -> norm -> q_b_proj
  int64_t qk_nope_head_dim = 0;  // d_kn
  int64_t qk_rope_head_dim = 0;  // d_r
  int64_t v_head_dim = 0;        // d_v
  bool rope_interleave = true;   // V3 rope_interleave / V2: pairs (2i, 2i+1) of the rotated part
  bool enabled() const { return kv_lora_rank > 0; }
};

// Gemma-3n's text decoder around the shared attention/FFN steps (models/gemma3n/
// modeling_gemma3n.py): AltUp keeps altup_num_inputs copies of the residual stream (layers
// update copy 0 and a learned correction spreads the change), Laurel adds a low-rank residual,
// and every layer receives a per-layer input (its own token embedding slice + a projection of
// the main embedding). Activation sparsity keeps FFN gate values above mean + z(p)·std.
struct Gemma3nConfig {
  int64_t altup_num_inputs = 0;  // 0: not Gemma-3n
  int64_t altup_active_idx = 0;
  float altup_coef_clip = 0.0f;  // 0: none
  bool altup_correct_scale = true;
  int64_t laurel_rank = 0;
  int64_t hidden_size_per_layer_input = 0;
  int64_t vocab_size_per_layer_input = 0;
  std::vector<float> activation_sparsity;   // [n_layers]
  std::vector<int64_t> intermediate_sizes;  // [n_layers]
  bool enabled() const { return altup_num_inputs > 0; }
};

// Gated DeltaNet (Qwen3-Next's "linear_attention" layers, models/qwen3_next/
// modeling_qwen3_next.py Qwen3NextGatedDeltaNet): in_proj_qkvz / in_proj_ba, a causal depthwise
// conv over the q, k, v channels, the gated delta rule, a gated RMSNorm, out_proj.
struct LinearAttentionConfig {
  int64_t num_key_heads = 0;    // H_k (linear_num_key_heads); 0: no linear-attention layers
  int64_t num_value_heads = 0;  // H_v (linear_num_value_heads), a multiple of H_k
  int64_t key_head_dim = 0;     // d_k (linear_key_head_dim)
  int64_t value_head_dim = 0;   // d_v (linear_value_head_dim)
  int64_t conv_kernel = 0;      // K (linear_conv_kernel_dim)
  bool enabled() const { return num_value_heads > 0; }
  // C = 2 H_k d_k + H_v d_v: the channels of the conv (q, k, v).
  int64_t conv_dim() const {
    return 2 * num_key_heads * key_head_dim + num_value_heads * value_head_dim;
  }
};

// DeepSeek-V4 (models/deepseek_v4/configuration_deepseek_v4.py and modeling_deepseek_v4.py):
// every layer is a sliding-window K==V MQA attention (one head of head_dim, q through q_a/q_b
// with q_lora_rank, per-head sinks, grouped low-rank output o_a/o_b), plus for
// compressed_sparse_attention (CSA) / heavily_compressed_attention (HCA) layers a compressor
// folding every `rate` tokens into one entry (CSA: overlapping windows and the lightning
// indexer's top-k); partial interleaved RoPE on the trailing rope_dim() dims (main theta on
// sliding layers, compress theta, maybe YaRN, on CSA/HCA); hc_mult hyper-connection streams
// around every block; MoE on every layer (hash-routed on hash_moe layers) with one shared
// expert, SwiGLU clamped at swiglu_limit.
enum class V4Scoring { kSqrtSoftplus, kSoftmax, kSigmoid };
struct DeepseekV4Config {
  int64_t q_lora_rank = 0;  // 0: not DeepSeek-V4
  int64_t o_groups = 0, o_lora_rank = 0;
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  int64_t csa_rate = 0, hca_rate = 0;  // compress_rates of the two compressed layer types
  float compress_rope_theta = 160000.0f;
  std::vector<float> compress_freq_factors;  // [rope_dim / 2] YaRN divisors, empty: none
  float compress_attention_factor = 1.0f;
  int64_t hc_mult = 0, hc_sinkhorn_iters = 0;
  float hc_eps = 1e-6f;
  std::vector<char> hash_layers;  // [n_layers] 1 where mlp_layer_types[i] is "hash_moe"
  V4Scoring scoring = V4Scoring::kSqrtSoftplus;
  float swiglu_limit = 10.0f;  // <= 0: no clamp
  bool enabled() const { return q_lora_rank > 0; }
  // The compression rate of a layer type (0: a plain sliding layer).
  int64_t rate_of(const std::string& layer_type) const {
    return layer_type == "compressed_sparse_attention"    ? csa_rate
           : layer_type == "heavily_compressed_attention" ? hca_rate
                                                          : 0;
  }
};

struct ModelConfig {
  // The block structure: llama family (llama/mistral/qwen2), gemma2, gpt_oss, deepseek_v2,
  // deepseek_v3 (is_llama_family() tells the GGUF-canonical-name families apart).
  std::string architecture = "llama";
  int64_t dim = 0;  // hidden size (embedding length)
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads (GQA when < n_heads)
  int64_t head_dim = 0;    // usually dim / n_heads; HF `head_dim` / GGUF key_length may differ
  int64_t hidden_dim = 0;  // FFN intermediate size
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;  // context length the model was trained for
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  // Per-pair frequency divisors, [head_dim / 2]; empty means all 1. The runtime computes
  //   freq_i = rope_theta^(-2i/head_dim) / rope_freq_factors[i]   (ggml_rope_ext's freq_factors)
  // and needs nothing else: loaders fold every supported scaling into this vector — linear
  // (all entries = factor, HF's inv_freq / factor), llama3 (per-wavelength factors, as
  // llama.cpp's converter writes them into the GGUF tensor rope_freqs.weight). `rope_scaling`
  // above records where they came from.
  std::vector<float> rope_freq_factors;
  bool rope_interleaved = true;  // see the header comment: pairs (2i,2i+1) vs (i, i+D/2)
  float rms_eps = 1e-5f;
  bool tie_word_embeddings = false;  // no output.weight: the LM head is token_embd
  int64_t sliding_window = 0;        // 0: none; else the window of "sliding_attention" layers
  bool qkv_bias = false;             // Qwen2: attn_q/k/v carry biases
  // Per layer "full_attention", "sliding_attention" (window sliding_window) or
  // "chunked_attention" (chunks of attention_chunk_size, Llama-4's layer type).
  std::vector<std::string> layer_types;
  int64_t attention_chunk_size = 0;  // 0: none
  int32_t bos_id = -1;               // -1: unknown
  int32_t eos_id = -1;

  // --- Families beyond Llama (gemma2, gpt_oss, deepseek_v2/v3). The defaults are Llama's, so
  // a llama/mistral/qwen2 config leaves all of this untouched. Each family's file
  // (model/gemma2.cc, gpt_oss.cc, deepseek.cc) builds its blocks from them.
  bool norm_add_one = false;    // Gemma: RMSNorm scales by (1 + w) instead of w
  float embed_scale = 1.0f;     // Gemma: embeddings multiplied by sqrt(hidden_size)
  bool sandwich_norms = false;  // Gemma-2: post-attention, pre- and post-feedforward norms
  FfnActivation ffn_act = FfnActivation::kSilu;
  float query_scale = 0.0f;          // attention logit scale; 0: 1/sqrt(query-key head dim)
  float attn_softcap = 0.0f;         // Gemma-2 attn_logit_softcapping; 0: none
  float final_softcap = 0.0f;        // Gemma-2 final_logit_softcapping on the logits; 0: none
  bool attn_out_bias = false;        // o_proj has a bias (attention_bias = true: GPT-OSS)
  bool attn_sinks = false;           // GPT-OSS: one learned sink logit per query head
  int64_t num_kv_shared_layers = 0;  // the last N layers read an earlier layer's cache
  // YaRN (rope_type "yarn": GPT-OSS, DeepSeek-V3): cos/sin multiplied by this attention factor
  // (transformers' _compute_yarn_parameters); the frequencies go to rope_freq_factors.
  float rope_attention_factor = 1.0f;
  bool qkv_norm = false;  // Gemma-3n: q_norm/k_norm (weighted) and v_norm (unweighted) per head
  float rope_local_theta = 0.0f;  // Gemma-3n: theta of sliding layers (0: rope_theta everywhere)
  Gemma3nConfig gemma3n;
  MoeConfig moe;  // n_experts == 0: every FFN is dense
  MlaConfig mla;  // kv_lora_rank == 0: plain multi-head / grouped-query attention
  // Qwen3-Next: q_norm / k_norm per head without Gemma-3n's v_norm.
  bool qk_norm = false;
  // Qwen3-Next's gated attention: q_proj yields [query (D), gate (D)] per head; the attention
  // output is multiplied by sigmoid(gate) before o_proj.
  bool attn_output_gate = false;
  // RoPE rotates the first head_dim * partial_rotary_factor dims of each head (Qwen3-Next 0.25).
  float partial_rotary_factor = 1.0f;
  LinearAttentionConfig linear_attn;  // Qwen3-Next's Gated DeltaNet layers
  DeepseekV4Config deepseek_v4;       // DeepSeek-V4's attention, hyper-connections and MoE

  // Checks positivity and divisibility (n_heads % n_kv_heads, layer_types size, ...); throws
  // Error(kFormat) prefixed with `source` (the file) naming the bad field.
  void validate(const std::string& source) const;
  // Fills layer_types when empty by transformers' generic rule (model/decoder_layout.h: all
  // sliding when a window is set, else all chunked when a chunk size is, else all full) and
  // head_dim from dim / n_heads when 0.
  void fill_defaults();
  std::string summary() const;  // one line for logs: "llama dim=64 layers=5 heads=8/4 ..."
  bool is_llama_family() const {
    return architecture == "llama" || architecture == "mistral" || architecture == "qwen2";
  }
  // Query/key head dim (MLA: qk_nope + qk_rope) and value head dim.
  int64_t qk_head_dim() const {
    return mla.enabled() ? mla.qk_nope_head_dim + mla.qk_rope_head_dim : head_dim;
  }
  int64_t v_head_dim() const { return mla.enabled() ? mla.v_head_dim : head_dim; }
  // Dims RoPE rotates per head (MLA: only the qk_rope part).
  // (partial_rotary_factor: int(head_dim * factor), as transformers truncates it).
  int64_t rope_dim() const {
    return mla.enabled() ? mla.qk_rope_head_dim
                         : static_cast<int64_t>(static_cast<double>(head_dim) *
                                                static_cast<double>(partial_rotary_factor));
  }
};

class ModelFile {
 public:
  ModelFile(std::string path, std::string format)
      : path_(std::move(path)), format_(std::move(format)) {}
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;

  const std::string& path() const { return path_; }
  const std::string& format() const { return format_; }  // "gguf", "safetensors", "llama2c"
  const ModelConfig& config() const { return config_; }
  ModelConfig& mutable_config() { return config_; }

  // Canonical-name lookup. find() returns nullptr when absent; tensor() throws Error(kFormat)
  // "<path>: missing tensor '<name>'".
  const TensorView* find(const std::string& name) const;
  const TensorView& tensor(const std::string& name) const;
  // tensor() plus a shape check: Error(kFormat) "<path>: tensor '<name>' has shape [..] but the
  // config implies [..]".
  const TensorView& tensor(const std::string& name, const Shape& expected) const;
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // Bytes of all weights (as stored).
  size_t weight_bytes() const;

  // --- for loaders ---
  // Registers a view; throws Error(kFormat) on a duplicate name.
  void add_tensor(const std::string& name, const TensorView& view);
  // Keeps `owner` (a MappedFile, a Tensor, a parsed GGUF...) alive as long as this ModelFile.
  void keep_alive(std::shared_ptr<const void> owner) { owners_.push_back(std::move(owner)); }

  // Checks that every tensor the llama block needs exists with the shape config() implies
  // (biases only when qkv_bias, output.weight only when not tied) and dtypes are f32/f16/bf16/
  // q8_0 (norms and biases: float types). Throws Error(kFormat) naming the file and tensor.
  void validate_llama_weights() const;
  // The check for any architecture: llama-family files as above; the other families by their
  // Hugging Face tensor names and shapes (model/weight_spec.h).
  void validate_weights() const;

 private:
  std::string path_;
  std::string format_;
  ModelConfig config_;
  std::map<std::string, TensorView> tensors_;
  std::vector<std::shared_ptr<const void>> owners_;
};

// Name of a per-layer tensor: layer_tensor(3, "attn_q.weight") == "blk.3.attn_q.weight".
std::string layer_tensor(int64_t layer, const char* suffix);

// Opens any supported model: a GGUF file, a llama2.c checkpoint (recognised by its header and
// exact size), a Hugging Face folder (config.json + model.safetensors or
// model.safetensors.index.json) or a single .safetensors file with config.json beside it.
// Other files throw Error(kFormat) naming the path and the formats accepted. The loaders check
// the llama weights (names, shapes, dtypes) against the config.
// `mode`: how the files' bytes get into memory (model/mapped_file.h).
std::unique_ptr<ModelFile> open_model_file(const std::string& path, MapMode mode = MapMode::kMap);

}  // namespace kvcache
