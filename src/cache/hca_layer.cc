// heavily_compressed_attention (HCA, DeepSeek-V4): a sliding K==V window plus one compressed
// entry per `rate` tokens (V4: 128), non-overlapping windows, no indexer. The containers are
// CompressedLayer's (cache/compressed_layer.h); transformers' DeepseekV4HCACache.
#include <memory>

#include "cache/compressed_layer.h"

namespace kvcache {

namespace {
template <bool kRecompute>
std::unique_ptr<CacheLayer> make_hca(const CacheConfig& config, int layer_index) {
  return make_compressed_layer(config, layer_index, kRecompute ? "recompute" : "dynamic",
                               "heavily_compressed_attention", /*csa=*/false);
}
}  // namespace

KVCACHE_REGISTER_LAYER(dynamic_hca, "dynamic", "heavily_compressed_attention", make_hca<false>);
KVCACHE_REGISTER_LAYER(recompute_hca, "recompute", "heavily_compressed_attention", make_hca<true>);

}  // namespace kvcache
