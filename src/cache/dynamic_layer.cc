#include "cache/dynamic_layer.h"

#include <algorithm>
#include <memory>

#include "core/error.h"

namespace kvcache {

KVSpan DynamicLayer::update(const TensorView& k, const TensorView& v) {
  const int64_t n = check_update(k, v);
  prepare_rows(k, v, std::max(n, kMinCapacity));
  const int64_t end = buf_.end();  // begin is always 0: full attention never drops the head
  if (end + n > buf_.capacity())
    buf_.reallocate(buf_.batch_capacity(), std::max(2 * buf_.capacity(), end + n));
  buf_.append(k, v);
  KVSpan span;
  span.k = buf_.k_slots(0, buf_.end());
  span.v = buf_.v_slots(0, buf_.end());
  span.kv_offset = 0;
  return span;
}

MaskSizes DynamicLayer::mask_sizes(int64_t query_len) const {
  return {seq_length() + query_len, 0};
}

void DynamicLayer::crop(int64_t n) {
  const int64_t keep = crop_length(n, seq_length());
  if (buf_.allocated()) buf_.set_window(0, keep);
}

void DynamicLayer::reset() {
  if (buf_.allocated()) buf_.set_window(0, 0);
}

namespace {
std::unique_ptr<CacheLayer> make_dynamic_full(const CacheConfig& config, int layer_index) {
  return std::make_unique<DynamicLayer>(
      dense_params(config, layer_index, "dynamic/full_attention", /*fixed_storage=*/false));
}
}  // namespace

KVCACHE_REGISTER_LAYER(dynamic_full, "dynamic", "full_attention", make_dynamic_full);

}  // namespace kvcache
