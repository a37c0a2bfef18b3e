// deepseek_sparse_attention (cache/indexed_layer.h): full attention plus one indexer key per
// token, transformers' DynamicIndexedLayer: update_indexer appends and returns every key, crop
// cuts both, reset / reorder / select / repeat_interleave act on both, recompute forgets both
// per call.
#include "cache/indexed_layer.h"

#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <vector>

#include "cache/cache.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::History;
using testing_util::random_tensor;
using testing_util::views_equal;

constexpr int64_t B = 3, H = 2, D = 8, C = 5;

std::unique_ptr<IndexedLayer> make(const std::string& impl) {
  CacheConfig cfg;
  auto layer = LayerRegistry::create(impl, "deepseek_sparse_attention", cfg, 4);
  auto* l = dynamic_cast<IndexedLayer*>(layer.release());
  EXPECT_NE(l, nullptr);
  return std::unique_ptr<IndexedLayer>(l);
}

// One forward step: the K/V update, then the indexer keys; both checked against histories.
void step(IndexedLayer& l, History& kv, History& idx, int64_t n, std::mt19937& rng) {
  Tensor k = random_tensor(DType::kF32, {B, H, n, D}, rng);
  Tensor v = random_tensor(DType::kF32, {B, H, n, D}, rng);
  Tensor x = random_tensor(DType::kF32, {B, 1, n, C}, rng);
  const KVSpan s = l.update(k.view(), v.view());
  kv.append(k.view(), v.view());
  idx.append(x.view(), x.view());
  EXPECT_TRUE(views_equal(s.k, kv.k(0, kv.length())));
  const KVSpan is = l.update_indexer(x.view());
  EXPECT_EQ(is.kind, KVSpanKind::kDense);
  EXPECT_EQ(is.kv_offset, 0);
  EXPECT_EQ(is.v.data(), is.k.data());
  EXPECT_TRUE(views_equal(is.k, idx.k(0, idx.length())));
  EXPECT_EQ(l.indexer_length(), l.seq_length());
}

TEST(IndexedLayer, AppendsOneIndexerKeyPerTokenAndCropsBoth) {
  auto l = make("dynamic");
  EXPECT_EQ(l->name(), "dynamic/deepseek_sparse_attention");
  std::mt19937 rng(1);
  History kv(DType::kF32), idx(DType::kF32);
  for (int64_t n : {5, 1, 1, 20, 3}) step(*l, kv, idx, n, rng);
  EXPECT_EQ(l->seq_length(), 30);
  EXPECT_EQ(l->mask_sizes(2).kv_length, 32);
  l->crop(-4);
  EXPECT_EQ(l->seq_length(), 26);
  EXPECT_EQ(l->indexer_length(), 26);
  kv.crop(26);
  idx.crop(26);
  step(*l, kv, idx, 2, rng);
  l->crop(10);
  kv.crop(10);
  idx.crop(10);
  step(*l, kv, idx, 1, rng);
  EXPECT_EQ(l->indexer_length(), 11);
  // bytes: K/V storage plus the indexer keys' (one copy: K == V).
  const size_t attn = l->attention().bytes();
  // 16 slots, then 2 x 16 when 27 were needed: 32.
  EXPECT_EQ(l->bytes(), attn + static_cast<size_t>(B * 1 * 32 * C) * 4);
}

TEST(IndexedLayer, ReorderSelectRepeatMoveTheIndexerKeysToo) {
  auto l = make("dynamic");
  std::mt19937 rng(2);
  History kv(DType::kF32), idx(DType::kF32);
  step(*l, kv, idx, 6, rng);
  const std::vector<int64_t> perm = {2, 0, 1};
  l->reorder(perm);
  kv.gather(perm);
  idx.gather(perm);
  step(*l, kv, idx, 1, rng);
  EXPECT_THROW(l->reorder(std::vector<int64_t>{0, 1}), Error);
  l->select(std::vector<int64_t>{1});
  l->repeat_interleave(3);
  kv.gather({1, 1, 1});
  idx.gather({1, 1, 1});
  step(*l, kv, idx, 2, rng);
  l->reset();
  EXPECT_EQ(l->seq_length(), 0);
  EXPECT_EQ(l->indexer_length(), 0);
  History kv2(DType::kF32), idx2(DType::kF32);
  step(*l, kv2, idx2, 3, rng);
}

TEST(IndexedLayer, RecomputeKeepsOnlyTheCallsKeys) {
  auto l = make("recompute");
  std::mt19937 rng(3);
  for (int64_t n : {4, 7, 2}) {
    History kv(DType::kF32), idx(DType::kF32);
    step(*l, kv, idx, n, rng);
    EXPECT_EQ(l->mask_sizes(n).kv_length, n);
  }
}

TEST(IndexedLayer, RejectsBadIndexerKeys) {
  auto l = make("dynamic");
  std::mt19937 rng(4);
  Tensor x3 = random_tensor(DType::kF32, {B, 4, C}, rng);
  EXPECT_THROW(l->update_indexer(x3.view()), Error);
  Tensor x = random_tensor(DType::kF32, {B, 1, 2, C}, rng);
  l->update_indexer(x.view());
  Tensor wide = random_tensor(DType::kF32, {B, 1, 2, C + 1}, rng);
  EXPECT_THROW(l->update_indexer(wide.view()), Error);
  Tensor other = random_tensor(DType::kF32, {B + 1, 1, 2, C}, rng);
  EXPECT_THROW(l->update_indexer(other.view()), Error);
}

}  // namespace
}  // namespace kvcache
