// Cache object API parity with transformers v5 (cache_utils.py: Cache.__init__, DynamicCache
// from legacy per-layer data with per-layer sliding windows, __iter__, batch_size, is_sliding,
// is_compileable) and a deep copy (clone) whose storage is independent of the original.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::random_tensor;
using testing_util::views_equal;

constexpr int64_t B = 2, H = 2, D = 4;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// v5: DynamicCache(ddp_cache_data) builds one layer per entry; a layer with a sliding window
// keeps only its last W-1 tokens (DynamicSlidingWindowLayer), a full layer keeps all; iterating
// the cache gives each layer's keys and values.
TEST(CacheParity, FromLayerDataWithPerLayerWindowsAndIterateBack) {
  std::mt19937 rng(1);
  std::vector<Tensor> ks, vs;
  for (int i = 0; i < 3; ++i) {
    ks.push_back(random_tensor(DType::kF32, {B, H, 10, D}, rng));
    vs.push_back(random_tensor(DType::kF32, {B, H, 10, D}, rng));
  }
  const std::vector<LayerData> data = {{ks[0].view(), vs[0].view(), 0},
                                       {ks[1].view(), vs[1].view(), 4},
                                       {ks[2].view(), vs[2].view(), 8}};
  auto cache = Cache::from_layer_data(data);
  ASSERT_EQ(cache->num_layers(), 3);
  EXPECT_EQ(cache->config().layer_types,
            (std::vector<std::string>{"full_attention", "sliding_attention", "sliding_attention"}));
  EXPECT_EQ(cache->config().window_of(1), 4);
  EXPECT_EQ(cache->config().window_of(2), 8);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cache->seq_length(i), 10);
  // Iterating back: the full layer everything, each sliding layer its last W-1 tokens.
  const KVSpan full = cache->stored_kv(0);
  EXPECT_EQ(full.kv_offset, 0);
  EXPECT_TRUE(views_equal(full.k, ks[0].view()));
  EXPECT_TRUE(views_equal(full.v, vs[0].view()));
  const int64_t windows[] = {0, 4, 8};
  for (int i = 1; i < 3; ++i) {
    const KVSpan s = cache->stored_kv(i);
    const int64_t keep = windows[i] - 1;
    EXPECT_EQ(s.kv_offset, 10 - keep) << i;
    EXPECT_TRUE(views_equal(s.k, ks[static_cast<size_t>(i)].view().slice(2, 10 - keep, 10))) << i;
    EXPECT_TRUE(views_equal(s.v, vs[static_cast<size_t>(i)].view().slice(2, 10 - keep, 10))) << i;
  }
  // The windows differ per layer in what the next query sees.
  EXPECT_EQ(cache->mask_sizes(1, 1).kv_length, 4);
  EXPECT_EQ(cache->mask_sizes(2, 1).kv_length, 8);
  EXPECT_EQ(cache->is_sliding(), (std::vector<bool>{false, true, true}));
  EXPECT_EQ(cache->batch_size(), B);
  // Bad input: nothing, or a negative window.
  EXPECT_THROW(Cache::from_layer_data({}), Error);
  const std::vector<LayerData> bad = {{ks[0].view(), vs[0].view(), -1}};
  EXPECT_THROW(Cache::from_layer_data(bad), Error);
}

TEST(CacheParity, LayerWindowsMustCoverEveryLayer) {
  CacheConfig cfg;
  cfg.layer_types = {"sliding_attention", "sliding_attention"};
  cfg.sliding_window = 16;
  cfg.layer_windows = {4, 0};  // 0: the cache-wide window
  Cache cache(cfg);
  EXPECT_EQ(cache.config().window_of(0), 4);
  EXPECT_EQ(cache.config().window_of(1), 16);
  cfg.layer_windows = {4};
  const std::string msg = message_of([&] { Cache c(cfg); });
  EXPECT_NE(msg.find("one window per layer"), std::string::npos) << msg;
}

TEST(CacheParity, ConfigAndExplicitLayersAreExclusive) {
  CacheConfig cfg;
  cfg.layer_types = {"full_attention"};
  CacheSource both;
  both.config = cfg;
  both.layers.push_back(LayerRegistry::create("dynamic", "full_attention", cfg, 0));
  const std::string msg = message_of([&] { Cache::create(std::move(both)); });
  EXPECT_NE(msg.find("not both"), std::string::npos) << msg;
  EXPECT_THROW(Cache::create(CacheSource{}), Error);  // neither

  // Explicit layers: the config's types come from their registry names.
  CacheConfig sliding = cfg;
  sliding.sliding_window = 4;
  CacheSource layers;
  layers.layers.push_back(LayerRegistry::create(
      "static", "full_attention",
      [] {
        CacheConfig c;
        c.options.max_cache_len = 32;
        return c;
      }(),
      0));
  layers.layers.push_back(LayerRegistry::create("dynamic", "sliding_attention", sliding, 1));
  auto cache = Cache::create(std::move(layers));
  EXPECT_EQ(cache->config().layer_types,
            (std::vector<std::string>{"full_attention", "sliding_attention"}));
  EXPECT_EQ(cache->is_sliding(), (std::vector<bool>{false, true}));
  std::mt19937 rng(2);
  Tensor k = random_tensor(DType::kF32, {B, H, 6, D}, rng);
  cache->update(0, k.view(), k.view());
  cache->update(1, k.view(), k.view());
  EXPECT_EQ(cache->stored_kv(1).k.dim(2), 3);  // W-1
  EXPECT_THROW(cache->clone(), Error);         // its layers' options are not in a config
}

TEST(CacheParity, CloneIsADeepCopy) {
  for (const char* impl : {"dynamic", "static"}) {
    CacheConfig cfg;
    cfg.options.implementation = impl;
    cfg.options.max_cache_len = 32;
    cfg.layer_types = {"full_attention", "sliding_attention"};
    cfg.sliding_window = 8;  // nothing evicted: crop may go back
    Cache cache(cfg);
    std::mt19937 rng(3);
    Tensor k = random_tensor(DType::kF32, {B, H, 6, D}, rng);
    Tensor v = random_tensor(DType::kF32, {B, H, 6, D}, rng);
    for (int l = 0; l < 2; ++l) cache.update(l, k.view(), v.view());
    auto copy = cache.clone();
    for (int l = 0; l < 2; ++l) {
      EXPECT_EQ(copy->seq_length(l), 6) << impl;
      const KVSpan a = cache.stored_kv(l), b = copy->stored_kv(l);
      EXPECT_NE(a.k.data(), b.k.data()) << impl;  // its own storage
      EXPECT_TRUE(views_equal(a.k, b.k)) << impl;
      EXPECT_TRUE(views_equal(a.v, b.v)) << impl;
      EXPECT_EQ(a.kv_offset, b.kv_offset) << impl;
    }
    // Changing one leaves the other as it was.
    Tensor k2 = random_tensor(DType::kF32, {B, H, 1, D}, rng);
    copy->crop(-2);
    copy->update(0, k2.view(), k2.view());
    EXPECT_EQ(cache.seq_length(0), 6) << impl;
    EXPECT_TRUE(views_equal(cache.stored_kv(0).k, k.view())) << impl;
    EXPECT_TRUE(views_equal(copy->stored_kv(0).k.slice(2, 0, 4), k.view().slice(2, 0, 4)));
    cache.reset();
    EXPECT_EQ(copy->seq_length(0), 5) << impl;
  }
}

// The other containers that keep tokens: the copy has the same length and its own life.
TEST(CacheParity, CloneQuantizedOffloadedAndLinear) {
  for (const char* impl : {"quantized", "offloaded"}) {
    CacheConfig cfg;
    cfg.options.implementation = impl;
    cfg.layer_types = {"full_attention"};
    Cache cache(cfg);
    std::mt19937 rng(5);
    Tensor k = random_tensor(DType::kF32, {B, H, 6, D}, rng);
    cache.update(0, k.view(), k.view());
    auto copy = cache.clone();
    EXPECT_EQ(copy->seq_length(), 6) << impl;
    copy->crop(-2);
    EXPECT_EQ(copy->seq_length(), 4) << impl;
    EXPECT_EQ(cache.seq_length(), 6) << impl;
    const KVSpan a = cache.update(0, k.view(), k.view());
    EXPECT_EQ(cache.seq_length(), 12) << impl;
    EXPECT_EQ(copy->seq_length(), 4) << impl;
    (void)a;
  }
  CacheConfig cfg;
  cfg.layer_types = {"linear_attention", "full_attention"};
  cfg.linear = {.conv_kernel = 4, .conv_dim = 5, .heads_v = 2, .head_dim_k = 3, .head_dim_v = 4};
  Cache cache(cfg);
  std::mt19937 rng(6);
  Tensor x = random_tensor(DType::kF32, {1, 3, 5}, rng);
  cache.update_conv_state(0, x.view());
  Tensor st = random_tensor(DType::kF32, {1, 2, 3, 4}, rng);
  cache.update_recurrent_state(0, st.view());
  auto copy = cache.clone();
  EXPECT_TRUE(views_equal(copy->linear_layer(0).recurrent_state(),
                          cache.linear_layer(0).recurrent_state()));
  EXPECT_NE(copy->linear_layer(0).recurrent_state().data(),
            cache.linear_layer(0).recurrent_state().data());
  EXPECT_EQ(copy->seq_length(0), 3);
}

TEST(CacheParity, ClonePagedIsRefusedWithAReason) {
  CacheConfig cfg;
  cfg.options.implementation = "paged";
  cfg.options.max_cache_len = 32;
  cfg.layer_types = {"full_attention"};
  Cache cache(cfg);
  const std::string msg = message_of([&] { cache.clone(); });
  EXPECT_NE(msg.find("repeat_interleave"), std::string::npos) << msg;
}

TEST(CacheParity, BatchSizeIsSlidingIsCompileable) {
  CacheConfig cfg;
  cfg.layer_types = {"full_attention", "sliding_attention", "chunked_attention"};
  cfg.sliding_window = 4;
  cfg.attention_chunk_size = 8;
  cfg.options.max_cache_len = 16;
  Cache dynamic(cfg);
  EXPECT_EQ(dynamic.batch_size(), -1);  // nothing held yet (v5: -1)
  EXPECT_EQ(dynamic.is_sliding(), (std::vector<bool>{false, true, true}));
  EXPECT_FALSE(dynamic.is_compileable());  // growing storage
  std::mt19937 rng(4);
  Tensor k = random_tensor(DType::kF32, {3, H, 2, D}, rng);
  for (int l = 0; l < 3; ++l) dynamic.update(l, k.view(), k.view());
  EXPECT_EQ(dynamic.batch_size(), 3);
  dynamic.repeat_interleave(2);
  EXPECT_EQ(dynamic.batch_size(), 6);

  cfg.options.implementation = "static";
  Cache fixed(cfg);
  EXPECT_TRUE(fixed.is_compileable());
  // Layers that disagree on the batch: an error naming the layer.
  Cache mixed(cfg);
  Tensor k1 = random_tensor(DType::kF32, {1, H, 2, D}, rng);
  mixed.update(0, k.view(), k.view());
  mixed.update(1, k1.view(), k1.view());
  const std::string msg = message_of([&] { (void)mixed.batch_size(); });
  EXPECT_NE(msg.find("layer 1"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kvcache
