// The Llama-family forward pass (Llama, Mistral's sliding window, Qwen2's QKV bias) over any
// ModelFile (llama2.c, GGUF, safetensors), with the KV cache behind its one protocol call:
//
//   embed -> per layer: RMSNorm -> Q,K,V -> RoPE(Q, K) -> cache.update(layer, K, V)
//         -> attention kernel (by name) -> O -> residual -> RMSNorm -> SwiGLU FFN -> residual
//   -> final RMSNorm -> LM head (the embedding table when tied)
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

#include "core/tensor.h"
#include "kernels/attention.h"
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

  struct Layer {
    const float* attn_norm;      // [dim]
    TensorView wq, wk, wv;       // [H*D, dim], [Hkv*D, dim], [Hkv*D, dim]
    const float* bq = nullptr;   // [H*D] (qkv_bias) or nullptr
    const float* bk = nullptr;   // [Hkv*D]
    const float* bv = nullptr;   // [Hkv*D]
    TensorView wo;               // [dim, H*D]
    const float* ffn_norm;       // [dim]
    TensorView w_gate, w_up;     // [hidden, dim]
    TensorView w_down;           // [dim, hidden]
    bool sliding = false;        // layer type "sliding_attention"
  };

  const ModelConfig& config() const { return file_->config(); }
  const ModelFile& file() const { return *file_; }
  const std::vector<Layer>& layers() const { return layers_; }
  const TensorView& tok_embeddings() const { return tok_embeddings_; }  // [vocab, dim]
  const TensorView& output() const { return output_; }  // [vocab, dim] (== tok_embeddings if tied)
  const float* output_norm() const { return output_norm_; }             // [dim]
  const std::vector<float>& rope_inv_freq() const { return inv_freq_; }  // [head_dim / 2]
  RopeStyle rope_style() const { return rope_style_; }
  size_t weight_bytes() const { return file_->weight_bytes(); }

 private:
  const float* as_f32(const TensorView& t);

  std::unique_ptr<ModelFile> file_;
  std::vector<Layer> layers_;
  TensorView tok_embeddings_, output_;
  const float* output_norm_ = nullptr;
  std::vector<float> inv_freq_;
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
  // The KV store. nullptr: no cache — the chunk attends only to its own keys (pos0 must be 0);
  // the "full recompute" oracle that --verify compares against.
  Cache* cache = nullptr;
  LogitsMode logits = LogitsMode::kLast;
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

 private:
  void reserve(int64_t rows);

  const LlamaModel& model_;
  AttentionFn attention_;
  int64_t rows_ = 0;  // capacity in rows (batch * tokens)
  // Activations, row-major over rows = batch * tokens.
  Tensor x_;       // [rows, dim] residual stream
  Tensor xb_;      // [rows, max(dim, H*D)] normed input / branch output
  Tensor q_;       // [rows, H*D]
  Tensor k_, v_;   // [rows, Hkv*D]
  Tensor att_;     // [rows, H*D] attention output
  Tensor hb_, hb2_;  // [rows, hidden]
  Tensor logits_;  // [rows, vocab]
};

}  // namespace kvcache
