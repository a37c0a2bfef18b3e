// The "recompute" container (the no-cache reference): every update is a sequence of its own —
// the span is exactly the new K/V at kv_offset 0, held in the layer's storage (a copy) until the
// next update, so a KV-shared layer reads its source's latest tokens as from any cache.
#include "cache/recompute_layer.h"

#include <gtest/gtest.h>

#include "cache/cache.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::random_tensor;
using testing_util::views_equal;

TEST(RecomputeLayer, EachUpdateIsAWholeSequenceHeldAsACopy) {
  for (const char* type : {"full_attention", "sliding_attention", "chunked_attention"}) {
    CacheConfig cfg;
    cfg.sliding_window = 4;
    cfg.attention_chunk_size = 4;
    auto layer = LayerRegistry::create("recompute", type, cfg, 0);
    EXPECT_EQ(layer->name(), std::string("recompute/") + type);
    std::mt19937 rng(3);
    // Batch, length and dtype of the first update; then a shorter call with another batch.
    for (const auto& [B, S] : {std::pair<int64_t, int64_t>{2, 9}, {3, 5}, {3, 12}}) {
      EXPECT_EQ(layer->mask_sizes(S).kv_length, S);
      EXPECT_EQ(layer->mask_sizes(S).kv_offset, 0);
      Tensor k = random_tensor(DType::kF32, {B, 2, S, 8}, rng),
             v = random_tensor(DType::kF32, {B, 2, S, 6}, rng);
      const KVSpan span = layer->update(k.view(), v.view());
      EXPECT_EQ(span.kind, KVSpanKind::kDense);
      EXPECT_EQ(span.kv_offset, 0);
      EXPECT_EQ(layer->seq_length(), S);
      EXPECT_NE(span.k.data(), k.data());  // held by the layer, not a view of the input
      std::fill(k.data_as<float>(), k.data_as<float>() + k.numel(), 0.0f);
      EXPECT_FALSE(views_equal(span.k, k.view()));
      EXPECT_TRUE(views_equal(span.v, v.view())) << type;
    }
    layer->reset();
    EXPECT_EQ(layer->seq_length(), 0);
    EXPECT_EQ(layer->max_length(), -1);
  }
}

TEST(RecomputeLayer, SharedLayersReadTheSourcesLatestTokens) {
  CacheConfig cfg;
  cfg.options.implementation = "recompute";
  cfg.layer_types = {"sliding_attention", "full_attention", "sliding_attention"};
  cfg.sliding_window = 3;
  cfg.num_kv_shared_layers = 1;
  Cache cache(cfg);
  std::mt19937 rng(5);
  for (int call = 0; call < 2; ++call) {
    const Tensor k = random_tensor(DType::kF32, {1, 2, 4 + call, 8}, rng),
                 v = random_tensor(DType::kF32, {1, 2, 4 + call, 8}, rng);
    const KVSpan own = cache.update_or_share(0, k.view(), v.view());
    cache.update_or_share(1, v.view(), k.view());
    const KVSpan shared = cache.update_or_share(2, TensorView(), TensorView());
    EXPECT_TRUE(views_equal(shared.k, k.view()));
    EXPECT_TRUE(views_equal(shared.v, v.view()));
    EXPECT_EQ(shared.k.data(), own.k.data());
  }
}

}  // namespace
}  // namespace kvcache
