// Internal to the kernels layer: the argument checks and the span row access shared by the
// sparse attention reference (sparse_attention_reference.cc) and the fast kernels
// (sparse_attention.cc), so both accept exactly the same calls and read the same rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "core/kv_span.h"
#include "core/tensor.h"
#include "kernels/sparse_attention.h"

namespace kvcache::detail {

// Rows of one part (K or V) of a dense or paged span: row(b, h, j) is the address of token /
// entry j of batch row b, KV head h (f32, f16 or bf16, unit innermost stride). Reads nothing.
struct SpanRows {
  const std::byte* base = nullptr;
  DType dtype = DType::kF32;
  int64_t width = 0;               // D of a row
  int64_t s0 = 0, s1 = 0, s2 = 0;  // byte strides: batch (dense) or page, head, token/slot
  const PagedKV* paged = nullptr;  // set: the rows go through its page table
  const std::byte* row(int64_t b, int64_t h, int64_t j) const {
    if (paged == nullptr) return base + b * s0 + h * s1 + j * s2;
    const int64_t bt = paged->block_tokens;
    const int64_t page = paged->indices[paged->indptr[b] + j / bt];
    return base + page * s0 + h * s1 + (j % bt) * s2;
  }
};

// A checked span: absent (ndim 0 dense k: "no window", "no entries"), else its heads, widths,
// storage dtype, per-row length and the two parts. v_is_k: the v part is the k part (an empty v
// view or one aliasing k), so a kernel may widen a row once for both.
struct SpanInfo {
  bool present = false;
  int64_t heads = 0, dk = 0, dv = 0;
  DType dtype = DType::kF32;
  bool v_is_k = false;
  int64_t kv_offset = 0;
  SpanRows k, v;
  const KVSpan* span = nullptr;
  int64_t length(int64_t b) const;  // rows of batch row b (0 when absent)
};

// The checked arguments of a sparse_attention call.
struct SparsePlan {
  int64_t B = 0, Hq = 0, S = 0, D = 0, Dv = 0, Hkv = 1, G = 1;
  float scale = 1.0f;
  int64_t W = 0;
  SpanInfo window, entries;
  // Query (b, t) sees window rows [win_lo, win_hi) (span row indices) and entry rows below
  // limit; selected (when set) lists its entries.
  int64_t pos(int64_t b, int64_t t) const { return pos_[static_cast<size_t>(b)] + t; }
  void window_rows(int64_t b, int64_t t, int64_t& lo, int64_t& hi) const;
  int64_t limit(int64_t b, int64_t t) const;  // entries visible to query (b, t)
  std::span<const int64_t> pos_;
  int64_t rate_ = 1;
};

// Throws Error(kInvalidArgument / kUnsupported) "<who>: ..." on any bad argument, before the
// caller writes anything.
SparsePlan check_sparse_attention(const char* who, const TensorView& q, const KVSpan& window,
                                  const KVSpan& entries, std::span<const int64_t> pos,
                                  const SparseAttentionParams& params, const TensorView& out);

struct IndexerPlan {
  int64_t B = 0, S = 0, HI = 0, C = 0;
  SpanInfo keys;
  std::span<const int64_t> pos;
  int64_t limit(int64_t b, int64_t t, int64_t rate) const {
    return (pos[static_cast<size_t>(b)] + t + 1) / rate;
  }
};
IndexerPlan check_indexer_topk(const char* who, const TensorView& q_index,
                               const TensorView& weights, const KVSpan& keys,
                               std::span<const int64_t> pos, const IndexerParams& params,
                               const int32_t* selected);

}  // namespace kvcache::detail
