// FullAttentionLayer: what every "full_attention" container shares once its storage policy has
// placed the new tokens — it keeps every token from slot 0, so the span, the mask sizes, crop
// and reset are the same whether the storage grows (DynamicLayer) or is fixed (StaticLayer).
// Subclasses implement update() (where the tokens go) and max_length().
#pragma once

#include "cache/dense_layer.h"

namespace kvcache {

class FullAttentionLayer : public DenseLayer {
 public:
  using DenseLayer::DenseLayer;

  // {seq_length() + query_len, 0}: a full-attention kernel sees every earlier key.
  MaskSizes mask_sizes(int64_t query_len) const override { return {seq_length() + query_len, 0}; }
  int64_t seq_length() const override { return buf_.end(); }
  void crop(int64_t n) override {
    const int64_t keep = crop_length(n, seq_length());
    if (buf_.allocated()) buf_.set_window(0, keep);
  }
  void reset() override {
    if (buf_.allocated()) buf_.set_window(0, 0);
  }

 protected:
  // [B, H_kv, seq_length(), D] views of everything stored, kv_offset 0.
  KVSpan stored_span() const {
    KVSpan span;
    span.k = buf_.k_slots(0, buf_.end());
    span.v = buf_.v_slots(0, buf_.end());
    span.kv_offset = 0;
    return span;
  }
};

}  // namespace kvcache
