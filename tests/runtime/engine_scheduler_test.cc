// The engine's scheduler policies (EngineConfig::scheduler: fifo, prefill-first), FIFO's safety
// margin, and the per-group admission check (full, sliding groups), asserted from what the
// engine delivers: the order of the stream events, the requests' statistics and submit's errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "scratch_dir.h"
#include "tiny_model.h"

namespace kvcache {
namespace {

using testing_util::process_scratch;
using testing_util::tiny_model;

std::vector<int32_t> prompt_of(int n, int32_t salt) {
  std::vector<int32_t> p = {1};
  for (int i = 1; i < n; ++i) p.push_back(3 + (i * 37 + salt * 101) % 400);
  return p;
}

RequestParams greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  RequestParams rp;
  rp.prompt = std::move(prompt);
  rp.max_tokens = max_tokens;
  return rp;
}

// Every token event and finish, in delivery order.
struct Event {
  uint64_t id = 0;
  bool finished = false;
};

struct Recorder {
  std::vector<Event> events;
  std::map<uint64_t, RequestOutput> outputs;
  StreamCallback callback() {
    return [this](const StreamEvent& ev) {
      if (ev.token >= 0 || ev.finished) events.push_back({ev.id, ev.finished});
      if (ev.output != nullptr) outputs[ev.id] = *ev.output;
    };
  }
  // Token events of `id` delivered before the first token event of `other`.
  int tokens_before_first_of(uint64_t id, uint64_t other) const {
    int n = 0;
    for (const Event& e : events) {
      if (e.id == other && !e.finished) return n;
      if (e.id == id && !e.finished) ++n;
    }
    return -1;
  }
  size_t first_token_of(uint64_t id) const {
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i].id == id && !events[i].finished) return i;
    return events.size();
  }
  size_t finish_of(uint64_t id) const {
    for (size_t i = 0; i < events.size(); ++i)
      if (events[i].id == id && events[i].finished) return i;
    return events.size();
  }
};

struct SchedulerRun {
  int a_tokens_before_b = -1;
  std::vector<int32_t> a, b;
};

// A decodes alone; then B (a 40-token prompt) arrives while the step budget is 8 tokens.
SchedulerRun run_policy(SchedulerPolicy policy) {
  EngineConfig c;
  c.cache.max_cache_len = 512;
  c.max_tokens_per_step = 8;
  c.scheduler = policy;
  Engine e(*tiny_model().model, nullptr, c);
  Recorder rec;
  const uint64_t a = e.submit(greedy(prompt_of(4, 1), 30), rec.callback());
  e.step();  // A's prompt, and its first token
  EXPECT_EQ(rec.events.size(), 1u);
  const uint64_t b = e.submit(greedy(prompt_of(40, 2), 4), rec.callback());
  while (e.has_work()) {
    e.step();
    EXPECT_EQ(e.check_invariants(), "");
  }
  SchedulerRun out;
  out.a_tokens_before_b = rec.tokens_before_first_of(a, b);
  out.a = rec.outputs.at(a).samples.at(0).tokens;
  out.b = rec.outputs.at(b).samples.at(0).tokens;
  return out;
}

TEST(EngineScheduler, PrefillFirstReachesANewRequestsFirstTokenBeforeTheRunningDecodes) {
  const SchedulerRun fifo = run_policy(SchedulerPolicy::kFifo);
  const SchedulerRun pf = run_policy(SchedulerPolicy::kPrefillFirst);
  // A's first token came before B arrived. FIFO: then every step decodes A (1 token) and B's
  // prefill takes the 7 left: ceil(40 / 7) = 6 steps, each with one token of A, before B's
  // first token.
  EXPECT_EQ(fifo.a_tokens_before_b, 1 + 6);
  // Prefill-first: B's prefill takes the whole budget (5 steps of 8 tokens): A waits.
  EXPECT_EQ(pf.a_tokens_before_b, 1 + 0);
  // The order changes, never the tokens (batch-invariant engine).
  EXPECT_EQ(fifo.a, pf.a);
  EXPECT_EQ(fifo.b, pf.b);
  EXPECT_EQ(fifo.a.size(), 30u);
  EXPECT_EQ(fifo.b.size(), 4u);
}

// 10 blocks of 16 tokens. A holds 6 of them from its first step on (a 90-token prompt), so 4
// stay free: under a margin of 0.5 (5 blocks) B is not admitted while A decodes.
struct MarginRun {
  Recorder rec;
  uint64_t a = 0, b = 0;
  EngineMetrics metrics;
};
void run_margin(double margin, MarginRun& out) {
  EngineConfig c;
  c.num_blocks = 10;
  c.cache.max_cache_len = 160;
  c.safety_margin = margin;
  Engine e(*tiny_model().model, nullptr, c);
  out.a = e.submit(greedy(prompt_of(90, 3), 12), out.rec.callback());
  out.b = e.submit(greedy(prompt_of(10, 4), 2), out.rec.callback());
  while (e.has_work()) {
    e.step();
    EXPECT_EQ(e.check_invariants(), "");
  }
  out.metrics = e.metrics();
}

TEST(EngineScheduler, FifoSafetyMarginHoldsNewRequestsWhileDecodesGoOn) {
  MarginRun held, plain;
  run_margin(0.5, held);
  run_margin(0, plain);
  // Without a margin both run at once: B's first token comes before A ends.
  EXPECT_LT(plain.rec.first_token_of(plain.b), plain.rec.finish_of(plain.a));
  EXPECT_EQ(plain.metrics.running_peak, 2);
  // With it, A decodes all its 12 tokens while B waits; B is admitted once A's blocks are back.
  EXPECT_EQ(held.rec.tokens_before_first_of(held.a, held.b), 12);
  EXPECT_GT(held.rec.first_token_of(held.b), held.rec.finish_of(held.a));
  EXPECT_EQ(held.metrics.running_peak, 1);
  EXPECT_EQ(held.metrics.preemptions, 0);
  // Same tokens either way.
  EXPECT_EQ(held.rec.outputs.at(held.a).samples.at(0).tokens,
            plain.rec.outputs.at(plain.a).samples.at(0).tokens);
  EXPECT_EQ(held.rec.outputs.at(held.b).samples.at(0).tokens,
            plain.rec.outputs.at(plain.b).samples.at(0).tokens);
  EXPECT_EQ(held.rec.outputs.at(held.b).samples.at(0).tokens.size(), 2u);
}

TEST(EngineScheduler, PoliciesAndMarginsAreValidated) {
  EXPECT_EQ(parse_scheduler_policy("fifo"), SchedulerPolicy::kFifo);
  EXPECT_EQ(parse_scheduler_policy("prefill-first"), SchedulerPolicy::kPrefillFirst);
  EXPECT_STREQ(scheduler_policy_name(SchedulerPolicy::kPrefillFirst), "prefill-first");
  try {
    parse_scheduler_policy("lifo");
    FAIL() << "lifo accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fifo or prefill-first"), std::string::npos) << e.what();
  }
  const auto refused = [](EngineConfig c) {
    try {
      Engine e(*tiny_model().model, nullptr, c);
    } catch (const Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  EngineConfig c;
  c.cache.max_cache_len = 64;
  for (double bad : {-0.1, 1.0, std::numeric_limits<double>::quiet_NaN()}) {
    c.safety_margin = bad;
    EXPECT_NE(refused(c).find("[0, 1)"), std::string::npos) << bad;
  }
  c.safety_margin = 0.2;
  c.scheduler = SchedulerPolicy::kPrefillFirst;
  EXPECT_NE(refused(c).find("fifo scheduler's admission rule"), std::string::npos);
  c.safety_margin = 0;
  EXPECT_EQ(refused(c), "");
}

const LoadedModel& preset(const std::string& name) {
  static std::map<std::string, LoadedModel> models;
  auto it = models.find(name);
  if (it == models.end()) {
    LoadOptions lo;
    lo.dummy_cache_dir = process_scratch().file(name);
    it = models.emplace(name, load_model("dummy:" + name + ":f32", lo)).first;
  }
  return it->second;
}

// Blocks of 4 tokens, steps of 4 tokens, every group `blocks` blocks (a sliding group's null
// block among them).
EngineConfig small_pool(int32_t blocks) {
  EngineConfig c;
  c.cache.paged.block_tokens = 4;
  c.cache.max_cache_len = 64;
  c.num_blocks = blocks;
  c.max_tokens_per_step = 4;
  return c;
}

std::string submit_error(Engine& e, int64_t prompt, int64_t max_tokens) {
  try {
    e.submit(greedy(prompt_of(static_cast<int>(prompt), 6), max_tokens), nullptr);
  } catch (const Error& err) {
    return err.what();
  }
  return "";
}

// Gemma-2 (full + sliding window 8): a step of 4 tokens keeps 8 - 1 + 4 = 11 keys of the sliding
// group, at most 4 blocks of 4. With 4 blocks per group the full group holds 16 tokens but the
// sliding group only 3 blocks: a 16-token request is refused at once, naming the group, and a
// 12-token one (3 blocks in both) runs.
TEST(EngineScheduler, ARequestTheSlidingGroupCannotHoldIsRefusedNamingIt) {
  const Model& gemma = *preset("gemma2-tiny").model;
  Engine e(gemma, nullptr, small_pool(4));
  const std::string err = submit_error(e, 10, 6);
  EXPECT_NE(err.find("sliding window 8"), std::string::npos) << err;
  EXPECT_NE(err.find("need 4 blocks"), std::string::npos) << err;
  EXPECT_NE(err.find("which has 3"), std::string::npos) << err;
  EXPECT_EQ(submit_error(e, 10, 2), "");
  e.run_until_idle();
  EXPECT_EQ(e.metrics().requests_failed, 0);
  // The full group: 20 tokens need 5 of its 4 blocks (the context check says so first).
  EXPECT_NE(submit_error(e, 10, 10), "");
}

// Phi-3 (every layer sliding, window 8): a sequence holds at most 4 blocks whatever its length,
// so a 120-token request runs in a pool of 5 blocks (4 usable, 16 tokens) with the same tokens
// as in a large pool, and a pool of 4 (3 usable) refuses it naming the sliding group.
TEST(EngineScheduler, ALongRequestOnASlidingOnlyModelIsNotRefusedForTheWindowsSake) {
  const Model& phi = *preset("phi3-tiny").model;
  const RequestParams rp = greedy(prompt_of(100, 7), 20);
  std::vector<int32_t> want;
  {
    Engine big(phi, nullptr, small_pool(64));
    Recorder rec;
    const uint64_t id = big.submit(rp, rec.callback());
    big.run_until_idle();
    want = rec.outputs.at(id).samples.at(0).tokens;
  }
  ASSERT_EQ(want.size(), 20u);
  Engine e(phi, nullptr, small_pool(5));
  EXPECT_GE(e.max_context(), 120);
  Recorder rec;
  const uint64_t id = e.submit(rp, rec.callback());
  while (e.has_work()) {
    e.step();
    ASSERT_EQ(e.check_invariants(), "");
  }
  EXPECT_EQ(rec.outputs.at(id).samples.at(0).tokens, want);
  EXPECT_EQ(rec.outputs.at(id).stats.preemptions, 0);
  // The eager kernel widens the whole span into scratch billed for the pool's tokens: there the
  // context stays the pool's.
  EngineConfig eager = small_pool(5);
  eager.kernel = "eager";
  EXPECT_LT(Engine(phi, nullptr, eager).max_context(), 120);
  Engine tight(phi, nullptr, small_pool(4));
  const std::string err = submit_error(tight, 100, 20);
  EXPECT_NE(err.find("sliding window 8"), std::string::npos) << err;
}

}  // namespace
}  // namespace kvcache
