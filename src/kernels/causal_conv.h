// Causal depthwise conv1d with a carried window, optionally followed by SiLU: the short
// convolution in front of Gated DeltaNet (Qwen3-Next's conv1d over the concatenated q, k, v
// channels; transformers' Qwen3NextGatedDeltaNet.forward and torch_causal_conv1d_update in
// models/qwen3_next/modeling_qwen3_next.py). Prefill is T tokens, decode is T = 1: one kernel.
//
//   y[t, c] = act(bias[c] + sum_{j < K} w[j, c] * in(t - (K - 1) + j, c))
//   in(s, c) = x[s, c] for s >= 0, state[K - 1 + s, c] for s < 0
//
// Layouts (f32, row-major, the channel dim contiguous: stride 1; the row stride is free):
//   x, y    [T, C]       token-major, as the in_proj matmul writes them
//   weight  [K, C]       tap-major: w[j, c] = HF's conv1d.weight[c, 0, j] (the loader
//                        transposes it once; the kernel then reads whole vectors of
//                        channels); w[K - 1, c] multiplies the current token
//   bias    [C], or a view without data (default-constructed): none (Qwen3-Next has none)
//   state   [K - 1, C]   the last K - 1 inputs (pre-conv, pre-activation), oldest first; all
//                        zeros at the start of a sequence (transformers' left zero padding).
//                        Rewritten to the last K - 1 inputs of (state, x). transformers' cache
//                        keeps [B, C, K], whose oldest column is never read again; this keeps
//                        the K - 1 that are (the (K - 1) d_qkv per sequence that the planner
//                        bills) and token-major, so an update is row copies.
// y may be x itself (same data and strides): the kernel runs tokens last to first and saves
// the new window first. 1 <= K <= 16.
//
// Arithmetic: one float FMA chain per output over j = 0..K-1 starting from the bias (or 0),
// then SiLU as x * (1 / (1 + exp(-x))) with the kernels' vector exp (activation.h's swiglu
// arithmetic). An output depends only on its own inputs, so splitting a prefill at any token
// (the window carried in state) or running it token by token gives the same bits.
// Tolerance against double: 1e-6 * (|bias| + sum_j |w x|) + 1e-7 (rounding of K products and
// the exp's ~1e-7 relative).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace kvcache {

class ThreadPool;

inline constexpr int64_t kMaxConvKernel = 16;

struct CausalConv1dParams {
  TensorView x;                // [T, C]
  TensorView y;                // [T, C]
  TensorView weight;           // [K, C] (HF's [C, 1, K] transposed)
  TensorView bias;             // [C], or no data: no bias
  TensorView state;            // [K - 1, C], in and out
  bool silu = true;            // Qwen3-Next: hidden_act "silu" after the conv
  ThreadPool* pool = nullptr;  // nullptr: default_pool() (used only for large T * C)
};

// Throws Error(kInvalidArgument) naming the argument on a bad view (dims, shapes, strides,
// K outside [1, 16], y overlapping x other than exactly).
void causal_conv1d(const CausalConv1dParams& p);

}  // namespace kvcache
