// EncoderDecoderCache (transformers v5 cache_utils.py, EncoderDecoderCache): cross K/V are set
// once per layer and marked updated; reorder / select / repeat_interleave / reset act on both
// caches, crop on the self-attention cache only; bytes() counts both.
#include "cache/encoder_decoder_cache.h"

#include <gtest/gtest.h>

#include <random>

#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::random_tensor;
using testing_util::views_equal;

constexpr int64_t kH = 2, kD = 4, kEnc = 5;

CacheConfig self_config(const std::string& impl, int layers = 2) {
  CacheConfig c;
  c.options.implementation = impl;
  c.options.max_cache_len = 32;
  c.options.max_batch_size = 4;
  c.layer_types.assign(static_cast<size_t>(layers), "full_attention");
  return c;
}

struct Filled {
  EncoderDecoderCache cache;
  std::vector<Tensor> ck, cv;  // cross K/V per layer
  std::vector<Tensor> sk, sv;  // the self tokens fed per layer (one update of 3 tokens)
  Filled(const std::string& impl, int64_t B, std::mt19937& rng) : cache(self_config(impl)) {
    for (int l = 0; l < cache.num_layers(); ++l) {
      ck.push_back(random_tensor(DType::kF32, {B, kH, kEnc, kD}, rng));
      cv.push_back(random_tensor(DType::kF32, {B, kH, kEnc, kD}, rng));
      cache.set_cross(l, ck.back().view(), cv.back().view());
      sk.push_back(random_tensor(DType::kF32, {B, kH, 3, kD}, rng));
      sv.push_back(random_tensor(DType::kF32, {B, kH, 3, kD}, rng));
      cache.self_attention_cache().update(l, sk.back().view(), sv.back().view());
    }
  }
};

// Row `row` of a [B, H, S, D] view.
TensorView row_of(const TensorView& t, int64_t row) {
  return t.slice(0, row, row + 1);
}

TEST(EncoderDecoderCache, CrossIsSetOncePerLayerUntilReset) {
  std::mt19937 rng(1);
  EncoderDecoderCache c(self_config("dynamic"));
  Tensor k = random_tensor(DType::kF32, {1, kH, kEnc, kD}, rng);
  Tensor v = random_tensor(DType::kF32, {1, kH, kEnc, kD}, rng);
  EXPECT_FALSE(c.is_updated(0));
  EXPECT_FALSE(c.is_updated(1));
  EXPECT_THROW(c.cross(0), Error);
  const KVSpan s = c.set_cross(0, k.view(), v.view());
  EXPECT_TRUE(views_equal(s.k, k.view()));
  EXPECT_TRUE(views_equal(s.v, v.view()));
  EXPECT_TRUE(c.is_updated(0));
  EXPECT_FALSE(c.is_updated(1));  // per layer
  EXPECT_EQ(c.encoder_length(), kEnc);
  // Computed once: a second set of the same layer is refused and changes nothing.
  Tensor k2 = random_tensor(DType::kF32, {1, kH, kEnc, kD}, rng);
  EXPECT_THROW(c.set_cross(0, k2.view(), k2.view()), Error);
  EXPECT_TRUE(views_equal(c.cross(0).k, k.view()));
  // The stored copy is independent of the caller's tensor.
  k.data_as<float>()[0] += 1.0f;
  EXPECT_NE(c.cross(0).k.data_as<float>()[0], k.data_as<float>()[0]);
  // Another layer with another encoder length is refused (one encoder output per cache).
  Tensor other = random_tensor(DType::kF32, {1, kH, kEnc + 1, kD}, rng);
  EXPECT_THROW(c.set_cross(1, other.view(), other.view()), Error);
  EXPECT_THROW(c.set_cross(2, k2.view(), k2.view()), Error);  // no such layer
  c.reset();
  EXPECT_FALSE(c.is_updated(0));
  EXPECT_EQ(c.encoder_length(), 0);
  EXPECT_EQ(c.cross_bytes(), 0u);
  EXPECT_NO_THROW(c.set_cross(0, k2.view(), k2.view()));
  EXPECT_TRUE(views_equal(c.cross(0).k, k2.view()));
}

TEST(EncoderDecoderCache, BytesCountBothCaches) {
  std::mt19937 rng(2);
  Filled f("dynamic", 2, rng);
  const size_t cross = 2 /*layers*/ * 2 /*k, v*/ * 2 * kH * kEnc * kD * sizeof(float);
  EXPECT_EQ(f.cache.cross_bytes(), cross);
  EXPECT_GT(f.cache.self_bytes(), 0u);
  EXPECT_EQ(f.cache.self_bytes(), f.cache.self_attention_cache().bytes());
  EXPECT_EQ(f.cache.bytes(), f.cache.self_bytes() + cross);
}

TEST(EncoderDecoderCache, CrossFollowsTheKvDtype) {
  std::mt19937 rng(8);
  CacheConfig cfg = self_config("dynamic");
  cfg.options.kv_dtype = DType::kF16;
  EncoderDecoderCache c(cfg);
  Tensor k = random_tensor(DType::kF32, {1, kH, kEnc, kD}, rng);
  const KVSpan s = c.set_cross(0, k.view(), k.view());
  EXPECT_EQ(s.k.dtype(), DType::kF16);
  EXPECT_EQ(c.cross_bytes(), 2u * kH * kEnc * kD * 2u);
  Tensor want = Tensor::empty(DType::kF16, k.shape());
  copy_view(k.view(), want.view());
  EXPECT_TRUE(views_equal(s.k, want.view()));
  cfg.options.kv_dtype = DType::kQ8_0;
  EXPECT_THROW(EncoderDecoderCache{cfg}, Error);
}

TEST(EncoderDecoderCache, CropActsOnSelfOnly) {
  for (const char* impl : {"dynamic", "static", "paged"}) {
    SCOPED_TRACE(impl);
    std::mt19937 rng(3);
    Filled f(impl, 1, rng);
    ASSERT_EQ(f.cache.seq_length(), 3);
    f.cache.crop(2);  // keep the first 2 decoder tokens
    EXPECT_EQ(f.cache.seq_length(), 2);
    EXPECT_EQ(f.cache.encoder_length(), kEnc);
    for (int l = 0; l < 2; ++l) {
      EXPECT_TRUE(f.cache.is_updated(l));
      EXPECT_TRUE(views_equal(f.cache.cross(l).k, f.ck[static_cast<size_t>(l)].view()));
      EXPECT_TRUE(views_equal(f.cache.cross(l).v, f.cv[static_cast<size_t>(l)].view()));
    }
  }
}

TEST(EncoderDecoderCache, ResetEmptiesBoth) {
  std::mt19937 rng(4);
  Filled f("dynamic", 1, rng);
  f.cache.reset();
  EXPECT_EQ(f.cache.seq_length(), 0);
  EXPECT_FALSE(f.cache.is_updated(0));
  EXPECT_FALSE(f.cache.is_updated(1));
  EXPECT_EQ(f.cache.cross_bytes(), 0u);
}

// The self cache's row b after an operation: one more token fed, the span's first 3 tokens.
TensorView self_row(EncoderDecoderCache& c, int layer, int64_t b, Tensor& extra_k,
                    Tensor& extra_v) {
  const KVSpan s = c.self_attention_cache().update(layer, extra_k.view(), extra_v.view());
  return row_of(s.k, b).slice(2, 0, 3);
}

TEST(EncoderDecoderCache, ReorderAppliesToBoth) {
  std::mt19937 rng(5);
  Filled f("dynamic", 2, rng);
  const std::vector<int64_t> beams = {1, 0};
  f.cache.reorder(beams);
  for (int l = 0; l < 2; ++l) {
    const size_t L = static_cast<size_t>(l);
    EXPECT_TRUE(views_equal(row_of(f.cache.cross(l).k, 0), row_of(f.ck[L].view(), 1)));
    EXPECT_TRUE(views_equal(row_of(f.cache.cross(l).v, 1), row_of(f.cv[L].view(), 0)));
    Tensor ek = random_tensor(DType::kF32, {2, kH, 1, kD}, rng);
    Tensor ev = random_tensor(DType::kF32, {2, kH, 1, kD}, rng);
    EXPECT_TRUE(views_equal(self_row(f.cache, l, 0, ek, ev), row_of(f.sk[L].view(), 1)));
  }
  // An index outside the batch changes nothing.
  const std::vector<int64_t> bad = {0, 2};
  EXPECT_THROW(f.cache.reorder(bad), Error);
  EXPECT_TRUE(views_equal(row_of(f.cache.cross(0).k, 0), row_of(f.ck[0].view(), 1)));
}

TEST(EncoderDecoderCache, SelectAppliesToBoth) {
  std::mt19937 rng(6);
  Filled f("dynamic", 3, rng);
  const std::vector<int64_t> keep = {2, 0};
  f.cache.select(keep);
  for (int l = 0; l < 2; ++l) {
    const size_t L = static_cast<size_t>(l);
    ASSERT_EQ(f.cache.cross(l).k.dim(0), 2);
    EXPECT_TRUE(views_equal(row_of(f.cache.cross(l).k, 0), row_of(f.ck[L].view(), 2)));
    EXPECT_TRUE(views_equal(row_of(f.cache.cross(l).k, 1), row_of(f.ck[L].view(), 0)));
    Tensor ek = random_tensor(DType::kF32, {2, kH, 1, kD}, rng);
    Tensor ev = random_tensor(DType::kF32, {2, kH, 1, kD}, rng);
    EXPECT_TRUE(views_equal(self_row(f.cache, l, 0, ek, ev), row_of(f.sk[L].view(), 2)));
  }
  EXPECT_EQ(f.cache.cross_bytes(), 2u * 2u * 2u * kH * kEnc * kD * sizeof(float));
}

TEST(EncoderDecoderCache, RepeatInterleaveAppliesToBoth) {
  std::mt19937 rng(7);
  Filled f("dynamic", 2, rng);
  f.cache.repeat_interleave(2);
  for (int l = 0; l < 2; ++l) {
    const size_t L = static_cast<size_t>(l);
    ASSERT_EQ(f.cache.cross(l).k.dim(0), 4);
    for (int64_t r = 0; r < 4; ++r)
      EXPECT_TRUE(views_equal(row_of(f.cache.cross(l).k, r), row_of(f.ck[L].view(), r / 2)));
    Tensor ek = random_tensor(DType::kF32, {4, kH, 1, kD}, rng);
    Tensor ev = random_tensor(DType::kF32, {4, kH, 1, kD}, rng);
    EXPECT_TRUE(views_equal(self_row(f.cache, l, 3, ek, ev), row_of(f.sk[L].view(), 1)));
  }
  EXPECT_THROW(f.cache.repeat_interleave(0), Error);
}

}  // namespace
}  // namespace kvcache
