// The shared remote tier with real processes (issue 41): two `kvcache serve` share one
// redis-server, standalone or a three-master Redis Cluster; a prefix computed by one is served
// by the other, with the same tokens; a killed master, a stopped Redis or a corrupted value
// never reaches a client as an error and never changes an answer; tenants' salts keep their
// prefixes apart in Redis too.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../server/raw_http.h"
#include "redis_harness.h"
#include "scratch_dir.h"
#include "serve_child.h"

namespace kvcache {
namespace {

using nlohmann::json;
using testing_util::RedisCluster;
using testing_util::RedisProcess;
using testing_util::RedisStandalone;
using testing_util::ScratchDir;
using testing_util::ServeChild;

// dummy:tiny, 16-token blocks: a 70-token prompt has 4 full blocks before its last token.
constexpr int kPromptTokens = 70;
constexpr int kCachedTokens = 64;

std::vector<std::string> serve_args(const std::string& url, const std::string& extra = "") {
  std::vector<std::string> a = {"serve",           "--model", "dummy:tiny",  "--port", "0",
                                "--max-cache-len", "512",     "--kv-remote", url};
  if (!extra.empty()) {
    a.push_back("--kv-remote-deadline-ms");
    a.push_back(extra);
  }
  return a;
}

std::string prompt_json(int seed) {
  std::string p = "[1";
  for (int i = 1; i < kPromptTokens; ++i)
    p += ", " + std::to_string(3 + (seed * 7919 + i * 37) % 250);
  return p + "]";
}

json complete(int port, int seed, const std::string& salt = "") {
  std::string body =
      R"({"prompt": )" + prompt_json(seed) + R"(, "max_tokens": 6, "temperature": 0)";
  if (!salt.empty()) body += R"(, "cache_salt": ")" + salt + "\"";
  body += "}";
  const auto r = testing_util::http(port, "POST", "/v1/completions", body);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.status == 200 ? json::parse(r.body) : json{{"error", r.body}};
}

int64_t metric(int port, const std::string& name) {
  const std::string m = testing_util::http(port, "GET", "/metrics").body;
  const size_t at = m.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stoll(m.substr(at + name.size() + 2));
}

// Waits until server `port` has written at least `n` blocks behind (its writer is asynchronous).
bool wait_written(int port, int64_t n) {
  for (int i = 0; i < 200; ++i) {
    if (metric(port, "kvcache_remote_writes_total") >= n) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

const json& details(const json& reply) {
  return reply["usage"]["prompt_tokens_details"];
}
std::string text(const json& reply) {
  return reply["choices"][0]["text"].get<std::string>();
}

TEST(CliRemote, TwoServersShareOneRedis) {
  if (const std::string why = testing_util::redis_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const ScratchDir scratch("cli_remote");
  RedisStandalone redis;
  ServeChild a, b;
  ASSERT_TRUE(a.start(scratch.str(), serve_args(redis.url()))) << a.err;
  ASSERT_TRUE(b.start(scratch.str(), serve_args(redis.url()))) << b.err;
  const json first = complete(a.port, 1);
  EXPECT_EQ(details(first)["cached_tokens"], 0);
  ASSERT_TRUE(wait_written(a.port, kCachedTokens / 16));
  const json second = complete(b.port, 1);
  EXPECT_EQ(text(second), text(first));
  EXPECT_EQ(details(second)["cached_tokens"], kCachedTokens) << second.dump();
  EXPECT_EQ(details(second)["cached_tokens_remote"], kCachedTokens) << second.dump();
  EXPECT_EQ(metric(b.port, "kvcache_remote_hits_total"), kCachedTokens / 16);
  // Every key the tier wrote is namespaced and holds one block.
  const std::string keys = redis.server().cli("--scan --pattern 'kvc:*'");
  EXPECT_EQ(std::count(keys.begin(), keys.end(), '\n'), kCachedTokens / 16) << keys;
  EXPECT_EQ(a.stop(), 0);
  EXPECT_EQ(b.stop(), 0);
}

TEST(CliRemote, TenantsWithDifferentSaltsNeverShareAHit) {
  if (const std::string why = testing_util::redis_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const ScratchDir scratch("cli_remote_salt");
  RedisStandalone redis;
  ServeChild a, b;
  ASSERT_TRUE(a.start(scratch.str(), serve_args(redis.url()))) << a.err;
  ASSERT_TRUE(b.start(scratch.str(), serve_args(redis.url()))) << b.err;
  const json alice = complete(a.port, 2, "alice");
  ASSERT_TRUE(wait_written(a.port, kCachedTokens / 16));
  const json bob = complete(b.port, 2, "bob");
  EXPECT_EQ(details(bob)["cached_tokens"], 0) << bob.dump();
  EXPECT_EQ(text(bob), text(alice));  // the salt keys the cache, never the answer
  const json unsalted = complete(b.port, 2);
  EXPECT_EQ(details(unsalted)["cached_tokens_remote"], 0) << unsalted.dump();
  const json alice_again = complete(b.port, 2, "alice");
  EXPECT_EQ(details(alice_again)["cached_tokens_remote"], kCachedTokens) << alice_again.dump();
  EXPECT_EQ(text(alice_again), text(alice));
}

TEST(CliRemote, ACorruptedValueIsACountedMissNeverAnAnswer) {
  if (const std::string why = testing_util::redis_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const ScratchDir scratch("cli_remote_corrupt");
  RedisStandalone redis;
  ServeChild a, b;
  ASSERT_TRUE(a.start(scratch.str(), serve_args(redis.url()))) << a.err;
  ASSERT_TRUE(b.start(scratch.str(), serve_args(redis.url()))) << b.err;
  const json first = complete(a.port, 3);
  ASSERT_TRUE(wait_written(a.port, kCachedTokens / 16));
  // Flip one byte in the middle of every stored value (SETRANGE), by hand as an operator could.
  std::string keys = redis.server().cli("--scan --pattern 'kvc:*'");
  int corrupted = 0;
  for (size_t at = 0; at < keys.size();) {
    const size_t nl = keys.find('\n', at);
    const std::string key = keys.substr(at, nl - at);
    at = nl == std::string::npos ? keys.size() : nl + 1;
    if (key.empty()) continue;
    const int64_t len = std::stoll(redis.server().cli("STRLEN " + key));
    redis.server().cli("SETRANGE " + key + " " + std::to_string(len / 2) + " Z");
    ++corrupted;
  }
  ASSERT_EQ(corrupted, kCachedTokens / 16);
  const json second = complete(b.port, 3);
  EXPECT_EQ(text(second), text(first));
  EXPECT_EQ(details(second)["cached_tokens_remote"], 0) << second.dump();
  EXPECT_GE(metric(b.port, "kvcache_remote_corrupt_total"), 1);
}

TEST(CliRemote, RedisDownMeansLocalComputeAndTheSameTokens) {
  if (const std::string why = testing_util::redis_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const ScratchDir scratch("cli_remote_down");
  ServeChild plain;
  ASSERT_TRUE(plain.start(
      scratch.str(), {"serve", "--model", "dummy:tiny", "--port", "0", "--max-cache-len", "512"}))
      << plain.err;
  const json expected = complete(plain.port, 4);
  // A port nobody listens on (a Redis that is down at start), and a Redis stopped mid-way.
  RedisStandalone redis;
  const int dead_port = testing_util::free_port();
  ServeChild a, b;
  ASSERT_TRUE(
      a.start(scratch.str(), serve_args("redis://127.0.0.1:" + std::to_string(dead_port), "30")))
      << a.err;
  ASSERT_TRUE(b.start(scratch.str(), serve_args(redis.url(), "30"))) << b.err;
  const auto t0 = std::chrono::steady_clock::now();
  const json down = complete(a.port, 4);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(text(down), text(expected));
  EXPECT_LT(seconds, 5.0);
  EXPECT_GE(metric(a.port, "kvcache_remote_errors_total"), 1);
  redis.server().kill();
  for (int seed = 5; seed < 9; ++seed) {  // the breaker opens; every request still succeeds
    const json r = complete(b.port, seed);
    EXPECT_EQ(r["choices"][0]["finish_reason"], "length") << r.dump();
  }
  EXPECT_EQ(text(complete(b.port, 4)), text(expected));
  EXPECT_GE(metric(b.port, "kvcache_remote_breaker_opens_total"), 1);
}

TEST(CliRemote, AClusterLosingAMasterMidwayChangesNoAnswer) {
  if (const std::string why = testing_util::redis_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const ScratchDir scratch("cli_remote_cluster");
  RedisCluster cluster(3);
  ServeChild a, b;
  ASSERT_TRUE(a.start(scratch.str(), serve_args(cluster.url()))) << a.err;
  ASSERT_TRUE(b.start(scratch.str(), serve_args(cluster.url()))) << b.err;
  std::vector<json> expected;
  for (int seed = 10; seed < 14; ++seed) expected.push_back(complete(a.port, seed));
  ASSERT_TRUE(wait_written(a.port, 4 * kCachedTokens / 16));
  // The blocks are spread over the masters.
  int holding = 0;
  for (size_t i = 0; i < cluster.size(); ++i)
    holding += std::stoll(cluster.node(i).cli("DBSIZE")) > 0;
  EXPECT_GE(holding, 2);
  const json hit = complete(b.port, 10);
  EXPECT_EQ(details(hit)["cached_tokens_remote"], kCachedTokens) << hit.dump();
  EXPECT_EQ(text(hit), text(expected[0]));
  cluster.node(1).kill();
  for (int seed = 11; seed < 14; ++seed) {
    const json r = complete(b.port, seed);
    EXPECT_EQ(text(r), text(expected[static_cast<size_t>(seed - 10)])) << r.dump();
    EXPECT_LE(details(r)["cached_tokens_remote"].get<int64_t>(), kCachedTokens);
  }
  // New prompts are written behind to the masters still up, and served from them.
  const json fresh = complete(b.port, 20);
  EXPECT_EQ(fresh["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(a.stop(), 0);
  EXPECT_EQ(b.stop(), 0);
}

}  // namespace
}  // namespace kvcache
