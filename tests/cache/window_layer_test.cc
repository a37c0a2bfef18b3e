// Sliding-window and chunked containers (dynamic and static): keep W-1 / return everything
// visible, mask sizes against transformers' formulas at every step, workspace for long
// prefills, static == dynamic, crop rules and past recording, exact bytes, compaction cost.
#include "cache/window_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::History;
using testing_util::random_tensor;
using testing_util::views_equal;

constexpr int64_t B = 3, H = 5, DK = 7, DV = 9;

std::unique_ptr<WindowLayer> make(const std::string& impl, const std::string& type, int64_t window,
                                  int64_t max_cache_len = 0, int64_t max_batch_size = 0) {
  CacheConfig cfg;
  cfg.options.max_batch_size = max_batch_size;
  cfg.options.implementation = impl;
  cfg.sliding_window = window;
  cfg.attention_chunk_size = window;
  cfg.options.max_cache_len = max_cache_len;
  auto layer = LayerRegistry::create(impl, type, cfg, 1);
  return std::unique_ptr<WindowLayer>(dynamic_cast<WindowLayer*>(layer.release()));
}

// transformers' DynamicSlidingWindowLayer.get_mask_sizes, written from its formula.
MaskSizes hf_sliding_mask_sizes(int64_t cum, int64_t q, int64_t w) {
  const int64_t kv_offset = std::max<int64_t>(cum - w + 1, 0);
  const int64_t kv_length = cum >= w ? w - 1 + q : cum + q;
  return {kv_length, kv_offset};
}

struct Step {
  KVSpan span;
  MaskSizes before;
};

// Appends n random tokens to `layer` and `hist`; checks the span against the history slice
// the mask sizes announce.
Step step(WindowLayer& layer, History& hist, int64_t n, std::mt19937& rng, DType dt = DType::kF16) {
  Step s;
  s.before = layer.mask_sizes(n);
  Tensor k = random_tensor(dt, {B, H, n, DK}, rng);
  Tensor v = random_tensor(dt, {B, H, n, DV}, rng);
  s.span = layer.update(k.view(), v.view());
  hist.append(k.view(), v.view());
  const int64_t end = hist.length();
  EXPECT_EQ(layer.seq_length(), end);
  EXPECT_EQ(s.span.kv_offset, s.before.kv_offset);
  EXPECT_EQ(s.span.k.shape(), Shape({B, H, s.before.kv_length, DK}));
  EXPECT_EQ(s.span.v.shape(), Shape({B, H, s.before.kv_length, DV}));
  EXPECT_EQ(s.before.kv_offset + s.before.kv_length, end);
  EXPECT_TRUE(views_equal(s.span.k, hist.k(s.before.kv_offset, end)));
  EXPECT_TRUE(views_equal(s.span.v, hist.v(s.before.kv_offset, end)));
  return s;
}

class Sliding : public ::testing::TestWithParam<std::string> {};

TEST_P(Sliding, KeepsWMinusOneReturnsFullWithTransformersMaskSizes) {
  constexpr int64_t W = 5;
  auto layer = make(GetParam(), "sliding_attention", W);
  std::mt19937 rng(21);
  History hist(DType::kF16);
  // Prefill 3, decode past the window, a chunk of 4, more decode.
  std::vector<int64_t> sizes = {3};
  for (int i = 0; i < 12; ++i) sizes.push_back(1);
  sizes.push_back(4);
  for (int i = 0; i < 9; ++i) sizes.push_back(1);
  int64_t cum = 0;
  for (int64_t n : sizes) {
    const Step s = step(*layer, hist, n, rng);
    const MaskSizes hf = hf_sliding_mask_sizes(cum, n, W);
    EXPECT_EQ(s.before.kv_offset, hf.kv_offset) << "cum " << cum;
    EXPECT_EQ(s.before.kv_length, hf.kv_length) << "cum " << cum;
    cum += n;
    EXPECT_EQ(layer->stored_tokens(), std::min(cum, W - 1));
  }
}

TEST_P(Sliding, PrefillLongerThanTheBufferGoesThroughTheWorkspace) {
  constexpr int64_t W = 5;  // storage capacity 2W = 10
  auto layer = make(GetParam(), "sliding_attention", W);
  std::mt19937 rng(22);
  History hist(DType::kF16);
  const Step s = step(*layer, hist, 13, rng);
  EXPECT_EQ(s.before.kv_length, 13);
  EXPECT_EQ(layer->stats().workspace_uses, 1);
  EXPECT_EQ(layer->stored_tokens(), 4);
  // The long step's span lives in the workspace: bytes = storage (10 slots) + workspace (13).
  EXPECT_EQ(layer->bytes(), size_t{B * H * (10 + 13) * (DK + DV) * 2});
  int64_t cum = 13;
  for (int64_t n : {1, 1, 2, 11, 1, 17, 1}) {
    const Step t = step(*layer, hist, n, rng);
    const MaskSizes hf = hf_sliding_mask_sizes(cum, n, W);
    EXPECT_EQ(t.before.kv_offset, hf.kv_offset);
    EXPECT_EQ(t.before.kv_length, hf.kv_length);
    cum += n;
  }
}

TEST_P(Sliding, CropIsRefusedPastTheWindowUnlessRecording) {
  constexpr int64_t W = 6;
  auto layer = make(GetParam(), "sliding_attention", W);
  std::mt19937 rng(23);
  History hist(DType::kF16);
  step(*layer, hist, 4, rng);
  layer->crop(-2);  // nothing evicted yet: fine
  EXPECT_EQ(layer->seq_length(), 2);
  hist.crop(2);
  for (int i = 0; i < 8; ++i) step(*layer, hist, 1, rng);  // 10 tokens, positions 5..9 kept
  try {
    layer->crop(-1);
    FAIL() << "crop past the window must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("activate_past_recording"), std::string::npos) << e.what();
  }
  EXPECT_THROW(layer->crop(9), Error);
  EXPECT_EQ(layer->seq_length(), 10);
  layer->crop(0);  // v5: removes nothing, even past the window
  EXPECT_EQ(layer->seq_length(), 10);
  layer->crop(10);             // no-op
  layer->crop(25);             // no-op
  step(*layer, hist, 1, rng);  // still consistent

  // With past recording the layer keeps what it has from now on and can go back.
  layer->activate_past_recording();
  for (int i = 0; i < 6; ++i) step(*layer, hist, 1, rng);  // 17 tokens
  EXPECT_EQ(layer->stored_tokens(), 5 + 6);                // positions [6, 17)
  layer->crop(-4);  // to 13: needs positions [8, 13), held since 6
  hist.crop(13);
  EXPECT_EQ(layer->seq_length(), 13);
  // v5's crop restricts the layer to its working size: [8, 13), recording still on.
  EXPECT_EQ(layer->stored_tokens(), 5);
  EXPECT_TRUE(layer->past_recording());
  for (int64_t n : {1, 3, 1}) step(*layer, hist, n, rng);  // 18, holds [8, 18)
  EXPECT_EQ(layer->stored_tokens(), 10);
  EXPECT_THROW(layer->crop(9), Error);   // needs position 4: evicted before recording began
  EXPECT_THROW(layer->crop(-7), Error);  // 11 needs 6: recorded, but the last crop dropped it
  layer->crop(-5);                       // 13 needs 8: held
  hist.crop(13);
  step(*layer, hist, 2, rng);
  // Recording keeps everything: a static layer runs out of its 2W = 12 slots, a dynamic grows.
  for (int i = 0; i < 5; ++i) step(*layer, hist, 1, rng);  // holds [8, 20): 12 tokens
  if (GetParam() == "static") {
    Tensor k = random_tensor(DType::kF16, {B, H, 1, DK}, rng);
    EXPECT_THROW(layer->update(k.view(), k.view()), Error);
  } else {
    step(*layer, hist, 1, rng);
    EXPECT_EQ(layer->stored_tokens(), 13);
  }
}

TEST_P(Sliding, ResetKeepsMemoryAndBatchOpsMoveRows) {
  constexpr int64_t W = 4;
  auto layer = make(GetParam(), "sliding_attention", W, 0, /*max_batch_size=*/6);
  std::mt19937 rng(24);
  History hist(DType::kF16);
  for (int64_t n : {2, 1, 1, 1, 1, 1}) step(*layer, hist, n, rng);
  const std::vector<int64_t> beam = {2, 2, 0};
  layer->reorder(beam);
  hist.gather(beam);
  step(*layer, hist, 1, rng);
  const std::vector<int64_t> sel = {1, 0};
  layer->select(sel);
  hist.gather(sel);
  layer->repeat_interleave(3);
  hist.gather({0, 0, 0, 1, 1, 1});
  layer->select(std::vector<int64_t>{0, 3, 5});  // back to B = 3 rows for step()
  hist.gather({0, 3, 5});
  step(*layer, hist, 1, rng);
  const size_t bytes = layer->bytes();
  const void* base = layer->buffer().k_storage();
  layer->reset();
  EXPECT_EQ(layer->seq_length(), 0);
  EXPECT_EQ(layer->mask_sizes(3).kv_length, 3);
  EXPECT_EQ(layer->bytes(), bytes);
  History fresh(DType::kF16);
  for (int64_t n : {3, 1, 1, 1}) step(*layer, fresh, n, rng);
  if (GetParam() == "static") {
    EXPECT_EQ(layer->buffer().k_storage(), base);
  }
}

INSTANTIATE_TEST_SUITE_P(Containers, Sliding, ::testing::Values("dynamic", "static"));

TEST(Sliding, ExactBytesAndMaxLength) {
  auto dyn = make("dynamic", "sliding_attention", 40);
  auto sta = make("static", "sliding_attention", 40);
  auto sta_small = make("static", "sliding_attention", 40, 50);
  EXPECT_EQ(dyn->max_length(), -1);
  EXPECT_EQ(sta->max_length(), 40);
  EXPECT_EQ(sta_small->max_length(), 40);
  EXPECT_EQ(make("static", "sliding_attention", 40, 30)->max_length(), 30);
  std::mt19937 rng(25);
  History h1(DType::kF16), h2(DType::kF16), h3(DType::kF16);
  step(*dyn, h1, 3, rng);
  step(*sta, h2, 3, rng);
  step(*sta_small, h3, 3, rng);
  const size_t per_slot = size_t{B * H * (DK + DV) * 2};
  EXPECT_EQ(dyn->bytes(), 16 * per_slot);        // kMinCapacity
  EXPECT_EQ(sta->bytes(), 80 * per_slot);        // 2W
  EXPECT_EQ(sta_small->bytes(), 50 * per_slot);  // min(2W, max_cache_len)
  for (int i = 0; i < 60; ++i) step(*dyn, h1, 1, rng);
  EXPECT_EQ(dyn->bytes(), 64 * per_slot);  // 16 -> 32 -> 64
  for (int i = 0; i < 100; ++i) step(*dyn, h1, 1, rng);
  EXPECT_EQ(dyn->bytes(), 80 * per_slot);  // grew to 2W and stopped
  EXPECT_EQ(dyn->stored_tokens(), 39);
}

TEST(Sliding, StaticRefusesWhenTheWindowCannotFit) {
  // max_cache_len 6 < W-1 = 9: the static storage cannot hold the window past 6 tokens.
  auto layer = make("static", "sliding_attention", 10, 6);
  std::mt19937 rng(26);
  History hist(DType::kF16);
  step(*layer, hist, 5, rng);
  step(*layer, hist, 1, rng);
  Tensor k = random_tensor(DType::kF16, {B, H, 1, DK}, rng);
  Tensor v = random_tensor(DType::kF16, {B, H, 1, DV}, rng);
  try {
    layer->update(k.view(), v.view());
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("--max-cache-len"), std::string::npos) << e.what();
  }
  EXPECT_EQ(layer->seq_length(), 6);
  const Step s = step(*layer, hist, 0, rng);  // an empty update still returns the window
  EXPECT_EQ(s.span.k.dim(2), 6);
}

TEST(Sliding, DecodeCostIsAmortisedConstant) {
  constexpr int64_t W = 64, kSteps = 5000;
  auto layer = make("dynamic", "sliding_attention", W);
  Tensor k = Tensor::zeros(DType::kF16, {1, 2, 1, 8});
  for (int64_t i = 0; i < kSteps; ++i) layer->update(k.view(), k.view());
  const size_t token_bytes = 2 * 8 * 2 * 2;  // heads * D * (K+V) * f16
  // Growth to 2W copies < 2W tokens; then W-1 tokens move every W+1 appends.
  EXPECT_LE(layer->stats().bytes_copied, (2 * W + kSteps) * token_bytes);
  // Steady state: capacity 2W = 128, 63 kept, so one compaction per 65 appends.
  EXPECT_GE(layer->stats().compactions, (kSteps - 2 * W) / (W + 1));
  EXPECT_LE(layer->stats().compactions, kSteps / (W + 1));
  EXPECT_EQ(layer->stats().workspace_uses, 0);
}

class Chunked : public ::testing::TestWithParam<std::string> {};

TEST_P(Chunked, SpanIsTransformersSlidingSpan) {
  // transformers v5 keeps a chunked layer in a DynamicSlidingWindowLayer(attention_chunk_size):
  // the span starts C-1 keys back whatever the chunk boundary, because a left-padded row counts
  // its chunks from its first real token (the mask, not the span, draws the boundary).
  constexpr int64_t C = 4;
  auto layer = make(GetParam(), "chunked_attention", C);
  EXPECT_EQ(layer->max_length(), GetParam() == "static" ? C : -1);
  std::mt19937 rng(27);
  History hist(DType::kF32);
  int64_t cum = 0;
  for (int64_t n : {6, 1, 1, 1, 1, 1, 3, 1, 9, 1, 2, 1}) {
    const Step s = step(*layer, hist, n, rng, DType::kF32);
    const MaskSizes want = hf_sliding_mask_sizes(cum, n, C);
    EXPECT_EQ(s.before.kv_offset, want.kv_offset) << "cum " << cum;
    EXPECT_EQ(s.before.kv_length, want.kv_length) << "cum " << cum;
    cum += n;
    EXPECT_LE(layer->stored_tokens(), C - 1);
  }
  // At 28 (a chunk boundary of an unpadded row) 25..27 are still held: a row padded by 1, 2
  // or 3 is mid-chunk there.
  EXPECT_EQ(layer->stored_tokens(), C - 1);
  step(*layer, hist, 2, rng, DType::kF32);
  EXPECT_EQ(layer->stored_tokens(), C - 1);
  // Holding 27..29, a crop to 29 would leave a query at 29 without key 26: refused (as for a
  // sliding layer) unless past recording was on.
  EXPECT_THROW(layer->crop(-1), Error);
  step(*layer, hist, 1, rng, DType::kF32);
}

INSTANTIATE_TEST_SUITE_P(Containers, Chunked, ::testing::Values("dynamic", "static"));

TEST(Window, StaticEqualsDynamicOverRandomUpdates) {
  for (const char* type : {"sliding_attention", "chunked_attention"}) {
    for (int64_t w : {1, 2, 7, 33}) {
      auto dyn = make("dynamic", type, w);
      auto sta = make("static", type, w);
      const void* base = nullptr;
      std::mt19937 rng(static_cast<uint32_t>(100 + w));
      std::uniform_int_distribution<int> size(1, 20);
      std::uniform_int_distribution<int> coin(0, 3);
      for (int i = 0; i < 150; ++i) {
        const int64_t n = coin(rng) == 0 ? size(rng) : 1;
        const MaskSizes md = dyn->mask_sizes(n), ms = sta->mask_sizes(n);
        ASSERT_EQ(md.kv_length, ms.kv_length);
        ASSERT_EQ(md.kv_offset, ms.kv_offset);
        Tensor k = random_tensor(DType::kBF16, {B, H, n, DK}, rng);
        Tensor v = random_tensor(DType::kBF16, {B, H, n, DV}, rng);
        const KVSpan a = dyn->update(k.view(), v.view());
        const KVSpan b = sta->update(k.view(), v.view());
        ASSERT_EQ(a.kv_offset, b.kv_offset);
        ASSERT_TRUE(views_equal(a.k, b.k)) << type << " w=" << w << " step " << i;
        ASSERT_TRUE(views_equal(a.v, b.v)) << type << " w=" << w << " step " << i;
        if (base == nullptr) base = sta->buffer().k_storage();
        ASSERT_EQ(sta->buffer().k_storage(), base);
        ASSERT_LE(dyn->buffer().capacity(), 2 * w);
      }
    }
  }
}

TEST(Window, ConfigErrorsNameTheLayer) {
  CacheConfig cfg;
  cfg.layer_types = {"full_attention", "sliding_attention"};
  try {
    Cache cache(cfg);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sliding_window"), std::string::npos) << e.what();
  }
  cfg.layer_types = {"chunked_attention"};
  EXPECT_THROW(Cache{cfg}, Error);
}

TEST(Window, GemmaStyleCacheWithSharedLayers) {
  // Gemma-3n-like: sliding/full pattern, the last 3 layers shared.
  CacheConfig cfg;
  cfg.layer_types = {"sliding_attention", "sliding_attention", "full_attention",
                     "sliding_attention", "full_attention",    "sliding_attention",
                     "full_attention"};
  cfg.sliding_window = 4;
  cfg.num_kv_shared_layers = 3;
  Cache cache(cfg);
  EXPECT_EQ(cache.source_layer(4), 2);  // last full layer before the shared block
  EXPECT_EQ(cache.source_layer(5), 3);  // last sliding layer before it
  EXPECT_EQ(cache.source_layer(6), 2);
  std::mt19937 rng(28);
  for (int64_t n : {6, 1, 1}) {
    std::vector<KVSpan> spans;
    for (int l = 0; l < 4; ++l) {
      Tensor k = random_tensor(DType::kF16, {1, 2, n, 3}, rng);
      spans.push_back(cache.update(l, k.view(), k.view()));
    }
    for (int shared : {4, 5, 6}) {
      const KVSpan& src = spans[static_cast<size_t>(cache.source_layer(shared))];
      EXPECT_EQ(cache.shared_kv(shared).k.data(), src.k.data());
      EXPECT_EQ(cache.shared_kv(shared).k.shape(), src.k.shape());
      EXPECT_EQ(cache.shared_kv(shared).kv_offset, src.kv_offset);
    }
  }
  // Only the 4 owning layers hold memory.
  size_t owned = 0;
  for (int l = 0; l < 4; ++l) owned += cache.layer(l).bytes();
  EXPECT_EQ(cache.bytes(), owned);
  EXPECT_EQ(cache.mask_sizes(5, 1).kv_offset, cache.layer(3).mask_sizes(1).kv_offset);
  EXPECT_EQ(cache.mask_sizes(6, 1).kv_length, 9);
}

}  // namespace
}  // namespace kvcache
