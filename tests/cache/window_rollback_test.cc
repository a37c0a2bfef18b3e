// Bounded rollback of the sliding and chunked containers (speculative decoding, issue 45 item
// 4): with reserve_rollback(r) / set_rollback_tokens(r), a verification step of several tokens
// returns exactly the keys its queries may see (the same as one-token steps would), and crops
// removing at most r tokens in all since the last update succeed and leave a layer whose later
// spans are again exact. Without the bound the same crops are refused (the window dropped the
// keys), which is what the speculative driver ran into.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/quantized_layer.h"
#include "cache/window_layer.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::History;
using testing_util::random_tensor;
using testing_util::views_equal;

constexpr int64_t B = 1, H = 2, D = 8;

CacheConfig config(const std::string& impl, int64_t window, int64_t max_cache_len = 0) {
  CacheConfig cfg;
  cfg.options.implementation = impl;
  cfg.sliding_window = window;
  cfg.attention_chunk_size = window;
  cfg.options.max_cache_len = max_cache_len;
  return cfg;
}

std::unique_ptr<WindowLayer> make_window(const std::string& impl, const std::string& type,
                                         int64_t window, int64_t max_cache_len = 0) {
  auto layer = LayerRegistry::create(impl, type, config(impl, window, max_cache_len), 0);
  return std::unique_ptr<WindowLayer>(dynamic_cast<WindowLayer*>(layer.release()));
}

// One update of n random tokens; the span must be exactly the history's [start, end) with
// start = max(p - W + 1, 0): what each of the step's queries may see, for the first query, and
// a superset the kernel's window mask trims for the later ones (the same keys one-token steps
// would have returned, per query).
void step_and_check(WindowLayer& layer, History& hist, int64_t n, int64_t window, std::mt19937& rng,
                    const std::string& what) {
  const int64_t p = layer.seq_length();
  const MaskSizes ms = layer.mask_sizes(n);
  Tensor k = random_tensor(DType::kF32, {B, H, n, D}, rng);
  Tensor v = random_tensor(DType::kF32, {B, H, n, D}, rng);
  const KVSpan span = layer.update(k.view(), v.view());
  hist.append(k.view(), v.view());
  const int64_t start = std::max<int64_t>(p - window + 1, 0);
  ASSERT_EQ(span.kv_offset, start) << what << " at " << p;
  ASSERT_EQ(ms.kv_offset, start) << what;
  ASSERT_EQ(ms.kv_length, p + n - start) << what;
  ASSERT_EQ(span.k.dim(2), p + n - start) << what;
  EXPECT_TRUE(views_equal(span.k, hist.k(start, p + n))) << what << " at " << p << " n " << n;
  EXPECT_TRUE(views_equal(span.v, hist.v(start, p + n))) << what << " at " << p << " n " << n;
}

// Random verification steps of 1..r+1 tokens, each followed by crops removing at most r tokens
// in all (sometimes split in two, as a stop token among accepted drafts does), with a prefill
// longer than the storage first.
void run_rollbacks(WindowLayer& layer, int64_t window, int64_t r, uint32_t seed,
                   const std::string& what) {
  std::mt19937 rng(seed);
  History hist(DType::kF32);
  layer.reserve_rollback(r);
  step_and_check(layer, hist, 3 * window + 5, window, rng, what + " prefill");
  for (int it = 0; it < 60; ++it) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(r + 1));
    step_and_check(layer, hist, n, window, rng, what);
    // Between steps at most the window's keys plus r more are held.
    KVSpan held;
    ASSERT_TRUE(layer.stored(&held));
    EXPECT_LE(held.k.dim(2), window - 1 + r) << what;
    const int64_t m = static_cast<int64_t>(rng() % static_cast<uint32_t>(std::min(n, r) + 1));
    const int64_t m1 = (it % 3 == 0) ? m / 2 : m;
    layer.crop(-m1);
    if (m > m1) layer.crop(-(m - m1));
    hist.crop(hist.length() - m);
    ASSERT_EQ(layer.seq_length(), hist.length()) << what;
  }
  // Ordinary decoding afterwards stays exact.
  for (int i = 0; i < 2 * window; ++i) step_and_check(layer, hist, 1, window, rng, what);
}

TEST(WindowRollback, DynamicAndStaticSlidingAndChunkedStepsAndCropsAreExact) {
  for (const char* impl : {"dynamic", "static"})
    for (const char* type : {"sliding_attention", "chunked_attention"})
      for (const int64_t r : {1, 4, 11}) {
        const std::string what = std::string(impl) + "/" + type + " r " + std::to_string(r);
        auto layer = make_window(impl, type, 6);
        run_rollbacks(*layer, 6, r, 7 + static_cast<uint32_t>(r), what);
        // Static: sized once, 2W + r slots; its storage never moved.
        if (std::string(impl) == "static") {
          EXPECT_EQ(layer->max_length(), 6) << what;
        }
      }
}

TEST(WindowRollback, StaticStorageIsSizedUpFrontAndRefusesALateLargerBound) {
  auto layer = make_window("static", "sliding_attention", 6);
  layer->reserve_rollback(4);
  std::mt19937 rng(3);
  History hist(DType::kF32);
  step_and_check(*layer, hist, 2, 6, rng, "static");
  // Allocated at the first update: 2W + r = 16 slots of K and V, f32; never grown.
  const size_t sized = size_t{B * H * 16 * 2 * D * sizeof(float)};
  EXPECT_EQ(layer->bytes(), sized);
  for (int i = 0; i < 40; ++i) {
    step_and_check(*layer, hist, 5, 6, rng, "static");
    layer->crop(-4);
    hist.crop(hist.length() - 4);
  }
  EXPECT_EQ(layer->bytes(), sized);
  EXPECT_EQ(layer->stats().reallocations, 0);
  // A bound the allocated storage cannot hold beside the window is refused, naming the fix.
  try {
    layer->reserve_rollback(40);
    FAIL() << "a static storage of 16 slots cannot keep 40 tokens for rollback";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("reserve the rollback before the first update"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(layer->rollback(), 4);
}

TEST(WindowRollback, WithoutTheBoundTheSameCropIsRefused) {
  // What the speculative driver met: after a step of 3 tokens the window dropped the keys a
  // query 2 positions back needs.
  auto layer = make_window("dynamic", "sliding_attention", 6);
  std::mt19937 rng(5);
  History hist(DType::kF32);
  step_and_check(*layer, hist, 20, 6, rng, "no bound");
  step_and_check(*layer, hist, 3, 6, rng, "no bound");
  EXPECT_THROW(layer->crop(-2), Error);
  EXPECT_EQ(layer->seq_length(), 23);  // a refused crop changes nothing
}

std::unique_ptr<QuantizedLayer> make_quantized(const std::string& type, int64_t window) {
  CacheConfig cfg = config("quantized", window);
  cfg.options.quantized.group = 4;
  cfg.options.quantized.residual = 4;
  auto layer = LayerRegistry::create("quantized", type, cfg, 0);
  return std::unique_ptr<QuantizedLayer>(dynamic_cast<QuantizedLayer*>(layer.release()));
}

TEST(WindowRollback, QuantizedSlidingAndChunkedKeepTheBlocksACropNeeds) {
  for (const char* type : {"sliding_attention", "chunked_attention"}) {
    for (const bool bounded : {false, true}) {
      auto layer = make_quantized(type, 8);
      if (bounded) layer->reserve_rollback(4);
      std::mt19937 rng(11);
      Tensor k = random_tensor(DType::kF32, {B, H, 30, D}, rng);
      layer->update(k.view(), k.view());
      int refused = 0;
      // Decode one token at a time (a draft model), then roll 3 back, many times over: the
      // blocks that left the window during the 3 steps are needed again.
      for (int it = 0; it < 20; ++it) {
        for (int i = 0; i < 4; ++i) {
          Tensor t = random_tensor(DType::kF32, {B, H, 1, D}, rng);
          const int64_t p = layer->seq_length();
          const MaskSizes ms = layer->mask_sizes(1);
          const KVSpan s = layer->update(t.view(), t.view());
          // The span covers every key the query at p may see (and a block-aligned few more).
          const int64_t start = std::string(type) == "sliding_attention"
                                    ? std::max<int64_t>(p - 8 + 1, 0)
                                    : p / 8 * 8;
          EXPECT_LE(s.kv_offset, start) << type;
          EXPECT_EQ(s.kv_offset, ms.kv_offset) << type;
        }
        try {
          layer->crop(-3);
        } catch (const Error& e) {
          ++refused;
          EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
          layer->crop(0);
          Tensor t = random_tensor(DType::kF32, {B, H, 1, D}, rng);
          layer->update(t.view(), t.view());
        }
      }
      if (bounded) {
        EXPECT_EQ(refused, 0) << type;
      } else {
        EXPECT_GT(refused, 0) << type << ": the test must exercise a dropped block";
      }
    }
  }
}

}  // namespace
}  // namespace kvcache
