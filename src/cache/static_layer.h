// StaticLayer ("static" / "full_attention"): storage preallocated at the first update to
// max_cache_len tokens (and max_batch_size rows, or the first batch) and written in place at
// the cache position, as transformers' StaticLayer does with index_copy_. The storage is
// never reallocated: its address is stable for the object's lifetime (reset, crop, reorder
// and select included), which is what graph capture and pinned/registered memory need.
//
// Difference from transformers: its StaticLayer returns the whole max_cache_len buffer and
// the mask hides the empty slots (a fixed shape for torch.compile). On a CPU that only makes
// the kernel read garbage slots, so update() returns the filled prefix [0, seq_length())
// and mask_sizes() reports {seq_length() + q, 0}, exactly like the dynamic layer.
//
// Writing past max_cache_len throws Error(kOutOfRange) and leaves the cache unchanged.
#pragma once

#include "cache/full_attention_layer.h"

namespace kvcache {

class StaticLayer final : public FullAttentionLayer {
 public:
  // params.fixed_storage must be true; max_cache_len > 0 (checked, Error otherwise).
  StaticLayer(DenseLayerParams params, int64_t max_cache_len);

  KVSpan update(const TensorView& k, const TensorView& v) override;
  int64_t max_length() const override { return max_cache_len_; }

 protected:
  int64_t full_capacity(int64_t tokens) const override;

 private:
  int64_t max_cache_len_;
};

}  // namespace kvcache
