// compressed_sparse_attention (CSA, DeepSeek-V4): a sliding K==V window plus one compressed
// entry per `rate` tokens (V4: 4) from overlapping windows (the overlap state carries the last
// window's Ca half across calls), and the lightning indexer's compressed keys as a second
// stream kept the same way. The containers are CompressedLayer's (cache/compressed_layer.h);
// transformers' DeepseekV4CSACache.
#include <memory>

#include "cache/compressed_layer.h"

namespace kvcache {

namespace {
template <bool kRecompute>
std::unique_ptr<CacheLayer> make_csa(const CacheConfig& config, int layer_index) {
  return make_compressed_layer(config, layer_index, kRecompute ? "recompute" : "dynamic",
                               "compressed_sparse_attention", /*csa=*/true);
}
}  // namespace

KVCACHE_REGISTER_LAYER(dynamic_csa, "dynamic", "compressed_sparse_attention", make_csa<false>);
KVCACHE_REGISTER_LAYER(recompute_csa, "recompute", "compressed_sparse_attention", make_csa<true>);

}  // namespace kvcache
