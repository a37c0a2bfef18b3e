#include "cache/paged_layer.h"

#include <algorithm>
#include <vector>

#include "cache/cache.h"
#include "core/error.h"

namespace kvcache {

PagedLayer::PagedLayer(std::shared_ptr<PagedKVStore> store, int layer)
    : store_(std::move(store)), layer_(layer) {
  KV_CHECK(store_ != nullptr, "PagedLayer needs a store");
  const auto& types = store_->config().layer_types;
  if (layer < 0 || layer >= static_cast<int>(types.size()))
    throw Error(ErrorKind::kInvalidArgument, "paged cache: layer " + std::to_string(layer) +
                                                 " outside the store's " +
                                                 std::to_string(types.size()) + " layers");
  name_ = "paged/" + types[static_cast<size_t>(layer)];
  store_->attach_layer(layer);
}

PagedLayer::PagedLayer(const PagedStoreConfig& pending, int64_t tokens_per_row)
    : pending_(pending), tokens_per_row_(tokens_per_row) {
  KV_CHECK(pending.layer_types.size() == 1, "a private paged store holds one layer");
  name_ = "paged/" + pending.layer_types[0];
  (void)paged_groups(pending_.layer_types, pending_.sliding_window);  // bad type/window: throw now
}

PagedKVStore& PagedLayer::store() const {
  if (!store_)
    throw Error(ErrorKind::kInvalidArgument, name_ + ": no store before the first update");
  return *store_;
}

// Private stores: every lifecycle call before the first update has nothing to act on.
bool PagedLayer::is_leader() const {
  return store_ && store_->leader_layer() == layer_;
}

KVSpan PagedLayer::update(const TensorView& k, const TensorView& v) {
  if (!store_) {
    if (k.ndim() != 4)
      throw Error(ErrorKind::kInvalidArgument, name_ + ": k must be [B, H_kv, S, D]");
    PagedStoreConfig c = pending_;
    c.max_tokens = tokens_per_row_ * std::max<int64_t>(1, k.dim(0));
    if (c.quant)
      c.linear_slots = static_cast<int32_t>(std::max<int64_t>(1, k.dim(0)));  // residuals
    store_ = std::make_shared<PagedKVStore>(c);
    store_->attach_layer(0);
  }
  return store_->write(layer_, k, v);
}

MaskSizes PagedLayer::mask_sizes(int64_t query_len) const {
  return {seq_length() + query_len, 0};
}

int64_t PagedLayer::seq_length() const {
  return store_ ? store_->layer_length(layer_) : 0;
}

bool PagedLayer::is_initialized() const {
  return store_ && store_->allocated();
}

void PagedLayer::crop(int64_t n) {
  if (is_leader()) store_->crop(n);
}

void PagedLayer::reset() {
  if (is_leader()) store_->reset();
}

void PagedLayer::reorder(std::span<const int64_t> beam_idx) {
  if (is_leader()) store_->reorder(beam_idx);
}

void PagedLayer::repeat_interleave(int64_t r) {
  if (is_leader()) store_->repeat_interleave(r);
}

void PagedLayer::select(std::span<const int64_t> indices) {
  if (is_leader()) store_->remap(indices);
}

size_t PagedLayer::bytes() const {
  if (!store_) return 0;
  return store_->layer_page_bytes(layer_) + (is_leader() ? store_->leader_extra_bytes() : 0);
}

namespace {

// The registry passes the config and the layer index; the layer type is the registration's
// (config.layer_types may be empty when a layer is built on its own).
std::unique_ptr<CacheLayer> make_paged_layer(const CacheConfig& config, int layer_index,
                                             const std::string& layer_type) {
  const CacheOptions& o = config.options;
  if (o.paged.store) {
    const PagedStoreConfig& store = o.paged.store->config();
    if (layer_index < 0 || layer_index >= static_cast<int>(store.layer_types.size()) ||
        store.layer_types[static_cast<size_t>(layer_index)] != layer_type)
      throw Error(ErrorKind::kInvalidArgument,
                  "paged cache: layer " + std::to_string(layer_index) +
                      " of the cache config does not match the store's layer types");
    if (store.num_kv_shared_layers != config.num_kv_shared_layers)
      throw Error(ErrorKind::kInvalidArgument,
                  "paged cache: the store leaves the last " +
                      std::to_string(store.num_kv_shared_layers) +
                      " layers without pages but the cache config shares " +
                      std::to_string(config.num_kv_shared_layers) +
                      "; build both from the model's num_kv_shared_layers");
    if (layer_type == "sliding_attention" && config.window_of(layer_index) != store.sliding_window)
      throw Error(ErrorKind::kUnsupported,
                  "paged cache: layer " + std::to_string(layer_index) + " has window " +
                      std::to_string(config.window_of(layer_index)) + " but the store's sliding " +
                      "group has one window for all its layers (" +
                      std::to_string(store.sliding_window) +
                      "); per-layer windows need the dynamic or static cache");
    return std::make_unique<PagedLayer>(o.paged.store, layer_index);
  }
  // A private store for this one layer (protocol use without a runtime-built store).
  if (o.max_cache_len <= 0)
    throw Error(ErrorKind::kInvalidArgument,
                "paged cache: layer " + std::to_string(layer_index) +
                    " has no store and no max_cache_len to size one; set max_cache_len or build a "
                    "PagedKVStore (CacheOptions::paged.store)");
  PagedStoreConfig sc;
  sc.block_tokens = static_cast<int32_t>(o.paged.block_tokens);
  sc.layer_types = {layer_type};
  sc.sliding_window = config.window_of(layer_index);  // a private store: this layer's own
  sc.dtype = o.kv_dtype.value_or(DType::kF32);
  sc.quant = o.paged.quant;
  if (sc.quant && config.kv_content != CacheConfig::KVContent::kPerHead)
    throw Error(ErrorKind::kUnsupported,
                "paged cache: layer " + std::to_string(layer_index) +
                    ": quantized pages hold per-head K/V, but this model's cache holds " +
                    (config.kv_content == CacheConfig::KVContent::kMlaLatent
                         ? "MLA's latent c_kv and rotated key k_rot (quantized latents are not "
                           "defined for the paged store)"
                         : "K == V once (the packed format cannot serve both)") +
                    "; use f16/f32 pages");
  if (o.max_batch_size > 0) {
    sc.max_tokens = o.max_cache_len * o.max_batch_size;
    if (sc.quant) sc.linear_slots = static_cast<int32_t>(o.max_batch_size);
    return std::make_unique<PagedLayer>(std::make_shared<PagedKVStore>(sc), 0);
  }
  return std::make_unique<PagedLayer>(sc, o.max_cache_len);  // rows known at the first update
}

std::unique_ptr<CacheLayer> make_paged_full(const CacheConfig& config, int layer_index) {
  return make_paged_layer(config, layer_index, "full_attention");
}

std::unique_ptr<CacheLayer> make_paged_sliding(const CacheConfig& config, int layer_index) {
  return make_paged_layer(config, layer_index, "sliding_attention");
}

}  // namespace

KVCACHE_REGISTER_LAYER(paged_full, "paged", "full_attention", make_paged_full);
KVCACHE_REGISTER_LAYER(paged_sliding, "paged", "sliding_attention", make_paged_sliding);

}  // namespace kvcache
