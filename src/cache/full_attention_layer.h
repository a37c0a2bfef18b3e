// FullAttentionLayer: what every "full_attention" container shares once its storage policy has
// placed the new tokens — it keeps every token from slot 0, so the span, the mask sizes, crop
// and reset are the same whether the storage grows (DynamicLayer) or is fixed (StaticLayer).
// Subclasses implement update() (where the tokens go) and max_length().
#pragma once

#include <string>

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
  bool stored(KVSpan* out) const override {
    if (!buf_.allocated()) return false;
    *out = stored_span();
    return true;
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
  // Keeps every token: nothing evicted, nothing recorded.
  int64_t restore_capacity(const SavedPosition& p) const override {
    if (p.stored != p.seq_length || p.recording)
      refuse_restore("the file holds " + std::to_string(p.stored) + " of " +
                     std::to_string(p.seq_length) +
                     " tokens (a window layer's state), a full-attention layer keeps all");
    return full_capacity(p.stored);
  }
  // Slots to allocate for `tokens` restored tokens (checks a fixed capacity).
  virtual int64_t full_capacity(int64_t tokens) const = 0;
};

}  // namespace kvcache
