// Speculative decoding in the continuous-batching engine (EngineConfig::spec_k, prompt lookup):
// greedy tokens equal plain decoding's for concurrent requests (drafts accepted and rejected,
// so crop runs), with the prefix cache, quantized pages, preemption, stop ids and logprobs;
// sampling is valid and deterministic for a seed; what cannot roll back is refused.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "scratch_dir.h"
#include "shared_data.h"

namespace kvcache {
namespace {

// stories260K: a trained model retells a story it was told, so prompt lookup's drafts are
// accepted for a while and then rejected where it departs from the story.
const Model& stories() {
  static const LoadedModel m = load_model(testing_util::stories_model());
  return *m.model;
}

// The golden story's prompt "Once upon a time" and its first 60 greedy ids
// (../shared/golden/stories260K/once_upon_a_time.ids).
const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378};
const std::vector<int32_t> kStory = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
                                     401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282,
                                     295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352,
                                     266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312, 432,
                                     398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};

std::vector<int32_t> random_tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(rng() % 500) + 3);
  return p;
}

// Prompts of several kinds: the story told three times then its prompt again (retold, then
// departed from), the story cut short and restarted (lookup continues it), the bare prompt,
// random prompts, and one sharing the first's prefix.
std::vector<std::vector<int32_t>> spec_prompts() {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> told;
  for (int i = 0; i < 3; ++i) {
    told.insert(told.end(), kPrompt.begin(), kPrompt.end());
    told.insert(told.end(), kStory.begin(), kStory.end());
  }
  told.insert(told.end(), kPrompt.begin(), kPrompt.end());
  out.push_back(told);
  std::vector<int32_t> cut = kPrompt;
  cut.insert(cut.end(), kStory.begin(), kStory.begin() + 40);
  cut.insert(cut.end(), kPrompt.begin(), kPrompt.end());
  cut.insert(cut.end(), kStory.begin(), kStory.begin() + 12);
  out.push_back(cut);
  out.push_back(kPrompt);
  for (uint32_t s = 10; s < 13; ++s) {
    std::vector<int32_t> p = {1};
    const std::vector<int32_t> t = random_tokens(3 + static_cast<int>(s % 7) * 4, s);
    p.insert(p.end(), t.begin(), t.end());
    out.push_back(p);
  }
  std::vector<int32_t> shared = told;
  shared.resize(70);
  out.push_back(shared);
  return out;
}

RequestParams greedy(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  RequestParams rp;
  rp.prompt = prompt;
  rp.max_tokens = max_tokens;
  return rp;
}

std::vector<RequestOutput> run_all(Engine& e, const std::vector<RequestParams>& reqs) {
  std::vector<RequestOutput> outs(reqs.size());
  std::map<uint64_t, size_t> slot;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const uint64_t id = e.submit(reqs[i], [&outs, &slot](const StreamEvent& ev) {
      if (ev.output != nullptr) outs[slot.at(ev.id)] = *ev.output;
    });
    EXPECT_NE(id, 0u);
    slot[id] = i;
  }
  while (e.has_work()) {
    e.step();
    const std::string inv = e.check_invariants();
    EXPECT_EQ(inv, "");
    if (!inv.empty()) break;
  }
  return outs;
}

EngineConfig config(int64_t spec_k, int64_t block_tokens = 16) {
  EngineConfig c;
  c.cache.max_cache_len = 2048;
  c.cache.paged.block_tokens = block_tokens;
  c.max_tokens_per_step = 64;
  c.spec_k = spec_k;
  c.check_invariants_every_step = true;
  return c;
}

// Spec on vs off over the same requests: the same tokens (and reasons, and logprobs), drafts
// both accepted and rejected.
void expect_same_as_plain(const EngineConfig& spec, const EngineConfig& plain,
                          const std::vector<RequestParams>& reqs) {
  KVCACHE_REQUIRE_STORIES();
  const Model& model = stories();
  Engine a(model, nullptr, plain), b(model, nullptr, spec);
  const std::vector<RequestOutput> want = run_all(a, reqs);
  const std::vector<RequestOutput> got = run_all(b, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(got[i].samples.size(), want[i].samples.size());
    for (size_t j = 0; j < want[i].samples.size(); ++j) {
      EXPECT_EQ(got[i].samples[j].tokens, want[i].samples[j].tokens) << "request " << i;
      EXPECT_EQ(got[i].samples[j].reason, want[i].samples[j].reason) << "request " << i;
      ASSERT_EQ(got[i].samples[j].logprobs.size(), want[i].samples[j].logprobs.size());
      for (size_t t = 0; t < want[i].samples[j].logprobs.size(); ++t)
        EXPECT_EQ(got[i].samples[j].logprobs[t].chosen.logprob,
                  want[i].samples[j].logprobs[t].chosen.logprob);
    }
    EXPECT_TRUE(got[i].stats.speculative);
    EXPECT_FALSE(want[i].stats.speculative);
    EXPECT_EQ(want[i].stats.spec_drafted, 0);
  }
  const EngineMetrics m = b.metrics();
  EXPECT_GT(m.spec_accepted, 0);               // drafts were accepted ...
  EXPECT_LT(m.spec_accepted, m.spec_drafted);  // ... and rejected: crop rolled them back
  EXPECT_EQ(m.blocks_used, 0);
  int64_t drafted = 0, accepted = 0;
  for (const RequestOutput& o : got) {
    drafted += o.stats.spec_drafted;
    accepted += o.stats.spec_accepted;
  }
  EXPECT_EQ(drafted, m.spec_drafted);
  EXPECT_EQ(accepted, m.spec_accepted);
}

TEST(EngineSpec, GreedyConcurrentRequestsEqualPlainDecoding) {
  KVCACHE_REQUIRE_STORIES();
  std::vector<RequestParams> reqs;
  const auto prompts = spec_prompts();
  for (size_t i = 0; i < prompts.size(); ++i)
    reqs.push_back(greedy(prompts[i], 30 + static_cast<int64_t>(i) * 7));
  reqs[1].logprobs = 2;  // a verified row's logits are a decode's: the same log-probabilities
  reqs[0].n = 2;         // forked samples draft and roll back on their own blocks
  expect_same_as_plain(config(4), config(0), reqs);
  EngineConfig prefill_first = config(4);  // decodes (and drafts) take what prefills leave
  prefill_first.scheduler = SchedulerPolicy::kPrefillFirst;
  prefill_first.max_tokens_per_step = 40;
  expect_same_as_plain(prefill_first, config(0), reqs);
}

// 8-token blocks: the drafts' room inside the last block changes every step; k larger than it.
TEST(EngineSpec, SmallBlocksAndLargeKEqualPlainDecoding) {
  KVCACHE_REQUIRE_STORIES();
  std::vector<RequestParams> reqs;
  for (const auto& p : spec_prompts()) reqs.push_back(greedy(p, 45));
  expect_same_as_plain(config(7, 8), config(0, 8), reqs);
}

// A stop id the plain run meets mid-way ends the spec run at the same token, even when it
// comes among accepted drafts; max_tokens cuts the drafts so no token past it is emitted.
TEST(EngineSpec, StopIdsAndMaxTokensEndWhereThePlainRunEnds) {
  KVCACHE_REQUIRE_STORIES();
  const Model& model = stories();
  const auto prompts = spec_prompts();
  std::vector<RequestParams> reqs;
  for (const auto& p : prompts) reqs.push_back(greedy(p, 40));
  Engine plain(model, nullptr, config(0));
  const std::vector<RequestOutput> first = run_all(plain, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].stop_ids = {first[i].samples[0].tokens.at(20 + i)};
    reqs[i].max_tokens = 33 + static_cast<int64_t>(i);
  }
  expect_same_as_plain(config(4), config(0), reqs);
}

// The blocks a spec run completes are keyed like a plain run's: the same request again hits
// the prefix cache, and a prompt that continues the first answer hits its generated blocks.
TEST(EngineSpec, PrefixCacheHitsGiveTheSameTokens) {
  KVCACHE_REQUIRE_STORIES();
  const Model& model = stories();
  const RequestParams rp = greedy(spec_prompts()[0], 48);
  Engine e(model, nullptr, config(4));
  const RequestOutput once = run_all(e, {rp})[0];
  // Alone, each accepted draft saves one forward of plain decoding.
  const int64_t spec_forwards = e.metrics().forwards;
  Engine alone(model, nullptr, config(0));
  EXPECT_EQ(run_all(alone, {rp})[0].samples[0].tokens, once.samples[0].tokens);
  EXPECT_EQ(spec_forwards + once.stats.spec_accepted, alone.metrics().forwards);
  const RequestOutput again = run_all(e, {rp})[0];
  EXPECT_EQ(again.samples[0].tokens, once.samples[0].tokens);
  const auto full = [](size_t tokens) { return static_cast<int64_t>((tokens - 1) / 16 * 16); };
  EXPECT_GE(again.stats.cached_tokens, full(rp.prompt.size()));  // the prompt's full blocks
  EXPECT_GT(once.stats.spec_accepted, 0);
  RequestParams more = rp;
  more.prompt.insert(more.prompt.end(), once.samples[0].tokens.begin(),
                     once.samples[0].tokens.end());
  more.max_tokens = 20;
  const RequestOutput cont = run_all(e, {more})[0];
  // The first answer's blocks (all but its last token computed) were keyed too.
  EXPECT_GE(cont.stats.cached_tokens, full(more.prompt.size()));
  EXPECT_GT(full(more.prompt.size()), full(rp.prompt.size()));
  Engine plain(model, nullptr, config(0));
  EXPECT_EQ(cont.samples[0].tokens, run_all(plain, {more})[0].samples[0].tokens);
}

TEST(EngineSpec, QuantizedPagesEqualPlainDecoding) {
  KVCACHE_REQUIRE_STORIES();
  EngineConfig spec = config(4), plain = config(0);
  for (EngineConfig* c : {&spec, &plain})
    c->cache.paged.quant = PagedQuantFormat{KVQuantScheme::kKivi, 4};
  std::vector<RequestParams> reqs;
  for (const auto& p : spec_prompts()) reqs.push_back(greedy(p, 40));
  expect_same_as_plain(spec, plain, reqs);
}

TEST(EngineSpec, PreemptionUnderATinyBlockBudgetEqualsPlainDecoding) {
  KVCACHE_REQUIRE_STORIES();
  std::vector<RequestParams> reqs;
  for (int r = 0; r < 3; ++r)
    for (const auto& p : spec_prompts()) reqs.push_back(greedy(p, 30));
  EngineConfig spec = config(4, 4), plain = config(0, 4);
  for (EngineConfig* c : {&spec, &plain}) {
    c->num_blocks = 60;
    c->check_invariants_every_step = true;
  }
  const Model& model = stories();
  Engine probe(model, nullptr, spec);
  run_all(probe, reqs);
  EXPECT_GT(probe.metrics().preemptions, 0);
  expect_same_as_plain(spec, plain, reqs);
}

// Sampling: every token follows the sampler's distribution (the rejection rule; its statistics
// are tested in speculative_test.cc); here, the engine's run is valid and a seed repeats it.
TEST(EngineSpec, SamplingIsValidAndDeterministicForASeed) {
  KVCACHE_REQUIRE_STORIES();
  const Model& model = stories();
  std::vector<RequestParams> reqs;
  for (const auto& p : spec_prompts()) {
    RequestParams rp = greedy(p, 40);
    rp.sampler.temperature = 0.7f;
    rp.sampler.top_k = 5;
    rp.sampler.seed = 11;
    rp.n = 2;
    reqs.push_back(rp);
  }
  Engine a(model, nullptr, config(4)), b(model, nullptr, config(4));
  const std::vector<RequestOutput> x = run_all(a, reqs), y = run_all(b, reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    for (size_t j = 0; j < 2; ++j) {
      EXPECT_EQ(x[i].samples[j].tokens, y[i].samples[j].tokens);
      EXPECT_EQ(static_cast<int64_t>(x[i].samples[j].tokens.size()), 40);
      for (int32_t t : x[i].samples[j].tokens) EXPECT_TRUE(t >= 0 && t < 512);
    }
  EXPECT_GT(a.metrics().spec_accepted, 0);
  EXPECT_NE(x[0].samples[0].tokens, x[0].samples[1].tokens);  // seeds seed and seed + 1
}

TEST(EngineSpec, PerRequestKAndRefusals) {
  KVCACHE_REQUIRE_STORIES();
  const Model& model = stories();
  Engine e(model, nullptr, config(3));
  RequestParams off = greedy(spec_prompts()[0], 30);
  off.spec_k = 0;
  const RequestOutput o = run_all(e, {off})[0];
  EXPECT_FALSE(o.stats.speculative);
  EXPECT_EQ(o.stats.spec_drafted, 0);
  EXPECT_EQ(e.metrics().spec_drafted, 0);
  RequestParams one = off;
  one.spec_k = 1;
  const RequestOutput p = run_all(e, {one})[0];
  EXPECT_EQ(p.samples[0].tokens, o.samples[0].tokens);
  EXPECT_GT(p.stats.spec_drafted, 0);
  const auto submit_kind = [&](Engine& eng, const RequestParams& rp) {
    try {
      eng.submit(rp, nullptr);
    } catch (const Error& err) {
      return std::optional<ErrorKind>(err.kind());
    }
    return std::optional<ErrorKind>();
  };
  RequestParams big = off;
  big.spec_k = 4;  // above the engine's 3
  EXPECT_EQ(submit_kind(e, big), ErrorKind::kInvalidArgument);
  Engine plain(model, nullptr, config(0));
  EXPECT_EQ(submit_kind(plain, one), ErrorKind::kInvalidArgument);  // no --spec

  const auto start_kind = [&](const Model& m, const EngineConfig& c) {
    try {
      Engine x(m, nullptr, c);
    } catch (const Error& err) {
      return std::optional<ErrorKind>(err.kind());
    }
    return std::optional<ErrorKind>();
  };
  EngineConfig streaming = config(4);
  streaming.cache.policy = KVPolicy::parse("streaming:sink=4,window=64");
  EXPECT_EQ(start_kind(model, streaming), ErrorKind::kUnsupported);
  EXPECT_EQ(start_kind(model, config(4, 2)), ErrorKind::kInvalidArgument);  // no room in a block
  EngineConfig chunk = config(4);
  chunk.max_tokens_per_step = 4;  // k + 1 rows do not fit a step
  EXPECT_EQ(start_kind(model, chunk), ErrorKind::kInvalidArgument);
  testing_util::ScratchDir dir("spec");
  LoadOptions lo;
  lo.dummy_cache_dir = dir.file("models");
  const LoadedModel hybrid = load_model("dummy:qwen3next-tiny:f32", lo);
  EngineConfig h = config(4);
  h.cache.max_cache_len = 256;
  EXPECT_EQ(start_kind(*hybrid.model, h), ErrorKind::kUnsupported);  // linear attention
}

// Sliding-window layers (gptoss-tiny: window 8 on every other layer, with sinks): the store keeps
// the blocks a rollback of up to k tokens returns to (PagedKVStore::set_rollback_tokens), so the
// tokens equal plain decoding's while drafts are rejected and cropped. Blocks of 4 tokens make
// the window leave blocks behind at almost every step.
TEST(EngineSpec, SlidingWindowLayersEqualPlainDecoding) {
  testing_util::ScratchDir dir("spec_sliding");
  LoadOptions lo;
  lo.dummy_cache_dir = dir.file("models");
  const LoadedModel m = load_model("dummy:gptoss-tiny:f32", lo);
  EngineConfig plain = config(0, 4), spec = config(3, 4);
  plain.cache.max_cache_len = spec.cache.max_cache_len = 256;
  std::vector<RequestParams> reqs;
  // Repeated runs of ids, so that prompt lookup has something to propose.
  for (uint32_t s = 0; s < 4; ++s) {
    const std::vector<int32_t> run = random_tokens(5 + static_cast<int>(s), 40 + s);
    std::vector<int32_t> p = {2};
    for (int r = 0; r < 4; ++r) p.insert(p.end(), run.begin(), run.end());
    reqs.push_back(greedy(p, 24));
  }
  Engine a(*m.model, nullptr, plain), b(*m.model, nullptr, spec);
  EXPECT_EQ(b.store().rollback_tokens(), 3);
  const std::vector<RequestOutput> want = run_all(a, reqs);
  const std::vector<RequestOutput> got = run_all(b, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(got[i].samples.size(), 1u);
    EXPECT_EQ(got[i].samples[0].tokens, want[i].samples[0].tokens) << "request " << i;
    EXPECT_EQ(got[i].samples[0].tokens.size(), 24u);
  }
  const EngineMetrics met = b.metrics();
  EXPECT_GT(met.spec_drafted, met.spec_accepted);  // drafts were rejected: crop rolled back
  EXPECT_EQ(met.blocks_used, 0);
}

}  // namespace
}  // namespace kvcache
