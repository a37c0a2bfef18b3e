// CompressedLayer: the dense ("dynamic") and no-cache ("recompute") containers of DeepSeek-V4's
// compressed layer types, heavily_compressed_attention (HCA, registered in hca_layer.cc) and
// compressed_sparse_attention (CSA, csa_layer.cc). The face and its semantics are
// cache/compressed_cache_layer.h; this file is how the dense containers keep it:
//
// - The sliding K==V branch is a WindowLayer (dynamic) or a RecomputeLayer (recompute) built
//   with shared_kv, owned by composition: update(kv, kv), mask_sizes, seq_length and the
//   window's crop rules are exactly those of "sliding_attention" with kSharedKV (keep W-1,
//   return window + new, kv_offset = max(p - W + 1, 0)).
// - Per stream (the compressor; CSA also the indexer) and per batch row: the buffer of the
//   len % rate rows not yet folded ([rate - 1, width] f32 slots), the overlap (CSA: the Ca half
//   [rate, width / 2] of kv and gate of the last window emitted), the entries ([B, 1, cap, D] in
//   the cache dtype: CacheOptions::kv_dtype, else the first entries' dtype) and their count.
//   The rate is CacheConfig::compressed.rates[layer type] (V4's compress_rates).
// - The overlap is taken from the raw rows when store_compression_weights emits windows (not
//   from the chunk the model passes back, which it may have biased in place), so it is always
//   the Ca half of window windows - 1; update_overlap_state returns the one before.
//   transformers keeps the gate after adding position_bias; here the prior's gate is raw, like
//   the chunk's: the model adds position_bias[:, :width / 2] to it as it does to the chunk.
// - "recompute" (the no-cache oracle of --verify) starts every update() from an empty state,
//   transformers' stateless mode (past_key_values None): only the whole windows of the call's
//   own rows are emitted, from position 0, with no overlap prior; the remainder is dropped.
//
// Lifecycle. reset() forgets everything and keeps the memory. reorder / select /
// repeat_interleave move every per-row state (window, buffers, overlaps, entries, history).
// crop(p) to 0 or to seq_length() always works; otherwise the compressed state at p is
// rebuilt only from what past recording kept: activate_past_recording() at position r0 keeps,
// per stream and row, every (kv, gate) row fed from floor(r0 / rate) * rate on (the buffer's
// first row) and the overlap there, so crop(p) for any p >= floor(r0 / rate) * rate rebuilds
// buffer = rows [floor(p / rate) * rate, p), entries = the first floor(p / rate) and overlap =
// Ca half of window floor(p / rate) - 1; the window branch has its own rule
// (WindowLayer::crop). Anything else is an Error naming the reachable positions, and a
// refused crop changes nothing.
//
// bytes(): the window's storage and workspace, and per stream the buffers, overlaps, the
// prior and chunk workspaces, the entries' storage and the recorded history, exactly.
// "static" has no compressed container: the registry's error lists what exists.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/compressed_cache_layer.h"

namespace kvcache {

struct CompressedLayerParams {
  std::string name;               // registry name, "dynamic/heavily_compressed_attention"
  int layer_index = -1;           // model layer, for error messages
  int64_t rate = 0;               // tokens per entry, >= 1
  bool overlap = false;           // CSA: overlapping windows (overlap state)
  bool indexer = false;           // CSA: the indexer's compressed keys as a second stream
  bool per_call = false;          // recompute: every update() starts from an empty state
  std::optional<DType> kv_dtype;  // entries' dtype; unset: the first entries'
};

// The layer for (implementation, layer_type) of `config` ("dynamic" or "recompute"; HCA or CSA):
// checks the rate (Error naming the layer and compress_rates when missing) and builds the
// sliding K==V branch.
std::unique_ptr<CacheLayer> make_compressed_layer(const CacheConfig& config, int layer_index,
                                                  const std::string& implementation,
                                                  const std::string& layer_type, bool csa);

class CompressedLayer final : public CompressedCacheLayer {
 public:
  CompressedLayer(CompressedLayerParams params, std::unique_ptr<CacheLayer> sliding);

  // The sliding K==V branch: k and v the same tensor [B, 1, n, d]. The first update (or one
  // on an empty layer) sets the batch of every per-row state.
  KVSpan update(const TensorView& k, const TensorView& v) override;
  MaskSizes mask_sizes(int64_t query_len) const override { return sliding_->mask_sizes(query_len); }
  int64_t seq_length() const override { return sliding_->seq_length(); }
  int64_t max_length() const override { return -1; }
  bool is_initialized() const override { return sliding_->is_initialized(); }
  void crop(int64_t n) override;
  void reset() override;
  void reorder(std::span<const int64_t> beam_idx) override;
  void repeat_interleave(int64_t r) override;
  void select(std::span<const int64_t> indices) override;
  void activate_past_recording() override;
  // The window's hint, and room for ceil(tokens / rate) entries per row.
  void reserve(int64_t tokens) override;
  size_t bytes() const override;
  CopyStats stats() const override { return sliding_->stats(); }
  std::string_view name() const override { return params_.name; }

  int64_t compress_rate() const override { return params_.rate; }
  bool has_overlap() const override { return params_.overlap; }
  bool has_indexer() const override { return params_.indexer; }
  CompressionChunk store_compression_weights(CompressedStream s, int64_t row, const TensorView& kv,
                                             const TensorView& gate) override;
  OverlapPrior update_overlap_state(CompressedStream s, int64_t row,
                                    const CompressionChunk& chunk) override;
  void update_compressor_states(CompressedStream s, int64_t row,
                                const TensorView& entries) override;
  // Every row must hold the same number of entries (a dense span is rectangular): Error naming
  // the rows otherwise (rows at different positions need the paged container).
  KVSpan compressed(CompressedStream s) const override;
  int64_t entry_count(CompressedStream s, int64_t row) const override;
  // The compressed streams' rule (header comment) and the window's (WindowLayer::crop).
  void check_crop(int64_t n) const override;

  // Inspection (tests): the rows buffered ([len % rate, width] f32), the overlap ([rate,
  // width / 2] f32, ndim 0 when none), the batch, the sliding branch.
  TensorView buffer_kv(CompressedStream s, int64_t row) const;
  TensorView buffer_gate(CompressedStream s, int64_t row) const;
  TensorView overlap_kv(CompressedStream s, int64_t row) const;
  TensorView overlap_gate(CompressedStream s, int64_t row) const;
  int64_t batch() const { return batch_; }
  bool past_recording() const { return recording_; }
  const CacheLayer& sliding() const { return *sliding_; }

 private:
  struct Stream {
    int64_t width = 0;            // kv / gate row width, set by the first store_compression_weights
    int64_t dim = 0;              // entry width D: width (HCA) or width / 2 (CSA), set with it
    DType dtype = DType::kF32;    // the entries' (set by the first update_compressor_states)
    Tensor buf_kv, buf_gate;      // [rows, rate - 1, width] f32
    Tensor ovl_kv, ovl_gate;      // [rows, rate, width / 2] f32 (overlap streams)
    Tensor prior_kv, prior_gate;  // [rate, width / 2] f32: update_overlap_state's answer
    Tensor chunk_kv, chunk_gate;  // [chunk rows, width] f32: store_compression_weights' answer
    Tensor entries;               // [rows, 1, cap, D] in the cache dtype
    std::vector<int64_t> buf_len;  // per row, < rate
    std::vector<int64_t> windows;  // per row: windows emitted (rows consumed / rate)
    std::vector<int64_t> count;    // per row: entries stored
    std::vector<uint8_t> has_ovl;  // per row
    // The last store: (row, windows emitted, whether it had a prior), for update_overlap_state.
    int64_t last_row = -1;
    int64_t last_windows = 0;
    bool last_prior = false;
    // Past recording, per row: every row fed from hist_start on ([n, width] f32, row-major),
    // and the overlap at hist_start (Ca half of window hist_start / rate - 1; empty if none).
    std::vector<int64_t> hist_start;
    std::vector<std::vector<float>> hist_kv, hist_gate, seed_kv, seed_gate;
  };

  std::string where() const;
  Stream& stream(CompressedStream s, const char* op);
  const Stream& stream(CompressedStream s, const char* op) const;
  void check_row(int64_t row, const char* op) const;
  // Per-row state for `batch` rows, all empty (storage kept when large enough).
  void set_batch(int64_t batch);
  void clear_row(Stream& st, int64_t row);
  void clear_streams();
  // Allocates the per-row tensors once the width is known.
  void allocate_rows(Stream& st, int64_t rows);
  void restart_history(Stream& st, int64_t row);
  // Error text when crop to `length` is impossible for (stream, row), "" when it can.
  std::string crop_problem(const Stream& st, int64_t row, int64_t length) const;
  void apply_crop(Stream& st, int64_t row, int64_t length);
  // Row i of every per-row state becomes old row rows[i] (the caller validated and moved the
  // window branch).
  void gather(std::span<const int64_t> rows);
  // Entries storage of `rows` rows and `cap` slots, each row's entries kept.
  void grow_entries(Stream& st, int64_t rows, int64_t cap);

  CompressedLayerParams params_;
  std::unique_ptr<CacheLayer> sliding_;
  Stream streams_[2];
  int64_t batch_ = 0;
  bool recording_ = false;
  int64_t reserved_entries_ = 0;
};

}  // namespace kvcache
