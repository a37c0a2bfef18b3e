#include "cache/recompute_layer.h"

#include <memory>
#include <string>

namespace kvcache {

KVSpan RecomputeLayer::update(const TensorView& k, const TensorView& v) {
  // The previous call's tokens are no part of this update's sequence: dropping them first
  // loses nothing a refused update could have kept, and lets the batch change between calls.
  if (buf_.allocated()) buf_.set_window(0, 0);
  const int64_t n = check_update(k, v);
  prepare_rows(k, v, n);
  if (n > buf_.capacity()) buf_.reallocate(buf_.batch_capacity(), n);
  buf_.append(k, v);
  return stored_span();
}

namespace {
template <const char* kType>
std::unique_ptr<CacheLayer> make_recompute(const CacheConfig& config, int layer_index) {
  return std::make_unique<RecomputeLayer>(dense_params(
      config, layer_index, std::string("recompute/") + kType, /*fixed_storage=*/false));
}
constexpr char kFull[] = "full_attention";
constexpr char kSliding[] = "sliding_attention";
constexpr char kChunked[] = "chunked_attention";
}  // namespace

KVCACHE_REGISTER_LAYER(recompute_full, "recompute", kFull, make_recompute<kFull>);
KVCACHE_REGISTER_LAYER(recompute_sliding, "recompute", kSliding, make_recompute<kSliding>);
KVCACHE_REGISTER_LAYER(recompute_chunked, "recompute", kChunked, make_recompute<kChunked>);

}  // namespace kvcache
