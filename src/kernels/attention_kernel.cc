#include "kernels/attention_kernel.h"

#include <cstring>

#include "core/error.h"
#include "kernels/attention_quant.h"

namespace kvcache {

namespace {

const char* kind_name(KVSpanKind kind) {
  switch (kind) {
    case KVSpanKind::kDense:
      return "dense";
    case KVSpanKind::kPaged:
      return "paged";
    case KVSpanKind::kQuantized:
      return "quantized";
    case KVSpanKind::kPagedQuantized:
      return "paged quantized";
  }
  return "unknown";
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// Keys of the span for batch row b, and the position after its last one.
int64_t span_end(const KVSpan& span, int64_t b) {
  switch (span.kind) {
    case KVSpanKind::kDense:
      return span.kv_offset + span.k.dim(2);
    case KVSpanKind::kPaged:
      return span.kv_offset + span.paged.offset(b) + span.paged.seq_len(b);
    case KVSpanKind::kQuantized:
      return span.kv_offset + span.quant.seq_len();
    case KVSpanKind::kPagedQuantized:
      return span.paged_quant.kv_offset[b] + span.paged_quant.seq_len(b);
  }
  return 0;
}

// The checks every kind shares: a span serves the queries whose keys it ends with.
void check_positions(const std::string& kernel, const TensorView& q, const KVSpan& span,
                     const QueryPositions& at) {
  const int64_t B = q.dim(0), S = q.dim(2);
  const bool per_row = span.kind == KVSpanKind::kPaged || span.kind == KVSpanKind::kPagedQuantized;
  const int64_t span_rows =
      span.kind == KVSpanKind::kPaged ? span.paged.batch : span.paged_quant.batch;
  if (!per_row) {
    for (int64_t b = 1; b < B; ++b)
      if (at.of(b) != at.of(0))
        throw Error(
            ErrorKind::kInvalidArgument,
            "attention: batch rows at different positions need a paged cache (--cache paged)");
  } else if (span_rows != B) {
    throw Error(ErrorKind::kInvalidArgument,
                "attention: the paged span holds " + std::to_string(span_rows) +
                    " sequences for a batch of " + std::to_string(B) + " query rows");
  }
  for (int64_t b = 0; b < (per_row ? B : 1); ++b) {
    const int64_t q_end = at.of(b) + S, k_end = span_end(span, b);
    if (q_end != k_end)
      throw Error(
          ErrorKind::kInvalidArgument,
          "attention ('" + kernel + "', " + kind_name(span.kind) +
              " span): the queries of batch row " + std::to_string(b) + " end at position " +
              std::to_string(q_end) + " but the span's keys end at " + std::to_string(k_end) +
              "; a span must end with the keys of the queries it serves (a forward continues where "
              "its "
              "cache stopped; a recompute cache holds only its call's tokens, from position 0)");
  }
}

}  // namespace

AttentionKernel::AttentionKernel(std::string_view name)
    : name_(name), dense_(get_attention_kernel(name)), paged_(find_paged_attention_kernel(name)) {}

bool AttentionKernel::reads(KVSpanKind kind) const {
  return kind != KVSpanKind::kPaged || paged_ != nullptr;
}

void AttentionKernel::attend(const TensorView& q, const KVSpan& span, const TensorView& out,
                             AttentionOptions options, const QueryPositions& at) {
  if (!reads(span.kind))
    throw Error(ErrorKind::kUnsupported,
                "attention kernel '" + name_ + "' cannot read a " + kind_name(span.kind) +
                    " KV span (kernels for paged spans: " + joined(paged_attention_kernel_names()) +
                    ")");
  if (q.ndim() == 4 && (span.kind != KVSpanKind::kDense || span.k.ndim() == 4))
    check_positions(name_, q, span, at);
  options.kv_offset = span.kv_offset;
  switch (span.kind) {
    case KVSpanKind::kDense:
      options.q_offset = at.of(0);
      options.workspace = workspace_.reserve_for(q, span, options);
      dense_(q, span.k, span.v, out, options);
      return;
    case KVSpanKind::kQuantized:
      options.q_offset = at.of(0);
      options.workspace = workspace_.reserve_for(q, span, options);
      quantized_attention(q, span.quant, out, options);
      return;
    case KVSpanKind::kPaged:
      attend_paged(q, span, out, options);
      return;
    case KVSpanKind::kPagedQuantized:
      attend_paged_quantized(q, span, out, options, at);
      return;
  }
}

void AttentionKernel::attend_paged_quantized(const TensorView& q, const KVSpan& span,
                                             const TensorView& out, AttentionOptions options,
                                             const QueryPositions& at) {
  // One sequence at a time, each a quantized span of batch 1 read through its block table: the
  // dense quantized kernel's arithmetic on the same codes, so a row equals what the dense
  // quantized cache gives that sequence alone (tested), and rows of different lengths and
  // positions need nothing more.
  const PagedQuantKV& pq = span.paged_quant;
  for (int64_t b = 0; b < pq.batch; ++b) {
    const TensorView qb = q.slice(0, b, b + 1), ob = out.slice(0, b, b + 1);
    KVSpan row;
    row.kind = KVSpanKind::kQuantized;
    row.quant = pq.rows[b];
    row.kv_offset = pq.kv_offset[b];
    options.kv_offset = row.kv_offset;
    options.q_offset = at.of(b);
    options.workspace = workspace_.reserve_for(qb, row, options);
    quantized_attention(qb, row.quant, ob, options);
  }
}

void AttentionKernel::attend_paged(const TensorView& q, const KVSpan& span, const TensorView& out,
                                   AttentionOptions options) {
  // The [B, H, S, D] views over row-major [B*S, H*D] buffers are the packed varlen layout
  // [total_q = B*S, H, D] paged_attention takes, sequence b owning rows [b*S, (b+1)*S).
  const int64_t B = q.dim(0), H = q.dim(1), S = q.dim(2), D = q.dim(3), Dv = out.dim(3);
  KV_CHECK(q.stride(0) == S * q.stride(2) && out.stride(0) == S * out.stride(2),
           "paged attention takes the queries of batch row b right after those of row b - 1");
  PagedAttentionArgs pa;
  pa.q = TensorView(q.data(), DType::kF32, {B * S, H, D}, {q.stride(2), q.stride(1), 1});
  pa.out = TensorView(out.data(), DType::kF32, {B * S, H, Dv}, {out.stride(2), out.stride(1), 1});
  pa.kv = span.paged;
  cu_seqlens_q_.resize(static_cast<size_t>(B + 1));
  for (int64_t b = 0; b <= B; ++b)
    cu_seqlens_q_[static_cast<size_t>(b)] = static_cast<int32_t>(b * S);
  pa.cu_seqlens_q = cu_seqlens_q_.data();
  // Each sequence's queries sit at its own last positions (bottom-right; check_positions made
  // sure): the paged kernels take no q_offset.
  options.q_offset = -1;
  options.workspace = workspace_.reserve_for(pa.q, span, options);
  paged_(pa, options);
}

void AttentionKernel::attend_last(const TensorView& q, const KVSpan& span,
                                  const TensorView& out_all, const TensorView& out_last,
                                  const AttentionOptions& options, const QueryPositions& at) {
  const int64_t B = q.dim(0), H = q.dim(1), S = q.dim(2), D = q.dim(3), Dv = out_all.dim(3);
  if (span.kind == KVSpanKind::kQuantized || span.kind == KVSpanKind::kPagedQuantized) {
    // Its one-query path is not promised to give a prefill row's bits: every row, then the
    // last ones moved (front to back, so a row is read before anything overwrites it).
    attend(q, span, out_all, options, at);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        std::memmove(out_last.ptr(b, h, 0), out_all.ptr(b, h, S - 1),
                     static_cast<size_t>(Dv) * sizeof(float));
    return;
  }
  // One query per batch row; its query stride is the batch stride, so that the view is also
  // the packed varlen layout of one-query sequences.
  const TensorView q_last(q.ptr(0, 0, S - 1), DType::kF32, {B, H, 1, D},
                          {q.stride(0), q.stride(1), q.stride(0), 1});
  QueryPositions last = at;
  last.shift += S - 1;
  attend(q_last, span, out_last, options, last);
}

}  // namespace kvcache
