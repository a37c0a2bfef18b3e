#include "kernels/kv_span_rows.h"

#include <string>

#include "core/error.h"

namespace kvcache {

int64_t kv_span_length(const KVSpan& span, int64_t b) {
  switch (span.kind) {
    case KVSpanKind::kDense:
      return span.k.dim(2);
    case KVSpanKind::kPaged:
      return span.paged.seq_len(b);
    case KVSpanKind::kQuantized:
      return span.quant.seq_len();
    case KVSpanKind::kPagedQuantized:
      return span.paged_quant.seq_len(b);
  }
  return 0;
}

void read_kv_rows(const KVSpan& span, KVPart part, int64_t b, int64_t h, int64_t n, float* dst,
                  int64_t ld_dst) {
  switch (span.kind) {
    case KVSpanKind::kDense: {
      const TensorView& t = part == KVPart::kK ? span.k : span.v;
      for (int64_t j = 0; j < n; ++j)
        convert_n(t.ptr(b, h, j), t.dtype(), dst + j * ld_dst, DType::kF32,
                  static_cast<size_t>(t.dim(3)));
      return;
    }
    case KVSpanKind::kPaged: {
      const PagedKV& pk = span.paged;
      const TensorView& pages = part == KVPart::kK ? pk.k_pages : pk.v_pages;
      for (int64_t j = 0; j < n; ++j) {
        const int64_t bt = pk.block_tokens, page = pk.indices[pk.indptr[b] + j / bt];
        convert_n(pages.ptr(page, h, j % bt), pages.dtype(), dst + j * ld_dst, DType::kF32,
                  static_cast<size_t>(pages.dim(3)));
      }
      return;
    }
    case KVSpanKind::kQuantized:
    case KVSpanKind::kPagedQuantized:
      break;
  }
  throw Error(ErrorKind::kUnsupported,
              "read_kv_rows: a quantized KV span is read in place by quantized_attention only; its "
              "rows can be "
              "read from dense and paged spans (use --cache dynamic, static or paged)");
}

}  // namespace kvcache
