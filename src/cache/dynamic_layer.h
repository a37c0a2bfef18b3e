// DynamicLayer ("dynamic" / "full_attention"): keeps every token, grows its storage
// geometrically. transformers' DynamicLayer runs torch.cat on every update, copying the whole
// cache each step: O(S^2) bytes over S steps (KV cache notes, "Dynamic"). Here the storage
// doubles when full, so appending S tokens one at a time moves fewer than 2*S tokens in
// reallocations (each doubling copies what is live, and those sizes sum to < final capacity),
// and update() returns strided views into the storage: no per-step copy of the history.
#pragma once

#include "cache/full_attention_layer.h"

namespace kvcache {

class DynamicLayer final : public FullAttentionLayer {
 public:
  // First allocation: max(first update's tokens, kMinCapacity) slots.
  static constexpr int64_t kMinCapacity = 16;

  explicit DynamicLayer(DenseLayerParams params) : FullAttentionLayer(std::move(params)) {}

  // Returns [B, H_kv, seq_length(), D] views of everything stored, kv_offset 0.
  KVSpan update(const TensorView& k, const TensorView& v) override;
  int64_t max_length() const override { return -1; }
  // Grows the storage now when it is allocated, else at the first update.
  void reserve(int64_t tokens) override;

 protected:
  int64_t full_capacity(int64_t tokens) const override;

 private:
  int64_t reserved_ = 0;  // the largest reserve() asked for
};

}  // namespace kvcache
