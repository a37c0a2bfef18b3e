// KVSpan: what a cache layer's update() hands to an attention kernel. A plain data type shared
// by the cache and kernel layers (kernels never include cache headers). Non-owning: the views
// point into the cache's storage and are valid until the next mutating call on that layer.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace kvcache {

// What a kernel must read: dense views, pages through a table, or packed quantized blocks plus a
// full-precision residual. Each kernel states which kinds it accepts.
enum class KVSpanKind { kDense, kPaged, kQuantized, kPagedQuantized };

// Paged K/V read in place through a CSR page table (FlashInfer's layout, "page table" in its
// BatchPrefill/BatchDecode wrappers). A page is one layer's storage of one cache block, so it
// holds block_tokens slots (FlashInfer's page_size). Sequence b owns pages
// indices[indptr[b] .. indptr[b+1]) in order; its length is
// (n_pages - 1) * block_tokens + last_page_len[b] (0 when it has no page).
// Non-owning: the pool and the table arrays belong to the cache layer that produced the span.
struct PagedKV {
  // [num_pages, H_kv, block_tokens, D_k] f32/f16/bf16, unit innermost stride
  TensorView k_pages;
  TensorView v_pages;                // [num_pages, H_kv, block_tokens, D_v] same dtype as k_pages
  int64_t batch = 0;                 // B, number of sequences
  int64_t block_tokens = 0;          // slots per page (= k_pages.dim(2))
  const int32_t* indptr = nullptr;   // [B + 1], indptr[0] = 0, non-decreasing
  const int32_t* indices = nullptr;  // [indptr[B]] page ids in [0, num_pages)
  const int32_t* last_page_len = nullptr;  // [B] in [1, block_tokens]; 0: a page-less sequence
  // [B] or nullptr (all 0): row b's keys are read as positions kv_offset + j, but its true
  // positions end row_offset[b] later — a StreamingLLM row whose table skips the blocks its
  // policy released (cache/paged_store.h). Kernels need not read it: their masks then see a
  // contiguous row ending with its queries, exact for causal attention (relative); the store
  // never compacts a group with a window or chunk mask. Position checks add it (span ends).
  const int64_t* row_offset = nullptr;
  int64_t offset(int64_t b) const { return row_offset != nullptr ? row_offset[b] : 0; }
  int64_t seq_len(int64_t b) const {
    const int64_t n = indptr[b + 1] - indptr[b];
    return n == 0 ? 0 : (n - 1) * block_tokens + last_page_len[b];
  }
};

// How the packed part of a quantized span is encoded (layouts in kernels/kv_quant.h).
enum class KVQuantScheme : uint8_t {
  // KIVI (Liu et al. 2024): keys per channel (a block quantizes `group` tokens of one channel),
  // values per token (groups of QuantKV::v_group channels); asymmetric, 2/4/8 bits, f16 scale
  // and f16 zero point per group.
  kKivi,
  // llama.cpp's per-token KV cache types, for comparison: every token row of K and of V is cut
  // into blocks of 32 channels with one f16 scale each; symmetric. q8_0: int8 codes (34 bytes
  // per 32); q4_0: 4-bit codes with an offset of 8 (18 bytes per 32). D must be a multiple of 32.
  kQ8_0,
  kQ4_0,
};

// Quantized K/V read in place: `n_blocks` packed blocks of `group` tokens per (batch row, KV
// head), oldest first, followed by the residual's tokens in full precision. Token t of the span
// (t < n_blocks * group) lives in block t / group; the rest are residual rows. Non-owning: the
// bytes and the residual belong to the cache layer that produced the span.
struct QuantKV {
  KVQuantScheme scheme = KVQuantScheme::kKivi;
  int bits = 4;            // code width: 2, 4 or 8
  int64_t group = 64;      // tokens per packed block (KIVI: the key group along tokens)
  int64_t v_group = 64;    // value channels sharing a scale/zero (divides D_v)
  int64_t batch = 0;       // B
  int64_t heads = 0;       // H_kv
  int64_t head_dim_k = 0;  // D_k
  int64_t head_dim_v = 0;  // D_v
  int64_t n_blocks = 0;    // packed blocks per (b, h)
  // Block (b, h, i) of K starts at k_blocks + b * k_batch_stride + h * k_head_stride +
  // i * k_block_bytes (bytes); likewise for V.
  const std::byte* k_blocks = nullptr;
  const std::byte* v_blocks = nullptr;
  int64_t k_block_bytes = 0, v_block_bytes = 0;
  int64_t k_head_stride = 0, v_head_stride = 0;
  int64_t k_batch_stride = 0, v_batch_stride = 0;
  // Paged pools (PagedQuantKV): when set, block i of (0, h) starts at k_blocks +
  // block_ids[i] * k_page_stride + h * k_head_stride (batch must be 1; the batch strides and
  // k_block_bytes' role as the block-to-block step are unused); likewise for V.
  const int32_t* block_ids = nullptr;
  int64_t k_page_stride = 0, v_page_stride = 0;
  TensorView k_residual;  // [B, H_kv, n_res, D_k] f32/f16/bf16, unit innermost stride
  TensorView v_residual;  // [B, H_kv, n_res, D_v] same dtype
  int64_t packed_len() const { return n_blocks * group; }
  int64_t residual_len() const { return k_residual.ndim() == 4 ? k_residual.dim(2) : 0; }
  int64_t seq_len() const { return packed_len() + residual_len(); }
  const std::byte* k_block(int64_t b, int64_t h, int64_t i) const {
    if (block_ids != nullptr) return k_blocks + block_ids[i] * k_page_stride + h * k_head_stride;
    return k_blocks + b * k_batch_stride + h * k_head_stride + i * k_block_bytes;
  }
  const std::byte* v_block(int64_t b, int64_t h, int64_t i) const {
    if (block_ids != nullptr) return v_blocks + block_ids[i] * v_page_stride + h * v_head_stride;
    return v_blocks + b * v_batch_stride + h * v_head_stride + i * v_block_bytes;
  }
};

// A quantized paged pool read in place (cache/paged_store.h, "Quantized pages"): batch row b is
// one sequence, described by rows[b], a QuantKV of batch 1 whose packed blocks (its full blocks,
// each one group of `group` = block_tokens tokens) are found through its block table
// (QuantKV::block_ids), followed by its residual (the partial last block plus the open step's
// tokens, in the pool's storage dtype). Its first key sits at absolute position kv_offset[b]
// (sliding groups start after the blocks they released; 0 otherwise). Rows may differ in
// length. Non-owning: the store owns the rows, tables, pages and residuals.
struct PagedQuantKV {
  int64_t batch = 0;
  const QuantKV* rows = nullptr;       // [batch]
  const int64_t* kv_offset = nullptr;  // [batch]
  int64_t seq_len(int64_t b) const { return rows[b].seq_len(); }
};

struct KVSpan {
  KVSpanKind kind = KVSpanKind::kDense;
  TensorView k;  // [B, H_kv, S_kv, D_k], strided, in the layer's storage dtype
  TensorView v;  // [B, H_kv, S_kv, D_v]
  // Absolute position of k[:, :, 0] in the sequence (sliding/chunked layers drop the head).
  int64_t kv_offset = 0;
  PagedKV paged;  // kind == kPaged: the pages and table (k / v above are then empty)
  QuantKV quant;  // kind == kQuantized: packed blocks + residual (k / v above are then empty)
  PagedQuantKV paged_quant;  // kind == kPagedQuantized (kv_offset above unused: per row)
};

}  // namespace kvcache
