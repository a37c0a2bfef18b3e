// Continuous batching engine: batched, preempted, prefix-cached and cancelled runs against the
// same requests run alone, on dummy:tiny (dummy:llama-125m is ~100x slower per token; the
// suite must stay fast — bench/bench_serve and docs/benchmarks.md use llama-125m).
#include "runtime/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <random>

#include "core/error.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "tiny_model.h"

namespace kvcache {
namespace {

using testing_util::tiny_model;

// Prompts sharing prefixes (so the prefix cache is exercised) of odd lengths.
std::vector<std::vector<int32_t>> make_prompts(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> common(37);
  for (int32_t& t : common) t = static_cast<int32_t>(rng() % 31000) + 3;
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = {1};
    if (i % 2 == 0) p.insert(p.end(), common.begin(), common.begin() + 5 + (i % 7) * 5);
    const int tail = 1 + static_cast<int>(rng() % 23);
    for (int j = 0; j < tail; ++j) p.push_back(static_cast<int32_t>(rng() % 31000) + 3);
    out.push_back(std::move(p));
  }
  return out;
}

RequestParams greedy(const std::vector<int32_t>& prompt, int64_t max_tokens) {
  RequestParams rp;
  rp.prompt = prompt;
  rp.max_tokens = max_tokens;
  return rp;
}

// Runs every request through one engine at once; returns the tokens of sample 0 by request.
struct RunResult {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<RequestOutput> outputs;
};
RunResult run_all(Engine& e, const std::vector<RequestParams>& reqs) {
  RunResult res;
  res.tokens.resize(reqs.size());
  res.outputs.resize(reqs.size());
  std::map<uint64_t, size_t> slot;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const uint64_t id = e.submit(reqs[i], [&res, &slot](const StreamEvent& ev) {
      if (ev.output != nullptr) res.outputs[slot.at(ev.id)] = *ev.output;
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
  for (size_t i = 0; i < reqs.size(); ++i) res.tokens[i] = res.outputs[i].samples.at(0).tokens;
  return res;
}

std::vector<int32_t> run_alone(const Model& model, const RequestParams& rp) {
  EngineConfig c;
  c.cache.max_cache_len = 512;
  c.max_tokens_per_step = 64;
  Engine e(model, nullptr, c);
  return run_all(e, {rp}).tokens[0];
}

EngineConfig holding(int64_t tokens) {
  EngineConfig c;
  c.cache.max_cache_len = tokens;
  return c;
}

TEST(Engine, SixtyFourConcurrentGreedyRequestsEqualEachRunAlone) {
  const Model& model = *tiny_model().model;
  const auto prompts = make_prompts(64, 7);
  std::vector<RequestParams> reqs;
  for (size_t i = 0; i < prompts.size(); ++i)
    reqs.push_back(greedy(prompts[i], 6 + static_cast<int64_t>(i % 9)));

  EngineConfig c;
  c.cache.max_cache_len = 64 * 80;
  c.max_tokens_per_step = 96;  // forces chunked prefill alongside running decodes
  Engine batched(model, nullptr, c);
  const RunResult got = run_all(batched, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(got.tokens[i], run_alone(model, reqs[i])) << "request " << i;
    EXPECT_EQ(static_cast<int64_t>(got.tokens[i].size()), reqs[i].max_tokens);
    EXPECT_EQ(got.outputs[i].samples[0].reason, FinishReason::kLength);
  }
  const EngineMetrics m = batched.metrics();
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.waiting, 0);
  EXPECT_EQ(m.blocks_used, 0);
  EXPECT_GT(m.blocks_cached, 0);
  EXPECT_GT(m.cached_prompt_tokens, 0);  // the shared prefixes were reused
  EXPECT_EQ(m.requests_finished, 64);
}

// A burst of prompts with equal uncached lengths is prefilled as one forward per step (rows at
// their own positions), and each completion still equals the prompt run alone. Two prompts of
// other lengths at the end take the one-by-one path.
TEST(Engine, EqualLengthPromptsArePrefilledInOneForwardAndEqualEachRunAlone) {
  const Model& model = *tiny_model().model;
  std::mt19937 rng(23);
  std::vector<RequestParams> reqs;
  for (int i = 0; i < 14; ++i) {
    std::vector<int32_t> p = {1};
    const int len = i < 12 ? 13 : 6 + 4 * (i - 12);
    while (static_cast<int>(p.size()) < len) p.push_back(static_cast<int32_t>(rng() % 31000) + 3);
    reqs.push_back(greedy(p, 5));
  }
  EngineConfig c;
  c.cache.max_cache_len = 14 * 32;
  c.max_tokens_per_step = 96;
  Engine e(model, nullptr, c);
  std::vector<std::vector<int32_t>> got(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i)
    e.submit(reqs[i], [&got, i](const StreamEvent& ev) {
      if (ev.output != nullptr) got[i] = ev.output->samples.at(0).tokens;
    });
  // Step 1: 7 prompts of 13 in one forward (91 tokens), then the first 5 tokens of the 8th as a
  // chunk of its own (the budget's rest).
  e.step();
  EXPECT_EQ(e.metrics().forwards, 2);
  EXPECT_EQ(e.metrics().computed_prompt_tokens, 7 * 13 + 5);
  EXPECT_EQ(e.metrics().running, 8);
  // Step 2: the 7 decodes; the 8th's last 8 tokens; the other 4 prompts of 13 in one forward;
  // the prompts of 6 and 10 tokens one by one.
  e.step();
  EXPECT_EQ(e.metrics().forwards, 2 + 5);
  EXPECT_EQ(e.metrics().computed_prompt_tokens, 12 * 13 + 6 + 10);
  while (e.has_work()) {
    e.step();
    ASSERT_EQ(e.check_invariants(), "");
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].size(), 5u) << "request " << i;
    ASSERT_EQ(got[i], run_alone(model, reqs[i])) << "request " << i;
  }
  EXPECT_EQ(e.metrics().blocks_used, 0);
}

// A burst sharing a system prompt keeps the prefix hits of one-by-one admission: the batch stops
// at a member whose first block an earlier member is about to write.
TEST(Engine, EqualLengthPromptsSharingABlockStillHitThePrefixCache) {
  const Model& model = *tiny_model().model;
  std::mt19937 rng(29);
  std::vector<int32_t> common = {1};
  while (common.size() < 32) common.push_back(static_cast<int32_t>(rng() % 31000) + 3);
  std::vector<RequestParams> reqs;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> p = common;
    while (p.size() < 40) p.push_back(static_cast<int32_t>(rng() % 31000) + 3);
    reqs.push_back(greedy(p, 3));
  }
  EngineConfig c;
  c.cache.max_cache_len = 512;  // blocks of 16: the common 32 tokens are two full blocks
  c.max_tokens_per_step = 256;
  Engine e(model, nullptr, c);
  const RunResult got = run_all(e, reqs);
  EXPECT_EQ(e.metrics().cached_prompt_tokens, 3 * 32);
  for (size_t i = 0; i < reqs.size(); ++i)
    ASSERT_EQ(got.tokens[i], run_alone(model, reqs[i])) << "request " << i;
}

// cache_salt: a tenant's prefix serves only requests of the same salt (an unsalted request is a
// tenant of its own), and the answers never change.
TEST(Engine, CacheSaltKeepsTenantsPrefixesApart) {
  const Model& model = *tiny_model().model;
  std::mt19937 rng(37);
  std::vector<int32_t> p = {1};
  while (p.size() < 50) p.push_back(static_cast<int32_t>(rng() % 31000) + 3);
  EngineConfig c;
  c.cache.max_cache_len = 512;
  c.max_tokens_per_step = 256;
  Engine e(model, nullptr, c);
  const std::vector<int32_t> alone = run_alone(model, greedy(p, 3));
  const auto run = [&](const std::string& salt) {
    RequestParams rp = greedy(p, 3);
    rp.cache_salt = salt;
    const RunResult got = run_all(e, {rp});
    EXPECT_EQ(got.tokens[0], alone) << "salt '" << salt << "'";
    return got.outputs[0].stats.cached_tokens;
  };
  EXPECT_EQ(run("tenant-a"), 0);
  EXPECT_EQ(run("tenant-b"), 0);   // the same prompt, another tenant: no hit
  EXPECT_EQ(run(""), 0);           // unsalted: not tenant-a's either
  EXPECT_EQ(run("tenant-a"), 49);  // its own prefix: everything but the last token
  EXPECT_EQ(run("tenant-b"), 49);
  EXPECT_EQ(run(""), 49);
  RequestParams too_long = greedy(p, 1);
  too_long.cache_salt = std::string(Engine::kMaxCacheSalt + 1, 's');
  EXPECT_THROW(e.submit(too_long, [](const StreamEvent&) {}), Error);
}

TEST(Engine, APrefixEndingInsideABlockIsReusedWhole) {
  const Model& model = *tiny_model().model;
  std::mt19937 rng(31);
  std::vector<int32_t> a = {1};
  while (a.size() < 50) a.push_back(static_cast<int32_t>(rng() % 31000) + 3);  // 3 full blocks
  std::vector<int32_t> b(a.begin(), a.begin() + 37);  // 2 full blocks of 16 and 5 more tokens
  while (b.size() < 45) b.push_back(static_cast<int32_t>(rng() % 31000) + 3);
  EngineConfig c;
  c.cache.max_cache_len = 512;
  c.max_tokens_per_step = 256;
  Engine e(model, nullptr, c);
  ASSERT_EQ(run_all(e, {greedy(a, 2)}).tokens[0], run_alone(model, greedy(a, 2)));
  const RunResult got = run_all(e, {greedy(b, 3)});
  // All 37 shared tokens: two blocks shared, the 5 tokens of the third copied from a's third
  // block (keyed once full; a partial last block is never keyed, so it could not serve).
  EXPECT_EQ(e.metrics().cached_prompt_tokens, 37);
  EXPECT_EQ(got.tokens[0], run_alone(model, greedy(b, 3)));
}

TEST(Engine, TheNextTurnOfAConversationReusesEverythingComputed) {
  const Model& model = *tiny_model().model;
  std::mt19937 rng(37);
  std::vector<int32_t> a = {1};
  while (a.size() < 40) a.push_back(static_cast<int32_t>(rng() % 31000) + 3);
  EngineConfig c;
  c.cache.max_cache_len = 512;
  c.max_tokens_per_step = 256;
  Engine e(model, nullptr, c);
  const std::vector<int32_t> out = run_all(e, {greedy(a, 3)}).tokens[0];
  ASSERT_EQ(out.size(), 3u);
  // The next turn: the prompt, the answer, a new message. Computed so far: the prompt and the
  // first two answer tokens (the last sampled one was never fed): 42 = 2 full blocks of 16 and
  // a partial block of 10 kept when the request finished.
  std::vector<int32_t> b = a;
  b.insert(b.end(), out.begin(), out.end());
  for (int i = 0; i < 5; ++i) b.push_back(static_cast<int32_t>(rng() % 31000) + 3);
  const int64_t before = e.metrics().cached_prompt_tokens;
  const RunResult got = run_all(e, {greedy(b, 2)});
  EXPECT_EQ(e.metrics().cached_prompt_tokens - before, 42);
  EXPECT_EQ(got.tokens[0], run_alone(model, greedy(b, 2)));
}

TEST(Engine, PreemptionUnderATinyBlockBudgetChangesNothing) {
  const Model& model = *tiny_model().model;
  const auto prompts = make_prompts(24, 11);
  std::vector<RequestParams> reqs;
  for (const auto& p : prompts) reqs.push_back(greedy(p, 12));
  for (size_t i = 1; i < reqs.size(); i += 2) reqs[i].prompt_logprobs = 1;  // scored: recomputed

  EngineConfig c;
  c.cache.paged.block_tokens = 4;
  c.num_blocks = 40;  // 160 token slots for 24 requests of up to ~60 tokens
  c.max_tokens_per_step = 64;
  Engine e(model, nullptr, c);
  const RunResult got = run_all(e, reqs);
  const EngineMetrics m = e.metrics();
  EXPECT_GT(m.preemptions, 0);
  int64_t scored_preempted = 0;
  Engine alone(model, nullptr, holding(512));
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(got.tokens[i], run_alone(model, reqs[i])) << "request " << i;
    if (reqs[i].prompt_logprobs < 0) continue;
    scored_preempted += got.outputs[i].stats.preemptions;
    // A scored prompt recomputed after preemption reports what it reports run alone.
    const RequestOutput ref = run_all(alone, {reqs[i]}).outputs[0];
    ASSERT_EQ(got.outputs[i].prompt_logprobs.size(), reqs[i].prompt.size() - 1);
    for (size_t j = 0; j < ref.prompt_logprobs.size(); ++j) {
      ASSERT_EQ(got.outputs[i].prompt_logprobs[j].chosen.logprob,
                ref.prompt_logprobs[j].chosen.logprob)
          << "request " << i << ", prompt token " << j + 1;
    }
  }
  EXPECT_GT(scored_preempted, 0);
  EXPECT_EQ(e.check_invariants(), "");
  EXPECT_EQ(m.blocks_used, 0);
  EXPECT_EQ(m.blocks_free + m.blocks_cached, m.blocks_total);
}

TEST(Engine, CancellationFreesBlocksAndOthersAreUnaffected) {
  const Model& model = *tiny_model().model;
  const auto prompts = make_prompts(16, 5);
  EngineConfig c;
  c.cache.paged.block_tokens = 4;
  c.num_blocks = 48;
  c.max_tokens_per_step = 48;
  Engine e(model, nullptr, c);
  std::vector<uint64_t> ids(prompts.size());
  std::vector<RequestOutput> outs(prompts.size());
  std::map<uint64_t, size_t> slot;
  std::vector<int> tokens_seen(prompts.size(), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids[i] = e.submit(greedy(prompts[i], 20), [&, i](const StreamEvent& ev) {
      if (ev.token >= 0) ++tokens_seen[i];
      if (ev.output != nullptr) outs[i] = *ev.output;
    });
    slot[ids[i]] = i;
  }
  for (int s = 0; s < 6; ++s) e.step();
  for (size_t i = 0; i < prompts.size(); i += 3) e.cancel(ids[i]);
  e.step();  // cancellations apply at the start of a step
  for (size_t i = 0; i < prompts.size(); i += 3)
    EXPECT_EQ(outs[i].samples.at(0).reason, FinishReason::kCancelled);
  EXPECT_EQ(e.check_invariants(), "");
  e.run_until_idle();
  EXPECT_EQ(e.check_invariants(), "");
  const EngineMetrics m = e.metrics();
  EXPECT_EQ(m.blocks_used, 0);
  EXPECT_GT(m.preemptions, 0);
  EXPECT_EQ(m.requests_cancelled, 6);
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (i % 3 == 0) continue;
    EXPECT_EQ(outs[i].samples[0].tokens, run_alone(model, greedy(prompts[i], 20)))
        << "request " << i;
    EXPECT_EQ(tokens_seen[i], 20);
  }
}

TEST(Engine, ParallelSamplesForkAndFollowTheirSeeds) {
  const Model& model = *tiny_model().model;
  RequestParams rp = greedy(make_prompts(1, 3)[0], 10);
  rp.n = 3;
  rp.sampler.temperature = 1.0f;
  rp.sampler.top_k = 40;
  rp.sampler.seed = 100;
  EngineConfig c;
  c.cache.max_cache_len = 512;
  Engine e(model, nullptr, c);
  const RunResult got = run_all(e, {rp});
  const RequestOutput& out = got.outputs[0];
  ASSERT_EQ(out.samples.size(), 3u);
  // Sample i equals a single-sample request seeded seed + i.
  for (int i = 0; i < 3; ++i) {
    RequestParams one = rp;
    one.n = 1;
    one.sampler.seed = 100 + static_cast<uint64_t>(i);
    EXPECT_EQ(out.samples[static_cast<size_t>(i)].tokens, run_alone(model, one)) << "sample " << i;
  }
  EXPECT_NE(out.samples[0].tokens, out.samples[1].tokens);
  EXPECT_EQ(e.check_invariants(), "");
  EXPECT_EQ(e.metrics().blocks_used, 0);
}

TEST(Engine, StopIdsMaxTokensAndValidation) {
  const Model& model = *tiny_model().model;
  Engine e(model, nullptr, holding(256));
  const std::vector<int32_t> prompt = make_prompts(1, 9)[0];
  const std::vector<int32_t> free_run = run_alone(model, greedy(prompt, 8));
  RequestParams rp = greedy(prompt, 8);
  rp.stop_ids = {free_run[3]};
  const RunResult got = run_all(e, {rp});
  const auto first = std::find(free_run.begin(), free_run.end(), free_run[3]);
  EXPECT_EQ(got.tokens[0], std::vector<int32_t>(free_run.begin(), first));
  EXPECT_EQ(got.outputs[0].samples[0].reason, FinishReason::kStop);

  EXPECT_THROW(e.submit(greedy({}, 4), {}), Error);
  EXPECT_THROW(e.submit(greedy({1, 999999}, 4), {}), Error);
  EXPECT_THROW(e.submit(greedy(std::vector<int32_t>(250, 5), 10), {}), Error);  // beyond 256
  RequestParams stop_text = greedy(prompt, 4);
  stop_text.stop_strings = {"x"};
  EXPECT_THROW(e.submit(stop_text, {}), Error);  // no tokenizer
}

TEST(Engine, LogprobsAreTheModelsLogSoftmaxOfEachSampledToken) {
  const Model& model = *tiny_model().model;
  Engine e(model, nullptr, holding(256));
  const std::vector<int32_t> prompt = make_prompts(1, 11)[0];
  RequestParams rp = greedy(prompt, 6);
  rp.logprobs = 3;
  size_t streamed = 0;
  RequestOutput out;
  ASSERT_NE(e.submit(rp,
                     [&](const StreamEvent& ev) {
                       streamed += ev.logprob.has_value();
                       if (ev.output != nullptr) out = *ev.output;
                     }),
            0u);
  e.run_until_idle();
  const SampleOutput& s = out.samples.at(0);
  ASSERT_EQ(s.tokens.size(), 6u);
  ASSERT_EQ(s.logprobs.size(), s.tokens.size());
  EXPECT_EQ(streamed, s.tokens.size());
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const TokenLogprob& t = s.logprobs[i];
    EXPECT_EQ(t.chosen.token, s.tokens[i]);
    EXPECT_EQ(t.chosen.piece, "token_id:" + std::to_string(s.tokens[i]));  // no tokenizer
    ASSERT_EQ(t.top.size(), 3u);
    EXPECT_EQ(t.top[0].token, s.tokens[i]);  // greedy takes the most likely
    EXPECT_EQ(t.top[0].logprob, t.chosen.logprob);
    EXPECT_GE(t.top[0].logprob, t.top[1].logprob);
    EXPECT_GE(t.top[1].logprob, t.top[2].logprob);
    EXPECT_LT(t.chosen.logprob, 0.0f);
  }
  // The first token's log-probability from the prompt's logits through a plain session.
  Session session(model, SessionConfig{});
  const std::span<const float> l = session.prefill(prompt);
  const float m = *std::max_element(l.begin(), l.end());
  double sum = 0;
  for (const float x : l) sum += std::exp(static_cast<double>(x) - m);
  const double expect = l[static_cast<size_t>(s.tokens[0])] - (m + std::log(sum));
  EXPECT_NEAR(s.logprobs[0].chosen.logprob, expect, 1e-4);
  // Without the request, none.
  EXPECT_TRUE(run_all(e, {greedy(prompt, 2)}).outputs[0].samples[0].logprobs.empty());
  rp.logprobs = kMaxTopLogprobs + 1;
  EXPECT_THROW(e.submit(rp, {}), Error);
}

// OpenAI's echo with logprobs (how evaluation harnesses score a text): every prompt token
// after the first, against a plain session's logits of the whole prompt; computed even when
// the prompt's blocks are cached (cached positions have no logits), across prefill chunks and
// beside other requests; max_tokens 0 samples nothing.
TEST(Engine, PromptLogprobsScoreEveryPromptTokenEvenWhenCached) {
  const Model& model = *tiny_model().model;
  EngineConfig cfg = holding(512);
  cfg.max_tokens_per_step = 16;  // 70 prompt tokens: five chunks
  Engine e(model, nullptr, cfg);
  std::vector<int32_t> prompt = make_prompts(1, 13)[0];
  std::mt19937 rng(5);
  while (prompt.size() < 70) prompt.push_back(static_cast<int32_t>(rng() % 31000) + 3);

  Session session(model, SessionConfig{});
  const std::span<const float> all = session.forward_all(prompt);
  const auto V = static_cast<size_t>(model.config().vocab_size);
  const auto expect = [&](size_t i) {  // log_softmax(row i)[prompt[i + 1]]
    const std::span<const float> l = all.subspan(i * V, V);
    const float m = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (const float x : l) sum += std::exp(static_cast<double>(x) - m);
    return l[static_cast<size_t>(prompt[i + 1])] - (m + std::log(sum));
  };

  RequestParams warm = greedy(prompt, 1);  // leaves the prompt's full blocks in the index
  RequestParams scored = greedy(prompt, 0);
  scored.prompt_logprobs = 2;
  RequestParams other = greedy(make_prompts(2, 17)[1], 5);
  run_all(e, {warm});
  const RunResult got = run_all(e, {scored, other});
  const RequestOutput& out = got.outputs[0];
  ASSERT_EQ(out.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 0; i + 1 < prompt.size(); ++i) {
    const TokenLogprob& t = out.prompt_logprobs[i];
    EXPECT_EQ(t.chosen.token, prompt[i + 1]) << i;
    EXPECT_NEAR(t.chosen.logprob, expect(i), 1e-4) << i;
    ASSERT_EQ(t.top.size(), 2u);
    EXPECT_GE(t.top[0].logprob, t.chosen.logprob);
  }
  EXPECT_EQ(out.stats.cached_tokens, 0);  // scored whole, although cached
  EXPECT_TRUE(out.samples.at(0).tokens.empty());
  EXPECT_EQ(out.samples[0].reason, FinishReason::kLength);
  EXPECT_EQ(got.tokens[1], run_alone(model, other));  // its neighbour is unaffected

  // With a sample: the prompt's scores, then the generated token, which equals a plain run's.
  scored.max_tokens = 3;
  scored.n = 2;
  const RequestOutput two = run_all(e, {scored}).outputs[0];
  ASSERT_EQ(two.prompt_logprobs.size(), prompt.size() - 1);
  EXPECT_EQ(two.prompt_logprobs.back().chosen.logprob, out.prompt_logprobs.back().chosen.logprob);
  EXPECT_EQ(two.samples.at(0).tokens, run_alone(model, greedy(prompt, 3)));
  EXPECT_EQ(two.samples.at(1).tokens, two.samples[0].tokens);  // greedy: the fork agrees
  EXPECT_TRUE(run_all(e, {greedy(prompt, 2)}).outputs[0].prompt_logprobs.empty());  // not asked

  scored.prompt_logprobs = kMaxTopLogprobs + 1;
  EXPECT_THROW(e.submit(scored, {}), Error);
  EXPECT_THROW(e.submit(greedy(prompt, -1), {}), Error);
  EXPECT_EQ(e.metrics().blocks_used, 0);
}

TEST(Engine, BoundedQueueRefuses) {
  const Model& model = *tiny_model().model;
  EngineConfig c;
  c.cache.max_cache_len = 256;
  c.max_waiting = 2;
  Engine e(model, nullptr, c);
  EXPECT_NE(e.submit(greedy({1, 5, 6}, 2), {}), 0u);
  EXPECT_NE(e.submit(greedy({1, 5, 7}, 2), {}), 0u);
  EXPECT_EQ(e.submit(greedy({1, 5, 8}, 2), {}), 0u);
  e.run_until_idle();
  EXPECT_NE(e.submit(greedy({1, 5, 8}, 2), {}), 0u);
  e.run_until_idle();
  EXPECT_EQ(e.metrics().requests_finished, 3);
}

}  // namespace
}  // namespace kvcache
