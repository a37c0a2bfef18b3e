// WindowLayer: the sliding-window ("sliding_attention") and chunked ("chunked_attention")
// containers, with dynamic or static storage. A query sees only a bounded stretch of recent
// keys, so between steps the layer keeps only what the next queries may see — the last W-1
// tokens for a window of W, the last C-1 for chunks of C (see below) — and
// forgets the rest, yet update() returns everything the step's queries may see (the kept
// tokens plus the new ones, chronological, one contiguous strided view) — eviction is
// invisible to the kernel, as in transformers' DynamicSlidingWindowLayer (KV cache notes,
// "滑窗与分块": keep W-1 because the new token is the W-th key of its own window).
//
// Which keys a step sees. For queries at positions [p, p+q) (p = seq_length() before the
// update) the earliest visible key is
//   sliding (W):  start(p) = max(p - W + 1, 0)   (kv_pos > q_pos - W, transformers semantics)
//   chunked (C):  start(p) = max(p - C + 1, 0)   (the same: see below)
// update() returns keys [start(p), p+q) with kv_offset = start(p), and mask_sizes(q) returns
// {p + q - start(p), start(p)}: exactly transformers' DynamicSlidingWindowLayer.get_mask_sizes
// (kv_offset = max(p-W+1, 0), kv_length = W-1+q once p >= W, else p+q). For chunked layers
// transformers v5 reuses the sliding layer and leaves the chunk boundary to the mask, and so do
// we: a left-padded row's chunks start at its first real token (AttentionOptions::chunk_offset),
// so its chunk may begin up to C-1 keys before p whatever floor(p / C) * C says. Keys outside
// a row's chunk are masked by the kernel (its key_range skips them, tile by tile).
//
// Storage: a SequenceBuffer whose live window [begin, end) slides right as tokens arrive.
// When the end reaches the capacity the kept tokens move to slot 0 (compaction); with a
// capacity of about 2W each token is moved O(1) times (once per ~W appends, W-1 tokens move).
// A step whose kept + new tokens exceed the capacity (a prefill longer than the buffer) is
// assembled in a workspace the layer owns (counted in bytes(), reused by later long steps);
// only the last `keep` tokens then go into the storage.
//   dynamic: capacity grows geometrically from 16 slots up to 2W; max_length() = -1.
//   static:  capacity fixed at the first update to min(2W, max_cache_len) (2W when
//            max_cache_len is 0); the storage pointer never changes (the workspace may);
//            max_length() = min(W, max_cache_len) like transformers' StaticSlidingWindowLayer.
//            The static layer rolls forever (no error at max_cache_len) unless the window
//            itself does not fit: max_cache_len < W-1 and more than max_cache_len tokens.
// Both return identical spans and mask sizes for identical updates (tested).
//
// crop(n) must leave the next step's queries every key they may see: cropping to length L
// needs positions [start(L), L) held. Once the window has dropped them, crop throws unless
// activate_past_recording() was called before those tokens were evicted: from then on the
// layer keeps everything it holds (dynamic: grows; static: up to its capacity, then an
// error), like transformers' record_past, while update() still returns just the window. Each
// crop (crop(0) included) then shrinks the layer back to the keys its next queries need, as
// v5's Cache.crop restricts a sliding or linear layer to its working size: a crop returns to
// positions recorded since the last crop, not before.
//
// Bounded rollback (speculative decoding: rejected drafts leave through crop(-n), n <= k):
// reserve_rollback(r) makes the layer keep, between steps, every key a query r positions back
// may see, [start(L - r), L) for a length L, instead of [start(L), L): at most r tokens more,
// whatever the number of steps, so a static layer knows its size up front (2W + r slots,
// within max_cache_len) and nothing grows without bound between crops (unlike unbounded past
// recording). Then crops removing at most r tokens in all since the last update always find
// their keys (start() is monotone). update() returns the same span as without it.
#pragma once

#include "cache/dense_layer.h"

namespace kvcache {

enum class WindowKind { kSliding, kChunked };

struct WindowLayerParams {
  WindowKind kind = WindowKind::kSliding;
  int64_t window = 0;         // W (sliding) or C (chunked), >= 1
  int64_t max_cache_len = 0;  // static: caps the capacity and max_length(); 0: unset
};

class WindowLayer final : public DenseLayer {
 public:
  static constexpr int64_t kMinCapacity = 16;  // dynamic: first allocation at least this

  WindowLayer(DenseLayerParams params, const WindowLayerParams& window);

  KVSpan update(const TensorView& k, const TensorView& v) override;
  MaskSizes mask_sizes(int64_t query_len) const override;
  int64_t seq_length() const override { return seq_length_; }
  int64_t max_length() const override;
  // Also on crop(0): whatever past recording kept beyond the next queries' keys is dropped
  // (recording stays on). Crop to 0 always works.
  void crop(int64_t n) override;
  // Content forgotten, memory (storage and workspace) kept, past recording left as it was.
  void reset() override;
  void activate_past_recording() override { recording_ = true; }
  // Keep the keys of the last `tokens` positions' windows too (see above). A static layer
  // whose storage is already allocated refuses (Error kOutOfRange) when it cannot hold them.
  void reserve_rollback(int64_t tokens);
  int64_t rollback() const { return rollback_; }
  // The tokens held: [first_stored_position(), seq_length()).
  bool stored(KVSpan* out) const override;
  bool past_recording() const { return recording_; }

  // First absolute position a query at `pos` (or any later query) may see.
  int64_t window_start(int64_t pos) const;
  // Most tokens kept between steps without past recording: W-1 or C-1.
  int64_t keep() const { return keep_; }
  // Absolute position of the first stored token.
  int64_t first_stored_position() const { return seq_length_ - buf_.size(); }

 private:
  int64_t restore_capacity(const SavedPosition& p) const override;
  void restore_position(const SavedPosition& p) override;
  bool recording() const override { return recording_ || rollback_ > 0; }
  int64_t capacity_limit() const;
  // First position held between steps at length `length` (no past recording): the first key a
  // query rollback_ positions back may see, and nothing the storage no longer holds.
  int64_t hold_from(int64_t length) const;
  // crop's cut to `length` (< seq_length(), > 0): Error when the window no longer holds the
  // keys a query at `length` needs.
  void cut_to(int64_t length);  // dynamic: growth stops here (unless recording); static: fixed

  WindowLayerParams window_;
  int64_t keep_ = 0;
  int64_t seq_length_ = 0;  // positions written (cumulative)
  bool recording_ = false;
  int64_t rollback_ = 0;  // reserve_rollback
};

}  // namespace kvcache
