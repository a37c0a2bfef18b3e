// Internal to the kernels layer: the kernel entry points the registry in attention.cc exposes,
// and small helpers shared by them. Not part of the public API.
#pragma once

#include <cstdint>

#include "core/kv_span.h"
#include "kernels/attention.h"
#include "kernels/attention_workspace.h"

namespace kvcache::detail {

void fused_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const AttentionOptions& options);
void flex_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const AttentionOptions& options);
void fused_attention_scalar(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& options);

// The fused kernel reading K/V through a page table (varlen batch, see paged_attention.h; the
// caller has validated the arguments). Bit-identical to fused_attention on the gathered K/V.
void fused_paged_attention(const TensorView& q, const PagedKV& kv, const int32_t* cu_seqlens_q,
                           const TensorView& out, const AttentionOptions& options);
void fused_paged_attention_scalar(const TensorView& q, const PagedKV& kv,
                                  const int32_t* cu_seqlens_q, const TensorView& out,
                                  const AttentionOptions& options);

// attention_workspace_bytes of each kernel family, for a pool of n_threads.
size_t fused_workspace_bytes(const AttentionShape& shape, int64_t n_threads);
size_t quantized_workspace_bytes(const AttentionShape& shape, int64_t n_threads);

// Runs f.template operator()<NR>(r) over the rows [0, R): blocks of 4 rows, then the 1 to 3
// left (register-blocked micro-kernels are instantiated for NR = 1..4). Shared by the fused and
// quantized kernels' row loops.
template <typename F>
inline void by_row_blocks(int64_t R, F&& f) {
  int64_t r = 0;
  for (; r + 4 <= R; r += 4) f.template operator()<4>(r);
  switch (R - r) {
    case 3:
      f.template operator()<3>(r);
      break;
    case 2:
      f.template operator()<2>(r);
      break;
    case 1:
      f.template operator()<1>(r);
      break;
    default:
      break;
  }
}

// Automatic split-KV (flash-decoding) for a sequence of `skv` keys read by a single query tile:
// the partition length in keys, or 0 for no split. A quarter of the keys in multiples of 64,
// between 1,024 and 4,096: short partitions keep B x H_kv tasks from leaving threads idle, long
// ones start fewer K/V streams (each start waits on memory before its prefetches run ahead). It
// looks at the sequence only, never at the batch or the thread count, so results do not depend
// on them.
inline int64_t auto_split_keys(int64_t skv) {
  constexpr int64_t kMin = 1024, kMax = 4096;
  if (skv <= kMin) return 0;
  const int64_t quarter = (skv / 4 + 63) / 64 * 64;
  return quarter < kMin ? kMin : quarter > kMax ? kMax : quarter;
}

// f32 dot product with 8 interleaved partial sums (vectorisable without -ffast-math).
inline float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace kvcache::detail
