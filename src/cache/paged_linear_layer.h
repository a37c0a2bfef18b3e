// PagedLinearLayer ("paged" / "linear_attention"): a hybrid model's linear-attention layer in
// the paged cache (issue 38). Its state lives in the store, per sequence slot, outside the block
// pool (cache/paged_store.h, cache/paged_linear_state.h); the layer only reads and writes the
// slots of the store's batch rows. update_conv_state / update_recurrent_state follow
// LinearStateLayer's contract, with these differences:
// - the views of the stored state are views of the slots when the batch's slots are
//   consecutive, else copies in a store workspace shared by the linear layers (valid until the
//   next linear call); update_recurrent_state writes a copy back to the slots;
// - has_previous_state(): whether any batch sequence had state before the open step (rows
//   without one hold the zero state, which continues exactly like a fresh start);
// - crop only to 0 or to the current length (no per-token history), snapshot() is an Error:
//   the store snapshots at block boundaries for prefix caching on its own;
// - lifecycle calls act on the store's batch through the store's leader layer, as PagedLayer's.
// A private store is refused: the state must sit in the store the attention layers share.
#pragma once

#include <memory>
#include <string>

#include "cache/linear_state_layer.h"
#include "cache/paged_store.h"

namespace kvcache {

class PagedLinearLayer final : public LinearCacheLayer {
 public:
  PagedLinearLayer(std::shared_ptr<PagedKVStore> store, int layer);

  KVSpan update(const TensorView& k, const TensorView& v) override;  // Error
  MaskSizes mask_sizes(int64_t query_len) const override;            // Error
  int64_t seq_length() const override { return store_->layer_length(layer_); }
  int64_t max_length() const override { return -1; }
  bool is_initialized() const override { return !store_->batch().empty(); }

  ConvStateUpdate update_conv_state(const TensorView& x) override;
  TensorView update_recurrent_state(const TensorView& state) override;
  TensorView conv_state() const override;
  TensorView recurrent_state() const override;
  bool has_previous_state() const override { return store_->linear_has_previous(); }
  const LinearStateShape& shape() const override { return store_->config().linear; }
  void check_crop(int64_t n) const override;
  void snapshot() override;

  void crop(int64_t n) override;
  void reset() override;
  void reorder(std::span<const int64_t> beam_idx) override;
  void repeat_interleave(int64_t r) override;
  void select(std::span<const int64_t> indices) override;
  // This layer's share of the slots and snapshots (slots x its state + snapshots x its state);
  // the store's leader counts the rest (workspaces, metadata).
  size_t bytes() const override;
  std::string_view name() const override { return "paged/linear_attention"; }

 private:
  bool is_leader() const { return store_->leader_layer() == layer_; }
  std::string where() const;

  std::shared_ptr<PagedKVStore> store_;
  int layer_ = 0;
};

}  // namespace kvcache
