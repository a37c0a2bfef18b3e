// KVSpan: what a cache layer's update() hands to an attention kernel. A plain data type shared
// by the cache and kernel layers (kernels never include cache headers). Non-owning: the views
// point into the cache's storage and are valid until the next mutating call on that layer.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace kvcache {

// What a kernel must read. Dense today; paged and quantized spans join as new kinds, and each
// kernel states which kinds it accepts.
enum class KVSpanKind { kDense };

struct KVSpan {
  KVSpanKind kind = KVSpanKind::kDense;
  TensorView k;  // [B, H_kv, S_kv, D_k], strided, in the layer's storage dtype
  TensorView v;  // [B, H_kv, S_kv, D_v]
  // Absolute position of k[:, :, 0] in the sequence (sliding/chunked layers drop the head).
  int64_t kv_offset = 0;
};

}  // namespace kvcache
