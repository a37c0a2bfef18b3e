// RecomputeLayer ("recompute" / full, sliding and chunked attention): the container of a forward
// that recomputes everything — the no-cache reference that `--verify` and the tests compare the
// real caches against. It keeps only the tokens of its latest update: every update is a whole
// sequence from position 0 (the span is exactly the new K/V, kv_offset 0), so a forward through
// it attends the call's own tokens only, and one that does not start at position 0 is refused
// by the attention kernel (its queries would end past the span's keys). The window or chunk of
// sliding and chunked layers is the kernel's mask, as for the other containers.
//
// Why a container and not "no cache" branches in model code: KV-shared layers (Gemma-3n) read
// their source layer's span later in the same forward, which is what Cache gives every
// container; the span's copy lives here until the next update, as a cache's would.
#pragma once

#include "cache/full_attention_layer.h"

namespace kvcache {

class RecomputeLayer final : public FullAttentionLayer {
 public:
  explicit RecomputeLayer(DenseLayerParams params) : FullAttentionLayer(std::move(params)) {}

  // Forgets the previous tokens, stores k/v (converted to the storage dtype) and returns
  // [B, H_kv, n, D] views of them, kv_offset 0.
  KVSpan update(const TensorView& k, const TensorView& v) override;
  // {query_len, 0}: the next update is a sequence of its own.
  MaskSizes mask_sizes(int64_t query_len) const override { return {query_len, 0}; }
  int64_t max_length() const override { return -1; }
  // It keeps nothing between calls: nothing to save (CacheLayer's kUnsupported).
  void save(StateWriter& out) const override { CacheLayer::save(out); }
  void load(StateReader& in) override { CacheLayer::load(in); }

 protected:
  int64_t full_capacity(int64_t tokens) const override { return tokens; }
};

}  // namespace kvcache
