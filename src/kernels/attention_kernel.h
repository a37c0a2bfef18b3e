// AttentionKernel: model code's one attention call, for whatever KV span a cache returns. The
// kernel is chosen once, by name (kernels/attention.h's table), and attend() reads the span
// where the cache keeps it:
//   dense      the named dense kernel (eager, fused, flex, fused_scalar)
//   paged      paged_attention under the same name (eager, fused, fused_scalar; flex has no
//              paged form)
//   quantized  quantized_attention, whatever the name (one kernel reads the packed codes)
//   paged quantized  quantized_attention per sequence, through its block table
// A span kind the kernel cannot read is an Error(kUnsupported) naming the kernel and the kind.
// Owns the varlen query offsets it hands the paged kernels and the kernels' scratch (an
// AttentionWorkspace planned per call, grown to the largest call and never shrunk, so a decode
// step allocates nothing). Not thread-safe; one per forward.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/kv_span.h"
#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/attention_workspace.h"
#include "kernels/paged_attention.h"

namespace kvcache {

// Where a call's queries sit: q[b, :, i] is at absolute position of(b) + i.
struct QueryPositions {
  int64_t pos0 = 0;                   // every batch row's first query ...
  const int64_t* row_pos0 = nullptr;  // ... unless each row has its own ([B]; paged spans only)
  int64_t shift = 0;                  // added to every row (a chunk's last query: S - 1)
  int64_t of(int64_t b) const { return (row_pos0 != nullptr ? row_pos0[b] : pos0) + shift; }
};

class AttentionKernel {
 public:
  // Error(kInvalidArgument) listing the registered names when `name` is unknown.
  explicit AttentionKernel(std::string_view name);

  const std::string& name() const { return name_; }
  bool reads(KVSpanKind kind) const;

  // q:   [B, H_q, S_q, D_k] f32, unit innermost stride, batch stride S_q x query stride (the
  //      views of row-major [B * S_q, H_q * D_k] activations: the paged kernels take them as
  //      the packed varlen layout)
  // out: [B, H_q, S_q, D_v] f32, laid out like q
  // The span holds, for every batch row, the keys its queries see, ending with their own:
  // query i of row b sits at at.of(b) + i, and the last one at the span's last position (an
  // Error otherwise: such a span cannot be what the cache returned for these queries). Rows at
  // different positions need a paged span. `options` gives the scale, window, chunk, softcap
  // and sinks; kv_offset and q_offset come from the span and `at`.
  void attend(const TensorView& q, const KVSpan& span, const TensorView& out,
              AttentionOptions options, const QueryPositions& at);

  // Only the last query of each batch row of q (as in attend()), with the bits that row gets
  // from attend() over all of q: one query per row where the kernel promises it (a decode
  // row of eager, fused and the paged kernels equals its prefill row); the quantized kernel
  // attends every row into out_all and its last rows are moved. out_last: [B, H_q, 1, D_v].
  void attend_last(const TensorView& q, const KVSpan& span, const TensorView& out_all,
                   const TensorView& out_last, const AttentionOptions& options,
                   const QueryPositions& at);

 private:
  void attend_paged(const TensorView& q, const KVSpan& span, const TensorView& out,
                    AttentionOptions options);
  void attend_paged_quantized(const TensorView& q, const KVSpan& span, const TensorView& out,
                              AttentionOptions options, const QueryPositions& at);

  std::string name_;
  AttentionFn dense_ = nullptr;
  PagedAttentionFn paged_ = nullptr;   // paged_attention's kernel of this name, if any
  std::vector<int32_t> cu_seqlens_q_;  // [B + 1] query rows per sequence (paged spans)
  AttentionWorkspace workspace_;       // AttentionOptions::workspace of every call
};

}  // namespace kvcache
