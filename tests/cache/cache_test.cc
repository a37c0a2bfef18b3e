// Cache: registry lookups and errors, per-layer construction, KV-shared layers, lifecycle over
// all layers, total bytes.
#include "cache/cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::random_tensor;
using testing_util::views_equal;

TEST(LayerRegistry, ListsRegisteredContainers) {
  const auto names = LayerRegistry::names();
  for (const char* want : {"dynamic/full_attention", "static/full_attention"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_TRUE(LayerRegistry::contains("dynamic", "full_attention"));
  EXPECT_FALSE(LayerRegistry::contains("dynamic", "no_such_attention"));
}

TEST(Cache, UnknownTypeNamesLayerTypeAndKnownNames) {
  CacheConfig cfg;
  cfg.layer_types = {"full_attention", "full_attention", "mystery_attention"};
  try {
    Cache cache(cfg);
    FAIL() << "an unknown layer type must throw";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(msg.find("layer 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mystery_attention"), std::string::npos) << msg;
    EXPECT_NE(msg.find("dynamic/full_attention"), std::string::npos) << msg;
  }
  cfg.layer_types = {"full_attention"};
  cfg.options.implementation = "nonsense";
  EXPECT_THROW(Cache{cfg}, Error);
  cfg.options.implementation = "dynamic";
  cfg.layer_types = {};
  EXPECT_THROW(Cache{cfg}, Error);
}

TEST(Cache, SharedLayersReadTheirSourceAndOwnNothing) {
  CacheConfig cfg;
  // 5 layers, the last 2 shared: both read layer 2, the last non-shared full_attention layer.
  cfg.layer_types = std::vector<std::string>(5, "full_attention");
  cfg.num_kv_shared_layers = 2;
  Cache cache(cfg);
  EXPECT_EQ(cache.num_layers(), 5);
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(cache.is_shared(i));
    EXPECT_EQ(cache.source_layer(i), i);
  }
  EXPECT_TRUE(cache.is_shared(3));
  EXPECT_EQ(cache.source_layer(3), 2);
  EXPECT_EQ(cache.source_layer(4), 2);
  EXPECT_THROW(cache.layer(3), Error);
  EXPECT_THROW(cache.shared_kv(3), Error);  // layer 2 not run yet

  std::mt19937 rng(11);
  std::vector<Tensor> ks, vs;
  for (int i = 0; i < 3; ++i) {
    ks.push_back(random_tensor(DType::kF16, {3, 5, 4, 7}, rng));
    vs.push_back(random_tensor(DType::kF16, {3, 5, 4, 7}, rng));
    cache.update(i, ks.back().view(), vs.back().view());
  }
  EXPECT_THROW(cache.update(3, ks[0].view(), vs[0].view()), Error);
  const KVSpan shared = cache.shared_kv(4);
  EXPECT_TRUE(views_equal(shared.k, ks[2].view()));
  EXPECT_TRUE(views_equal(shared.v, vs[2].view()));
  EXPECT_EQ(cache.seq_length(4), 4);
  EXPECT_EQ(cache.mask_sizes(4, 1).kv_length, 5);
  // Bytes: three owning layers of 16 slots each (DynamicLayer::kMinCapacity).
  EXPECT_EQ(cache.bytes(), size_t{3 * (3 * 5 * 16 * (7 + 7) * 2)});

  // Lifecycle applies to every owning layer and forgets the shared spans.
  cache.crop(-1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(cache.seq_length(i), 3);
  EXPECT_THROW(cache.shared_kv(3), Error);
  const std::vector<int64_t> sel = {1};
  cache.select(sel);
  cache.repeat_interleave(2);
  const std::vector<int64_t> beam = {1, 0};
  cache.reorder(beam);
  Tensor k1 = random_tensor(DType::kF16, {2, 5, 1, 7}, rng);
  const KVSpan s0 = cache.update(0, k1.view(), k1.view());
  EXPECT_EQ(s0.k.shape(), Shape({2, 5, 4, 7}));
  EXPECT_TRUE(
      views_equal(s0.k.slice(2, 0, 3).slice(0, 0, 1), ks[0].view().slice(0, 1, 2).slice(2, 0, 3)));
  cache.reset();
  for (int i = 0; i < 5; ++i) EXPECT_EQ(cache.seq_length(i), 0);
  EXPECT_EQ(cache.bytes(), size_t{3 * (3 * 5 * 16 * (7 + 7) * 2)});
}

TEST(Cache, SharedLayerWithoutSourceOfItsTypeIsAnError) {
  CacheConfig cfg;
  cfg.layer_types = {"full_attention", "full_attention", "sliding_attention"};
  cfg.sliding_window = 4;
  cfg.num_kv_shared_layers = 1;
  try {
    Cache cache(cfg);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("layer 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("sliding_attention"), std::string::npos) << msg;
  }
  cfg.num_kv_shared_layers = 3;  // all layers shared: nothing to read
  EXPECT_THROW(Cache{cfg}, Error);
  cfg.num_kv_shared_layers = -1;
  EXPECT_THROW(Cache{cfg}, Error);
}

TEST(Cache, LayerIndexIsChecked) {
  CacheConfig cfg;
  cfg.layer_types = {"full_attention"};
  Cache cache(cfg);
  Tensor k = Tensor::zeros(DType::kF32, {1, 1, 1, 1});
  EXPECT_THROW(cache.update(1, k.view(), k.view()), Error);
  EXPECT_THROW(cache.update(-1, k.view(), k.view()), Error);
  EXPECT_THROW(cache.seq_length(3), Error);
}

}  // namespace
}  // namespace kvcache
