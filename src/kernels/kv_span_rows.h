// Row access to a KV span, for code that must read the cached tokens themselves rather than
// attend over them (MLA expands its cached latent into per-head keys and values): the keys of
// a batch row, and rows widened to f32 wherever the span keeps them — a dense span through its
// strides, a paged span through its page table, a quantized span (dense or paged blocks)
// dequantized block by block into the caller's rows (an explicit copy: the caller's workspace
// holds the f32 rows, as it does for a dense f16 span; the residual rows widened exactly).
#pragma once

#include <cstdint>

#include "core/kv_span.h"

namespace kvcache {

enum class KVPart { kK, kV };

// Keys batch row b sees (a paged span's rows differ; dense and quantized ones do not).
int64_t kv_span_length(const KVSpan& span, int64_t b);

// Rows [0, n) of `part`, batch row b, KV head h, as f32: row j goes to dst + j * ld_dst
// (n <= kv_span_length(span, b); head dim floats per row).
void read_kv_rows(const KVSpan& span, KVPart part, int64_t b, int64_t h, int64_t n, float* dst,
                  int64_t ld_dst);

}  // namespace kvcache
