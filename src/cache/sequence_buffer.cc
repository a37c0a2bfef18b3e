#include "cache/sequence_buffer.h"

#include <cstring>

#include "core/error.h"

namespace kvcache {

void SequenceBuffer::allocate(const SequenceBufferShape& shape, int64_t batch_capacity,
                              int64_t capacity) {
  KV_CHECK(shape.batch <= batch_capacity && capacity >= 0, "bad SequenceBuffer geometry");
  KV_CHECK(dtype_is_float(shape.dtype), "SequenceBuffer stores float dtypes only");
  KV_CHECK(!shape.shared_kv || shape.head_dim_k == shape.head_dim_v, "K == V needs D_k == D_v");
  k_ = Tensor();  // release first: peak memory is one buffer, not two
  v_ = Tensor();
  k_ = Tensor::empty(shape.dtype, {batch_capacity, shape.heads, capacity, shape.head_dim_k});
  if (!shape.shared_kv)
    v_ = Tensor::empty(shape.dtype, {batch_capacity, shape.heads, capacity, shape.head_dim_v});
  shape_ = shape;
  batch_capacity_ = batch_capacity;
  capacity_ = capacity;
  begin_ = end_ = 0;
  allocated_ = true;
}

TensorView SequenceBuffer::slots(const Tensor& t, int64_t head_dim, int64_t from,
                                 int64_t to) const {
  KV_CHECK(0 <= from && from <= to && to <= capacity_, "slot range outside the storage");
  const int64_t seq_stride = head_dim;
  const int64_t head_stride = capacity_ * head_dim;
  const int64_t batch_stride = shape_.heads * head_stride;
  auto* base = static_cast<std::byte*>(t.data());
  if (base != nullptr) base += dtype_bytes(shape_.dtype, from * seq_stride);
  return TensorView(base, shape_.dtype, {shape_.batch, shape_.heads, to - from, head_dim},
                    Dims{batch_stride, head_stride, seq_stride, 1});
}

TensorView SequenceBuffer::k_slots(int64_t from, int64_t to) const {
  return slots(k_, shape_.head_dim_k, from, to);
}
TensorView SequenceBuffer::v_slots(int64_t from, int64_t to) const {
  return slots(shape_.shared_kv ? k_ : v_, shape_.head_dim_v, from, to);
}

size_t SequenceBuffer::token_bytes() const {
  const int64_t dims = shape_.head_dim_k + (shape_.shared_kv ? 0 : shape_.head_dim_v);
  return dtype_bytes(shape_.dtype, shape_.heads * dims);
}

void SequenceBuffer::append(const TensorView& k, const TensorView& v) {
  const int64_t n = k.dim(2);
  KV_CHECK(end_ + n <= capacity_, "append past the capacity (the container must check)");
  copy_view(k, k_slots(end_, end_ + n));
  if (!shape_.shared_kv) copy_view(v, v_slots(end_, end_ + n));
  end_ += n;
}

void SequenceBuffer::set_window(int64_t begin, int64_t end) {
  KV_CHECK(0 <= begin && begin <= end && end <= capacity_, "window outside the storage");
  begin_ = begin;
  end_ = end;
}

void SequenceBuffer::set_batch(int64_t batch) {
  KV_CHECK(size() == 0 && batch > 0 && batch <= batch_capacity_, "set_batch on a live buffer");
  shape_.batch = batch;
}

size_t SequenceBuffer::compact() {
  if (begin_ == 0) return 0;
  const int64_t n = size();
  size_t moved = 0;
  // Each (row, head) holds its tokens contiguously, so one memmove per pair; the source and
  // destination overlap when n > begin_.
  for (const auto& [t, d] :
       {std::pair{&k_, shape_.head_dim_k}, std::pair{&v_, shape_.head_dim_v}}) {
    if (t == &v_ && shape_.shared_kv) continue;
    const TensorView dst = slots(*t, d, 0, n);
    const TensorView src = slots(*t, d, begin_, end_);
    const size_t run = dtype_bytes(shape_.dtype, n * d);
    for (int64_t b = 0; b < shape_.batch; ++b)
      for (int64_t h = 0; h < shape_.heads; ++h) {
        std::memmove(dst.ptr(b, h), src.ptr(b, h), run);
        moved += run;
      }
  }
  begin_ = 0;
  end_ = n;
  stats_.bytes_copied += moved;
  stats_.compactions += 1;
  return moved;
}

void SequenceBuffer::reallocate(int64_t batch_capacity, int64_t capacity) {
  KV_CHECK(capacity >= size() && batch_capacity >= shape_.batch, "reallocate would lose tokens");
  Tensor nk =
      Tensor::empty(shape_.dtype, {batch_capacity, shape_.heads, capacity, shape_.head_dim_k});
  Tensor nv = shape_.shared_kv ? Tensor()
                               : Tensor::empty(shape_.dtype, {batch_capacity, shape_.heads,
                                                              capacity, shape_.head_dim_v});
  SequenceBuffer next;
  next.k_ = std::move(nk);
  next.v_ = std::move(nv);
  next.shape_ = shape_;
  next.batch_capacity_ = batch_capacity;
  next.capacity_ = capacity;
  const int64_t n = size();
  if (n > 0) {
    stats_.bytes_copied += copy_view(k_slots(begin_, end_), next.k_slots(0, n));
    if (!shape_.shared_kv)
      stats_.bytes_copied += copy_view(v_slots(begin_, end_), next.v_slots(0, n));
  }
  k_ = std::move(next.k_);
  v_ = std::move(next.v_);
  batch_capacity_ = batch_capacity;
  capacity_ = capacity;
  begin_ = 0;
  end_ = n;
  stats_.reallocations += 1;
}

void SequenceBuffer::gather_rows(std::span<const int64_t> rows) {
  const auto new_batch = static_cast<int64_t>(rows.size());
  KV_CHECK(new_batch > 0, "gather_rows needs at least one row");
  for (int64_t r : rows) KV_CHECK(0 <= r && r < shape_.batch, "gather_rows index out of range");
  const int64_t n = size();
  if (new_batch > batch_capacity_) {
    // Grow the row capacity: copy the selected rows straight into the new storage.
    SequenceBuffer next;
    SequenceBufferShape s = shape_;
    s.batch = new_batch;
    next.allocate(s, new_batch, capacity_);
    for (int64_t i = 0; i < new_batch; ++i) {
      const auto r = rows[static_cast<size_t>(i)];
      stats_.bytes_copied += copy_view(k_slots(begin_, end_).slice(0, r, r + 1),
                                       next.k_slots(0, n).slice(0, i, i + 1));
      if (!shape_.shared_kv)
        stats_.bytes_copied += copy_view(v_slots(begin_, end_).slice(0, r, r + 1),
                                         next.v_slots(0, n).slice(0, i, i + 1));
    }
    k_ = std::move(next.k_);
    v_ = std::move(next.v_);
    shape_.batch = new_batch;
    batch_capacity_ = new_batch;
    begin_ = 0;
    end_ = n;
    stats_.reallocations += 1;
    return;
  }
  // In place: snapshot the live window of the old rows, then write the selected rows back.
  // The scratch is allocated per call: reorder/select run once per beam step, not per token.
  const bool shared = shape_.shared_kv;
  const TensorView old_k = k_slots(begin_, end_);
  const TensorView old_v = v_slots(begin_, end_);
  Tensor sk = Tensor::empty(shape_.dtype, old_k.shape());
  Tensor sv = shared ? Tensor() : Tensor::empty(shape_.dtype, old_v.shape());
  stats_.bytes_copied += copy_view(old_k, sk.view());
  if (!shared) stats_.bytes_copied += copy_view(old_v, sv.view());
  shape_.batch = new_batch;
  const TensorView new_k = k_slots(begin_, end_);
  const TensorView new_v = v_slots(begin_, end_);
  for (int64_t i = 0; i < new_batch; ++i) {
    const auto r = rows[static_cast<size_t>(i)];
    stats_.bytes_copied += copy_view(sk.view().slice(0, r, r + 1), new_k.slice(0, i, i + 1));
    if (!shared)
      stats_.bytes_copied += copy_view(sv.view().slice(0, r, r + 1), new_v.slice(0, i, i + 1));
  }
}

}  // namespace kvcache
