// Indexer top-k sparse attention (issue 39): DeepSeek's lightning indexer picks, per query, the
// top-k entries of a compressed (or per-token) key series, and attention reads only those
// entries plus the query's sliding window, in place, with learned sinks (s_aux) in the
// denominator. The decode cost of the attention part grows with k and the window, not with the
// context; the scoring part reads every indexer key once (c^I wide, DeepSeek's design).
//
//   score[t, s] = sum_h w[t, h] * relu(q_I[t, h, :] . k_I[s, :]) * index_scale   (s < limit(t))
//   selected[t] = the top_k entries by score, ties broken by the lower index, padded with -1
//   out[t, h]   = softmax over {window keys of t} u {selected entries} u {sink_h} of q . k,
//                 then the same weights over the values (the sink has no value)
//
// limit(t) = (pos(t) + 1) / rate: entry s covers tokens [s * rate, (s + 1) * rate), visible
// once whole (transformers' causal_threshold, modeling_deepseek_v4.py); rate 1 for per-token
// indexer keys (DSA). HCA (no indexer): every entry below limit(t) is attended (selected ==
// nullptr).
//
// Spans are read where the cache keeps them: KVSpan kind kDense or kPaged (cache pages, one
// slot per entry for compressed series); only the rows a query sees are read (a paged sliding
// layer's dropped blocks never are). Quantized spans: Error(kUnsupported). A dense span's batch
// rows share one length, so a dense batch's rows sit at one position; paged rows may differ.
// Both the reference and the fast kernel take the same arguments and run the same checks,
// which throw Error(kInvalidArgument) before anything is written; the fast one matches the
// reference within the tolerance stated in tests/kernels/sparse_attention_test.cc (2e-5
// relative for the attention; the same selection on exact scores for the indexer).
//
// Span/position contract (checked per batch row b, S queries at pos[b] .. pos[b] + S - 1):
// - the window span holds positions kv_offset .. pos[b] + S - 1 (it ends at the last query)
//   and starts at or before max(pos[b] - W + 1, 0) (the first query's window is whole): what
//   WindowLayer / RecomputeLayer / a paged sliding layer's update() returns;
// - the entries and indexer-key spans start at entry 0 (kv_offset 0) and hold exactly
//   (pos[b] + S) / rate rows: the entries emitted once the step's tokens are in.
#pragma once

#include <cstdint>
#include <span>

#include "core/kv_span.h"
#include "core/tensor.h"

namespace kvcache {

struct IndexerParams {
  int64_t rate = 1;          // tokens per entry (limit(t) above)
  int64_t top_k = 0;         // entries kept per query
  float index_scale = 1.0f;  // index_head_dim^-0.5 (transformers' softmax_scale)
};

// q_index: [B, S, H_I, c] f32 (RoPE applied); weights: [B, S, H_I] f32 (weights_proj output,
// already multiplied by H_I^-0.5); keys: the indexer series, [B, 1, T_b, c] dense or paged;
// pos: absolute position of query (b, t) is pos[b] + t. selected: [B, S, top_k] int32 out,
// entries ascending by (-score, index), -1 past the number of visible entries (transformers
// returns min(top_k, T) columns; here always top_k). A NaN score counts as -inf.
void indexer_topk_reference(const TensorView& q_index, const TensorView& weights,
                            const KVSpan& keys, std::span<const int64_t> pos,
                            const IndexerParams& params, int32_t* selected);
void indexer_topk(const TensorView& q_index, const TensorView& weights, const KVSpan& keys,
                  std::span<const int64_t> pos, const IndexerParams& params, int32_t* selected);

struct SparseAttentionParams {
  float scale = 0.0f;            // logit scale; 0: 1/sqrt(D)
  int64_t sliding_window = 0;    // W: the window span's keys a query sees (itself included)
  const float* sinks = nullptr;  // [H_q] sink logits (s_aux), or nullptr
  int64_t rate = 1;              // tokens per entry (the causal limit of the entries)
  // [B, S, top_k] entries per query, or nullptr: every entry below limit(t). -1 slots (anywhere)
  // are skipped; every other index must lie in [0, limit(t)) and appear once per query.
  const int32_t* selected = nullptr;
  int64_t top_k = 0;
};

// q: [B, H_q, S, D] f32; window: the sliding K==V span the cache's update() returned (dense or
// paged; its kv_offset places it; the v view may alias k or be empty (ndim 0), both meaning
// v == k: such rows are widened once for both; an empty span (k of ndim 0): no window, as DSA);
// entries: the compressed series (k == v, [B, 1, T_b, D]) or, for DSA, the full-attention span
// itself (rate 1, [B, H_kv, T_b, D_k / D_v]), dense or paged, may be empty; pos[b]: absolute
// position of q[b, :, 0];
// out: [B, H_q, S, D_v] f32. MQA/GQA: H_q a multiple of the spans' heads.
void sparse_attention_reference(const TensorView& q, const KVSpan& window, const KVSpan& entries,
                                std::span<const int64_t> pos, const SparseAttentionParams& params,
                                const TensorView& out);
void sparse_attention(const TensorView& q, const KVSpan& window, const KVSpan& entries,
                      std::span<const int64_t> pos, const SparseAttentionParams& params,
                      const TensorView& out);

}  // namespace kvcache
