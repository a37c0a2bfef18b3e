// Hybrid models in the paged runtime (issue 38): the memory plan bills the linear-attention
// state per running sequence and the snapshot arena, exactly as the store allocates them.
// The engine on dummy:qwen3next-tiny (Gated DeltaNet + gated attention): prefix hits restore
// the snapshot at or before the hit and give the tokens of a run alone, cached_tokens is the
// snapshot-aligned hit, several hybrid requests batched equal each alone.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "cache/paged_store.h"
#include "core/error.h"
#include "model/paged_plan.h"
#include "paged_compare.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"

namespace kvcache {
namespace {

PagedPlanOptions hybrid_options(const ModelConfig& c, uint64_t budget, int32_t slots,
                                int32_t snapshots) {
  PagedPlanOptions po;
  po.budget_bytes = budget;
  po.block_tokens = 16;
  po.kv_dtype = DType::kF16;
  po.max_tokens_per_step = 512;
  po.max_cached_tokens = 4096;
  po.layer_types = c.layer_types;
  for (size_t l = 0; l < po.layer_types.size(); l += 2) po.layer_types[l] = "linear_attention";
  po.sliding_window = c.sliding_window;
  po.linear = {.conv_kernel = 4, .conv_dim = 96, .heads_v = 4, .head_dim_k = 16, .head_dim_v = 16};
  po.linear_slots = slots;
  po.snapshot_every_blocks = 4;
  po.max_snapshots = snapshots;
  return po;
}

TEST(HybridPagedPlan, BillsStatePerSequenceAndSnapshotsExactly) {
  const LoadedModel m = load_model("dummy:tiny");
  const ModelConfig& c = m.model->config();
  ASSERT_GE(c.layer_types.size(), 2u);
  const auto n_linear = static_cast<size_t>((c.layer_types.size() + 1) / 2);
  const size_t per_seq = n_linear * (4 * 16 * 16 + 3 * 96) * sizeof(float);
  for (const uint64_t budget : {uint64_t{0}, uint64_t{8} << 20}) {
    const PagedPlanOptions po = hybrid_options(c, budget, 8, 10);
    const PagedMemoryPlan plan = plan_paged_memory(c, po);
    EXPECT_EQ(plan.linear_bytes_per_sequence, per_seq);
    EXPECT_GE(plan.linear_state_bytes, 8 * per_seq);
    EXPECT_GE(plan.snapshot_bytes, 10 * per_seq);
    const PagedKVStore store(plan.store);
    EXPECT_EQ(store.pool_bytes(), plan.pool_bytes);
    EXPECT_EQ(store.linear_state_bytes(), plan.linear_state_bytes);
    EXPECT_EQ(store.snapshot_bytes(), plan.snapshot_bytes);
    EXPECT_EQ(store.free_linear_slots(), 8);
    if (budget > 0) {
      EXPECT_LE(plan.total_bytes(), budget);
      // The state comes out of the budget before the blocks: more state, fewer blocks.
      const PagedMemoryPlan more = plan_paged_memory(c, hybrid_options(c, budget, 64, 40));
      EXPECT_LT(more.pool_bytes, plan.pool_bytes);
      EXPECT_LE(more.total_bytes(), budget);
    }
  }
  // A budget the state alone exceeds is refused, naming the state.
  try {
    (void)plan_paged_memory(c, hybrid_options(c, uint64_t{2} << 20, 4096, 0));
    FAIL() << "a budget smaller than the state must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear-attention state"), std::string::npos) << e.what();
  }
  // No linear layers: nothing billed.
  PagedPlanOptions plain = hybrid_options(c, 0, 8, 10);
  plain.layer_types = c.layer_types;
  const PagedMemoryPlan p = plan_paged_memory(c, plain);
  EXPECT_EQ(p.linear_state_bytes + p.snapshot_bytes + p.linear_bytes_per_sequence, 0u);
}

const Model& hybrid_model() {
  static const LoadedModel m = load_model("dummy:qwen3next-tiny");
  return *m.model;
}

std::vector<int32_t> random_ids(std::mt19937& rng, size_t n) {
  std::vector<int32_t> ids(n);
  for (int32_t& t : ids) t = static_cast<int32_t>(rng() % 500) + 3;
  return ids;
}

RequestParams greedy(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  RequestParams rp;
  rp.prompt = prompt;
  rp.max_tokens = max_tokens;
  rp.logprobs = 5;  // compared exactly: greedy ids alone hardly see the linear state here
  return rp;
}

std::vector<double> trace(const RequestOutput& out) {
  return testing_util::logprob_trace(out);
}

EngineConfig hybrid_engine(int32_t block_tokens = 8, int32_t every = 2) {
  EngineConfig c;
  c.cache.max_cache_len = 2048;
  c.cache.paged.block_tokens = block_tokens;
  c.cache.paged.snapshot_every_blocks = every;
  c.max_tokens_per_step = 256;
  c.max_running = 8;
  return c;
}

struct EngineRun {
  std::vector<std::vector<double>> tokens;  // trace() of each request
  std::vector<RequestOutput> outputs;
};

EngineRun run_all(Engine& e, const std::vector<RequestParams>& reqs) {
  EngineRun res;
  res.tokens.resize(reqs.size());
  res.outputs.resize(reqs.size());
  std::map<uint64_t, size_t> slot;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const uint64_t id = e.submit(reqs[i], [&res, &slot](const StreamEvent& ev) {
      if (ev.output != nullptr) res.outputs[slot.at(ev.id)] = *ev.output;
    });
    slot[id] = i;
  }
  while (e.has_work()) {
    e.step();
    const std::string inv = e.check_invariants();
    EXPECT_EQ(inv, "");
    if (!inv.empty()) break;
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    res.tokens[i] = trace(res.outputs[i]);
    EXPECT_EQ(res.outputs[i].samples.at(0).logprobs.size(),
              res.outputs[i].samples.at(0).tokens.size());
  }
  return res;
}

std::vector<double> run_alone(const RequestParams& rp, const EngineConfig& c = hybrid_engine()) {
  Engine e(hybrid_model(), nullptr, c);
  const EngineRun r = run_all(e, {rp});
  EXPECT_EQ(r.outputs[0].stats.cached_tokens, 0);
  return r.tokens[0];
}

TEST(HybridEngine, TwoRequestsSharingA90PercentPrefixEqualEachAloneAndReportTheSnapshotHit) {
  std::mt19937 rng(5);
  const std::vector<int32_t> a = random_ids(rng, 100);
  std::vector<int32_t> b(a.begin(), a.begin() + 90);
  const std::vector<int32_t> tail = random_ids(rng, 10);
  b.insert(b.end(), tail.begin(), tail.end());
  for (const int32_t every : {1, 2, 4}) {
    const EngineConfig c = hybrid_engine(8, every);
    Engine e(hybrid_model(), nullptr, c);
    const EngineRun ra = run_all(e, {greedy(a, 6)});
    EXPECT_EQ(ra.outputs[0].stats.cached_tokens, 0);
    const EngineRun rb = run_all(e, {greedy(b, 6)});
    // 90 shared tokens: 11 full blocks of 8 (88); the latest snapshot at or before them is at
    // the last multiple of `every` blocks: 88 (every 1), 80 (2), 64 (4).
    const int64_t snap = 8 * every;
    EXPECT_EQ(rb.outputs[0].stats.cached_tokens, 88 / snap * snap) << "every " << every;
    EXPECT_EQ(e.metrics().cached_prompt_tokens, 88 / snap * snap);
    EXPECT_EQ(ra.tokens[0], run_alone(greedy(a, 6), c)) << "every " << every;
    EXPECT_EQ(rb.tokens[0], run_alone(greedy(b, 6), c)) << "every " << every;
    EXPECT_GT(e.metrics().snapshots, 0);
    EXPECT_GT(e.metrics().linear_state_bytes, 0);
  }
}

TEST(HybridEngine, APrefixHitInTheMiddleOfAPromptEqualsRecomputing) {
  std::mt19937 rng(9);
  const std::vector<int32_t> a = random_ids(rng, 40);
  // b continues a's first 37 tokens for 60 more: the hit (32, the snapshot at 4 blocks of 8)
  // is in the middle of b's prompt, the rest is recomputed from the restored state.
  std::vector<int32_t> b(a.begin(), a.begin() + 37);
  const std::vector<int32_t> more = random_ids(rng, 60);
  b.insert(b.end(), more.begin(), more.end());
  const EngineConfig c = hybrid_engine(8, 4);
  Engine e(hybrid_model(), nullptr, c);
  run_all(e, {greedy(a, 1)});
  const EngineRun rb = run_all(e, {greedy(b, 8)});
  EXPECT_EQ(rb.outputs[0].stats.cached_tokens, 32);
  EXPECT_EQ(rb.tokens[0], run_alone(greedy(b, 8), c));
  // Snapshots off: the same blocks are cached but a hybrid cannot use them: an honest 0.
  EngineConfig off = c;
  off.cache.paged.max_snapshots = 0;
  Engine e0(hybrid_model(), nullptr, off);
  run_all(e0, {greedy(a, 1)});
  const EngineRun r0 = run_all(e0, {greedy(b, 8)});
  EXPECT_EQ(r0.outputs[0].stats.cached_tokens, 0);
  EXPECT_EQ(r0.tokens[0], run_alone(greedy(b, 8), off));
}

TEST(HybridEngine, ContinuousBatchingOfHybridRequestsEqualsEachAlone) {
  std::mt19937 rng(13);
  const std::vector<int32_t> common = random_ids(rng, 24);
  std::vector<RequestParams> reqs;
  for (int i = 0; i < 5; ++i) {
    std::vector<int32_t> p = i % 2 == 0 ? common : std::vector<int32_t>{};
    const std::vector<int32_t> t = random_ids(rng, 5 + 9 * static_cast<size_t>(i));
    p.insert(p.end(), t.begin(), t.end());
    reqs.push_back(greedy(p, 7 + i));
  }
  EngineConfig c = hybrid_engine(8, 2);
  c.max_tokens_per_step = 40;  // chunked prefills alongside running decodes
  Engine e(hybrid_model(), nullptr, c);
  const EngineRun got = run_all(e, reqs);
  EXPECT_GE(e.metrics().forwards, 1);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got.tokens[i], run_alone(reqs[i], c)) << "request " << i;
  EXPECT_EQ(e.metrics().running, 0);
  EXPECT_EQ(e.metrics().blocks_used, 0);
}

TEST(HybridEngine, ParallelSamplesForkTheStateAndPreemptionRecomputes) {
  std::mt19937 rng(17);
  RequestParams rp = greedy(random_ids(rng, 30), 6);
  rp.n = 3;
  Engine e(hybrid_model(), nullptr, hybrid_engine());
  const EngineRun r = run_all(e, {rp});
  ASSERT_EQ(r.outputs[0].samples.size(), 3u);
  // Greedy samples of one prompt: the forked states continue identically.
  for (const auto& s : r.outputs[0].samples) EXPECT_EQ(s.tokens, r.outputs[0].samples[0].tokens);
  EXPECT_EQ(r.tokens[0], run_alone(greedy(rp.prompt, 6)));
  // A pool so small that sequences are preempted and recomputed (from their snapshots).
  EngineConfig tiny = hybrid_engine(8, 1);
  tiny.num_blocks = 12;
  tiny.cache.max_cache_len = 0;
  std::vector<RequestParams> reqs;
  for (int i = 0; i < 4; ++i)
    reqs.push_back(greedy(random_ids(rng, 20 + 3 * static_cast<size_t>(i)), 12));
  Engine small(hybrid_model(), nullptr, tiny);
  const EngineRun got = run_all(small, reqs);
  EXPECT_GT(small.metrics().preemptions, 0);
  // Recomputed after a preemption, tokens first decoded one by one (the recurrent form) go
  // through a prefill (the chunked form): equal to rounding, not bit for bit.
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::vector<double> alone = run_alone(reqs[i]);
    ASSERT_EQ(got.tokens[i].size(), alone.size()) << "request " << i;
    for (size_t j = 0; j < alone.size(); ++j)
      EXPECT_NEAR(got.tokens[i][j], alone[j], 1e-4) << "request " << i << " entry " << j;
  }
}

}  // namespace
}  // namespace kvcache
