#include "cache/paged_compressed_layer.h"

#include "cache/cache.h"
#include "core/error.h"

namespace kvcache {

PagedCompressedLayer::PagedCompressedLayer(std::shared_ptr<PagedKVStore> store, int layer)
    : PagedStoreLayer(std::move(store), layer, "") {
  name_ = "paged/" + store_->config().layer_types[static_cast<size_t>(layer)];
}

KVSpan PagedCompressedLayer::update(const TensorView& k, const TensorView& v) {
  if (k.data() != v.data() || !(k.shape() == v.shape()))
    throw Error(ErrorKind::kInvalidArgument,
                "layer " + std::to_string(layer_) + " (" + name_ +
                    "): the sliding branch is K==V: pass the same view as k and v "
                    "(update(kv, kv))");
  return store_->write(layer_, k, v);
}

PagedIndexedLayer::PagedIndexedLayer(std::shared_ptr<PagedKVStore> store, int layer)
    : PagedStoreLayer(std::move(store), layer, "paged/deepseek_sparse_attention") {}

namespace {

// The store must be the one every layer shares, built with this layer type at this index and
// the cache config's compress rates and indexer width.
const PagedKVStore& shared_store(const CacheConfig& config, int layer_index,
                                 const std::string& type) {
  const CacheOptions& o = config.options;
  const std::string where = "layer " + std::to_string(layer_index) + " (paged/" + type + "): ";
  if (!o.paged.store)
    throw Error(ErrorKind::kInvalidArgument,
                where +
                    "the paged compressed and indexed layers live in the store every layer "
                    "shares; build a PagedKVStore with the model's layer types and "
                    "CacheConfig::compressed and pass it in CacheOptions::paged.store (the "
                    "runtime's Session and Engine do)");
  const PagedStoreConfig& sc = o.paged.store->config();
  if (layer_index < 0 || layer_index >= static_cast<int>(sc.layer_types.size()) ||
      sc.layer_types[static_cast<size_t>(layer_index)] != type)
    throw Error(ErrorKind::kInvalidArgument,
                where + "the cache config does not match the store's layer types");
  if (sc.compressed.rates != config.compressed.rates ||
      sc.compressed.index_head_dim != config.compressed.index_head_dim)
    throw Error(ErrorKind::kInvalidArgument,
                where +
                    "the store's compress rates or index_head_dim differ from the cache "
                    "config's; build both from the model's cache config");
  return *o.paged.store;
}

std::unique_ptr<CacheLayer> make_paged_compressed(const CacheConfig& config, int layer_index,
                                                  const std::string& type) {
  shared_store(config, layer_index, type);
  return std::make_unique<PagedCompressedLayer>(config.options.paged.store, layer_index);
}

std::unique_ptr<CacheLayer> make_paged_csa(const CacheConfig& config, int layer_index) {
  return make_paged_compressed(config, layer_index, "compressed_sparse_attention");
}

std::unique_ptr<CacheLayer> make_paged_hca(const CacheConfig& config, int layer_index) {
  return make_paged_compressed(config, layer_index, "heavily_compressed_attention");
}

std::unique_ptr<CacheLayer> make_paged_dsa(const CacheConfig& config, int layer_index) {
  shared_store(config, layer_index, "deepseek_sparse_attention");
  return std::make_unique<PagedIndexedLayer>(config.options.paged.store, layer_index);
}

}  // namespace

KVCACHE_REGISTER_LAYER(paged_csa, "paged", "compressed_sparse_attention", make_paged_csa);
KVCACHE_REGISTER_LAYER(paged_hca, "paged", "heavily_compressed_attention", make_paged_hca);
KVCACHE_REGISTER_LAYER(paged_dsa, "paged", "deepseek_sparse_attention", make_paged_dsa);

}  // namespace kvcache
