// crop(n) as transformers v5 defines it (cache_utils.py: Cache.crop, DynamicLayer.crop,
// LinearAttentionCacheLayerMixin.crop), in every container: n < 0 removes the last |n| tokens
// and removing more than is stored empties the cache without an error; crop(0) removes nothing
// (speculative decoding's crop(-num_rejected) with nothing rejected) but shrinks a layer that
// records its past back to its working size; n > 0 is the deprecated "keep the first n" form,
// which warns once and is a no-op when n >= the length. Containers that cannot go back keep
// refusing, except for crop(0), no-op crops and crops to 0.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cache/cache.h"
#include "cache/crop_rule.h"
#include "cache/linear_state_layer.h"
#include "cache/window_layer.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::History;
using testing_util::random_tensor;
using testing_util::views_equal;

constexpr int64_t B = 2, H = 2, D = 8;

TEST(CropRule, TargetLengths) {
  EXPECT_EQ(crop_target_length(-3, 10), 7);
  EXPECT_EQ(crop_target_length(-10, 10), 0);
  EXPECT_EQ(crop_target_length(-11, 10), 0);  // more than stored: empty, no error
  EXPECT_EQ(crop_target_length(0, 10), 10);   // nothing removed
  EXPECT_EQ(crop_target_length(0, 0), 0);
  EXPECT_EQ(crop_target_length(4, 10), 4);    // deprecated: keep the first 4
  EXPECT_EQ(crop_target_length(10, 10), 10);  // n >= length: no-op
  EXPECT_EQ(crop_target_length(99, 10), 10);
}

TEST(CropRule, PositiveArgumentWarnsOncePerProcess) {
  reset_crop_deprecation_warning();
  ::testing::internal::CaptureStderr();
  crop_target_length(-2, 10);
  crop_target_length(0, 10);
  EXPECT_FALSE(crop_deprecation_warned());  // the current forms never warn
  crop_target_length(4, 10);
  crop_target_length(5, 10);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(crop_deprecation_warned());
  const auto first = err.find("deprecated");
  ASSERT_NE(first, std::string::npos) << err;
  EXPECT_EQ(err.find("deprecated", first + 1), std::string::npos) << "warned twice: " << err;
}

// (implementation, layer type, policy spec or "")
using Container = std::tuple<std::string, std::string, std::string>;

CacheConfig config_for(const Container& c) {
  CacheConfig cfg;
  cfg.options.implementation = std::get<0>(c);
  cfg.layer_types = {std::get<1>(c)};
  cfg.options.max_cache_len = 64;
  cfg.sliding_window = 32;  // larger than anything written: nothing is evicted
  cfg.attention_chunk_size = 64;
  if (!std::get<2>(c).empty()) cfg.options.policy = KVPolicy::parse(std::get<2>(c));
  return cfg;
}

class CropV5 : public ::testing::TestWithParam<Container> {
 protected:
  void SetUp() override { cache_ = std::make_unique<Cache>(config_for(GetParam())); }
  // Appends n tokens to the cache and the history; checks the span against the history when
  // the container returns plain dense views.
  void step(int64_t n) {
    Tensor k = random_tensor(DType::kF32, {B, H, n, D}, rng_);
    Tensor v = random_tensor(DType::kF32, {B, H, n, D}, rng_);
    hist_.append(k.view(), v.view());
    const KVSpan span = cache_->update(0, k.view(), v.view());
    if (span.kind == KVSpanKind::kDense && std::get<0>(GetParam()) != "quantized") {
      const int64_t len = hist_.length();
      EXPECT_TRUE(views_equal(span.k, hist_.k(len - span.k.dim(2), len)));
      EXPECT_TRUE(views_equal(span.v, hist_.v(len - span.v.dim(2), len)));
    }
    EXPECT_EQ(cache_->seq_length(), hist_.length());
  }
  void crop_hist(int64_t to) { hist_.crop(to); }

  std::mt19937 rng_{5};
  History hist_{DType::kF32};
  std::unique_ptr<Cache> cache_;
};

TEST_P(CropV5, ZeroRemovesNothing) {
  step(10);
  cache_->crop(0);  // speculative decoding with nothing rejected
  EXPECT_EQ(cache_->seq_length(), 10);
  EXPECT_EQ(cache_->mask_sizes(0, 1).kv_length, 11);
  step(1);  // the next token still sees all ten
}

TEST_P(CropV5, NegativeRemovesTheLastTokens) {
  step(10);
  cache_->crop(-3);
  EXPECT_EQ(cache_->seq_length(), 7);
  crop_hist(7);
  step(2);
  cache_->crop(-1);
  EXPECT_EQ(cache_->seq_length(), 8);
  crop_hist(8);
  step(1);
}

TEST_P(CropV5, RemovingMoreThanStoredEmptiesWithoutError) {
  step(10);
  EXPECT_NO_THROW(cache_->crop(-11));
  EXPECT_EQ(cache_->seq_length(), 0);
  EXPECT_NO_THROW(cache_->crop(-1));  // an empty cache: still nothing to complain about
  EXPECT_EQ(cache_->seq_length(), 0);
  crop_hist(0);
  step(3);  // starts over from position 0
}

TEST_P(CropV5, PositiveIsTheDeprecatedKeepFirstForm) {
  step(10);
  ::testing::internal::CaptureStderr();
  cache_->crop(25);  // n >= length: no-op
  EXPECT_EQ(cache_->seq_length(), 10);
  cache_->crop(10);
  EXPECT_EQ(cache_->seq_length(), 10);
  cache_->crop(6);  // keeps the first 6
  ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(crop_deprecation_warned());
  EXPECT_EQ(cache_->seq_length(), 6);
  crop_hist(6);
  step(1);
}

std::string container_name(const ::testing::TestParamInfo<Container>& info) {
  std::string s = std::get<0>(info.param) + "_" + std::get<1>(info.param);
  if (!std::get<2>(info.param).empty()) s += "_policy";
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(
    Containers, CropV5,
    ::testing::Values(
        Container{"dynamic", "full_attention", ""}, Container{"static", "full_attention", ""},
        Container{"dynamic", "sliding_attention", ""}, Container{"static", "sliding_attention", ""},
        Container{"dynamic", "chunked_attention", ""}, Container{"static", "chunked_attention", ""},
        Container{"quantized", "full_attention", ""},
        Container{"quantized", "sliding_attention", ""},
        Container{"offloaded", "full_attention", ""},
        Container{"offloaded_static", "full_attention", ""},
        Container{"dynamic", "full_attention", "streaming:sink=4,window=256"},
        Container{"dynamic", "deepseek_sparse_attention", ""},
        Container{"paged", "full_attention", ""}, Container{"paged", "sliding_attention", ""}),
    container_name);

// A sliding window that records its past: crop(0) drops what recording kept beyond the keys the
// next queries need (v5: "restrict the size of the cached states back to their minimal working
// size"); nothing the model sees changes.
TEST(CropV5Window, ZeroShrinksARecordingWindowToItsWorkingSize) {
  for (const char* impl : {"dynamic", "static"}) {
    CacheConfig cfg = config_for({impl, "sliding_attention", ""});
    cfg.sliding_window = 4;
    Cache cache(cfg);
    cache.activate_past_recording();
    std::mt19937 rng(3);
    for (int i = 0; i < 7; ++i) {  // the static layer's 2W = 8 slots hold them all
      Tensor k = random_tensor(DType::kF32, {B, H, 1, D}, rng);
      cache.update(0, k.view(), k.view());
    }
    auto& w = dynamic_cast<WindowLayer&>(cache.layer(0));
    EXPECT_EQ(w.stored_tokens(), 7) << impl;  // recording kept everything
    const MaskSizes before = cache.mask_sizes(0, 1);
    cache.crop(0);
    EXPECT_EQ(cache.seq_length(), 7) << impl;
    EXPECT_EQ(w.stored_tokens(), 3) << impl;  // W-1: what the next query may see
    EXPECT_EQ(cache.mask_sizes(0, 1).kv_length, before.kv_length) << impl;
    EXPECT_EQ(cache.mask_sizes(0, 1).kv_offset, before.kv_offset) << impl;
    EXPECT_TRUE(w.past_recording()) << impl;      // recording goes on from here
    EXPECT_THROW(cache.crop(-1), Error) << impl;  // position 6 needs key 3: no longer held
    // crop to 0 is always reachable.
    cache.crop(-100);
    EXPECT_EQ(cache.seq_length(), 0) << impl;
  }
}

// Past the window without recording: going back is still refused, but crop(0), no-op crops and
// crops to 0 succeed.
TEST(CropV5Window, EvictedWindowRefusesButZeroAndEmptyWork) {
  CacheConfig cfg = config_for({"dynamic", "sliding_attention", ""});
  cfg.sliding_window = 4;
  Cache cache(cfg);
  std::mt19937 rng(4);
  Tensor k = random_tensor(DType::kF32, {B, H, 9, D}, rng);
  cache.update(0, k.view(), k.view());
  EXPECT_THROW(cache.crop(-1), Error);
  EXPECT_EQ(cache.seq_length(), 9);
  EXPECT_NO_THROW(cache.crop(0));
  EXPECT_EQ(cache.seq_length(), 9);
  EXPECT_NO_THROW(cache.crop(-9));
  EXPECT_EQ(cache.seq_length(), 0);
}

TEST(CropV5Evicting, AfterEvictionOnlyZeroAndEmptyCropsWork) {
  CacheConfig cfg = config_for({"dynamic", "full_attention", "streaming:sink=1,window=4"});
  Cache cache(cfg);
  std::mt19937 rng(6);
  for (int i = 0; i < 10; ++i) {
    Tensor k = random_tensor(DType::kF32, {B, H, 1, D}, rng);
    cache.update(0, k.view(), k.view());
  }
  EXPECT_THROW(cache.crop(-1), Error);  // the lossy cache cannot bring the state back
  EXPECT_NO_THROW(cache.crop(0));
  EXPECT_EQ(cache.seq_length(), 10);
  EXPECT_NO_THROW(cache.crop(-50));
  EXPECT_EQ(cache.seq_length(), 0);
}

// Linear-attention state (Gated DeltaNet): no recording, it can only stay or go to 0; with
// recording, crop(0) drops the recorded conv inputs and snapshots (working size: the conv
// window), so an earlier snapshot is no longer reachable.
class CropV5Linear : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_.layer_types = {"linear_attention", "full_attention"};
    cfg_.linear = {
        .conv_kernel = 4, .conv_dim = 16, .heads_v = 2, .head_dim_k = 3, .head_dim_v = 4};
  }
  void forward(Cache& cache, int64_t tokens) {
    Tensor x = random_tensor(DType::kF32, {1, tokens, cfg_.linear.conv_dim}, rng_);
    cache.update_conv_state(0, x.view());
    Tensor s = random_tensor(
        DType::kF32, {1, cfg_.linear.heads_v, cfg_.linear.head_dim_k, cfg_.linear.head_dim_v},
        rng_);
    cache.update_recurrent_state(0, s.view());
    Tensor k = random_tensor(DType::kF32, {1, H, tokens, D}, rng_);
    cache.update(1, k.view(), k.view());
  }
  CacheConfig cfg_;
  std::mt19937 rng_{8};
};

TEST_F(CropV5Linear, WithoutRecordingZeroAndEmptyWorkOthersRefuse) {
  Cache cache(cfg_);
  forward(cache, 5);
  EXPECT_NO_THROW(cache.crop(0));
  EXPECT_EQ(cache.seq_length(), 5);
  EXPECT_EQ(cache.seq_length(0), 5);
  EXPECT_THROW(cache.crop(-1), Error);  // a recurrent state cannot go back
  EXPECT_EQ(cache.seq_length(), 5);     // refused before any layer changed
  EXPECT_NO_THROW(cache.crop(-7));
  EXPECT_EQ(cache.seq_length(), 0);
  EXPECT_EQ(cache.seq_length(0), 0);
  EXPECT_FALSE(cache.has_previous_state());
}

TEST_F(CropV5Linear, ZeroShrinksTheRecordingToTheWorkingSize) {
  Cache cache(cfg_);
  forward(cache, 3);
  cache.activate_past_recording();
  cache.snapshot_linear_states();  // at 3
  forward(cache, 2);
  cache.snapshot_linear_states();  // at 5
  forward(cache, 2);               // 7
  auto& lin = dynamic_cast<LinearStateLayer&>(cache.linear_layer(0));
  EXPECT_EQ(lin.snapshot_positions(), (std::vector<int64_t>{3, 5}));
  EXPECT_NO_THROW(lin.check_crop(-4));  // back to 3: recorded
  cache.crop(0);
  EXPECT_EQ(cache.seq_length(0), 7);
  EXPECT_TRUE(lin.snapshot_positions().empty());
  EXPECT_THROW(cache.crop(-2), Error);  // 5: recorded before the crop, dropped by it
  EXPECT_EQ(cache.seq_length(0), 7);
  forward(cache, 1);  // recording goes on from 7
  cache.crop(0);
}

}  // namespace
}  // namespace kvcache
