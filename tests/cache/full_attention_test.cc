// Dynamic and static full-attention containers: values, lengths, views, mask sizes, lifecycle,
// exact bytes, copy bounds, pointer stability and overflow. Odd sizes throughout.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/dynamic_layer.h"
#include "cache/static_layer.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::History;
using testing_util::random_tensor;
using testing_util::views_equal;

constexpr int64_t B = 3, H = 5, DK = 7, DV = 9;

std::unique_ptr<CacheLayer> make(const std::string& impl, CacheConfig cfg = {}) {
  cfg.options.implementation = impl;
  if (impl == "static" && cfg.options.max_cache_len == 0) cfg.options.max_cache_len = 61;
  return LayerRegistry::create(impl, "full_attention", cfg, 0);
}

const DenseLayer& dense(const CacheLayer& l) {
  return dynamic_cast<const DenseLayer&>(l);
}

class FullAttention : public ::testing::TestWithParam<std::string> {};

TEST_P(FullAttention, ReturnsEverythingStoredExactlyWithMaskSizes) {
  auto layer = make(GetParam());
  std::mt19937 rng(1);
  History hist(DType::kF16);
  EXPECT_FALSE(layer->is_initialized());
  EXPECT_EQ(layer->seq_length(), 0);
  // Prefill 11, then decode single tokens, then a chunk of 4, then more decode.
  const std::vector<int64_t> steps = {11, 1, 1, 1, 4, 1, 1, 13, 1, 1};
  int64_t pos = 0;
  for (int64_t n : steps) {
    const MaskSizes m = layer->mask_sizes(n);
    EXPECT_EQ(m.kv_length, pos + n);
    EXPECT_EQ(m.kv_offset, 0);
    Tensor k = random_tensor(DType::kF16, {B, H, n, DK}, rng);
    Tensor v = random_tensor(DType::kF16, {B, H, n, DV}, rng);
    const KVSpan span = layer->update(k.view(), v.view());
    hist.append(k.view(), v.view());
    pos += n;
    EXPECT_TRUE(layer->is_initialized());
    EXPECT_EQ(layer->seq_length(), pos);
    EXPECT_EQ(span.kv_offset, 0);
    EXPECT_EQ(span.k.shape(), Shape({B, H, pos, DK}));
    EXPECT_EQ(span.v.shape(), Shape({B, H, pos, DV}));
    EXPECT_EQ(span.k.dtype(), DType::kF16);
    EXPECT_TRUE(views_equal(span.k, hist.k(0, pos)));
    EXPECT_TRUE(views_equal(span.v, hist.v(0, pos)));
    // A view into the storage, not a copy.
    EXPECT_EQ(span.k.data(), dense(*layer).buffer().k_storage());
    EXPECT_EQ(span.v.data(), dense(*layer).buffer().v_storage());
  }
}

TEST_P(FullAttention, CropBothSignsAndErrors) {
  auto layer = make(GetParam());
  std::mt19937 rng(2);
  History hist(DType::kF32);
  Tensor k = random_tensor(DType::kF32, {B, H, 20, DK}, rng);
  Tensor v = random_tensor(DType::kF32, {B, H, 20, DV}, rng);
  layer->update(k.view(), v.view());
  hist.append(k.view(), v.view());
  layer->crop(-3);  // drop the last 3
  EXPECT_EQ(layer->seq_length(), 17);
  layer->crop(30);  // keep the first 30: no-op
  EXPECT_EQ(layer->seq_length(), 17);
  layer->crop(12);  // keep the first 12
  EXPECT_EQ(layer->seq_length(), 12);
  EXPECT_EQ(layer->mask_sizes(1).kv_length, 13);
  layer->crop(0);  // v5: removes nothing (speculative decoding with nothing rejected)
  EXPECT_EQ(layer->seq_length(), 12);
  // Appending after a crop overwrites the dropped tail.
  hist.crop(12);
  Tensor k2 = random_tensor(DType::kF32, {B, H, 2, DK}, rng);
  Tensor v2 = random_tensor(DType::kF32, {B, H, 2, DV}, rng);
  const KVSpan span = layer->update(k2.view(), v2.view());
  hist.append(k2.view(), v2.view());
  EXPECT_TRUE(views_equal(span.k, hist.k(0, 14)));
  EXPECT_TRUE(views_equal(span.v, hist.v(0, 14)));
  layer->crop(-15);  // more than stored: empties without an error (v5)
  EXPECT_EQ(layer->seq_length(), 0);
}

TEST_P(FullAttention, ResetKeepsMemoryAndIsReusable) {
  auto layer = make(GetParam());
  std::mt19937 rng(3);
  Tensor k = random_tensor(DType::kF16, {B, H, 9, DK}, rng);
  Tensor v = random_tensor(DType::kF16, {B, H, 9, DV}, rng);
  layer->update(k.view(), v.view());
  const size_t bytes = layer->bytes();
  const void* base = dense(*layer).buffer().k_storage();
  layer->reset();
  EXPECT_EQ(layer->seq_length(), 0);
  EXPECT_TRUE(layer->is_initialized());
  EXPECT_EQ(layer->bytes(), bytes);
  EXPECT_EQ(dense(*layer).buffer().k_storage(), base);
  // A new conversation, with a different batch size that fits the rows already there.
  Tensor k2 = random_tensor(DType::kF16, {2, H, 4, DK}, rng);
  Tensor v2 = random_tensor(DType::kF16, {2, H, 4, DV}, rng);
  const KVSpan span = layer->update(k2.view(), v2.view());
  EXPECT_EQ(layer->seq_length(), 4);
  EXPECT_TRUE(views_equal(span.k, k2.view()));
  EXPECT_TRUE(views_equal(span.v, v2.view()));
  EXPECT_EQ(dense(*layer).buffer().k_storage(), base);
}

TEST_P(FullAttention, ReorderSelectRepeatMoveWholeRows) {
  CacheConfig cfg;
  cfg.options.max_batch_size = 7;
  auto layer = make(GetParam(), cfg);
  std::mt19937 rng(4);
  History hist(DType::kBF16);
  Tensor k = random_tensor(DType::kBF16, {B, H, 6, DK}, rng);
  Tensor v = random_tensor(DType::kBF16, {B, H, 6, DV}, rng);
  layer->update(k.view(), v.view());
  hist.append(k.view(), v.view());

  const std::vector<int64_t> beam = {2, 0, 2};
  layer->reorder(beam);
  hist.gather(beam);
  const std::vector<int64_t> rep = {0, 0, 1, 1, 2, 2};
  layer->repeat_interleave(2);
  hist.gather(rep);
  const std::vector<int64_t> sel = {5, 1, 2};
  layer->select(sel);
  hist.gather(sel);

  Tensor k2 = random_tensor(DType::kBF16, {3, H, 1, DK}, rng);
  Tensor v2 = random_tensor(DType::kBF16, {3, H, 1, DV}, rng);
  const KVSpan span = layer->update(k2.view(), v2.view());
  hist.append(k2.view(), v2.view());
  EXPECT_EQ(span.k.shape(), Shape({3, H, 7, DK}));
  EXPECT_TRUE(views_equal(span.k, hist.k(0, 7)));
  EXPECT_TRUE(views_equal(span.v, hist.v(0, 7)));

  // Bad arguments are refused with an Error and leave the rows alone.
  const std::vector<int64_t> short_beam = {0, 1};
  const std::vector<int64_t> bad_beam = {0, 1, 3};
  const std::vector<int64_t> neg = {-1};
  EXPECT_THROW(layer->reorder(short_beam), Error);
  EXPECT_THROW(layer->reorder(bad_beam), Error);
  EXPECT_THROW(layer->select(neg), Error);
  EXPECT_THROW(layer->select(std::vector<int64_t>{}), Error);
  EXPECT_THROW(layer->repeat_interleave(0), Error);
  EXPECT_EQ(layer->seq_length(), 7);
  Tensor k3 = random_tensor(DType::kBF16, {3, H, 1, DK}, rng);
  Tensor v3 = random_tensor(DType::kBF16, {3, H, 1, DV}, rng);
  const KVSpan span3 = layer->update(k3.view(), v3.view());
  hist.append(k3.view(), v3.view());
  EXPECT_TRUE(views_equal(span3.k, hist.k(0, 8)));
}

TEST_P(FullAttention, ConvertsInputToStorageDtype) {
  CacheConfig cfg;
  cfg.options.kv_dtype = DType::kF16;
  auto layer = make(GetParam(), cfg);
  std::mt19937 rng(5);
  Tensor k = random_tensor(DType::kF32, {B, H, 3, DK}, rng);
  Tensor v = random_tensor(DType::kF32, {B, H, 3, DV}, rng);
  const KVSpan span = layer->update(k.view(), v.view());
  ASSERT_EQ(span.k.dtype(), DType::kF16);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < 3; ++s) {
        for (int64_t d = 0; d < DK; ++d)
          ASSERT_EQ(*span.k.ptr_as<f16_t>(b, h, s, d),
                    f32_to_f16(*k.view().ptr_as<float>(b, h, s, d)));
        for (int64_t d = 0; d < DV; ++d)
          ASSERT_EQ(*span.v.ptr_as<f16_t>(b, h, s, d),
                    f32_to_f16(*v.view().ptr_as<float>(b, h, s, d)));
      }
  // Strided input (a slice along the sequence) is accepted too.
  Tensor k2 = random_tensor(DType::kF32, {B, H, 5, DK}, rng);
  Tensor v2 = random_tensor(DType::kF32, {B, H, 5, DV}, rng);
  const KVSpan span2 = layer->update(k2.view().slice(2, 1, 3), v2.view().slice(2, 1, 3));
  EXPECT_EQ(layer->seq_length(), 5);
  EXPECT_EQ(*span2.k.ptr_as<f16_t>(2, 4, 3, 6), f32_to_f16(*k2.view().ptr_as<float>(2, 4, 1, 6)));
}

TEST_P(FullAttention, RejectsBadShapesNamingTheLayer) {
  auto layer = make(GetParam());
  std::mt19937 rng(6);
  Tensor k = random_tensor(DType::kF32, {B, H, 2, DK}, rng);
  Tensor v = random_tensor(DType::kF32, {B, H, 2, DV}, rng);
  Tensor v_bad = random_tensor(DType::kF32, {B, H, 3, DV}, rng);
  EXPECT_THROW(layer->update(k.view(), v_bad.view()), Error);
  layer->update(k.view(), v.view());
  Tensor k_heads = random_tensor(DType::kF32, {B, H + 1, 1, DK}, rng);
  Tensor v_heads = random_tensor(DType::kF32, {B, H + 1, 1, DV}, rng);
  try {
    layer->update(k_heads.view(), v_heads.view());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("KV heads"), std::string::npos) << e.what();
  }
  Tensor k_batch = random_tensor(DType::kF32, {B + 1, H, 1, DK}, rng);
  Tensor v_batch = random_tensor(DType::kF32, {B + 1, H, 1, DV}, rng);
  EXPECT_THROW(layer->update(k_batch.view(), v_batch.view()), Error);
  EXPECT_EQ(layer->seq_length(), 2);
}

INSTANTIATE_TEST_SUITE_P(Containers, FullAttention, ::testing::Values("dynamic", "static"));

TEST(DynamicLayer, ExactBytesAndGeometricGrowth) {
  auto layer = make("dynamic");
  EXPECT_EQ(layer->bytes(), 0u);
  EXPECT_EQ(layer->max_length(), -1);
  std::mt19937 rng(7);
  Tensor k = random_tensor(DType::kF16, {B, H, 5, DK}, rng);
  Tensor v = random_tensor(DType::kF16, {B, H, 5, DV}, rng);
  layer->update(k.view(), v.view());
  // First allocation: kMinCapacity = 16 slots.
  EXPECT_EQ(layer->bytes(), size_t{B * H * 16 * (DK + DV) * 2});
  Tensor k2 = random_tensor(DType::kF16, {B, H, 12, DK}, rng);
  Tensor v2 = random_tensor(DType::kF16, {B, H, 12, DV}, rng);
  layer->update(k2.view(), v2.view());  // 17 > 16: doubles to 32
  EXPECT_EQ(layer->bytes(), size_t{B * H * 32 * (DK + DV) * 2});
  EXPECT_EQ(layer->stats().reallocations, 1);
  EXPECT_EQ(layer->stats().bytes_copied, size_t{B * H * 5 * (DK + DV) * 2});  // the 5 live tokens
  Tensor k3 = random_tensor(DType::kF16, {B, H, 40, DK}, rng);
  Tensor v3 = random_tensor(DType::kF16, {B, H, 40, DV}, rng);
  layer->update(k3.view(), v3.view());  // 57 > 64? no: max(64, 57) = 64
  EXPECT_EQ(layer->bytes(), size_t{B * H * 64 * (DK + DV) * 2});
}

TEST(DynamicLayer, AppendingSingleTokensCopiesAtMostTwiceTheFinalSize) {
  auto layer = make("dynamic");
  constexpr int64_t kSteps = 32768, h = 2, d = 8;
  Tensor k = Tensor::zeros(DType::kF16, {1, h, 1, d});
  Tensor v = Tensor::zeros(DType::kF16, {1, h, 1, d});
  for (int64_t i = 0; i < kSteps; ++i) {
    k.data_as<f16_t>()[0] = static_cast<f16_t>(i);  // a marker per position
    layer->update(k.view(), v.view());
  }
  const KVSpan span = layer->update(k.view(), v.view());
  const size_t final_bytes = size_t{(kSteps + 1) * h * d * 2 * 2};
  EXPECT_LE(layer->stats().bytes_copied, 2 * final_bytes);
  EXPECT_GT(layer->stats().bytes_copied, 0u);
  EXPECT_LE(layer->stats().reallocations, 12);
  for (int64_t i : {int64_t{0}, int64_t{1}, int64_t{4095}, int64_t{16384}, kSteps - 1})
    EXPECT_EQ(*span.k.ptr_as<f16_t>(0, 0, i, 0), static_cast<f16_t>(i));
}

TEST(DynamicLayer, ReserveGrowsOnceAndKeepsTheContent) {
  // Before the first update: the first allocation takes the reserved length, and growing to it
  // reallocates nothing.
  auto reserved = make("dynamic");
  reserved->reserve(50);
  std::mt19937 rng(8);
  History h(DType::kF32);
  KVSpan span;
  for (int64_t n : {int64_t{7}, int64_t{1}, int64_t{30}, int64_t{12}}) {
    Tensor k = random_tensor(DType::kF32, {B, H, n, DK}, rng);
    Tensor v = random_tensor(DType::kF32, {B, H, n, DV}, rng);
    h.append(k.view(), v.view());
    span = reserved->update(k.view(), v.view());
  }
  EXPECT_EQ(reserved->stats().reallocations, 0);
  EXPECT_EQ(reserved->bytes(), size_t{B * H * 50 * (DK + DV) * 4});
  EXPECT_TRUE(views_equal(span.k, h.k(0, 50)));
  // After content: one reallocation to exactly the reserved length, the content kept, and no
  // further one up to it; reserving less than the capacity changes nothing.
  reserved->reserve(120);
  EXPECT_EQ(reserved->stats().reallocations, 1);
  EXPECT_EQ(reserved->bytes(), size_t{B * H * 120 * (DK + DV) * 4});
  reserved->reserve(60);
  EXPECT_EQ(reserved->bytes(), size_t{B * H * 120 * (DK + DV) * 4});
  Tensor k = random_tensor(DType::kF32, {B, H, 70, DK}, rng);
  Tensor v = random_tensor(DType::kF32, {B, H, 70, DV}, rng);
  h.append(k.view(), v.view());
  span = reserved->update(k.view(), v.view());
  EXPECT_EQ(reserved->stats().reallocations, 1);
  EXPECT_EQ(reserved->seq_length(), 120);
  EXPECT_TRUE(views_equal(span.k, h.k(0, 120)));
  EXPECT_TRUE(views_equal(span.v, h.v(0, 120)));
  EXPECT_THROW(reserved->reserve(-1), Error);
}

TEST(StaticLayer, PointerNeverChangesAndBytesAreThePreallocation) {
  CacheConfig cfg;
  cfg.options.max_cache_len = 37;
  cfg.options.max_batch_size = 4;
  auto layer = make("static", cfg);
  EXPECT_EQ(layer->max_length(), 37);
  EXPECT_EQ(layer->bytes(), 0u);  // lazy: nothing before the first update
  std::mt19937 rng(8);
  Tensor k = random_tensor(DType::kF32, {B, H, 10, DK}, rng);
  Tensor v = random_tensor(DType::kF32, {B, H, 10, DV}, rng);
  layer->update(k.view(), v.view());
  const size_t expected = size_t{4 * H * 37 * (DK + DV) * 4};
  EXPECT_EQ(layer->bytes(), expected);
  const void* kp = dense(*layer).buffer().k_storage();
  const void* vp = dense(*layer).buffer().v_storage();
  auto same = [&] {
    EXPECT_EQ(dense(*layer).buffer().k_storage(), kp);
    EXPECT_EQ(dense(*layer).buffer().v_storage(), vp);
    EXPECT_EQ(layer->bytes(), expected);
  };
  for (int i = 0; i < 20; ++i) {
    Tensor k1 = random_tensor(DType::kF32, {B, H, 1, DK}, rng);
    Tensor v1 = random_tensor(DType::kF32, {B, H, 1, DV}, rng);
    layer->update(k1.view(), v1.view());
    same();
  }
  const std::vector<int64_t> beam = {1, 1, 0};
  layer->reorder(beam);
  same();
  layer->repeat_interleave(1);
  const std::vector<int64_t> sel = {2, 0};
  layer->select(sel);
  same();
  layer->crop(-4);
  same();
  layer->crop(3);
  same();
  layer->reset();
  same();
  Tensor k4 = random_tensor(DType::kF32, {4, H, 37, DK}, rng);
  Tensor v4 = random_tensor(DType::kF32, {4, H, 37, DV}, rng);
  layer->update(k4.view(), v4.view());  // exactly full, all preallocated rows
  same();
  EXPECT_EQ(layer->stats().reallocations, 0);
  EXPECT_THROW(layer->repeat_interleave(2), Error);  // 8 rows > 4 preallocated
  same();
}

TEST(StaticLayer, OverflowIsAClearErrorAndLeavesTheCacheIntact) {
  CacheConfig cfg;
  cfg.options.max_cache_len = 13;
  auto layer = make("static", cfg);
  std::mt19937 rng(9);
  Tensor k = random_tensor(DType::kF16, {B, H, 11, DK}, rng);
  Tensor v = random_tensor(DType::kF16, {B, H, 11, DV}, rng);
  layer->update(k.view(), v.view());
  Tensor k3 = random_tensor(DType::kF16, {B, H, 3, DK}, rng);
  Tensor v3 = random_tensor(DType::kF16, {B, H, 3, DV}, rng);
  try {
    layer->update(k3.view(), v3.view());
    FAIL() << "writing 3 tokens at 11 into 13 slots must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("3 tokens at position 11"), std::string::npos) << msg;
    EXPECT_NE(msg.find("holds 13 tokens"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--max-cache-len"), std::string::npos) << msg;
  }
  EXPECT_EQ(layer->seq_length(), 11);
  // Still usable: two more tokens fit exactly, and the earlier content is intact.
  const KVSpan span = layer->update(k3.view().slice(2, 0, 2), v3.view().slice(2, 0, 2));
  EXPECT_TRUE(views_equal(span.k.slice(2, 0, 11), k.view()));
  EXPECT_TRUE(views_equal(span.k.slice(2, 11, 13), k3.view().slice(2, 0, 2)));
  EXPECT_THROW(layer->update(k3.view().slice(2, 0, 1), v3.view().slice(2, 0, 1)), Error);
  EXPECT_EQ(layer->seq_length(), 13);
}

TEST(StaticLayer, NeedsMaxCacheLen) {
  CacheConfig cfg;
  cfg.options.implementation = "static";
  EXPECT_THROW(LayerRegistry::create("static", "full_attention", cfg, 4), Error);
  cfg.options.max_batch_size = 2;
  cfg.options.max_cache_len = 8;
  auto layer = LayerRegistry::create("static", "full_attention", cfg, 4);
  std::mt19937 rng(10);
  Tensor k = random_tensor(DType::kF16, {3, 1, 1, 2}, rng);
  EXPECT_THROW(layer->update(k.view(), k.view()), Error);  // batch 3 > max_batch_size 2
}

}  // namespace
}  // namespace kvcache
