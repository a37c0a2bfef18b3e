// Lossy KV policies (cache/kv_policy.h, cache/evicting_layer.h): spec parsing and validation,
// canonical keys, StreamingLLM's kept set and flat memory over a 16K-token decode, bit-identity
// with the dynamic container while nothing is evicted, H2O's heavy hitters and SnapKV's pooled
// observation window on hand-made attention, and the refusals (unobserved steps, caches and
// models a policy cannot act on).
#include "cache/kv_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cache/cache.h"
#include "cache/evicting_layer.h"
#include "cache_test_util.h"
#include "core/error.h"
#include "kernels/attention.h"

namespace kvcache {
namespace {

using testing_util::random_tensor;
using testing_util::views_equal;

std::string error_of(const std::string& spec) {
  try {
    KVPolicy::parse(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(KVPolicy, ParsesSpecsAndDefaults) {
  const KVPolicy s = KVPolicy::parse("streaming:sink=4,window=256");
  EXPECT_EQ(s.kind, KVPolicyKind::kStreaming);
  EXPECT_EQ(s.sink, 4);
  EXPECT_EQ(s.window, 256);
  const KVPolicy h = KVPolicy::parse("h2o:recent=64,heavy=32");  // any order
  EXPECT_EQ(h.heavy, 32);
  EXPECT_EQ(h.recent, 64);
  const KVPolicy k = KVPolicy::parse("snapkv:budget=100,window=16,kernel=5");
  EXPECT_EQ(k.budget, 100);
  EXPECT_EQ(k.obs_window, 16);
  EXPECT_EQ(k.kernel, 5);
  EXPECT_TRUE(KVPolicy::parse("exact").exact());
  EXPECT_FALSE(KVPolicy::parse("h2o").exact());
  // A kind alone takes the defaults, and names the same policy as the spelled-out spec.
  EXPECT_EQ(KVPolicy::parse("streaming").key(), "streaming:sink=4,window=256");
  EXPECT_EQ(KVPolicy::parse("h2o").key(), "h2o:heavy=128,recent=128");
  EXPECT_EQ(KVPolicy::parse("snapkv").key(), "snapkv:budget=256,window=32,kernel=7");
  EXPECT_EQ(KVPolicy::parse("h2o:recent=64,heavy=32").key(), "h2o:heavy=32,recent=64");
}

TEST(KVPolicy, RefusesBadSpecsSayingWhatAndWhere) {
  EXPECT_NE(error_of("lru").find("unknown policy 'lru'"), std::string::npos);
  EXPECT_NE(error_of("streaming:sinks=4")
                .find("no parameter 'sinks' (its parameters: sink, "
                      "window)"),
            std::string::npos);
  EXPECT_NE(error_of("streaming:sink=four").find("'sink=four': the value must be a whole number"),
            std::string::npos);
  EXPECT_NE(error_of("streaming:sink=").find("whole number"), std::string::npos);
  EXPECT_NE(error_of("streaming:sink=4,sink=5").find("given twice"), std::string::npos);
  EXPECT_NE(error_of("streaming:sink").find("not NAME=VALUE"), std::string::npos);
  EXPECT_NE(error_of("exact:window=3").find("exact takes no parameters"), std::string::npos);
  EXPECT_NE(error_of("streaming:window=0").find("window must be >= 1"), std::string::npos);
  EXPECT_NE(error_of("streaming:sink=-1").find("sink must be >= 0"), std::string::npos);
  EXPECT_NE(error_of("h2o:heavy=0,recent=0").find("at least one token"), std::string::npos);
  EXPECT_NE(error_of("snapkv:budget=32,window=32").find("must exceed the observation window"),
            std::string::npos);
  EXPECT_NE(error_of("snapkv:kernel=4").find("odd width"), std::string::npos);
  EXPECT_NE(error_of("h2o:heavy=99999999999999999999").find("whole number"), std::string::npos);
  EXPECT_NE(error_of("h2o:heavy=4000000000000000000,recent=4000000000000000000").find("at most"),
            std::string::npos);
  // Every message lists what would be accepted.
  EXPECT_NE(error_of("lru").find("streaming:sink=S,window=W"), std::string::npos);
}

TEST(KVPolicy, KeysDifferFromExactAndBetweenParameters) {
  const std::vector<std::string> specs = {"exact",
                                          "streaming:sink=4,window=256",
                                          "streaming:sink=0,window=256",
                                          "streaming:sink=4,window=128",
                                          "h2o:heavy=128,recent=128",
                                          "h2o:heavy=64,recent=128",
                                          "snapkv:budget=256,window=32,kernel=7",
                                          "snapkv:budget=256,window=32,kernel=5"};
  std::set<std::string> keys;
  for (const std::string& s : specs) keys.insert(KVPolicy::parse(s).key());
  EXPECT_EQ(keys.size(), specs.size());
  EXPECT_EQ(KVPolicy{}.key(), "exact");
  EXPECT_FALSE(KVPolicy::parse("streaming") == KVPolicy{});
  EXPECT_TRUE(KVPolicy::parse("streaming") == KVPolicy::parse("streaming:window=256,sink=4"));
}

CacheConfig config(const std::string& spec, std::vector<std::string> types = {"full_attention"}) {
  CacheConfig cfg;
  cfg.options.implementation = "dynamic";
  cfg.options.policy = KVPolicy::parse(spec);
  cfg.layer_types = std::move(types);
  cfg.sliding_window = 8;
  return cfg;
}

// One token per (b, h) whose K and V hold its position in every channel (f32).
Tensor positions_tensor(int64_t B, int64_t H, int64_t pos0, int64_t n, int64_t D) {
  Tensor t = Tensor::empty(DType::kF32, {B, H, n, D});
  float* p = t.data_as<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t d = 0; d < D; ++d) *p++ = static_cast<float>(pos0 + i);
  return t;
}

// The positions the span's keys hold (channel 0 of each slot), sorted.
std::vector<int64_t> span_positions(const KVSpan& span, int64_t b, int64_t h) {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < span.k.dim(2); ++s)
    out.push_back(static_cast<int64_t>(*span.k.ptr_as<float>(b, h, s, 0)));
  std::sort(out.begin(), out.end());
  return out;
}

TEST(StreamingPolicy, KeepsSinksPlusWindowAndMemoryStaysFlatOver16K) {
  constexpr int64_t B = 2, H = 2, D = 4, S = 4, W = 256;
  Cache cache(config("streaming:sink=4,window=256"));
  auto& layer = dynamic_cast<EvictingLayer&>(cache.layer(0));
  EXPECT_EQ(layer.name(), "dynamic/full_attention+streaming:sink=4,window=256");
  size_t bytes_1k = 0, copied_1k = 0;
  for (int64_t t = 0; t < 16384; ++t) {
    const Tensor kv = positions_tensor(B, H, t, 1, D);
    const MaskSizes ms = cache.mask_sizes(0, 1);
    const KVSpan span = cache.update(0, kv.view(), kv.view());
    const int64_t seen = t + 1;
    const int64_t visible = std::min(seen, S + W);
    ASSERT_EQ(span.k.dim(2), visible) << "step " << t;
    ASSERT_EQ(span.kv_offset + span.k.dim(2), seen);  // the span ends with the new token
    ASSERT_EQ(ms.kv_length, visible);
    ASSERT_EQ(ms.kv_offset, span.kv_offset);
    if (t == 1023) {
      bytes_1k = cache.bytes();
      copied_1k = layer.stats().bytes_copied;
    }
    if (t == 1023 || t == 16383 || t == 300) {
      std::vector<int64_t> want;
      for (int64_t p = 0; p < S; ++p) want.push_back(p);
      for (int64_t p = seen - (W); p < seen; ++p) want.push_back(p);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t h = 0; h < H; ++h) {
          EXPECT_EQ(span_positions(span, b, h), want) << "step " << t;
          EXPECT_EQ(layer.kept_positions(b, h), want);
        }
    }
  }
  EXPECT_EQ(cache.bytes(), bytes_1k);  // flat: nothing grows with the tokens seen
  EXPECT_EQ(layer.seq_length(), 16384);
  EXPECT_EQ(layer.evicted_tokens(), 16384 - (S + W));
  // Past the storage's growth, eviction moved one token per step per plane (an order-keeping
  // compaction would move the whole window each step).
  const size_t token_bytes = 2 * D * sizeof(float);
  EXPECT_EQ(layer.stats().bytes_copied - copied_1k,
            static_cast<size_t>((16384 - 1024) * B * H) * token_bytes);
}

TEST(StreamingPolicy, StaticStorageNeverMovesAndMatchesDynamic) {
  constexpr int64_t B = 1, H = 2, D = 4;
  CacheConfig st_cfg = config("streaming:sink=4,window=64");
  st_cfg.options.implementation = "static";
  st_cfg.options.max_cache_len = 80;
  Cache st(st_cfg), dyn(config("streaming:sink=4,window=64"));
  auto& layer = dynamic_cast<EvictingLayer&>(st.layer(0));
  EXPECT_EQ(layer.name(), "static/full_attention+streaming:sink=4,window=64");
  EXPECT_EQ(layer.max_length(), 80);
  const Tensor prompt = positions_tensor(B, H, 0, 10, D);
  st.update(0, prompt.view(), prompt.view());
  dyn.update(0, prompt.view(), prompt.view());
  const void* storage = layer.buffer().k_storage();
  const size_t bytes = st.bytes();
  for (int64_t t = 10; t < 1000; ++t) {
    const Tensor kv = positions_tensor(B, H, t, 1, D);
    const KVSpan a = st.update(0, kv.view(), kv.view()), b = dyn.update(0, kv.view(), kv.view());
    ASSERT_EQ(a.kv_offset, b.kv_offset);
    ASSERT_TRUE(views_equal(a.k, b.k)) << "step " << t;
  }
  EXPECT_EQ(layer.buffer().k_storage(), storage);
  EXPECT_EQ(st.bytes(), bytes);
  // A step that cannot fit (the 4 sinks + 100 new > 80 slots) is refused before anything
  // changes.
  const Tensor big = positions_tensor(B, H, 1000, 100, D);
  EXPECT_THROW(st.update(0, big.view(), big.view()), Error);
  EXPECT_EQ(st.seq_length(), 1000);
  EXPECT_EQ(layer.kept_positions(0, 0).size(), 68u);
}

TEST(StreamingPolicy, BitIdenticalToDynamicWhileTheWindowCoversEverything) {
  constexpr int64_t B = 2, H = 3, D = 8;
  std::mt19937 rng(7);
  Cache lossy(config("streaming:sink=4,window=200"));
  CacheConfig exact_cfg = config("exact");
  Cache exact(exact_cfg);
  // 153 tokens: the window (200) never has to drop one.
  const std::vector<int64_t> steps = {37, 1, 1, 60, 1, 1, 1, 50, 1};
  for (size_t i = 0; i < steps.size(); ++i) {
    const Tensor k = random_tensor(DType::kF32, {B, H, steps[i], D}, rng);
    const Tensor v = random_tensor(DType::kF32, {B, H, steps[i], D}, rng);
    const KVSpan a = lossy.update(0, k.view(), v.view()), b = exact.update(0, k.view(), v.view());
    ASSERT_EQ(a.kv_offset, 0);
    ASSERT_TRUE(views_equal(a.k, b.k)) << "step " << i;
    ASSERT_TRUE(views_equal(a.v, b.v)) << "step " << i;
  }
  EXPECT_EQ(dynamic_cast<EvictingLayer&>(lossy.layer(0)).evicted_tokens(), 0);
}

// The probabilities [S_q, S_kv] of causal attention of q over k (1 head, scale 1), in double.
std::vector<std::vector<double>> brute_probs(const std::vector<std::vector<float>>& q,
                                             const std::vector<std::vector<float>>& k,
                                             int64_t q_pos0) {
  std::vector<std::vector<double>> p;
  for (size_t i = 0; i < q.size(); ++i) {
    std::vector<double> row(k.size(), 0.0);
    double mx = -1e300, sum = 0;
    const auto pos = static_cast<size_t>(q_pos0) + i;
    for (size_t j = 0; j <= pos && j < k.size(); ++j) {
      row[j] = q[i][0] * k[j][0] + q[i][1] * k[j][1];
      mx = std::max(mx, row[j]);
    }
    for (size_t j = 0; j <= pos && j < k.size(); ++j) sum += row[j] = std::exp(row[j] - mx);
    for (size_t j = 0; j <= pos && j < k.size(); ++j) row[j] /= sum;
    p.push_back(row);
  }
  return p;
}

Tensor rows_tensor(const std::vector<std::vector<float>>& rows) {  // [1, 1, n, 2]
  Tensor t = Tensor::empty(DType::kF32, {1, 1, static_cast<int64_t>(rows.size()), 2});
  for (size_t i = 0; i < rows.size(); ++i) {
    t.data_as<float>()[2 * i] = rows[i][0];
    t.data_as<float>()[2 * i + 1] = rows[i][1];
  }
  return t;
}

TEST(H2OPolicy, KeepsTheRecentWindowAndTheKeysWithTheMostAccumulatedAttention) {
  // Keys 1 and 3 draw the queries' attention; key 0 gets all of query 0's (it is its only key).
  // Accumulated: key 1 about 3.5, key 3 about 1.5, key 0 about 1, the rest about 0. With
  // heavy=2, recent=1 the next step keeps 5 (recent) and 1, 3 (heavy): not the first tokens
  // (StreamingLLM's choice), not the latest.
  const std::vector<std::vector<float>> keys = {{0, 0}, {10, 0}, {0, 0}, {10, 0}, {0, 0}, {0, 0}};
  const std::vector<std::vector<float>> qs(6, std::vector<float>{1, 0});
  Cache cache(config("h2o:heavy=2,recent=1"));
  auto& layer = dynamic_cast<EvictingLayer&>(cache.layer(0));
  AttentionOptions opt;
  opt.scale = 1.0f;
  const Tensor k = rows_tensor(keys), q = rows_tensor(qs);
  cache.update(0, k.view(), k.view());
  cache.observe_queries(0, q.view(), opt);
  const auto p = brute_probs(qs, keys, 0);
  std::vector<double> want(keys.size(), 0.0);
  for (const auto& row : p)
    for (size_t j = 0; j < row.size(); ++j) want[j] += row[j];
  for (int64_t j = 0; j < 6; ++j) EXPECT_NEAR(layer.score_of(0, 0, j), want[j], 1e-5) << j;
  ASSERT_GT(want[3], want[0]);  // the case is what it claims
  // Decode one token: eviction to heavy + recent first, then the new token.
  const Tensor k6 = rows_tensor({{0, 1}});
  const KVSpan span = cache.update(0, k6.view(), k6.view());
  EXPECT_EQ(layer.kept_positions(0, 0), (std::vector<int64_t>{1, 3, 5, 6}));
  EXPECT_EQ(span.k.dim(2), 4);
  EXPECT_EQ(span.kv_offset, 7 - 4);
  EXPECT_EQ(layer.evicted_tokens(), 3);
  // The scores travel with their keys.
  EXPECT_NEAR(layer.score_of(0, 0, 1), want[1], 1e-5);
  EXPECT_EQ(layer.score_of(0, 0, 0), -1.0f);
  // The next step's queries add to the kept keys' scores.
  const Tensor q6 = rows_tensor({{1, 0}});
  cache.observe_queries(0, q6.view(), opt);
  EXPECT_NEAR(layer.score_of(0, 0, 1) + layer.score_of(0, 0, 3), want[1] + want[3] + 1.0, 1e-4);
}

TEST(H2OPolicy, RefusesAStepWhoseQueriesWereNotReported) {
  Cache cache(config("h2o:heavy=2,recent=2"));
  const Tensor k = rows_tensor({{1, 0}, {0, 1}});
  cache.update(0, k.view(), k.view());
  try {
    cache.update(0, k.view(), k.view());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("queries of the last step were not reported"),
              std::string::npos)
        << e.what();
  }
}

TEST(SnapKVPolicy, KeepsTheTopKeysOfTheObservationWindowPooledPlusTheWindow) {
  // 10 prompt tokens, observation window 2 (positions 8, 9), budget 4: 2 of positions 0..7.
  // Keys 3 and 4 draw equal attention, key 7 the most (logits 6, 6, 7). Without pooling the top
  // two are 7 and 3 (the tie goes to the earlier); pooled over 3 neighbours, 6 and 7 win (key
  // 7's mass is shared by 6 and 7; 3 and 4's by 2..5 but with less mass).
  std::vector<std::vector<float>> keys(10, std::vector<float>{0, 0});
  keys[3] = {6, 0};
  keys[4] = {6, 0};
  keys[7] = {7, 0};
  const std::vector<std::vector<float>> qs(10, std::vector<float>{1, 0});
  for (const auto& [spec, want] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
           {"snapkv:budget=4,window=2,kernel=1", {3, 7, 8, 9}},
           {"snapkv:budget=4,window=2,kernel=3", {6, 7, 8, 9}}}) {
    SCOPED_TRACE(spec);
    Cache cache(config(spec));
    auto& layer = dynamic_cast<EvictingLayer&>(cache.layer(0));
    AttentionOptions opt;
    opt.scale = 1.0f;
    const Tensor k = rows_tensor(keys), q = rows_tensor(qs);
    cache.update(0, k.view(), k.view());
    cache.observe_queries(0, q.view(), opt);
    EXPECT_EQ(layer.kept_positions(0, 0).size(), 10u);  // the prefill step evicts nothing
    const Tensor k10 = rows_tensor({{0, 1}});
    const MaskSizes ms = cache.mask_sizes(0, 1);
    const KVSpan span = cache.update(0, k10.view(), k10.view());
    std::vector<int64_t> kept = want;
    kept.push_back(10);
    EXPECT_EQ(layer.kept_positions(0, 0), kept);
    EXPECT_EQ(span.k.dim(2), 5);
    EXPECT_EQ(ms.kv_length, 5);
    EXPECT_EQ(span.kv_offset, 6);
    // Decode appends from now on, observed or not.
    for (int i = 0; i < 3; ++i) cache.update(0, k10.view(), k10.view());
    EXPECT_EQ(layer.kept_positions(0, 0).size(), 8u);
  }
}

TEST(SnapKVPolicy, AShortPromptIsKeptWhole) {
  Cache cache(config("snapkv:budget=8,window=2,kernel=1"));
  auto& layer = dynamic_cast<EvictingLayer&>(cache.layer(0));
  const Tensor k = rows_tensor(std::vector<std::vector<float>>(6, {1, 0}));
  AttentionOptions opt;
  opt.scale = 1.0f;
  cache.update(0, k.view(), k.view());
  cache.observe_queries(0, k.view(), opt);
  const Tensor k1 = rows_tensor({{0, 1}});
  cache.update(0, k1.view(), k1.view());
  EXPECT_EQ(layer.kept_positions(0, 0).size(), 7u);
  EXPECT_EQ(layer.evicted_tokens(), 0);
}

TEST(EvictingLayer, RefusesWhatItCannotHonour) {
  auto message = [](const CacheConfig& cfg) -> std::string {
    try {
      Cache c(cfg);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CacheConfig q = config("streaming");
  q.options.implementation = "quantized";
  EXPECT_NE(message(q).find("cannot act on the 'quantized' cache; the caches that honour a lossy "
                            "policy: dynamic, static"),
            std::string::npos)
      << message(q);
  EXPECT_NE(message(config("h2o", {"sliding_attention"})).find("has none"), std::string::npos);
  CacheConfig mla = config("streaming");
  mla.kv_content = CacheConfig::KVContent::kMlaLatent;
  EXPECT_NE(message(mla).find("needs per-head keys and values"), std::string::npos);
  // Sliding layers of a hybrid model keep their own container; full ones evict.
  Cache hybrid(config("streaming", {"sliding_attention", "full_attention"}));
  EXPECT_EQ(hybrid.layer(0).name(), "dynamic/sliding_attention");
  EXPECT_EQ(hybrid.layer(1).name(), "dynamic/full_attention+streaming:sink=4,window=256");
  // Past recording and session files would pass a lossy cache for a complete one.
  EXPECT_THROW(hybrid.layer(1).activate_past_recording(), Error);
}

TEST(EvictingLayer, CropsOnlyBeforeTheFirstEviction) {
  Cache cache(config("streaming:sink=1,window=4"));
  const Tensor kv = positions_tensor(1, 1, 0, 3, 2);
  cache.update(0, kv.view(), kv.view());
  cache.crop(-1);
  EXPECT_EQ(cache.seq_length(), 2);
  for (int i = 0; i < 6; ++i) {
    const Tensor t = positions_tensor(1, 1, cache.seq_length(), 1, 2);
    cache.update(0, t.view(), t.view());
  }
  EXPECT_THROW(cache.crop(-1), Error);
  cache.reset();
  EXPECT_EQ(cache.seq_length(), 0);
  const Tensor t = positions_tensor(1, 1, 0, 1, 2);
  EXPECT_EQ(cache.update(0, t.view(), t.view()).k.dim(2), 1);
}

TEST(EvictingLayer, BatchOpsCarryThePlanes) {
  Cache cache(config("streaming:sink=1,window=2"));
  auto& layer = dynamic_cast<EvictingLayer&>(cache.layer(0));
  Tensor kv = positions_tensor(2, 1, 0, 5, 2);
  cache.update(0, kv.view(), kv.view());
  const Tensor t = positions_tensor(2, 1, 5, 1, 2);
  cache.update(0, t.view(), t.view());
  const std::vector<int64_t> kept = {0, 4, 5};
  EXPECT_EQ(layer.kept_positions(1, 0), kept);
  const std::vector<int64_t> rows = {1};
  cache.select(rows);
  EXPECT_EQ(layer.kept_positions(0, 0), kept);
  cache.repeat_interleave(2);
  EXPECT_EQ(layer.kept_positions(1, 0), kept);
}

}  // namespace
}  // namespace kvcache
