// Attention kernels: a registry by name ("eager", "fused", "flex"), one signature.
// Kernels read K/V where the cache keeps them (any strides, f32/f16/bf16), handle GQA by
// indexing the KV head (H_q must be a multiple of H_kv; no repeated copies), accumulate in f32,
// and write out. They know nothing of caches or models: views and an options struct only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "kernels/mask.h"

namespace kvcache {

// MaskFn (user mask over absolute positions) lives in kernels/mask.h with the built-in masks.
// User score transform applied to the scaled (and softcapped) logit before the softmax.
using ScoreFn =
    std::function<float(float score, int64_t b, int64_t h, int64_t q_pos, int64_t kv_pos)>;

struct AttentionOptions {
  float scale = 0.0f;            // logit scale; 0 means 1/sqrt(D_k)
  bool causal = true;            // kv_pos <= q_pos
  int64_t sliding_window = 0;    // > 0: kv_pos > q_pos - sliding_window (W keys, itself included)
  int64_t chunk_size = 0;        // > 0: kv_pos / chunk_size == q_pos / chunk_size
  float softcap = 0.0f;          // > 0: logit = softcap * tanh(logit / softcap)
  const float* sinks = nullptr;  // [H_q] learned sink logits (denominator only), or nullptr
  int64_t kv_offset = 0;         // absolute position of k[:, :, 0]
  int64_t q_offset = -1;         // absolute position of q[:, :, 0]; -1: bottom-right aligned,
                                 // i.e. kv_offset + S_kv - S_q
  const MaskFn* mask = nullptr;  // extra mask ANDed with the above (flex; eager honours it)
  // The same, evaluated once (kernels/mask.h BlockMask; its geometry must be this call's).
  // fused/flex read its bits instead of calling a function; at most one of mask, block_mask.
  const BlockMask* block_mask = nullptr;
  const ScoreFn* score = nullptr;  // score_mod (flex; eager honours it)
  // Packed sequences: [B, doc_len] document id per absolute position (positions the call
  // covers must lie in [0, doc_len)); a query sees only keys of its own document.
  const int32_t* doc_ids = nullptr;
  int64_t doc_len = 0;
  // Padding: keys of batch row b are valid in [kv_valid_begin[b], kv_valid_end[b]), absolute
  // positions ([B] each, either may be null). From per-row lengths L_b of a right-padded
  // cache: begin = nullptr, end[b] = kv_offset + L_b.
  const int64_t* kv_valid_begin = nullptr;
  const int64_t* kv_valid_end = nullptr;
  // Chunked layers with left padding: [B] row b's chunks start at chunk_offset[b] (its number
  // of left-padding positions), i.e. (kv_pos - off) / C == (q_pos - off) / C, floor division
  // (transformers v5 chunked_overlay). nullptr: 0 for every row. Ignored when chunk_size is 0.
  const int64_t* chunk_offset = nullptr;
  // fused/flex: keys per split-KV partition (flash-decoding; rounded up to the 64-key tile).
  // 0: automatic (a sequence with one query tile and more than 1,024 keys is split into
  // partitions of a quarter of its keys in multiples of 64, between 1,024 and 4,096 keys:
  // auto_split_keys; decided per sequence, so results never depend on the batch or the thread
  // count), -1: never split (then a decode row is bit-identical to the same row of a prefill).
  int64_t kv_split = 0;
  // eager only: if set, receives the probabilities as f32 [B, H_q, S_q, S_kv].
  Tensor* weights_out = nullptr;
  // fused / flex / fused_scalar (dense and paged) and quantized: scratch owned by the caller, at
  // least attention_workspace_bytes() of the call's shape (kernels/attention_workspace.h); the
  // kernel then allocates nothing. Empty: the kernel allocates one for this call alone. Too
  // small: Error(kInvalidArgument) before anything is written. One call at a time per workspace.
  std::span<std::byte> workspace;
};

// q:   [B, H_q, S_q, D_k]  f32, any strides with unit innermost stride
// k:   [B, H_kv, S_kv, D_k] f32/f16/bf16, same
// v:   [B, H_kv, S_kv, D_v] same dtype as k
// out: [B, H_q, S_q, D_v]  f32, any strides with unit innermost stride
// A query row that sees no key (fully masked, no sink) produces zeros.
// Kernels parallelise on default_pool(); do not call them from inside a task of that pool.
using AttentionFn = void (*)(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const AttentionOptions& options);

// The built-in part of the options as a MaskSpec (plus options.mask as its user function).
MaskSpec attention_mask_spec(const AttentionOptions& options);

// Checks shapes, dtypes and strides of one call; throws Error(kInvalidArgument/kUnsupported)
// saying which argument is wrong. Every kernel calls it first.
void validate_attention_args(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const AttentionOptions& options);

// Registered kernels:
//   "eager"        materialises mask and scores per (b, h); the only one filling weights_out.
//   "fused"        online softmax over K/V tiles, GQA groups share each K/V tile, split-KV
//                  decode, AVX2/FMA/F16C when built for it. Honours mask/score if given.
//   "flex"         the fused kernel driven by options.mask / options.score (same code path).
//   "fused_scalar" the fused kernel's portable scalar fallback (tests, non-AVX2 builds).
// Throws Error listing the registered names when `name` is unknown.
AttentionFn get_attention_kernel(std::string_view name);
std::vector<std::string> attention_kernel_names();

}  // namespace kvcache
