// StreamingLLM through the engine (issue 43, item 3) on dummy:tiny: with a window wider than the
// run it is exact; a 1,500-token generation runs in a pool of 12 blocks; each request's policy
// shows in its usage and in the per-policy count; an exact request never hits a streaming
// request's blocks (nor the reverse); what the paged store cannot run is refused at submit or at
// construction.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "core/error.h"
#include "runtime/engine.h"
#include "tiny_model.h"

namespace kvcache {
namespace {

using testing_util::tiny_model;

EngineConfig engine_config(const std::string& policy) {
  EngineConfig c;
  c.cache.paged.block_tokens = 16;
  c.cache.max_cache_len = 1024;
  c.cache.policy = KVPolicy::parse(policy);
  c.max_tokens_per_step = 128;
  c.check_invariants_every_step = true;
  return c;
}

std::vector<int32_t> prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p = {1};
  for (int i = 1; i < n; ++i) p.push_back(static_cast<int32_t>(rng() % 31000) + 3);
  return p;
}

RequestParams greedy(const std::vector<int32_t>& p, int64_t max_tokens,
                     std::optional<std::string> policy = std::nullopt) {
  RequestParams rp;
  rp.prompt = p;
  rp.max_tokens = max_tokens;
  if (policy) rp.kv_policy = KVPolicy::parse(*policy);
  return rp;
}

RequestOutput run(Engine& e, const RequestParams& req, int32_t* peak_used = nullptr) {
  RequestOutput out;
  e.submit(req, [&out](const StreamEvent& ev) {
    if (ev.output != nullptr) out = *ev.output;
  });
  while (e.has_work()) {
    e.step();
    if (peak_used != nullptr)
      *peak_used = std::max<int32_t>(*peak_used, static_cast<int32_t>(e.metrics().blocks_used));
  }
  EXPECT_EQ(e.check_invariants(), "");
  return out;
}

TEST(PagedStreamingEngine, AWindowWiderThanTheRunIsExact) {
  const Model& model = *tiny_model().model;
  Engine exact(model, nullptr, engine_config("exact"));
  Engine wide(model, nullptr, engine_config("streaming:sink=4,window=1000"));
  const std::vector<int32_t> p = prompt(150, 3);  // two prefill chunks, then 60 decodes
  const RequestOutput a = run(exact, greedy(p, 60)), b = run(wide, greedy(p, 60));
  EXPECT_EQ(a.samples.at(0).tokens, b.samples.at(0).tokens);
  EXPECT_EQ(a.stats.kv_policy, "exact");
  EXPECT_EQ(b.stats.kv_policy, "streaming:sink=4,window=1000");
  EXPECT_EQ(wide.kv_policy_label(), "streaming:sink=4,window=1000");
}

TEST(PagedStreamingEngine, ALongGenerationRunsInASmallPool) {
  const Model& model = *tiny_model().model;
  EngineConfig c = engine_config("streaming:sink=4,window=64");
  c.num_blocks = 12;  // the null block and 11 blocks: 176 tokens of exact context
  // Steps of at most 32 tokens: a recompute after a preemption then needs at most the sink
  // block and ceil((63 + 32) / 16) + 1 window blocks (Engine::check_group_capacity).
  c.max_tokens_per_step = 32;
  Engine e(model, nullptr, c);
  const std::vector<int32_t> p = prompt(20, 4);
  // Exact, the request cannot fit; streaming, it holds 1 sink block, 5 window blocks and a step.
  EXPECT_THROW(e.submit(greedy(p, 1500, "exact"), nullptr), Error);
  int32_t peak = 0;
  const RequestOutput out = run(e, greedy(p, 1500), &peak);
  EXPECT_EQ(out.samples.at(0).tokens.size(), 1500u);
  EXPECT_EQ(out.samples.at(0).reason, FinishReason::kLength);
  EXPECT_EQ(out.stats.preemptions, 0);
  EXPECT_LE(peak, 1 + 1 + 5 + 1);
  EXPECT_EQ(e.metrics().blocks_used, 1);  // the null block once the request is done
}

TEST(PagedStreamingEngine, AnExactRequestNeverHitsAStreamingBlock) {
  const Model& model = *tiny_model().model;
  Engine e(model, nullptr, engine_config("streaming:sink=4,window=64"));
  const std::vector<int32_t> p = prompt(100, 5);  // one chunk: no eviction before its blocks
  const RequestOutput a = run(e, greedy(p, 4));
  EXPECT_EQ(a.stats.kv_policy, "streaming:sink=4,window=64");
  EXPECT_EQ(a.stats.cached_tokens, 0);
  const RequestOutput b = run(e, greedy(p, 4, "exact"));
  EXPECT_EQ(b.stats.kv_policy, "exact");
  EXPECT_EQ(b.stats.cached_tokens, 0);  // a's blocks are keyed under its policy
  const RequestOutput c = run(e, greedy(p, 4, "exact"));
  EXPECT_EQ(c.stats.cached_tokens, 99);  // b's blocks and its tail
  const RequestOutput d = run(e, greedy(p, 4, "streaming:sink=4,window=64"));
  EXPECT_EQ(d.stats.cached_tokens, 96);  // a's
  EXPECT_EQ(d.samples.at(0).tokens, a.samples.at(0).tokens);
  const RequestOutput f = run(e, greedy(p, 4, "streaming:sink=4,window=32"));
  EXPECT_EQ(f.stats.cached_tokens, 0);  // another window, other blocks
  const std::map<std::string, int64_t> want = {
      {"exact", 2}, {"streaming:sink=4,window=32", 1}, {"streaming:sink=4,window=64", 2}};
  EXPECT_EQ(e.requests_by_kv_policy(), want);
}

TEST(PagedStreamingEngine, RefusesWhatThePagedStoreCannotRun) {
  const Model& model = *tiny_model().model;
  const std::vector<int32_t> p = prompt(10, 6);
  Engine exact(model, nullptr, engine_config("exact"));
  try {
    exact.submit(greedy(p, 4, "streaming:sink=4,window=64"), nullptr);
    FAIL() << "streaming accepted by an exact engine";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("start the server with a streaming --kv-policy"),
              std::string::npos)
        << e.what();
  }
  Engine streaming(model, nullptr, engine_config("streaming:sink=4,window=64"));
  for (const char* lossy : {"h2o", "snapkv"}) {
    try {
      streaming.submit(greedy(p, 4, lossy), nullptr);
      FAIL() << lossy << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("per KV head by attention"), std::string::npos);
    }
  }
  EXPECT_THROW(Engine(model, nullptr, engine_config("h2o:heavy=64,recent=64")), Error);
}

}  // namespace
}  // namespace kvcache
