// Failures inside the engine stay contained: a forward that throws (a kernel that cannot read
// its span, an allocation), a detokenizer that throws for one row of a decode batch. Each case
// checks that the failed requests end with kError and a message naming the cause, that every
// other request produces exactly what it produces in a clean run, that the engine's invariants
// hold after every step, and that no KV block leaks. Faults are injected at the named points of
// core/fault.h, where production code would fail.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <new>
#include <random>

#include "core/error.h"
#include "core/fault.h"
#include "model/tokenizer.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "tiny_model.h"

namespace kvcache {
namespace {

using testing_util::tiny_model;

RequestParams greedy(std::vector<int32_t> prompt, int64_t max_tokens) {
  RequestParams rp;
  rp.prompt = std::move(prompt);
  rp.max_tokens = max_tokens;
  return rp;
}

std::vector<std::vector<int32_t>> prompts(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int32_t>> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> p = {1};
    const int len = 9 + static_cast<int>(rng() % 29);
    while (static_cast<int>(p.size()) < len) p.push_back(static_cast<int32_t>(rng() % 31000) + 3);
    out.push_back(std::move(p));
  }
  return out;
}

EngineConfig small_engine() {
  EngineConfig c;
  c.cache.max_cache_len = 1024;
  c.max_tokens_per_step = 48;
  return c;
}

// Collects every request's output; steps checking the invariants after each step.
struct Harness {
  explicit Harness(Engine& e) : engine(e) {}
  Engine& engine;
  std::map<uint64_t, RequestOutput> outputs;
  uint64_t submit(const RequestParams& rp) {
    const uint64_t id = engine.submit(rp, [this](const StreamEvent& ev) {
      if (ev.output != nullptr) outputs[ev.id] = *ev.output;
    });
    EXPECT_NE(id, 0u);
    return id;
  }
  void step_checked() {
    engine.step();
    ASSERT_EQ(engine.check_invariants(), "");
  }
  void run() {
    while (engine.has_work()) {
      step_checked();
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
};

std::vector<int32_t> clean_run(const RequestParams& rp, const Tokenizer* tok = nullptr) {
  Engine e(*tiny_model().model, tok, small_engine());
  Harness h(e);
  const uint64_t id = h.submit(rp);
  h.run();
  return h.outputs.at(id).samples.at(0).tokens;
}

void expect_no_block_held(const Engine& e) {
  const EngineMetrics m = e.metrics();
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.waiting, 0);
  EXPECT_EQ(m.blocks_used, 0) << "blocks leaked";
}

TEST(EngineFailure, AKernelThatCannotReadTheSpanFailsItsForwardOnly) {
  const auto ps = prompts(6, 3);
  Engine e(*tiny_model().model, nullptr, small_engine());
  Harness h(e);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(h.submit(greedy(ps[static_cast<size_t>(i)], 8)));
  // Step until all three decode together, then the next forward's first attention call throws.
  for (int i = 0; i < 6 && e.metrics().running < 3; ++i) h.step_checked();
  ASSERT_EQ(e.metrics().running, 3);
  {
    fault::Scoped f("paged_attention", [] {
      throw Error(ErrorKind::kUnsupported,
                  "paged_attention: this kernel cannot read the span (injected)");
    });
    h.step_checked();
    EXPECT_EQ(f.fired(), 1);
  }
  for (const uint64_t id : ids) {
    ASSERT_EQ(h.outputs.count(id), 1u) << "a failed request must be answered at once";
    const RequestOutput& out = h.outputs.at(id);
    EXPECT_EQ(out.samples[0].reason, FinishReason::kError);
    EXPECT_EQ(out.error_kind, RequestErrorKind::kEngine);
    EXPECT_NE(out.error.find("cannot read the span"), std::string::npos) << out.error;
  }
  EngineMetrics m = e.metrics();
  EXPECT_EQ(m.failed_forwards, 1);
  EXPECT_EQ(m.consecutive_failed_forwards, 1);
  EXPECT_NE(m.last_error.find("cannot read the span"), std::string::npos);
  expect_no_block_held(e);

  // The engine goes on: the same prompts (their prefix blocks cached before the failure) and
  // new ones give exactly a clean run's tokens.
  std::vector<uint64_t> again;
  for (int i = 0; i < 6; ++i) again.push_back(h.submit(greedy(ps[static_cast<size_t>(i)], 8)));
  h.run();
  for (int i = 0; i < 6; ++i) {
    const RequestOutput& out = h.outputs.at(again[static_cast<size_t>(i)]);
    EXPECT_EQ(out.samples[0].reason, FinishReason::kLength);
    EXPECT_EQ(out.samples[0].tokens, clean_run(greedy(ps[static_cast<size_t>(i)], 8)))
        << "prompt " << i;
  }
  m = e.metrics();
  EXPECT_EQ(m.consecutive_failed_forwards, 0);
  EXPECT_EQ(m.failed_forwards, 1);
  expect_no_block_held(e);
}

// A failure after some layers wrote their K/V: abort_step must give back the step's blocks and
// leave no half-written block in the prefix index (a later hit would read garbage).
TEST(EngineFailure, AnAllocationFailingMidForwardLeavesNoHalfWrittenBlock) {
  const auto ps = prompts(4, 11);
  Engine e(*tiny_model().model, nullptr, small_engine());
  Harness h(e);
  const uint64_t victim = h.submit(greedy(ps[0], 5));
  {
    // dummy:tiny has two layers: layer 0 writes the prompt's K/V, layer 1 fails.
    fault::Scoped f(
        "paged_store.write", [] { throw std::bad_alloc(); }, /*skip=*/1);
    h.step_checked();
    EXPECT_EQ(f.fired(), 1);
  }
  ASSERT_EQ(h.outputs.count(victim), 1u);
  EXPECT_EQ(h.outputs.at(victim).samples[0].reason, FinishReason::kError);
  EXPECT_NE(h.outputs.at(victim).error.find("out of memory"), std::string::npos)
      << h.outputs.at(victim).error;
  expect_no_block_held(e);
  EXPECT_EQ(e.metrics().blocks_cached, 0) << "a block of the failed step entered the prefix index";

  std::vector<uint64_t> ids;
  for (const auto& p : ps) ids.push_back(h.submit(greedy(p, 5)));
  h.run();
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_EQ(h.outputs.at(ids[i]).samples[0].tokens, clean_run(greedy(ps[i], 5)))
        << "prompt " << i;
  expect_no_block_held(e);
}

TEST(EngineFailure, ATokenizerErrorInTheMiddleOfABatchFailsThatRequestOnly) {
  const std::string vocab = KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf";
  if (!std::filesystem::exists(vocab)) GTEST_SKIP() << "needs " << vocab;
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(vocab);
  const auto ps = prompts(3, 5);
  Engine e(*tiny_model().model, tok.get(), small_engine());
  Harness h(e);
  std::vector<uint64_t> ids;
  for (const auto& p : ps) ids.push_back(h.submit(greedy(p, 6)));
  for (int i = 0; i < 6 && e.metrics().running < 3; ++i) h.step_checked();
  ASSERT_EQ(e.metrics().running, 3);
  {
    // The decode batch's second row fails to detokenize.
    fault::Scoped f(
        "engine.detokenize",
        [] { throw Error(ErrorKind::kInvalidArgument, "token text (injected)"); },
        /*skip=*/1);
    h.step_checked();
    EXPECT_EQ(f.fired(), 1);
  }
  h.run();
  int failed = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const RequestOutput& out = h.outputs.at(ids[i]);
    if (out.samples[0].reason == FinishReason::kError) {
      ++failed;
      EXPECT_NE(out.error.find("detokeniz"), std::string::npos) << out.error;
      EXPECT_EQ(out.error_kind, RequestErrorKind::kEngine);
      continue;
    }
    EXPECT_EQ(out.samples[0].tokens, clean_run(greedy(ps[i], 6), tok.get())) << "request " << i;
  }
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(e.metrics().failed_forwards, 0);  // the forward itself went through
  expect_no_block_held(e);
}

TEST(EngineFailure, AKernelThatCannotReadPagedBlocksIsRefusedAtConstruction) {
  EngineConfig c = small_engine();
  c.kernel = "flex";
  try {
    Engine e(*tiny_model().model, nullptr, c);
    FAIL() << "an engine with a dense-only kernel was built";
  } catch (const Error& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("'flex'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("eager, fused"), std::string::npos) << msg;
  }
}

// Requests that finish inside their admission chunk (max_tokens 1) left the queue twice, so
// after a few of them the queue limit no longer held; they also reported no cached tokens.
TEST(EngineFailure, TheQueueLimitHoldsAfterManyOneTokenRequests) {
  EngineConfig c = small_engine();
  c.max_waiting = 2;
  Engine e(*tiny_model().model, nullptr, c);
  Harness h(e);
  const auto ps = prompts(1, 17);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 30; ++i) {
    ids.push_back(h.submit(greedy(ps[0], 1)));
    h.run();
  }
  for (size_t i = 1; i < ids.size(); ++i)
    EXPECT_GT(h.outputs.at(ids[i]).stats.cached_tokens, 0)
        << "request " << i << " found its prefix cached";
  EXPECT_NE(e.submit(greedy(ps[0], 1), {}), 0u);
  EXPECT_NE(e.submit(greedy(ps[0], 1), {}), 0u);
  EXPECT_EQ(e.submit(greedy(ps[0], 1), {}), 0u) << "a third queued request passed --max-waiting 2";
  e.run_until_idle();
}

TEST(EngineFailure, ForkedSamplesRespectMaxRunning) {
  EngineConfig c = small_engine();
  c.max_running = 4;
  Engine e(*tiny_model().model, nullptr, c);
  Harness h(e);
  const auto ps = prompts(3, 29);
  h.submit(greedy(ps[0], 12));
  h.submit(greedy(ps[1], 12));
  RequestParams rp = greedy(ps[2], 6);
  rp.n = 4;
  rp.sampler.temperature = 0.8f;
  rp.sampler.seed = 5;
  const uint64_t id = h.submit(rp);
  int64_t most = 0;
  while (e.has_work()) {
    h.step_checked();
    most = std::max(most, e.metrics().running);
  }
  EXPECT_LE(most, 4) << "more sequences ran than --max-running";
  const RequestOutput& out = h.outputs.at(id);
  ASSERT_EQ(out.samples.size(), 4u);
  for (const SampleOutput& s : out.samples) {
    EXPECT_EQ(s.reason, FinishReason::kLength);
    EXPECT_EQ(s.tokens.size(), 6u);
  }
  expect_no_block_held(e);
}

TEST(EngineFailure, MaxTokensNearTheLimitsOfInt64IsRefused) {
  Engine e(*tiny_model().model, nullptr, small_engine());
  for (const int64_t mt : {INT64_MAX, INT64_MAX - 3, int64_t{1} << 62, int64_t{-1}}) {
    EXPECT_THROW(e.submit(greedy({1, 5, 6}, mt), {}), Error) << mt;
  }
  EXPECT_FALSE(e.has_work());
}

}  // namespace
}  // namespace kvcache
