// Paged attention: attention over K/V read in place through a CSR page table (core/kv_span.h
// PagedKV), for a varlen batch of sequences packed along the token axis. Views only: the cache
// owns the pages, the caller owns q/out and the cu_seqlens array.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/kv_span.h"
#include "core/tensor.h"
#include "kernels/attention.h"

namespace kvcache {

// q:   [total_q, H_q, D_k] f32, unit innermost stride. Sequence b's queries are rows
//      cu_seqlens_q[b] .. cu_seqlens_q[b+1] (cu_seqlens_q: [B + 1], [0] = 0, non-decreasing,
//      [B] = total_q), bottom-right aligned to its keys: query i of a sequence with S_q queries
//      and S_kv keys sits at absolute position options.kv_offset + S_kv - S_q + i (S_q <= S_kv).
// kv:  the pages (GQA: H_q a multiple of H_kv; query head h reads KV head h / (H_q / H_kv)).
// out: [total_q, H_q, D_v] f32, unit innermost stride.
// Honoured options: scale, causal, sliding_window, chunk_size (with chunk_offset), softcap,
// sinks, kv_offset
// (the same for every sequence), kv_split. Not supported here (Error kUnsupported): q_offset,
// mask, score, doc_ids, kv_valid_begin/end, weights_out.
// A query row that sees no key (and has no sink) produces zeros.
struct PagedAttentionArgs {
  TensorView q;
  PagedKV kv;
  const int32_t* cu_seqlens_q = nullptr;
  TensorView out;
};

// Kernels: "eager" — widens each (sequence, KV head) to f32 scratch through the page table and
// runs the dense eager kernel's arithmetic in the same order, so it is bit-identical to "eager"
// on the gathered contiguous K/V. "fused" (and its portable twin "fused_scalar") — the dense
// fused kernel's online softmax reading K/V rows in place, page by page (no gather, no widened
// copy), split-KV for long decode rows; bit-identical to dense "fused" on the gathered K/V of
// each sequence run alone. Unknown names throw Error(kInvalidArgument).
void paged_attention(std::string_view kernel, const PagedAttentionArgs& args,
                     const AttentionOptions& options);
// The same, resolved once by name (validation included): nullptr when `kernel` has no paged
// form. For callers that attend many times with one kernel (AttentionKernel).
using PagedAttentionFn = void (*)(const PagedAttentionArgs& args, const AttentionOptions& options);
PagedAttentionFn find_paged_attention_kernel(std::string_view kernel);
// The names paged_attention accepts (a runtime checks its kernel option against them before it
// serves anything: "flex" is a dense-only kernel).
const std::vector<std::string>& paged_attention_kernel_names();
bool is_paged_attention_kernel(std::string_view kernel);

// Checks the page table, shapes, dtypes and options; throws Error(kInvalidArgument /
// kUnsupported) naming the bad field. paged_attention calls it first.
void validate_paged_attention_args(const PagedAttentionArgs& args, const AttentionOptions& options);

}  // namespace kvcache
