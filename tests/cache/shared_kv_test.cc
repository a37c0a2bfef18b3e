// CacheConfig::KVContent::kSharedKV (DeepSeek-V4's K==V sliding layers): the dense containers
// store K once, return spans whose v is k, and bill half the bytes of the same layer with
// separate K and V; the quantized container refuses it.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/dense_layer.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::History;
using testing_util::random_tensor;
using testing_util::views_equal;

constexpr int64_t B = 2, H = 1, D = 8;

std::unique_ptr<CacheLayer> make(const std::string& impl, const std::string& type, bool shared) {
  CacheConfig cfg;
  cfg.sliding_window = 6;
  cfg.attention_chunk_size = 6;
  cfg.options.max_cache_len = 64;
  cfg.options.max_batch_size = 2 * B;  // static: room for repeat_interleave(2)
  cfg.kv_content = shared ? CacheConfig::KVContent::kSharedKV : CacheConfig::KVContent::kPerHead;
  return LayerRegistry::create(impl, type, cfg, 0);
}

struct Container {
  const char* impl;
  const char* type;
};

class SharedKV : public ::testing::TestWithParam<Container> {};

TEST_P(SharedKV, StoresKOnceSpansAliasAndBytesHalve) {
  auto shared = make(GetParam().impl, GetParam().type, true);
  auto plain = make(GetParam().impl, GetParam().type, false);
  std::mt19937 rng(9);
  History hist(DType::kF32);
  int64_t pos = 0;
  // A prefill longer than 2W (the window's workspace path), decode, a chunk.
  for (int64_t n : {15, 1, 1, 4, 1}) {
    Tensor kv = random_tensor(DType::kF32, {B, H, n, D}, rng);
    const MaskSizes ms = shared->mask_sizes(n);
    const KVSpan s = shared->update(kv.view(), kv.view());
    const KVSpan p = plain->update(kv.view(), kv.view());
    if (std::string(GetParam().impl) == "recompute") {  // each call is a sequence of its own
      hist = History(DType::kF32);
      pos = 0;
    }
    hist.append(kv.view(), kv.view());
    pos += n;
    EXPECT_EQ(s.v.data(), s.k.data());
    EXPECT_EQ(s.v.strides(), s.k.strides());
    EXPECT_EQ(s.kv_offset, ms.kv_offset);
    EXPECT_EQ(s.k.dim(2), ms.kv_length);
    EXPECT_TRUE(views_equal(s.k, p.k));
    EXPECT_TRUE(views_equal(s.v, p.v));
    EXPECT_TRUE(views_equal(s.k, hist.k(s.kv_offset, pos)));
    EXPECT_EQ(2 * shared->bytes(), plain->bytes());
  }
  // Row operations keep the aliasing and the content.
  shared->reorder(std::vector<int64_t>{1, 0});
  plain->reorder(std::vector<int64_t>{1, 0});
  shared->repeat_interleave(2);
  plain->repeat_interleave(2);
  Tensor kv = random_tensor(DType::kF32, {2 * B, H, 1, D}, rng);
  const KVSpan s = shared->update(kv.view(), kv.view());
  const KVSpan p = plain->update(kv.view(), kv.view());
  EXPECT_TRUE(views_equal(s.k, p.k));
  EXPECT_EQ(s.v.data(), s.k.data());
  EXPECT_EQ(2 * shared->bytes(), plain->bytes());
}

TEST_P(SharedKV, RefusesKAndVOfDifferentShapes) {
  auto shared = make(GetParam().impl, GetParam().type, true);
  std::mt19937 rng(10);
  Tensor k = random_tensor(DType::kF32, {B, H, 3, D}, rng);
  Tensor v = random_tensor(DType::kF32, {B, H, 3, D + 2}, rng);
  try {
    shared->update(k.view(), v.view());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K == V"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Dense, SharedKV,
                         ::testing::Values(Container{"dynamic", "full_attention"},
                                           Container{"static", "full_attention"},
                                           Container{"dynamic", "sliding_attention"},
                                           Container{"static", "sliding_attention"},
                                           Container{"dynamic", "chunked_attention"},
                                           Container{"recompute", "full_attention"},
                                           Container{"recompute", "sliding_attention"}),
                         [](const auto& info) {
                           return std::string(info.param.impl) + "_" + info.param.type;
                         });

TEST(SharedKV, QuantizedRefusesAtConstruction) {
  for (const char* type : {"full_attention", "sliding_attention"}) {
    try {
      make("quantized", type, true);
      FAIL() << "no error for " << type;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("K == V"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kvcache
