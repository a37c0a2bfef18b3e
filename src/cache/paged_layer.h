// PagedLayer ("paged" / "full_attention", "paged" / "sliding_attention"): the CacheLayer face of
// a PagedKVStore. update() copies the new K/V into the store's pages (no gather of the history)
// and returns a kPaged KVSpan — pages plus the batch's CSR page table — that paged_attention
// reads in place. Every layer of a Cache shares one store (CacheOptions::paged.store); the store
// owns pages, tables and sequences, the layer only its index into them.
//
// Lifecycle calls (crop, reset, reorder, select, repeat_interleave) act on the store's batch,
// i.e. on every layer at once: the store's first attached layer (the leader) applies them and
// the other layers' calls are no-ops, so Cache's per-layer loop applies each exactly once.
// Calling them on one non-leader layer alone therefore does nothing.
#pragma once

#include <memory>
#include <string>

#include "cache/cache_layer.h"
#include "cache/paged_store.h"

namespace kvcache {

class PagedLayer final : public CacheLayer {
 public:
  // layer: this layer's index in the store (the model layer index for a shared store).
  PagedLayer(std::shared_ptr<PagedKVStore> store, int layer);
  // A private one-layer store built at the first update, sized for `tokens_per_row` tokens per
  // batch row once the batch is known (protocol use without a runtime-built store).
  PagedLayer(const PagedStoreConfig& pending, int64_t tokens_per_row);

  KVSpan update(const TensorView& k, const TensorView& v) override;
  // {seq_length() + query_len, 0}: sliding groups keep positions (null blocks), the kernel's
  // window mask does the rest.
  MaskSizes mask_sizes(int64_t query_len) const override;
  int64_t seq_length() const override;  // batch row 0
  int64_t max_length() const override { return -1; }
  bool is_initialized() const override;
  void crop(int64_t n) override;
  void reset() override;
  void reorder(std::span<const int64_t> beam_idx) override;
  void repeat_interleave(int64_t r) override;
  void select(std::span<const int64_t> indices) override;
  // This layer's pages; the leader also counts the store's tables and pools.
  size_t bytes() const override;
  std::string_view name() const override { return name_; }

  PagedKVStore& store() const;
  bool is_leader() const;

 private:
  std::shared_ptr<PagedKVStore> store_;  // null until the first update of a private store
  int layer_ = 0;
  std::string name_;
  PagedStoreConfig pending_;
  int64_t tokens_per_row_ = 0;
};

}  // namespace kvcache
