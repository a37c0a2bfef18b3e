#include "cache/paged_linear_layer.h"

#include <algorithm>
#include <vector>

#include "cache/cache.h"
#include "cache/crop_rule.h"
#include "core/error.h"

namespace kvcache {

PagedLinearLayer::PagedLinearLayer(std::shared_ptr<PagedKVStore> store, int layer)
    : store_(std::move(store)), layer_(layer) {
  KV_CHECK(store_ != nullptr, "PagedLinearLayer needs a store");
  if (store_->linear_index(layer) < 0)
    throw Error(ErrorKind::kInvalidArgument,
                "paged cache: layer " + std::to_string(layer) +
                    " is not a linear_attention layer of the store's layer types");
  store_->attach_layer(layer);
}

std::string PagedLinearLayer::where() const {
  return "layer " + std::to_string(layer_) + " (paged/linear_attention)";
}

KVSpan PagedLinearLayer::update(const TensorView&, const TensorView&) {
  throw Error(ErrorKind::kInvalidArgument,
              where() +
                  " is a linear_attention layer: it stores no keys or values; call "
                  "update_conv_state / update_recurrent_state for it, update(k, v) for attention "
                  "layers only");
}

MaskSizes PagedLinearLayer::mask_sizes(int64_t) const {
  throw Error(ErrorKind::kInvalidArgument,
              where() +
                  " is a linear_attention layer: it has no attention mask; ask an "
                  "attention layer (Cache::mask_sizes of a full or sliding layer)");
}

ConvStateUpdate PagedLinearLayer::update_conv_state(const TensorView& x) {
  return store_->linear_conv_update(layer_, x);
}

TensorView PagedLinearLayer::update_recurrent_state(const TensorView& state) {
  return store_->linear_recurrent_update(layer_, state);
}

TensorView PagedLinearLayer::conv_state() const {
  return store_->linear_conv_state(layer_);
}

TensorView PagedLinearLayer::recurrent_state() const {
  return store_->linear_recurrent_state(layer_);
}

void PagedLinearLayer::check_crop(int64_t n) const {
  for (const SeqId id : store_->batch()) {
    const int64_t len = store_->length(id);
    const int64_t target = crop_target_length(n, len);
    if (target != 0 && target != len)
      throw Error(ErrorKind::kUnsupported,
                  where() + ": crop to " + std::to_string(target) + " of " + std::to_string(len) +
                      " tokens: the paged linear-attention state cannot go back (no per-token "
                      "history); crop to 0 or keep the length, or use the dynamic cache with "
                      "activate_past_recording() and snapshots");
  }
}

void PagedLinearLayer::snapshot() {
  throw Error(ErrorKind::kUnsupported,
              where() +
                  ": snapshot() for crop is not supported by the paged cache (it snapshots the "
                  "state at block boundaries for the prefix cache on its own, and crop goes to 0 "
                  "only); use the dynamic cache with activate_past_recording() for speculative "
                  "decoding");
}

void PagedLinearLayer::crop(int64_t n) {
  check_crop(n);
  if (is_leader()) store_->crop(n);
}

void PagedLinearLayer::reset() {
  if (is_leader()) store_->reset();
}

void PagedLinearLayer::reorder(std::span<const int64_t> beam_idx) {
  if (is_leader()) store_->reorder(beam_idx);
}

void PagedLinearLayer::repeat_interleave(int64_t r) {
  if (is_leader()) store_->repeat_interleave(r);
}

void PagedLinearLayer::select(std::span<const int64_t> indices) {
  if (is_leader()) store_->remap(indices);
}

size_t PagedLinearLayer::bytes() const {
  return store_->layer_state_bytes(layer_) + (is_leader() ? store_->leader_extra_bytes() : 0);
}

namespace {

std::unique_ptr<CacheLayer> make_paged_linear(const CacheConfig& config, int layer_index) {
  const CacheOptions& o = config.options;
  if (!o.paged.store)
    throw Error(ErrorKind::kInvalidArgument,
                "layer " + std::to_string(layer_index) +
                    " (paged/linear_attention): the paged linear-attention state lives in the "
                    "store every layer shares (one slot per sequence); build a PagedKVStore "
                    "with the model's layer types and CacheConfig::linear and pass it in "
                    "CacheOptions::paged.store (the runtime's Session and Engine do)");
  const PagedStoreConfig& sc = o.paged.store->config();
  if (layer_index < 0 || layer_index >= static_cast<int>(sc.layer_types.size()) ||
      sc.layer_types[static_cast<size_t>(layer_index)] != "linear_attention")
    throw Error(ErrorKind::kInvalidArgument,
                "paged cache: layer " + std::to_string(layer_index) +
                    " of the cache config does not match the store's layer types");
  const LinearStateShape& a = sc.linear;
  const LinearStateShape& b = config.linear;
  if (a.conv_kernel != b.conv_kernel || a.conv_dim != b.conv_dim || a.heads_v != b.heads_v ||
      a.head_dim_k != b.head_dim_k || a.head_dim_v != b.head_dim_v)
    throw Error(ErrorKind::kInvalidArgument,
                "layer " + std::to_string(layer_index) +
                    " (paged/linear_attention): the store's linear state shape differs from the "
                    "cache config's; build both from the model's cache config");
  return std::make_unique<PagedLinearLayer>(o.paged.store, layer_index);
}

}  // namespace

KVCACHE_REGISTER_LAYER(paged_linear, "paged", "linear_attention", make_paged_linear);

}  // namespace kvcache
