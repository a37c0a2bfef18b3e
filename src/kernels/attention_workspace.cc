// Workspace planning for the attention kernels (see attention_workspace.h).
#include "kernels/attention_workspace.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/attention_internal.h"

namespace kvcache {

size_t attention_workspace_bytes(const AttentionShape& shape) {
  if (shape.batch < 0 || shape.q_len < 0 || shape.kv_len < 0 || shape.heads_q < 1 ||
      shape.heads_kv < 1 || shape.heads_q % shape.heads_kv != 0 || shape.head_dim_k < 0 ||
      shape.head_dim_v < 0 || shape.quant_group < 0)
    throw Error(
        ErrorKind::kInvalidArgument,
        "attention_workspace_bytes: dimensions must be >= 0 and H_q a multiple of H_kv >= 1");
  const int64_t threads = shape.n_threads > 0 ? shape.n_threads : default_pool().n_threads();
  return shape.quant_group > 0 ? detail::quantized_workspace_bytes(shape, threads)
                               : detail::fused_workspace_bytes(shape, threads);
}

AttentionShape attention_shape(const TensorView& q, const KVSpan& span,
                               const AttentionOptions& options) {
  AttentionShape s;
  const bool rows = q.ndim() == 3;  // paged [total_q, H_q, D_k]
  s.heads_q = q.dim(1);
  s.q_len = rows ? q.dim(0) : q.dim(2);
  s.head_dim_k = q.dim(rows ? 2 : 3);
  s.kv_split = options.kv_split;
  switch (span.kind) {
    case KVSpanKind::kDense:
      s.batch = q.dim(0);
      s.heads_kv = span.k.dim(1);
      s.kv_len = span.k.dim(2);
      s.head_dim_v = span.v.dim(3);
      break;
    case KVSpanKind::kPaged:
      s.batch = span.paged.batch;
      s.heads_kv = span.paged.k_pages.dim(1);
      s.head_dim_v = span.paged.v_pages.dim(3);
      for (int64_t b = 0; b < span.paged.batch; ++b)
        s.kv_len = std::max(s.kv_len, span.paged.seq_len(b));
      break;
    case KVSpanKind::kQuantized:
      s.batch = q.dim(0);
      s.heads_kv = span.quant.heads;
      s.kv_len = span.quant.seq_len();
      s.head_dim_v = span.quant.head_dim_v;
      s.quant_group = span.quant.group;
      s.quant_v_group = span.quant.v_group;
      s.quant_scheme = span.quant.scheme;
      break;
    case KVSpanKind::kPagedQuantized:
      throw Error(ErrorKind::kUnsupported,
                  "attention workspace: a paged quantized span is planned one sequence at a time "
                  "(AttentionKernel::attend_paged_quantized)");
  }
  return s;
}

std::span<std::byte> AttentionWorkspace::reserve(size_t bytes) {
  if (bytes > size_) {
    const size_t n = std::max(bytes, 2 * size_);
    data_ = allocate_large(n);
    if (!data_) {
      size_ = 0;
      throw Error(ErrorKind::kOutOfRange,
                  "attention workspace: cannot allocate " + std::to_string(n) + " bytes");
    }
    size_ = n;
  }
  return {data_.get(), size_};
}

std::span<std::byte> AttentionWorkspace::reserve_for(const TensorView& q, const KVSpan& span,
                                                     const AttentionOptions& options) {
  return reserve(attention_workspace_bytes(attention_shape(q, span, options)));
}

std::span<std::byte> AttentionWorkspace::reserve_for(const TensorView& q, const TensorView& k,
                                                     const TensorView& v,
                                                     const AttentionOptions& options) {
  KVSpan span;
  span.k = k;
  span.v = v;
  return reserve_for(q, span, options);
}

}  // namespace kvcache
