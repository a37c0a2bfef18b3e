// The shared remote tier (issue 41, cache/remote_tier.h) through the engine: two engines on one
// model share one store (an in-memory KvClient); the second's request of a long prompt loads
// its prefix from the tier with the tokens a run without the tier gives; tenants' salts keep
// their blocks apart; a failing or slow store changes nothing but the time, within the
// deadline. dummy:tiny, blocks of 16 tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "core/error.h"
#include "fake_kv_client.h"
#include "model/fingerprint.h"
#include "model/tokenizer.h"
#include "remote_engine_util.h"
#include "runtime/engine.h"
#include "shared_data.h"
#include "tiny_model.h"

namespace kvcache {
namespace {

using testing_util::fake_client_factory;
using testing_util::FakeKvStore;
using testing_util::tiny_model;

using testing_util::random_prompt;
using testing_util::run_one;

EngineConfig config_for(const std::shared_ptr<FakeKvStore>& store, int32_t deadline_ms = 200) {
  EngineConfig c;
  c.cache.paged.block_tokens = 16;
  c.num_blocks = 40;  // 640 token slots
  c.max_tokens_per_step = 256;
  c.check_invariants_every_step = true;
  if (store) {
    c.kv_remote_url = "fake://";
    c.kv_remote_client = fake_client_factory(store);
    c.kv_remote_deadline_ms = deadline_ms;
  }
  return c;
}

const std::vector<int32_t>& long_prompt() {  // 18 full blocks (last token excluded) + 12
  static const std::vector<int32_t> p = random_prompt(300, 41);
  return p;
}

std::vector<int32_t> reference(const std::vector<int32_t>& prompt) {
  Engine e(*tiny_model().model, nullptr, config_for(nullptr));
  return run_one(e, prompt).samples.at(0).tokens;
}

// An engine on `store` computes `prompt` and writes its blocks behind; returns its tokens.
std::vector<int32_t> prime(const std::shared_ptr<FakeKvStore>& store,
                           const std::vector<int32_t>& prompt, const std::string& salt = "") {
  Engine e(*tiny_model().model, nullptr, config_for(store));
  const RequestOutput out = run_one(e, prompt, salt);
  e.store().remote_tier()->flush();
  EXPECT_GE(e.store().remote_tier()->stats().writes_stored, 18);  // metrics(): as of the last step
  EXPECT_EQ(out.stats.cached_tokens_remote, 0);
  return out.samples.at(0).tokens;
}

TEST(RemoteEngine, ASecondEngineLoadsALongPromptFromTheTierWithTheSameTokens) {
  auto store = std::make_shared<FakeKvStore>();
  const std::vector<int32_t> want = reference(long_prompt());
  EXPECT_EQ(prime(store, long_prompt()), want);
  Engine b(*tiny_model().model, nullptr, config_for(store));
  const RequestOutput out = run_one(b, long_prompt());
  EXPECT_EQ(out.samples.at(0).tokens, want);
  EXPECT_GE(out.stats.cached_tokens_remote, 270);  // >= 90% of 300
  EXPECT_EQ(out.stats.cached_tokens_remote, 288);
  EXPECT_EQ(out.stats.cached_tokens, 288);
  const EngineMetrics m = b.metrics();
  EXPECT_TRUE(m.remote_tier);
  EXPECT_EQ(m.remote.hit_blocks, 18);
  EXPECT_EQ(m.remote.corrupt, 0);
  EXPECT_EQ(m.cached_prompt_tokens_remote, 288);
  EXPECT_EQ(m.remote_waits_expired, 0);
  // Blocks loaded from the tier are not written back; they are RAM-cached now.
  b.store().remote_tier()->flush();
  EXPECT_EQ(b.store().remote_tier()->stats().writes_stored, 0);
  const RequestOutput again = run_one(b, long_prompt());
  EXPECT_EQ(again.samples.at(0).tokens, want);
  EXPECT_EQ(again.stats.cached_tokens_remote, 0);
  EXPECT_GE(again.stats.cached_tokens, 288);
}

TEST(RemoteEngine, TenantsWithOtherSaltsGetNoHitTheSameSaltHits) {
  auto store = std::make_shared<FakeKvStore>();
  const std::vector<int32_t> want = reference(long_prompt());
  EXPECT_EQ(prime(store, long_prompt(), "tenant-a"), want);
  Engine b(*tiny_model().model, nullptr, config_for(store));
  const RequestOutput other = run_one(b, long_prompt(), "tenant-b");
  EXPECT_EQ(other.samples.at(0).tokens, want);
  EXPECT_EQ(other.stats.cached_tokens, 0);
  EXPECT_EQ(other.stats.cached_tokens_remote, 0);
  Engine c(*tiny_model().model, nullptr, config_for(store));
  const RequestOutput unsalted = run_one(c, long_prompt());
  EXPECT_EQ(unsalted.stats.cached_tokens_remote, 0);
  Engine d(*tiny_model().model, nullptr, config_for(store));
  const RequestOutput same = run_one(d, long_prompt(), "tenant-a");
  EXPECT_EQ(same.samples.at(0).tokens, want);
  EXPECT_EQ(same.stats.cached_tokens_remote, 288);
}

TEST(RemoteEngine, AFailingStoreGivesTheSameTokensWithoutAHang) {
  auto store = std::make_shared<FakeKvStore>();
  store->fail = true;
  const std::vector<int32_t> want = reference(long_prompt());
  Engine e(*tiny_model().model, nullptr, config_for(store, 20));
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t i = 0; i < 4; ++i) {
    const RequestOutput out = run_one(e, random_prompt(200, 100 + i));
    EXPECT_EQ(out.stats.cached_tokens_remote, 0);
    EXPECT_EQ(out.samples.at(0).reason, FinishReason::kLength);
  }
  const RequestOutput out = run_one(e, long_prompt());
  EXPECT_EQ(out.samples.at(0).tokens, want);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  const EngineMetrics m = e.metrics();
  EXPECT_GE(m.remote.errors, 3);
  EXPECT_GE(m.remote.breaker_opens, 1);
  EXPECT_EQ(m.remote.breaker, BreakerState::kOpen);
  EXPECT_EQ(m.remote.hit_blocks, 0);
}

TEST(RemoteEngine, AStoreSlowerThanTheDeadlineIsAMissWithTheSameTokens) {
  auto store = std::make_shared<FakeKvStore>();
  const std::vector<int32_t> want = prime(store, long_prompt());
  store->delay_ms = 2000;
  Engine b(*tiny_model().model, nullptr, config_for(store, 30));
  const auto t0 = std::chrono::steady_clock::now();
  const RequestOutput out = run_one(b, long_prompt());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
  EXPECT_EQ(out.samples.at(0).tokens, want);
  EXPECT_EQ(out.stats.cached_tokens_remote, 0);
  EXPECT_GE(b.metrics().remote.timeouts, 1);
}

TEST(RemoteEngine, ACorruptValueIsACountedMissWithTheSameTokens) {
  auto store = std::make_shared<FakeKvStore>();
  const std::vector<int32_t> want = prime(store, long_prompt());
  {  // One byte of every value flipped.
    std::lock_guard<std::mutex> lock(store->mu);
    for (auto& [key, value] : store->map) value[value.size() / 2] ^= std::byte{0x40};
  }
  Engine b(*tiny_model().model, nullptr, config_for(store));
  const RequestOutput out = run_one(b, long_prompt());
  EXPECT_EQ(out.samples.at(0).tokens, want);
  EXPECT_EQ(out.stats.cached_tokens_remote, 0);
  EXPECT_GE(b.metrics().remote.corrupt, 1);
}

TEST(RemoteEngine, TheTokenizerFingerprintIsStableAndTellsTokenizersApart) {
  const Digest128 none = tokenizer_fingerprint(nullptr);
  EXPECT_EQ(none, tokenizer_fingerprint(nullptr));
  if (!testing_util::have_stories()) GTEST_SKIP() << "stories260K not in ../shared";
  const std::string tok = testing_util::stories_dir() + "/tok512.bin";
  const std::unique_ptr<Tokenizer> a = load_tokenizer(tok, 512);
  const std::unique_ptr<Tokenizer> b = load_tokenizer(tok, 512);
  const std::unique_ptr<Tokenizer> shorter = load_tokenizer(tok, 511);
  EXPECT_EQ(tokenizer_fingerprint(a.get()), tokenizer_fingerprint(b.get()));
  EXPECT_NE(tokenizer_fingerprint(a.get()), none);
  EXPECT_NE(tokenizer_fingerprint(a.get()), tokenizer_fingerprint(shorter.get()));
}

}  // namespace
}  // namespace kvcache
