// Gated DeltaNet (Qwen3-Next's linear-attention layers): the gated delta rule in its recurrent
// form (decode) and its chunked form (prefill), the gates g and beta, and the gated RMSNorm of
// the layer's output. The math is transformers' models/qwen3_next/modeling_qwen3_next.py
// (torch_recurrent_gated_delta_rule, torch_chunk_gated_delta_rule, l2norm,
// Qwen3NextRMSNormGated, Qwen3NextGatedDeltaNet.forward); the causal conv1d in front of it is
// kernels/causal_conv.h. One sequence per call; the kernels know nothing of caches or models.
//
// The rule, per value head h with state S [d_k, d_v] (f32), for each token t:
//   q = l2norm(q_t) * scale, k = l2norm(k_t)      (l2norm(x) = x / sqrt(sum x^2 + eps))
//   S = S * exp(g_t);  delta = (v_t - k^T S) * beta_t;  S = S + k delta^T;  o_t = q^T S
// q and k belong to key head h / (H_v / H_k) (transformers' repeat_interleave of q/k heads).
//
// Layouts (all f32, row-major, innermost dim contiguous: stride 1; the other strides are free,
// so q, k and v may be column slices of the conv output rows [T, 2 H_k d_k + H_v d_v]):
//   q, k  [T, H_k, d_k]     v, out  [T, H_v, d_v]     g, beta  [T, H_v]
//   state [H_v, d_k, d_v]   row i of a head's state is key dim i (d_v contiguous); read as the
//                           initial state, overwritten by the final one. Zeros: a new sequence.
// out may be v itself (same data and strides: each element is read before it is written);
// no other overlap between out or state and the inputs is allowed.
//
// Reference and tolerance. The reference is the token-by-token recurrence in double
// (tests/kernels/gated_delta_reference.h, transformers' torch_recurrent_gated_delta_rule in its
// order of operations). Both kernels are tested against it on random inputs of odd sizes
// (T 1..130, d 5..33, H_v = H_k and 2 H_k, g in [-2, 0), near 0 and in [-30, -8], beta in
// (0, 1), a nonzero initial state), per value head:
//   max |o - o_ref| <= 2e-5 * max_{t,j} sum_i |q_i S_ij|    (S after token t's update)
//   max |S - S_ref| <= 2e-5 * max |S_ref|                   (the final state)
// The output's scale is the magnitude of its terms, not its value: with T = 1 and d_k = 5 the
// terms of q^T S can cancel to 1e-3 of their size, and no float sum keeps relative accuracy
// there. Measured: recurrent 3e-7 (out) and 6e-7 (state); chunked (64) 1.4e-6 and 4e-6; at
// d_k = d_v = 128, T = 300, 1.4e-6 at most. Chunked and recurrent agree within the same bound.
// Why they differ at all: the recurrent form sums k^T S and q^T S over d_k per token; the
// chunked one solves the chunk's triangular system T = (I + tril(beta K K^T * decay))^-1 by
// forward substitution and forms W S, Q S and K^T V' over the chunk, other terms in another
// order. Its error grows with the chunk length: a single 130-token chunk measured 1e-5 on the
// state, hence 64 as in transformers. With l2-normalised keys and beta in
// (0, 1) each token's update I - beta k k^T has norm <= 1 and the decays are <= 1, so errors do
// not accumulate over chunks or tokens.
//
// Cost: both forms take ~4 d_k d_v multiply-adds per token and value head. The recurrent form
// keeps 32 columns of a head's state in L1 across a block of tokens (columns of S evolve
// independently); the chunked form runs register-tiled products (AVX2/FMA where built, plain
// loops otherwise). Both split value heads over the thread pool.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace kvcache {

class ThreadPool;

struct GatedDeltaParams {
  TensorView q, k, v;          // [T, H_k, d_k], [T, H_k, d_k], [T, H_v, d_v]
  TensorView g, beta;          // [T, H_v]: log-decay (<= 0 for Qwen3-Next) and write strength
  TensorView state;            // [H_v, d_k, d_v], in and out
  TensorView out;              // [T, H_v, d_v]
  bool qk_l2norm = true;       // use_qk_l2norm_in_kernel (Qwen3-Next: true)
  float l2norm_eps = 1e-6f;    // transformers' l2norm eps (added to the sum of squares)
  float scale = 0.0f;          // q scale; 0: 1 / sqrt(d_k)
  int64_t chunk_size = 64;     // gated_delta_chunked only: tokens per chunk (transformers: 64)
  ThreadPool* pool = nullptr;  // nullptr: default_pool()
};

// Token-by-token recurrence (decode: T = 1; any T works).
void gated_delta_recurrent(const GatedDeltaParams& p);
// The chunked (WY / UT-transform) form of torch_chunk_gated_delta_rule, the last chunk shorter
// instead of zero-padded (padding tokens with g = 0, beta = 0, k = 0 change nothing). Same
// outputs and final state as gated_delta_recurrent within the tolerance above; a prefill may be
// split into several calls (the state carries over) at any token.
void gated_delta_chunked(const GatedDeltaParams& p);
// Checks every view of p (dims, shapes against each other, H_v a multiple of H_k, unit
// innermost strides, chunk_size > 0) and throws Error(kInvalidArgument) naming the argument.
// Both kernels call it first.
void validate_gated_delta(const GatedDeltaParams& p, const char* who);

// The gates of Qwen3NextGatedDeltaNet.forward from the in_proj_ba outputs a and b:
//   beta = sigmoid(b),  g = -exp(A_log) * softplus(a + dt_bias)
// with torch's softplus (x > 20: x, else log1p(exp(x))), in float.
// Tolerance against double: 1e-6 relative + 1e-7.
struct GatedDeltaGateParams {
  TensorView a, b;            // [T, H_v]
  TensorView a_log, dt_bias;  // [H_v]
  TensorView g, beta;         // [T, H_v] outputs (may be a and b themselves)
};
void gated_delta_gates(const GatedDeltaGateParams& p);

// Qwen3NextRMSNormGated over the last dim: y = w * (x / sqrt(mean(x^2) + eps)) * silu(z),
// weight applied as is (initialised to ones; not Qwen3NextRMSNorm's 1 + w), in that order, in
// float. x, z, y [T, H, D] (unit innermost stride), weight [D]; y may be x itself.
// Tolerance against double: 1e-5 relative + 1e-6 (the float sum of squares over D).
struct RmsNormGatedParams {
  TensorView x, z, weight, y;
  float eps = 1e-6f;
};
void rms_norm_gated(const RmsNormGatedParams& p);

}  // namespace kvcache
