// The shared remote tier on a real Redis (tests/redis_harness.h, core/redis_client.h): two
// engines on one model share one redis-server; the second's long prompt is served from it with
// the same tokens; a corrupted value is a counted miss; Redis stopped changes nothing but the
// time. Skipped only where redis-server is absent.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "core/kv_client.h"
#include "redis_harness.h"
#include "remote_engine_util.h"
#include "runtime/engine.h"
#include "tiny_model.h"

namespace kvcache {
namespace {

using testing_util::redis_unavailable;
using testing_util::RedisStandalone;
using testing_util::tiny_model;

using testing_util::random_prompt;
using testing_util::run_one;

EngineConfig config_for(const std::string& url, int32_t deadline_ms = 200) {
  EngineConfig c;
  c.cache.paged.block_tokens = 16;
  c.num_blocks = 40;
  c.max_tokens_per_step = 256;
  c.check_invariants_every_step = true;
  if (!url.empty()) {
    const RedisOptions ro = parse_redis_url(url);
    c.kv_remote_url = url;
    c.kv_remote_client = [ro] { return make_redis_client(ro); };
    c.kv_remote_deadline_ms = deadline_ms;
  }
  return c;
}

const std::vector<int32_t>& long_prompt() {
  static const std::vector<int32_t> p = random_prompt(300, 43);
  return p;
}

TEST(RemoteRedisEngine, TwoEnginesShareOneRedis) {
  if (const std::string why = redis_unavailable(); !why.empty()) GTEST_SKIP() << why;
  RedisStandalone redis;
  std::vector<int32_t> want;
  {
    Engine ref(*tiny_model().model, nullptr, config_for(""));
    want = run_one(ref, long_prompt()).samples.at(0).tokens;
  }
  {
    Engine a(*tiny_model().model, nullptr, config_for(redis.url()));
    const RequestOutput out = run_one(a, long_prompt());
    EXPECT_EQ(out.samples.at(0).tokens, want);
    a.store().remote_tier()->flush();
    EXPECT_EQ(a.store().remote_tier()->stats().writes_stored, 18);
  }
  EXPECT_NE(redis.server().cli("DBSIZE").find("18"), std::string::npos);
  Engine b(*tiny_model().model, nullptr, config_for(redis.url()));
  const RequestOutput out = run_one(b, long_prompt());
  EXPECT_EQ(out.samples.at(0).tokens, want);
  EXPECT_EQ(out.stats.cached_tokens_remote, 288);
  EXPECT_GT(b.metrics().remote.bytes_in, 0u);
  // Another tenant: no hit.
  Engine c(*tiny_model().model, nullptr, config_for(redis.url()));
  EXPECT_EQ(run_one(c, long_prompt(), "other").stats.cached_tokens_remote, 0);
}

TEST(RemoteRedisEngine, TwoEnginesShareOneCluster) {
  if (const std::string why = redis_unavailable(); !why.empty()) GTEST_SKIP() << why;
  testing_util::RedisCluster cluster(3);
  std::vector<int32_t> want;
  {
    Engine ref(*tiny_model().model, nullptr, config_for(""));
    want = run_one(ref, long_prompt()).samples.at(0).tokens;
  }
  {
    Engine a(*tiny_model().model, nullptr, config_for(cluster.url()));
    EXPECT_EQ(run_one(a, long_prompt()).samples.at(0).tokens, want);
    a.store().remote_tier()->flush();
    EXPECT_EQ(a.store().remote_tier()->stats().writes_stored, 18);
  }
  Engine b(*tiny_model().model, nullptr, config_for(cluster.url()));
  const RequestOutput out = run_one(b, long_prompt());
  EXPECT_EQ(out.samples.at(0).tokens, want);
  EXPECT_EQ(out.stats.cached_tokens_remote, 288);
}

TEST(RemoteRedisEngine, AValueCorruptedInRedisIsACountedMiss) {
  if (const std::string why = redis_unavailable(); !why.empty()) GTEST_SKIP() << why;
  RedisStandalone redis;
  std::vector<int32_t> want;
  {
    Engine a(*tiny_model().model, nullptr, config_for(redis.url()));
    want = run_one(a, long_prompt()).samples.at(0).tokens;
  }
  // Overwrite the first block's value (group 0) with garbage of the same length, by hand.
  const std::string keys = redis.server().cli("--scan --pattern 'kvc:*'");
  ASSERT_FALSE(keys.empty());
  Engine b(*tiny_model().model, nullptr, config_for(redis.url()));
  for (size_t pos = 0; pos < keys.size();) {
    const size_t end = keys.find('\n', pos);
    const std::string key = keys.substr(pos, end - pos);
    pos = end == std::string::npos ? keys.size() : end + 1;
    if (!key.empty()) redis.server().cli("SETRANGE " + key + " 200 garbage");
  }
  const RequestOutput out = run_one(b, long_prompt());
  EXPECT_EQ(out.samples.at(0).tokens, want);
  EXPECT_EQ(out.stats.cached_tokens_remote, 0);
  EXPECT_GE(b.metrics().remote.corrupt, 1);
}

TEST(RemoteRedisEngine, RedisStoppedGivesTheSameTokensWithinTheDeadline) {
  if (const std::string why = redis_unavailable(); !why.empty()) GTEST_SKIP() << why;
  RedisStandalone redis;
  std::vector<int32_t> want;
  {
    Engine ref(*tiny_model().model, nullptr, config_for(""));
    want = run_one(ref, long_prompt()).samples.at(0).tokens;
  }
  const std::string url = redis.url();
  redis.server().kill();
  Engine e(*tiny_model().model, nullptr, config_for(url, 30));
  const auto t0 = std::chrono::steady_clock::now();
  const RequestOutput out = run_one(e, long_prompt());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(out.samples.at(0).tokens, want);
  EXPECT_EQ(out.stats.cached_tokens_remote, 0);
  EXPECT_GE(e.metrics().remote.errors, 1);
}

}  // namespace
}  // namespace kvcache
