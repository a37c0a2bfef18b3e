#include "kernels/kv_span_rows.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/kv_quant.h"

namespace kvcache {

namespace {

// Packed rows: each block is decoded whole (a KIVI key block shares one scale per channel over
// its G tokens, so a token cannot be decoded alone), straight into dst when all its rows are
// wanted, else through a [G, D] scratch (only a read that ends inside a block: the MLA step
// reads whole spans); then the residual rows are widened.
void read_quant_rows(const QuantKV& q, KVPart part, int64_t b, int64_t h, int64_t n, float* dst,
                     int64_t ld_dst) {
  const KVBlockFormat f =
      make_kv_block_format(q.scheme, q.bits, q.group, q.head_dim_k, q.head_dim_v);
  const bool key = part == KVPart::kK;
  const int64_t D = key ? q.head_dim_k : q.head_dim_v, G = q.group;
  const int64_t packed = std::min(n, q.packed_len());
  const auto decode = [&](const std::byte* block, float* out, int64_t ld) {
    if (key) {
      kv_dequantize_k_block(f, block, out, ld);
    } else {
      kv_dequantize_v_block(f, block, out, ld);
    }
  };
  std::vector<float> scratch;
  for (int64_t i = 0; i * G < packed; ++i) {
    const std::byte* block = key ? q.k_block(b, h, i) : q.v_block(b, h, i);
    const int64_t rows = std::min(G, packed - i * G);
    float* out = dst + i * G * ld_dst;
    if (rows == G) {
      decode(block, out, ld_dst);
      continue;
    }
    scratch.resize(static_cast<size_t>(G * D));
    decode(block, scratch.data(), D);
    for (int64_t t = 0; t < rows; ++t)
      std::memcpy(out + t * ld_dst, scratch.data() + t * D, static_cast<size_t>(D) * sizeof(float));
  }
  const TensorView& res = key ? q.k_residual : q.v_residual;
  for (int64_t j = packed; j < n; ++j)
    convert_n(res.ptr(b, h, j - packed), res.dtype(), dst + j * ld_dst, DType::kF32,
              static_cast<size_t>(D));
}

}  // namespace

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
      read_quant_rows(span.quant, part, b, h, n, dst, ld_dst);
      return;
    case KVSpanKind::kPagedQuantized:
      read_quant_rows(span.paged_quant.rows[b], part, 0, h, n, dst, ld_dst);
      return;
  }
}

}  // namespace kvcache
