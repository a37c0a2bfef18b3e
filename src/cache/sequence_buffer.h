// SequenceBuffer: the storage every dense cache container is built on. It owns one K tensor
// and one V tensor of `capacity` token slots and tracks a window [begin, end) of live slots
// along the sequence axis; containers decide the policy (grow, fail, compact, trim) and the
// buffer does the bytes. Views it returns point into its storage and are invalidated by
// allocate/reallocate (and, for the slots they cover, by compact/append/gather_rows).
//
//   k storage: [B_cap, H_kv, capacity, D_k]      v storage: [B_cap, H_kv, capacity, D_v]
//
// D_k and D_v may differ (MLA caches a 512-wide latent in one slot and a 64-wide rope key in
// the other). With shape.shared_kv there is no V storage: V is K. Rows [0, batch) are live; B_cap
// >= batch lets select() shrink without a copy of the storage and a later repeat_interleave()
// regrow into it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "cache/cache_layer.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace kvcache {

struct SequenceBufferShape {
  int64_t batch = 0;       // live rows
  int64_t heads = 0;       // H_kv
  int64_t head_dim_k = 0;  // D_k
  int64_t head_dim_v = 0;  // D_v
  DType dtype = DType::kF16;
  // K == V (CacheConfig::KVContent::kSharedKV): only K is stored (head_dim_v must equal
  // head_dim_k); v_slots() are views of the K storage and append() reads k only.
  bool shared_kv = false;
};

class SequenceBuffer {
 public:
  // Allocates empty storage (the previous storage, if any, is released first).
  void allocate(const SequenceBufferShape& shape, int64_t batch_capacity, int64_t capacity);
  bool allocated() const { return allocated_; }

  const SequenceBufferShape& shape() const { return shape_; }
  int64_t batch() const { return shape_.batch; }
  int64_t batch_capacity() const { return batch_capacity_; }
  int64_t capacity() const { return capacity_; }
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }
  int64_t size() const { return end_ - begin_; }

  // Strided views of slots [from, to) of the live rows: [batch, H_kv, to - from, D_k|D_v].
  TensorView k_slots(int64_t from, int64_t to) const;
  TensorView v_slots(int64_t from, int64_t to) const;
  // Base of the K storage: stable until allocate/reallocate (static containers test it).
  const void* k_storage() const { return k_.data(); }
  const void* v_storage() const { return v_.data(); }

  // Writes k, v ([batch, H_kv, n, D], any float dtype, converted) at slot end(); end += n.
  // The caller has checked shapes and room (end() + n <= capacity()).
  void append(const TensorView& k, const TensorView& v);
  // Moves the window to [begin, end) without touching data (trim the front, crop the back).
  void set_window(int64_t begin, int64_t end);
  // Live rows become `batch` (only while empty; batch <= batch_capacity()).
  void set_batch(int64_t batch);
  // Moves the live window to slot 0 (memmove per row); returns bytes moved.
  size_t compact();
  // Replaces the storage by one of the given capacities, with the live window copied to
  // slot 0 (rows [0, batch)). Counted in stats.
  void reallocate(int64_t batch_capacity, int64_t capacity);
  // Row i of the result is old row rows[i]; the batch becomes rows.size(). In place (through
  // a scratch copy of the live window) when it fits batch_capacity(); otherwise the storage is
  // reallocated with batch capacity rows.size(). The caller validated the indices.
  void gather_rows(std::span<const int64_t> rows);

  // Bytes of the K and V storage (capacity, not live size; K only when shared_kv).
  size_t bytes() const { return k_.size_bytes() + v_.size_bytes(); }
  // Bytes of one token of one row, K plus V (K only when shared_kv).
  size_t token_bytes() const;
  const CopyStats& stats() const { return stats_; }
  CopyStats& mutable_stats() { return stats_; }

 private:
  TensorView slots(const Tensor& t, int64_t head_dim, int64_t from, int64_t to) const;

  Tensor k_;  // [batch_capacity_, H_kv, capacity_, D_k]
  Tensor v_;  // [batch_capacity_, H_kv, capacity_, D_v]; empty when shape_.shared_kv
  SequenceBufferShape shape_;
  int64_t batch_capacity_ = 0;
  int64_t capacity_ = 0;
  int64_t begin_ = 0;
  int64_t end_ = 0;
  bool allocated_ = false;
  CopyStats stats_;
};

}  // namespace kvcache
