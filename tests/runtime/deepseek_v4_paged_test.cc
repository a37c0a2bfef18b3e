// DeepSeek-V4 in the paged runtime (issue 39, parts 1 and 4) on dummy:deepseekv4-tiny
// (sliding, CSA rate 4, HCA rate 8, window 8):
//   - the memory plan counts what the store allocates, exactly: K-only window pages, entry
//     blocks per rate, CSA's indexer pages, the compressors' state per slot;
//   - a paged session's logits equal the dynamic cache's through chunked prefill (chunks not
//     aligned to any rate) and decode;
//   - the engine batching prompts of different lengths (chunked prefills beside decodes)
//     gives each request's tokens and logprobs alone, and the dynamic cache's greedy ids;
//   - a repeated prompt is not served from the prefix cache (the compressors' state at the
//     hit is not kept) and the refusal is counted.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "cache/paged_store.h"
#include "core/error.h"
#include "model/forward.h"
#include "model/paged_plan.h"
#include "paged_compare.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"

namespace kvcache {
namespace {

const Model& v4_model() {
  static const LoadedModel m = load_model("dummy:deepseekv4-tiny");
  return *m.model;
}

std::vector<int32_t> prompt(int64_t n, int32_t salt) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + salt) % 500 + 3));
  return ids;
}

TEST(DeepseekV4PagedPlan, PredictsTheStoreExactly) {
  const ModelConfig& c = v4_model().config();
  for (const uint64_t budget : {uint64_t{0}, uint64_t{4} << 20}) {
    PagedPlanOptions po;
    po.budget_bytes = budget;
    po.block_tokens = 4;
    po.kv_dtype = DType::kF32;
    po.max_tokens_per_step = 64;
    po.max_cached_tokens = 256;
    const CacheConfig cc = model_cache_config(c, {});
    ASSERT_EQ(cc.kv_content, CacheConfig::KVContent::kSharedKV) << "DeepSeek-V4 is K==V";
    po.compressed = cc.compressed;
    po.shared_kv = cc.kv_content == CacheConfig::KVContent::kSharedKV;  // as engine.cc does
    po.linear_slots = 5;
    const PagedMemoryPlan plan = plan_paged_memory(c, po);
    EXPECT_TRUE(plan.store.shared_kv) << "DeepSeek-V4's layers are all K==V";
    const PagedKVStore store(plan.store);
    ASSERT_EQ(store.num_groups(), 3);  // sliding (window of every layer), rate 4, rate 8
    EXPECT_EQ(store.group(1).rate, 4);
    EXPECT_EQ(store.group(2).rate, 8);
    EXPECT_EQ(store.pool_bytes(), plan.pool_bytes);
    EXPECT_EQ(store.linear_state_bytes(), plan.linear_state_bytes);
    // Five slots and their bookkeeping; no linear workspaces.
    EXPECT_EQ(plan.linear_state_bytes,
              5 * (plan.linear_bytes_per_sequence + sizeof(int32_t) + sizeof(uint8_t)));
    // Per sequence: 2 CSA layers (compressor 64 wide + indexer 32 wide, rate 4, with overlaps)
    // and 2 HCA layers (32 wide, rate 8).
    const size_t csa = 2 * 3 * 64 + 2 * 4 * 32 + 2 * 3 * 32 + 2 * 4 * 16, hca = 2 * 7 * 32;
    EXPECT_EQ(plan.linear_bytes_per_sequence, (2 * csa + 2 * hca) * sizeof(float));
    // K only: one head of 32 per slot in the window group.
    EXPECT_EQ(store.layer_page_bytes(0),
              static_cast<size_t>(plan.store.group_blocks[0]) * 4 * 32 * sizeof(float));
    if (budget > 0) {
      EXPECT_LE(plan.total_bytes(), budget);
    }
    EXPECT_GT(plan.max_cached_tokens, 0);
  }
}

SessionConfig session(const char* cache) {
  SessionConfig sc;
  sc.cache.implementation = cache;
  sc.cache.max_cache_len = 128;
  sc.cache.paged.block_tokens = 3;
  sc.prefill_chunk = 5;  // neither a multiple of 4, 8 nor 3
  return sc;
}

TEST(DeepseekV4Paged, SessionLogitsEqualTheDynamicCache) {
  const std::vector<int32_t> ids = prompt(37, 5);
  Session dense(v4_model(), session("dynamic")), paged(v4_model(), session("paged"));
  ASSERT_NE(paged.paged_store(), nullptr);
  const size_t split = 23;
  std::vector<float> want;
  {
    const auto d = dense.prefill({ids.data(), split});
    want.assign(d.begin(), d.end());
  }
  auto got = paged.prefill({ids.data(), split});
  EXPECT_LE(max_rel_diff(got, want), 1e-5);
  for (size_t i = split; i < ids.size(); ++i) {
    const auto d = dense.decode(ids[i]);
    want.assign(d.begin(), d.end());
    got = paged.decode(ids[i]);
    EXPECT_LE(max_rel_diff(got, want), 1e-5) << "token " << i;
  }
  EXPECT_EQ(paged.paged_store()->check_invariants(), "");
}

std::vector<double> trace(const RequestOutput& out) {
  return testing_util::logprob_trace(out);
}

EngineConfig engine_config() {
  EngineConfig ec;
  ec.cache.paged.block_tokens = 4;
  ec.cache.max_cache_len = 200;
  ec.max_tokens_per_step = 16;  // prompts of 23 and 41 tokens prefill in chunks beside decodes
  ec.max_running = 6;
  return ec;
}

std::vector<RequestOutput> run(Engine& e, const std::vector<RequestParams>& rs) {
  std::vector<RequestOutput> out(rs.size());
  for (size_t i = 0; i < rs.size(); ++i)
    e.submit(rs[i], [&out, i](const StreamEvent& ev) {
      if (ev.output != nullptr) out[i] = *ev.output;
    });
  while (e.has_work()) {
    e.step();
    const std::string inv = e.check_invariants();
    EXPECT_EQ(inv, "");
    if (!inv.empty()) break;
  }
  return out;
}

TEST(DeepseekV4Engine, ABatchOfPromptsEqualsEachAloneAndTheDynamicCache) {
  std::vector<RequestParams> reqs;
  for (const int64_t n : {int64_t{5}, int64_t{23}, int64_t{41}, int64_t{13}}) {
    RequestParams rp;
    rp.prompt = prompt(n, static_cast<int32_t>(n));
    rp.max_tokens = 7;
    rp.logprobs = 5;
    reqs.push_back(rp);
  }
  Engine together(v4_model(), nullptr, engine_config());
  const std::vector<RequestOutput> all = run(together, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    Engine alone(v4_model(), nullptr, engine_config());
    const RequestOutput one = run(alone, {reqs[i]})[0];
    EXPECT_EQ(trace(all[i]), trace(one)) << "request " << i;
    ASSERT_EQ(all[i].samples.at(0).tokens.size(), 7u);
    // The dynamic cache's greedy continuation.
    Session s(v4_model(), session("dynamic"));
    auto l = s.prefill(reqs[i].prompt);
    std::vector<int32_t> greedy;
    for (int t = 0; t < 7; ++t) {
      greedy.push_back(testing_util::argmax_id(l));
      l = s.decode(greedy.back());
    }
    EXPECT_EQ(all[i].samples.at(0).tokens, greedy) << "request " << i;
  }
}

TEST(DeepseekV4Engine, ARepeatedPromptIsRecomputedAndTheRefusalCounted) {
  RequestParams rp;
  rp.prompt = prompt(30, 9);
  rp.max_tokens = 4;
  rp.logprobs = 5;
  Engine e(v4_model(), nullptr, engine_config());
  const RequestOutput first = run(e, {rp})[0];
  EXPECT_TRUE(e.metrics().compressed_model);
  const RequestOutput again = run(e, {rp})[0];
  EXPECT_EQ(again.stats.cached_tokens, 0);
  EXPECT_EQ(e.metrics().cached_prompt_tokens, 0);
  EXPECT_GE(e.metrics().prefix_refused_compressed, 1);
  ASSERT_EQ(first.samples.at(0).tokens.size(), 4u);
  EXPECT_EQ(trace(first), trace(again));
}

}  // namespace
}  // namespace kvcache
