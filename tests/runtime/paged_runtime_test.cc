// The paged cache under the real forward pass: paged generation equals dense generation bit for
// bit (same eager arithmetic) for a batch of sequences with different prompt lengths; a request
// sharing a 2,000-token prefix prefills only its suffix and equals a cold run; the memory
// planner's prediction is what gets allocated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cache/paged_store.h"
#include "core/error.h"
#include "golden_util.h"
#include "model/llama2c.h"
#include "model/paged_plan.h"
#include "paged_compare.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"

namespace kvcache {
namespace {

using testing_util::bits_equal;

std::vector<int32_t> ids_of(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<int32_t>((seed >> 33) % static_cast<uint64_t>(vocab));
  }
  return t;
}

// Three sequences of different prompt lengths: dense sessions one by one vs one paged cache
// that prefills each sequence alone and then decodes all three as one varlen batch (B = 3:
// below the sgemm threshold, so every projection row is the same GEMV as for B = 1).
void expect_paged_equals_dense(const Model& model, const std::vector<int64_t>& prompt_lens,
                               int decode_steps, const std::string& layer_override_note = "") {
  const int64_t vocab = model.config().vocab_size;
  const auto B = static_cast<int64_t>(prompt_lens.size());
  testing_util::PagedVsDense c;
  for (int64_t i = 0; i < B; ++i)
    c.prompts.push_back(
        ids_of(prompt_lens[static_cast<size_t>(i)], vocab, 11 + static_cast<uint64_t>(i)));
  c.decode_steps = decode_steps;
  c.dense.cache.implementation = "dynamic";
  c.dense.kernel = "eager";
  c.paged = c.dense;
  c.paged.cache.implementation = "paged";
  c.paged.cache.paged.block_tokens = 4;  // odd lengths straddle blocks
  c.paged.cache.max_cache_len = 256;
  c.note = layer_override_note;
  const std::shared_ptr<PagedKVStore> store = testing_util::expect_paged_equals_dense(model, c);
  ASSERT_NE(store, nullptr);
  // Waste: at most one partial block per sequence and group.
  for (int g = 0; g < store->num_groups(); ++g) {
    const PagedGroupStats st = store->stats(g);
    EXPECT_LT(st.allocated_slots - st.live_tokens, B * 4);
  }
}

TEST(PagedRuntime, VarlenBatchEqualsDenseOnStories260K) {
  KVCACHE_REQUIRE_STORIES();
  const Model model(load_llama2c(testing_util::stories_dir() + "/stories260K.bin"));
  expect_paged_equals_dense(model, {5, 11, 17}, 12);
}

TEST(PagedRuntime, VarlenBatchEqualsDenseOnDummyTiny) {
  const LoadedModel m = load_model("dummy:tiny");
  expect_paged_equals_dense(*m.model, {3, 10, 7}, 6);
}

TEST(PagedRuntime, VarlenBatchEqualsDenseOnDummyLlama125m) {
  const LoadedModel m = load_model("dummy:llama-125m");
  expect_paged_equals_dense(*m.model, {5, 9, 2}, 3);
}

TEST(PagedRuntime, RowsAtDifferentPositionsNeedAPagedCache) {
  const LoadedModel m = load_model("dummy:tiny");
  SessionConfig sc;
  sc.kernel = "eager";
  CacheConfig cc = make_cache_config(m.model->config(), sc);
  cc.options.max_batch_size = 2;
  Cache cache(cc);
  Forward fwd(*m.model, "eager");
  const int32_t ids[] = {1, 2};
  const int64_t pos[] = {0, 3};
  ForwardParams fp;
  fp.tokens = ids;
  fp.batch = 2;
  fp.n_tokens = 1;
  fp.row_pos0 = pos;
  fp.cache = &cache;
  EXPECT_THROW(fwd.forward(fp), Error);
}

TEST(PagedRuntime, SharedPrefixOf2000TokensPrefillsOnlyTheSuffixAndEqualsAColdRun) {
  const LoadedModel m = load_model("dummy:tiny");
  const Model& model = *m.model;
  SessionConfig sc;
  sc.cache.implementation = "paged";
  sc.kernel = "eager";
  sc.cache.max_cache_len = 4096;
  // Chunks of 256: the cold run's last chunk is [1792, 2000); the cached run prefills
  // [1800, 2000) in one go. The shapes differ and the bits must not: the prefill GEMM and the
  // attention kernels compute each row the same way whatever the number of rows.
  sc.prefill_chunk = 256;
  const int64_t vocab = model.config().vocab_size;
  const std::vector<int32_t> prefix = ids_of(1800, vocab, 5);
  std::vector<int32_t> a = prefix, b = prefix;
  const std::vector<int32_t> ta = ids_of(200, vocab, 6), tb = ids_of(200, vocab, 7);
  a.insert(a.end(), ta.begin(), ta.end());
  b.insert(b.end(), tb.begin(), tb.end());

  Session s(model, sc);
  EXPECT_EQ(s.reuse_prefix(a), 0);  // nothing cached yet
  s.prefill(a);
  s.reset();  // the request finishes: blocks released, keys kept
  const PagedKVStore& store = *s.paged_store();
  EXPECT_EQ(store.stats(0).pool.cached, 2000 / 16);
  const int64_t allocs_before = store.stats(0).pool.allocations;
  const int64_t reused = s.reuse_prefix(b);
  // All 1,800 shared tokens: 112 full blocks shared, and the 8 tokens of block 112 that a and
  // b share copied from a's cached block into b's own.
  EXPECT_EQ(reused, 1800);
  EXPECT_EQ(s.position(), 1800);
  EXPECT_EQ(s.paged_store()->match_prefix(b, {}, PagedKVStore::PrefixMatch::kFullBlocks), 1792);
  const auto lb = s.prefill(std::span<const int32_t>(b).subspan(static_cast<size_t>(reused)));
  const std::vector<float> cached(lb.begin(), lb.end());
  // Only the suffix was computed: 200 tokens in 13 new blocks (the first holds the copy).
  EXPECT_EQ(store.stats(0).pool.allocations - allocs_before, 13);
  EXPECT_EQ(store.stats(0).pool.hits, 112 + 1);  // the shared blocks and the copy's source

  Session cold(model, sc);
  const auto lc = cold.prefill(b);
  EXPECT_TRUE(bits_equal(cached, lc));
  EXPECT_EQ(testing_util::argmax_id(cached), testing_util::argmax_id(lc));
  EXPECT_EQ(store.check_invariants(), "");
}

// A prompt prefilled again without a prefix lookup while its first copy is still cached, in a
// full pool: the recomputation evicts the old copy (least recently released) chunk by chunk,
// and each new block must take its key over from the cached copy — refused, the new blocks
// stayed unkeyed and the whole prefix was lost (reuse 0; found by the TTFT benchmark's
// harness).
TEST(PagedRuntime, RecomputedPromptKeepsItsPrefixUnderPressure) {
  const LoadedModel m = load_model("dummy:tiny");
  const Model& model = *m.model;
  SessionConfig sc;
  sc.cache.implementation = "paged";
  sc.cache.max_cache_len = 4000;  // room for two 2,000-token prompts
  const int64_t vocab = model.config().vocab_size;
  const std::vector<int32_t> a = ids_of(2000, vocab, 11), cold = ids_of(2000, vocab, 12);
  std::vector<int32_t> b(a.begin(), a.begin() + 1800);
  const std::vector<int32_t> tail = ids_of(200, vocab, 13);
  b.insert(b.end(), tail.begin(), tail.end());

  Session s(model, sc);
  s.prefill(a);
  s.reset();
  s.prefill(cold);  // the pool is now full of cached blocks, a's the least recent
  s.reset();
  s.prefill(a);  // a again, computed instead of looked up: it evicts its own old copies
  s.reset();
  EXPECT_EQ(s.reuse_prefix(b), 1800);  // 112 full blocks and the shared 8 of the next
  EXPECT_EQ(s.paged_store()->check_invariants(), "");
}

TEST(PagedRuntime, PlannerPredictionIsWhatGetsAllocated) {
  const LoadedModel m = load_model("dummy:tiny");
  const ModelConfig& c = m.model->config();
  for (const uint64_t budget : {uint64_t{3} << 20, uint64_t{40} << 20}) {
    PagedPlanOptions po;
    po.budget_bytes = budget;
    po.block_tokens = 16;
    po.kv_dtype = DType::kF16;
    po.max_tokens_per_step = 512;
    const PagedMemoryPlan plan = plan_paged_memory(c, po);
    EXPECT_LE(plan.total_bytes(), budget);
    EXPECT_GT(plan.max_cached_tokens, 0);
    const PagedKVStore store(plan.store);
    EXPECT_EQ(store.pool_bytes(), plan.pool_bytes);
    EXPECT_EQ(plan.pool_bytes, predict_pool_bytes(plan.store));
    const Forward fwd(*m.model, "eager", plan.max_tokens_per_step);
    EXPECT_EQ(fwd.workspace_bytes(), plan.activation_bytes);
    // Through a session: --kv-budget sizes the pool the same way.
    SessionConfig sc;
    sc.cache.implementation = "paged";
    sc.cache.kv_dtype = DType::kF16;
    sc.kv_budget_bytes = budget;
    const Session s(*m.model, sc);
    EXPECT_EQ(s.paged_store()->pool_bytes(), plan.pool_bytes);
  }
  // The smaller budget shrank the step (activations at most half of it).
  PagedPlanOptions po;
  po.budget_bytes = 3 << 20;
  EXPECT_LT(plan_paged_memory(c, po).max_tokens_per_step, 512);
  po.budget_bytes = 1000;
  EXPECT_THROW(plan_paged_memory(c, po), Error);
}

// A forward sized for 8 rows that meets a longer prefill grows its workspaces — the prefill GEMM's
// packed-input scratch among them — in the middle of the call; the result must be the same bits
// as a forward sized for the chunk up front (a stale scratch pointer once wrote into freed
// memory here; the ASan build catches any recurrence).
TEST(ForwardWorkspace, GrowingDuringAPrefillChangesNothing) {
  const LoadedModel m = load_model("dummy:tiny");
  std::vector<int32_t> tokens(37);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(3 + 7 * i % 200);
  ForwardParams fp;
  fp.tokens = tokens.data();
  fp.n_tokens = static_cast<int64_t>(tokens.size());
  Forward grown(*m.model, "fused", 8),
      sized(*m.model, "fused", 64);  // 8 rows: a scratch to outgrow
  const std::span<const float> ga = grown.forward(fp);
  const std::vector<float> a(ga.begin(), ga.end());
  const std::span<const float> b = sized.forward(fp);
  EXPECT_TRUE(bits_equal(b, a));
  EXPECT_EQ(grown.workspace_bytes(), Forward::workspace_bytes_for(m.model->config(), 37));
}

}  // namespace
}  // namespace kvcache
