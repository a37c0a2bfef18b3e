// The faces of the compressed and indexed layer types (issue 39; the KV cache notes, "CSA / HCA"
// and the indexed / sparse layers), shared by their dynamic, recompute and paged containers:
//
//   heavily_compressed_attention (HCA, DeepSeek-V4)  a sliding window of raw K==V rows plus one
//       compressed entry per `rate` tokens (V4: 128), windows not overlapping, no indexer;
//   compressed_sparse_attention (CSA, DeepSeek-V4)   the same with rate 4, overlapping windows
//       (each entry folds the previous window's Ca half with its own Cb half, so the last
//       window's Ca half is carried across calls: the overlap state) and a second compressed
//       series, the lightning indexer's keys, kept the same way at index_head_dim;
//   deepseek_sparse_attention (DSA, DeepSeek-V3.2)   full attention plus one indexer key per
//       token (transformers' DynamicIndexedLayer).
//
// Semantics follow transformers' DeepseekV4HCACache / DeepseekV4CSACache
// (models/deepseek_v4/modeling_deepseek_v4.py) and DynamicIndexedLayer (cache_utils.py):
// - update(kv, kv) is the sliding K==V branch: k and v must be the same view ([B, 1, n, d]);
//   it is stored once (no factor 2) and the span's v aliases k. mask_sizes() describes it.
// - store_compression_weights(stream, row, kv, gate) appends one batch row's new projected
//   (kv, gate) rows to that row's buffer and returns the longest window-aligned prefix of
//   (buffer, new) (the windows to fold now) and the absolute position of its first window,
//   entry_count * rate; the remainder stays buffered for the next call. Windows are emitted only
//   when whole.
// - update_overlap_state(stream, row, chunk) (CSA only, after store_compression_weights and only
//   when the chunk holds windows): returns the Ca half ([rate, width / 2] of kv and gate) of the
//   last window folded by an earlier call (empty views when there is none yet) and keeps the Ca
//   half of the chunk's last window for the next call. Both are raw rows as fed (the dense
//   container keeps them when store_compression_weights emits the windows, so a chunk the
//   model biased in place changes nothing): unlike transformers, whose overlap gate already
//   holds position_bias, the model adds position_bias[:, :width / 2] to the prior's gate as it
//   does to the chunk's.
// - update_compressor_states(stream, row, entries) appends the entries the model folded from
//   that chunk ([n_windows, D], RoPE already applied at position first_window_position + i *
//   rate); compressed(stream) then returns every batch row's entries as a span (k == v,
//   [B, 1, T, D] dense, or paged with one page slot per entry: paged blocks hold entries, not
//   tokens). Entry i of a row covers tokens [i * rate, (i + 1) * rate).
// Rows are fed one at a time because batch rows of a paged step may sit at different positions
// (and so emit different numbers of windows). Per-row buffers and overlaps live in the layer.
#pragma once

#include <cstdint>

#include "cache/cache_layer.h"
#include "core/kv_span.h"
#include "core/tensor.h"

namespace kvcache {

// A compressed layer's two series: the attention entries, and (CSA only) the indexer's keys.
enum class CompressedStream : int { kCompressor = 0, kIndexer = 1 };

// What store_compression_weights returns; views valid until the next mutating call on the layer.
struct CompressionChunk {
  TensorView kv;    // [n_windows * rate, width] f32: buffered rows first, then the new ones
  TensorView gate;  // [n_windows * rate, width] f32
  int64_t first_window_position = 0;  // absolute position of the chunk's first token
  int64_t n_windows = 0;
};

// The previous window's Ca half (CSA); both views empty (ndim 0) when no window was folded yet.
struct OverlapPrior {
  TensorView kv;    // [rate, width / 2] f32
  TensorView gate;  // [rate, width / 2] f32
};

class CompressedCacheLayer : public CacheLayer {
 public:
  virtual int64_t compress_rate() const = 0;
  virtual bool has_overlap() const = 0;  // CSA
  virtual bool has_indexer() const = 0;  // CSA
  // kv, gate: [n, width] f32 rows of batch row `row` (width: 2 * head_dim for CSA's compressor,
  // head_dim for HCA's, 2 * index_head_dim for the indexer), n >= 0.
  virtual CompressionChunk store_compression_weights(CompressedStream s, int64_t row,
                                                     const TensorView& kv,
                                                     const TensorView& gate) = 0;
  virtual OverlapPrior update_overlap_state(CompressedStream s, int64_t row,
                                            const CompressionChunk& chunk) = 0;
  // entries: [n_windows, D] f32 (any float dtype accepted; stored in the layer's dtype).
  virtual void update_compressor_states(CompressedStream s, int64_t row,
                                        const TensorView& entries) = 0;
  // Every batch row's entries (k == v); kv_offset 0.
  virtual KVSpan compressed(CompressedStream s) const = 0;
  virtual int64_t entry_count(CompressedStream s, int64_t row) const = 0;
  // The Error crop(n) would throw, without changing anything (Cache::crop checks every
  // compressed layer before it changes any layer). Default: crop never refuses.
  virtual void check_crop(int64_t n) const { (void)n; }
};

class IndexedCacheLayer : public CacheLayer {
 public:
  // index_keys: [B, 1, n, c] (the step's new tokens, RoPE applied) appended; returns every
  // token's indexer key so far, [B, 1, T, c] dense or paged (k == v), kv_offset 0.
  virtual KVSpan update_indexer(const TensorView& index_keys) = 0;
};

}  // namespace kvcache
