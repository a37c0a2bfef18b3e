// The linear-attention state of a paged store (hybrid models, Qwen3-Next; issue 38): per
// sequence slot, and prefix snapshots at block boundaries.
//
// LinearStateSlots: a fixed arena [slots, slot_elems] f32, allocated once (stable address, never
// moved), outside the block pool. A slot holds every linear layer's state of one sequence,
// layer by layer: the conv window [K-1, C] then the recurrent state [H_v, d_k, d_v]. The store
// gives a sequence a slot when it is added (zeroed) and takes it back when the sequence is freed.
// Consecutive slots are slot_elems apart, so a batch of sequences on consecutive slots is one
// strided [B, ...] view per layer (no copy).
//
// LinearSnapshotStore: copies of whole slots (every linear layer) taken when a sequence's
// length reaches a snapshot boundary, keyed by the block key of the block ending there (the
// key hashes the whole token prefix, salt and group included, so the state is a function of
// it). A fixed arena of `capacity` snapshots, preallocated: bytes() is exact and constant;
// when full, put() replaces the least recently used. The store erases a snapshot when the
// block pool drops its key (the block is evicted), so snapshots go with their blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cache/block_pool.h"
#include "cache/cache.h"
#include "core/tensor.h"

namespace kvcache {

// Element counts of one linear layer's state and of a slot (n_layers linear layers).
// A slot may carry extra_elems more floats after the linear layers' state: the compressors'
// state of CSA/HCA layers (issue 39), which lives per sequence the same way.
struct LinearSlotLayout {
  LinearStateShape shape;
  int n_layers = 0;
  int64_t extra_elems = 0;
  int64_t conv_elems() const { return (shape.conv_kernel - 1) * shape.conv_dim; }
  int64_t rec_elems() const { return shape.heads_v * shape.head_dim_k * shape.head_dim_v; }
  int64_t layer_elems() const { return conv_elems() + rec_elems(); }
  int64_t slot_elems() const { return layer_elems() * n_layers + extra_elems; }
  size_t slot_bytes() const { return static_cast<size_t>(slot_elems()) * sizeof(float); }
};

class LinearStateSlots {
 public:
  LinearStateSlots(const LinearSlotLayout& layout, int32_t slots);
  const LinearSlotLayout& layout() const { return layout_; }
  int32_t num_slots() const { return static_cast<int32_t>(used_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  // A zeroed slot, lowest free first; -1 when every slot is in use.
  int32_t acquire();
  void release(int32_t slot);
  bool in_use(int32_t slot) const;
  float* slot_data(int32_t slot);
  const float* slot_data(int32_t slot) const;
  // Layer li's (index among the linear layers) conv window [K-1, C] and recurrent state.
  float* conv(int32_t slot, int li) { return slot_data(slot) + li * layout_.layer_elems(); }
  float* rec(int32_t slot, int li) { return conv(slot, li) + layout_.conv_elems(); }
  void zero(int32_t slot);
  void copy(int32_t src, int32_t dst);
  // Exact: the arena (slots x slot_bytes) and the bookkeeping vectors.
  size_t bytes() const;
  static size_t predict_bytes(const LinearSlotLayout& layout, int32_t slots);

 private:
  LinearSlotLayout layout_;
  Tensor data_;                // [slots, slot_elems] f32
  std::vector<int32_t> free_;  // stack, lowest on top
  std::vector<uint8_t> used_;  // [slots]
};

struct LinearSnapshotStats {
  int64_t puts = 0, hits = 0, evictions = 0, dropped_with_block = 0;
};

class LinearSnapshotStore {
 public:
  LinearSnapshotStore(int64_t snapshot_elems, int32_t capacity);
  int32_t capacity() const { return static_cast<int32_t>(entries_.size()); }
  int32_t size() const { return size_; }
  int64_t snapshot_elems() const { return elems_; }
  // Stores a copy of data[snapshot_elems] taken at `position` tokens under `key` (replacing one
  // under the same key; when full, the least recently used). false: capacity 0.
  bool put(const BlockKey& key, int64_t position, const float* data);
  bool contains(const BlockKey& key) const { return find_index(key) >= 0; }
  // The snapshot under `key`, marked most recently used; nullptr when none. Valid until the
  // next put or erase.
  const float* get(const BlockKey& key);
  int64_t position(const BlockKey& key) const;  // -1: none
  // The largest n <= keys.size() such that keys[n - 1] has a snapshot (keys: a prompt's block
  // keys in order, so n blocks = the latest snapshot at or before keys.size() blocks); 0: none.
  int64_t latest_at_or_before(std::span<const BlockKey> keys) const;
  // Drops the snapshot under `key` (if any); returns whether there was one.
  bool erase(const BlockKey& key);
  // erase() because the block pool dropped the key (counted in stats().dropped_with_block).
  bool drop_with_block(const BlockKey& key);
  void clear();
  const LinearSnapshotStats& stats() const { return stats_; }
  // Exact and constant: the arena (capacity x snapshot_elems f32) and the entry table.
  size_t bytes() const;
  static size_t predict_bytes(int64_t snapshot_elems, int32_t capacity);

 private:
  struct Entry {
    bool live = false;
    BlockKey key;
    int64_t position = 0;
    uint64_t last_use = 0;
  };
  int32_t find_index(const BlockKey& key) const;

  int64_t elems_ = 0;
  Tensor data_;  // [capacity, elems] f32
  std::vector<Entry> entries_;
  int32_t size_ = 0;
  uint64_t clock_ = 0;
  LinearSnapshotStats stats_;
};

}  // namespace kvcache
