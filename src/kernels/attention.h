// Attention kernels: a registry by name ("eager", "fused", "flex"), one signature.
// Kernels read K/V where the cache keeps them (any strides, f32/f16/bf16), handle GQA by
// indexing the KV head (H_q must be a multiple of H_kv; no repeated copies), accumulate in f32,
// and write out. They know nothing of caches or models: views and an options struct only.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace kvcache {

// User mask: true where query position q_pos may see key position kv_pos (absolute positions).
using MaskFn = std::function<bool(int64_t b, int64_t h, int64_t q_pos, int64_t kv_pos)>;
// User score transform applied to the scaled (and softcapped) logit before the softmax.
using ScoreFn = std::function<float(float score, int64_t b, int64_t h, int64_t q_pos,
                                    int64_t kv_pos)>;

struct AttentionOptions {
  float scale = 0.0f;          // logit scale; 0 means 1/sqrt(D_k)
  bool causal = true;          // kv_pos <= q_pos
  int64_t sliding_window = 0;  // > 0: kv_pos > q_pos - sliding_window (W keys, itself included)
  int64_t chunk_size = 0;      // > 0: kv_pos / chunk_size == q_pos / chunk_size
  float softcap = 0.0f;        // > 0: logit = softcap * tanh(logit / softcap)
  const float* sinks = nullptr;  // [H_q] learned sink logits (denominator only), or nullptr
  int64_t kv_offset = 0;         // absolute position of k[:, :, 0]
  int64_t q_offset = -1;         // absolute position of q[:, :, 0]; -1: bottom-right aligned,
                                 // i.e. kv_offset + S_kv - S_q
  const MaskFn* mask = nullptr;    // extra mask ANDed with the above (flex; eager honours it)
  const ScoreFn* score = nullptr;  // score_mod (flex; eager honours it)
  // eager only: if set, receives the probabilities as f32 [B, H_q, S_q, S_kv].
  Tensor* weights_out = nullptr;
};

// q:   [B, H_q, S_q, D_k]  f32, any strides with unit innermost stride
// k:   [B, H_kv, S_kv, D_k] f32/f16/bf16, same
// v:   [B, H_kv, S_kv, D_v] same dtype as k
// out: [B, H_q, S_q, D_v]  f32, any strides with unit innermost stride
// A query row that sees no key (fully masked, no sink) produces zeros.
using AttentionFn = void (*)(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const AttentionOptions& options);

// Throws Error listing the registered names when `name` is unknown.
AttentionFn get_attention_kernel(std::string_view name);
std::vector<std::string> attention_kernel_names();

}  // namespace kvcache
