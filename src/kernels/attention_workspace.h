// Workspace planning for the attention kernels that keep scratch: fused / flex / fused_scalar,
// their paged versions, and quantized_attention. Plan, then run (FlashInfer's plan/run): a caller
// asks attention_workspace_bytes() for the bytes a call shape needs, owns that memory, and
// passes it in AttentionOptions::workspace; the kernel carves its per-thread tile buffers and
// split-KV partial states from it and allocates nothing. AttentionWorkspace is that memory for a
// caller that sizes it per call (a model's forward, whose cache grows).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "core/kv_span.h"
#include "core/tensor.h"
#include "kernels/attention.h"

namespace kvcache {

// The largest call a workspace serves: every dimension an upper bound.
struct AttentionShape {
  int64_t batch = 1;     // sequences (dense: B; paged: sequences of the varlen batch)
  int64_t heads_q = 1;   // H_q
  int64_t heads_kv = 1;  // H_kv
  int64_t q_len = 1;     // queries per sequence
  int64_t kv_len = 0;    // keys per sequence (quantized: packed + residual)
  int64_t head_dim_k = 0, head_dim_v = 0;
  int64_t kv_split = 0;  // AttentionOptions::kv_split of the calls
  // Quantized spans (QuantKV): tokens per packed block (QuantKV::group; 0 for dense and paged
  // K/V), value channels per group (QuantKV::v_group, KIVI) and the scheme.
  int64_t quant_group = 0;
  int64_t quant_v_group = 0;
  KVQuantScheme quant_scheme = KVQuantScheme::kKivi;
  int n_threads = 0;  // threads of the pool the kernels run on; 0: default_pool()'s
};

// Bytes of AttentionOptions::workspace enough for any call whose batch, q_len and kv_len are at
// most the shape's (with the same heads, head dims, kv_split, quantization and thread count),
// for any alignment of the bytes. Kernels without scratch (eager) need none of it.
size_t attention_workspace_bytes(const AttentionShape& shape);

// The shape of one call of attend_span (dense or quantized span) or of the paged kernels:
// q [B, H_q, S_q, D_k] (paged: also [total_q, H_q, D_k], taken as S_q = total_q).
AttentionShape attention_shape(const TensorView& q, const KVSpan& span,
                               const AttentionOptions& options);

// Workspace memory a caller keeps across calls. reserve() grows it to at least `bytes` (at
// least doubling, so a cache growing a token at a time reallocates O(log n) times) and never
// shrinks it; the span stays valid until the next reserve() that grows.
class AttentionWorkspace {
 public:
  std::span<std::byte> reserve(size_t bytes);
  // reserve(attention_workspace_bytes(attention_shape(...))) for one call: a span of any kind,
  // or dense k [B, H_kv, S_kv, D_k] / v views.
  std::span<std::byte> reserve_for(const TensorView& q, const KVSpan& span,
                                   const AttentionOptions& options);
  std::span<std::byte> reserve_for(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const AttentionOptions& options);
  size_t bytes() const { return size_; }

 private:
  std::unique_ptr<std::byte, AlignedFree> data_;
  size_t size_ = 0;
};

}  // namespace kvcache
