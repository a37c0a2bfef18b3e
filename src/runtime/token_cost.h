// What one token costs the memory system and the FMA units, computed from the model's config,
// its weight tensors and the cache's storage format: the bytes a decode token reads (weights +
// the K/V it attends) and the FLOPs of a prefill. `kvcache bench` divides its measured speeds
// by these and by the machine's limits (core/machine_limits.h) to print how far each test is
// from the roofline.
#pragma once

#include <cstdint>

#include "cache/cache.h"
#include "model/model.h"

namespace kvcache {

// Weight bytes one decode token reads:
//   W = sum over tensors of bytes(t) x share(t)
// share = n_experts_used / n_experts for routed-expert tensors (names with ".experts." or
// "_exps": a token reads its top-k experts only), 1 otherwise; the token-embedding table counts
// one row (dim elements of its dtype) unless it is also the LM head (tied), which reads all of
// it. Norm vectors and biases are in the sum: they are read too.
double decode_weight_bytes(const Model& model);

// K/V bytes one token reads when it attends `keys` positions (itself included):
//   KV(keys) = sum over layers l of bytes_l(keys)
// bytes_l is the memory planner's bill for one request of `keys` tokens (model/kv_plan.h:
// 2·H_kv·d_h·b per token for GQA layers, windows capped at W-1 stored tokens, MLA's latent,
// linear layers' f32 state) in the cache's format b: the --kv-dtype for dense containers;
// for "quantized", H_kv x (K block + V block bytes) / G per packed token (kernels/kv_quant.h's
// block layouts: KIVI codes with f16 scales and zeros, per channel over G tokens for K and per
// v_group channels for V; q8_0 / q4_0: 34 / 18 bytes per 32 elements) for the tokens past the
// residual, whose res = min(keys, ((keys - 1) mod max(R, G)) + 1) most recent tokens stay in
// --kv-dtype (the residual cycle of cache/quantized_layer.h, decoding one token at a time). A
// KV-shared layer reads the layer it shares (it stores nothing, but its attention reads that
// layer's K/V again). A lossy --kv-policy keeps fewer keys than this counts: for those the figure
// is an upper bound.
double kv_read_bytes(const Model& model, const CacheOptions& cache, int64_t keys);

// Bytes one decode token reads, averaged over a tgN test after `depth` tokens: token j
// (0-based) attends depth + j + 1 keys, so
//   bytes = W + (1/N) x sum_{j<N} KV(depth + j + 1).
double decode_bytes_per_token(const Model& model, const CacheOptions& cache, int64_t depth,
                              int64_t n_gen);

// FLOPs of prefilling n_prompt tokens after `depth` tokens (2 per multiply-add):
//   F = 2·M·n_prompt + 2·V·d + sum over attention layers, prompt tokens i of
//       2·H_q·(d_k + d_v)·keys_l(depth + i + 1)
// M: the matrix elements a token multiplies (tensors of 2 or more dims except the embedding
// table and the LM head, routed experts at their top-k share); V·d: the LM head, applied to the
// last position only; keys_l(p) = p, or min(p, W) on a windowed layer; d_v = d_k where K == V
// (MLA's latent, compressed layers: an approximation there). Linear-attention layers count
// their projections only.
double prefill_flops(const Model& model, int64_t depth, int64_t n_prompt);

}  // namespace kvcache
