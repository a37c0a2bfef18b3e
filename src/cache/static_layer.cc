#include "cache/static_layer.h"

#include <memory>
#include <string>

#include "core/error.h"

namespace kvcache {

StaticLayer::StaticLayer(DenseLayerParams params, int64_t max_cache_len)
    : FullAttentionLayer(std::move(params)), max_cache_len_(max_cache_len) {
  KV_CHECK(params_.fixed_storage, "a static layer has fixed storage");
  if (max_cache_len <= 0) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": the static cache needs max_cache_len > 0 (got " +
                    std::to_string(max_cache_len) + "); pass --max-cache-len");
  }
}

KVSpan StaticLayer::update(const TensorView& k, const TensorView& v) {
  const int64_t n = check_update(k, v);
  const int64_t pos = seq_length();
  if (pos + n > max_cache_len_) {  // checked before any mutation: the cache stays intact
    throw Error(ErrorKind::kOutOfRange,
                where() + ": cannot write " + std::to_string(n) + " tokens at position " +
                    std::to_string(pos) + ": the static cache holds " +
                    std::to_string(max_cache_len_) + " tokens (max_cache_len); raise " +
                    "--max-cache-len to at least " + std::to_string(pos + n) +
                    " or use the dynamic cache");
  }
  prepare_rows(k, v, max_cache_len_);
  buf_.append(k, v);
  return stored_span();
}

int64_t StaticLayer::full_capacity(int64_t tokens) const {
  if (tokens > max_cache_len_)
    refuse_restore("the file holds " + std::to_string(tokens) +
                   " tokens but this static cache holds " + std::to_string(max_cache_len_) +
                   " (max_cache_len); raise --max-cache-len to at least " + std::to_string(tokens));
  return max_cache_len_;
}

namespace {
std::unique_ptr<CacheLayer> make_static_full(const CacheConfig& config, int layer_index) {
  return std::make_unique<StaticLayer>(
      dense_params(config, layer_index, "static/full_attention", /*fixed_storage=*/true),
      config.options.max_cache_len);
}
}  // namespace

KVCACHE_REGISTER_LAYER(static_full, "static", "full_attention", make_static_full);

}  // namespace kvcache
