// Attention masks over absolute positions: mask functions (b, h, q_pos, kv_pos) -> bool, their
// combinators, and the three ways kernels use a mask: a materialised additive float mask
// (eager only), per-tile classification (empty / partial / full) so fused kernels skip empty
// tiles and skip masking on full ones, and detection that no mask is needed at all.
// Nothing here owns the arrays it points to (document ids, padding ranges): the caller does.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace kvcache {

// User mask: true where query position q_pos may see key position kv_pos (absolute positions).
using MaskFn = std::function<bool(int64_t b, int64_t h, int64_t q_pos, int64_t kv_pos)>;

// ---- mask functions and combinators (transformers' masking_utils vocabulary) ----
MaskFn causal_mask();                           // kv <= q
MaskFn sliding_window_overlay(int64_t window);  // kv > q - window (W keys, q included)
MaskFn chunked_overlay(int64_t chunk_size);     // floor(kv / C) == floor(q / C)
// Left-padded rows: chunks of row b are counted from its first real token, left_padding[b]
// (transformers v5 masking_utils.py chunked_overlay(chunk_size, left_padding):
// (kv - lp[b]) // C == (q - lp[b]) // C). left_padding is [B], owned by the caller; null: 0.
MaskFn chunked_overlay(int64_t chunk_size, const int64_t* left_padding);
// Packed sequences: doc_ids is [B, len] row-major, the document id of each absolute position;
// a query sees only keys of its own document. Positions outside [0, len) are invisible.
MaskFn packed_sequence_mask(const int32_t* doc_ids, int64_t len);
// Padding: keys of batch row b are valid in [begin[b], end[b]) (absolute); either may be null.
MaskFn padding_mask(const int64_t* begin, const int64_t* end);
MaskFn and_masks(std::vector<MaskFn> masks);  // empty list: all true
MaskFn or_masks(std::vector<MaskFn> masks);   // empty list: all false

// ---- built-in mask description, classified analytically ----
// The conjunction of every enabled part. All built-ins depend on (b, q_pos, kv_pos) only; a
// user `fn` may also depend on the head and is evaluated (never classified analytically).
struct MaskSpec {
  bool causal = true;
  int64_t sliding_window = 0;        // > 0: kv > q - sliding_window
  int64_t chunk_size = 0;            // > 0: same chunk
  const int32_t* doc_ids = nullptr;  // [B, doc_len] packed-sequence document ids, or nullptr
  int64_t doc_len = 0;
  const int64_t* kv_begin = nullptr;  // [B] first valid key position (padding), or nullptr
  const int64_t* kv_end = nullptr;    // [B] one past the last valid key position, or nullptr
  const MaskFn* fn = nullptr;         // user mask ANDed with the above, or nullptr
  // [B] where row b's chunks start (its left padding, i.e. the position of its first real
  // token): chunk index floor((pos - chunk_offset[b]) / chunk_size). nullptr: 0 for every row.
  const int64_t* chunk_offset = nullptr;
};

// The rectangle of positions a kernel call covers. Bottom-right alignment: the last query sits
// at the last key when q_offset = kv_offset + S_kv - S_q (what make_geometry does for -1).
struct MaskGeometry {
  int64_t batch = 1, heads = 1;  // heads only matters for user functions
  int64_t q_len = 0, kv_len = 0;
  int64_t q_offset = 0;   // absolute position of query row 0
  int64_t kv_offset = 0;  // absolute position of key 0
};
MaskGeometry make_geometry(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                           int64_t q_offset /* -1: bottom-right */, int64_t kv_offset);

inline int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

// Keys visible to query q_pos form the interval [lo, hi) for causal, window, chunk and padding
// (both ends nondecreasing in q_pos); documents and the user function cut it further.
struct KeyRange {
  int64_t lo = std::numeric_limits<int64_t>::min() / 4;
  int64_t hi = std::numeric_limits<int64_t>::max() / 4;
};
inline KeyRange key_range(const MaskSpec& s, int64_t b, int64_t q_pos) {
  KeyRange r;
  if (s.causal) r.hi = std::min(r.hi, q_pos + 1);
  if (s.sliding_window > 0) r.lo = std::max(r.lo, q_pos - s.sliding_window + 1);
  if (s.chunk_size > 0) {
    const int64_t off = s.chunk_offset ? s.chunk_offset[b] : 0;
    const int64_t c0 = off + floor_div(q_pos - off, s.chunk_size) * s.chunk_size;
    r.lo = std::max(r.lo, c0);
    r.hi = std::min(r.hi, c0 + s.chunk_size);
  }
  if (s.kv_begin) r.lo = std::max(r.lo, s.kv_begin[b]);
  if (s.kv_end) r.hi = std::min(r.hi, s.kv_end[b]);
  return r;
}
inline int32_t doc_id(const MaskSpec& s, int64_t b, int64_t pos) {
  return (pos >= 0 && pos < s.doc_len) ? s.doc_ids[b * s.doc_len + pos] : -1;
}
// Everything but the user function, for one pair.
inline bool builtin_visible(const MaskSpec& s, int64_t b, int64_t q_pos, int64_t kv_pos) {
  const KeyRange r = key_range(s, b, q_pos);
  if (kv_pos < r.lo || kv_pos >= r.hi) return false;
  if (s.doc_ids) {
    const int32_t d = doc_id(s, b, q_pos);
    if (d < 0 || d != doc_id(s, b, kv_pos)) return false;
  }
  return true;
}
inline bool mask_visible(const MaskSpec& s, int64_t b, int64_t h, int64_t q_pos, int64_t kv_pos) {
  return builtin_visible(s, b, q_pos, kv_pos) && (!s.fn || (*s.fn)(b, h, q_pos, kv_pos));
}
MaskFn mask_spec_fn(const MaskSpec& s);  // the whole spec as one function (copies the spec)

// ---- use 1: materialised additive mask, f32 [B, 1 or H, S_q, S_kv], 0 or -inf ----
// One head plane when the spec has no user function (built-ins ignore the head).
Tensor materialize_additive_mask(const MaskSpec& s, const MaskGeometry& g);

// ---- use 2: tile classification ----
enum class TileClass : uint8_t { kEmpty, kPartial, kFull };
// Queries [q0, q1) x keys [k0, k1), absolute positions, for one (b, h). Exact: kEmpty means no
// pair is visible, kFull means every pair is (cost O(q1 - q0) for built-ins, plus one
// evaluation per pair when documents or a user function are present).
TileClass classify_tile(const MaskSpec& s, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t k0,
                        int64_t k1);

// ---- use 2b: a user mask evaluated once (flex attention's BlockMask) ----
// mask_mod evaluated over one call geometry and kept as bits, 64 keys per word, so that the
// fused/flex kernels classify tiles and mask partial ones by lookup and never call the
// function (PyTorch's create_block_mask; here the word also carries the partial tiles' bits).
// Build it once per forward and pass it to every layer through AttentionOptions::block_mask.
// Memory: one bit per (batch, head plane, query, key) — S_q * S_kv / 8 bytes per plane.
// Tiles are 64-key runs of the key index (key j in tile j / 64), as the fused kernel's.
class BlockMask {
 public:
  static constexpr int64_t kTile = 64;
  BlockMask() = default;
  // per_head = false: fn must not depend on the head (evaluated with h = 0; one plane).
  // Evaluated in parallel on default_pool() (fn must be thread-safe).
  static BlockMask create(const MaskFn& fn, const MaskGeometry& g, bool per_head);

  const MaskGeometry& geometry() const { return d_->geo; }
  bool per_head() const { return d_->per_head; }
  int64_t tiles() const { return d_->tiles; }
  explicit operator bool() const { return d_ != nullptr; }
  // Bits of query index qi (0-based in the call) over tile t: bit c = key index t * 64 + c.
  uint64_t word(int64_t b, int64_t h, int64_t qi, int64_t t) const {
    const int64_t plane = d_->per_head ? h : 0;
    return d_->words[static_cast<size_t>(
        ((b * d_->planes + plane) * d_->geo.q_len + qi) * d_->tiles + t)];
  }
  bool visible(int64_t b, int64_t h, int64_t qi, int64_t kj) const {
    return (word(b, h, qi, kj / kTile) >> (kj % kTile)) & 1;
  }
  // The mask as a MaskFn over absolute positions (what eager and the reference consume);
  // valid while this BlockMask or a copy of it lives.
  const MaskFn& fn() const { return d_->fn; }
  double density() const;  // fraction of visible (b, plane, q, k) pairs
  size_t bytes() const { return d_ ? d_->words.size() * sizeof(uint64_t) : 0; }

 private:
  struct Data {
    MaskGeometry geo;
    bool per_head = false;
    int64_t planes = 1, tiles = 0;
    std::vector<uint64_t> words;  // [B, planes, S_q, tiles]
    MaskFn fn;
  };
  std::shared_ptr<const Data> d_;  // shared: copies are cheap, fn() outlives moves
};

// ---- use 3: no mask needed ----
// True when every (b, h, q, kv) in the rectangle is visible, e.g. decode (q_len = 1) with a
// plain causal mask and bottom-right alignment: kernels then skip masking altogether.
bool mask_is_all_visible(const MaskSpec& s, const MaskGeometry& g);

}  // namespace kvcache
