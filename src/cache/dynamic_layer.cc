#include "cache/dynamic_layer.h"

#include <algorithm>
#include <memory>

#include "core/error.h"

namespace kvcache {

KVSpan DynamicLayer::update(const TensorView& k, const TensorView& v) {
  const int64_t n = check_update(k, v);
  prepare_rows(k, v, std::max({n, kMinCapacity, reserved_}));
  const int64_t end = buf_.end();  // begin is always 0: full attention never drops the head
  if (end + n > buf_.capacity())
    buf_.reallocate(buf_.batch_capacity(), std::max(2 * buf_.capacity(), end + n));
  buf_.append(k, v);
  return stored_span();
}

void DynamicLayer::reserve(int64_t tokens) {
  if (tokens < 0)
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": reserve(" + std::to_string(tokens) + "): tokens must be >= 0");
  reserved_ = std::max(reserved_, tokens);
  if (buf_.allocated() && buf_.capacity() < tokens) buf_.reallocate(buf_.batch_capacity(), tokens);
}

int64_t DynamicLayer::full_capacity(int64_t tokens) const {
  return std::max({tokens, kMinCapacity, reserved_});
}

namespace {
std::unique_ptr<CacheLayer> make_dynamic_full(const CacheConfig& config, int layer_index) {
  return std::make_unique<DynamicLayer>(
      dense_params(config, layer_index, "dynamic/full_attention", /*fixed_storage=*/false));
}
}  // namespace

KVCACHE_REGISTER_LAYER(dynamic_full, "dynamic", "full_attention", make_dynamic_full);

}  // namespace kvcache
