// KVSpan: what a cache layer's update() hands to an attention kernel. A plain data type shared
// by the cache and kernel layers (kernels never include cache headers). Non-owning: the views
// point into the cache's storage and are valid until the next mutating call on that layer.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace kvcache {

// What a kernel must read. Dense or paged; quantized spans join as new kinds, and each kernel
// states which kinds it accepts.
enum class KVSpanKind { kDense, kPaged };

// Paged K/V read in place through a CSR page table (FlashInfer's layout, "page table" in its
// BatchPrefill/BatchDecode wrappers). Sequence b owns pages indices[indptr[b] .. indptr[b+1]) in
// order; its length is (n_pages - 1) * page_size + last_page_len[b] (0 when it has no page).
// Non-owning: the pool and the table arrays belong to the cache layer that produced the span.
struct PagedKV {
  TensorView k_pages;     // [num_pages, H_kv, page_size, D_k] f32/f16/bf16, unit innermost stride
  TensorView v_pages;     // [num_pages, H_kv, page_size, D_v] same dtype as k_pages
  int64_t batch = 0;      // B, number of sequences
  int64_t page_size = 0;  // slots per page (= k_pages.dim(2))
  const int32_t* indptr = nullptr;         // [B + 1], indptr[0] = 0, non-decreasing
  const int32_t* indices = nullptr;        // [indptr[B]] page ids in [0, num_pages)
  const int32_t* last_page_len = nullptr;  // [B] in [1, page_size]; 0 for a page-less sequence
  int64_t seq_len(int64_t b) const {
    const int64_t n = indptr[b + 1] - indptr[b];
    return n == 0 ? 0 : (n - 1) * page_size + last_page_len[b];
  }
};

struct KVSpan {
  KVSpanKind kind = KVSpanKind::kDense;
  TensorView k;  // [B, H_kv, S_kv, D_k], strided, in the layer's storage dtype
  TensorView v;  // [B, H_kv, S_kv, D_v]
  // Absolute position of k[:, :, 0] in the sequence (sliding/chunked layers drop the head).
  int64_t kv_offset = 0;
  PagedKV paged;  // kind == kPaged: the pages and table (k / v above are then empty)
};

}  // namespace kvcache
