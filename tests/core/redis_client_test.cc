// The Redis KvClient against real redis-server processes (tests/redis_harness.h): URL parsing,
// the cluster spec's hash slot vectors, standalone set/get (binary, 1 MiB, TTL, AUTH), a
// 3-master cluster (keys spread, -MOVED after a slot moved, -ASK while it migrates), and the
// faults: a killed master, a paused server (the deadline holds), a restarted server.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/kv_client.h"
#include "redis_harness.h"

namespace kvcache {
namespace {

using testing_util::free_port;
using testing_util::redis_unavailable;
using testing_util::RedisCluster;
using testing_util::RedisProcess;
using testing_util::RedisStandalone;
using testing_util::ScratchDir;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

#define SKIP_WITHOUT_REDIS()                                                            \
  do {                                                                                  \
    if (const std::string why = redis_unavailable(); !why.empty()) GTEST_SKIP() << why; \
  } while (0)

struct Got {
  std::vector<KvStatus> status;
  std::vector<std::string> value;
  std::vector<int> calls;  // callbacks per key (must be 1)
  milliseconds took{};
};

Got get_all(KvClient& c, const std::vector<std::string>& keys, milliseconds budget) {
  Got g;
  g.status.assign(keys.size(), KvStatus::kError);
  g.value.assign(keys.size(), "");
  g.calls.assign(keys.size(), 0);
  const auto t0 = Clock::now();
  c.get(keys, t0 + budget, [&](size_t i, KvStatus s, std::span<const std::byte> v) {
    g.status[i] = s;
    g.value[i].assign(reinterpret_cast<const char*>(v.data()), v.size());
    ++g.calls[i];
  });
  g.took = std::chrono::duration_cast<milliseconds>(Clock::now() - t0);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(g.calls[i], 1) << "key " << keys[i];
  return g;
}

size_t set_all(KvClient& c, const std::vector<std::string>& keys,
               const std::vector<std::string>& values, milliseconds budget, int64_t ttl = 0) {
  std::vector<std::span<const std::byte>> spans;
  for (const auto& v : values)
    spans.emplace_back(reinterpret_cast<const std::byte*>(v.data()), v.size());
  return c.set(keys, spans, Clock::now() + budget, ttl);
}

size_t count(const Got& g, KvStatus s) {
  return static_cast<size_t>(std::count(g.status.begin(), g.status.end(), s));
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

long dbsize(const RedisProcess& p) {
  return std::stol(trim(p.cli("DBSIZE")));
}

// ---- URL and slots ---------------------------------------------------------------------------

TEST(RedisUrl, ParsesSeedsPortsAndPassword) {
  RedisOptions o = parse_redis_url("redis://127.0.0.1:7000,127.0.0.1:7001,cache-host");
  ASSERT_EQ(o.seeds.size(), 3u);
  EXPECT_EQ(o.seeds[0].host, "127.0.0.1");
  EXPECT_EQ(o.seeds[0].port, 7000);
  EXPECT_EQ(o.seeds[1].port, 7001);
  EXPECT_EQ(o.seeds[2].host, "cache-host");
  EXPECT_EQ(o.seeds[2].port, 6379);
  EXPECT_TRUE(o.password.empty());
  o = parse_redis_url("redis://:s3cret@[::1]:6380/");
  ASSERT_EQ(o.seeds.size(), 1u);
  EXPECT_EQ(o.seeds[0].host, "::1");
  EXPECT_EQ(o.seeds[0].port, 6380);
  EXPECT_EQ(o.password, "s3cret");
  EXPECT_EQ(parse_redis_url("redis://default:pw@h:1").password, "pw");
}

TEST(RedisUrl, ErrorsNameTheBadPart) {
  auto message = [](const std::string& url) -> std::string {
    try {
      parse_redis_url(url);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      return e.what();
    }
    ADD_FAILURE() << url << " was accepted";
    return "";
  };
  EXPECT_NE(message("http://h:6379").find("scheme 'http'"), std::string::npos);
  EXPECT_NE(message("rediss://h:6379").find("scheme 'rediss'"), std::string::npos);
  EXPECT_NE(message("redis://").find("no host"), std::string::npos);
  EXPECT_NE(message("redis://:6379").find("empty host"), std::string::npos);
  EXPECT_NE(message("redis://h:1,,h:2").find("empty host"), std::string::npos);
  EXPECT_NE(message("redis://h:0").find("port '0'"), std::string::npos);
  EXPECT_NE(message("redis://h:65536").find("port '65536'"), std::string::npos);
  EXPECT_NE(message("redis://h:12x").find("port '12x'"), std::string::npos);
  EXPECT_NE(message("redis://h:1,g:").find("port ''"), std::string::npos);
  EXPECT_NE(message("redis://h:6379/0").find("path '/0'"), std::string::npos);
  EXPECT_NE(message("redis://h:6379?timeout=1").find("query '?timeout=1'"), std::string::npos);
  EXPECT_NE(message("redis://alice:pw@h:1").find("user info"), std::string::npos);
}

TEST(RedisKeySlot, ClusterSpecVectors) {
  // Cluster spec, "Key distribution model": CRC16("123456789") = 0x31C3 (XMODEM).
  EXPECT_EQ(redis_key_slot("123456789"), 0x31C3 % 16384);
  EXPECT_EQ(redis_key_slot("123456789"), 12739);
  EXPECT_EQ(redis_key_slot("foo"), 12182);  // CLUSTER KEYSLOT foo
  EXPECT_EQ(redis_key_slot(""), 0);
  EXPECT_EQ(redis_key_slot("{user1000}.following"), redis_key_slot("{user1000}.followers"));
  EXPECT_EQ(redis_key_slot("{user1000}.following"), redis_key_slot("user1000"));
  EXPECT_EQ(redis_key_slot("foo{}{bar}"), redis_key_slot(std::string_view("foo{}{bar}")));
  EXPECT_NE(redis_key_slot("foo{}{bar}"), redis_key_slot("bar"));  // the whole key
  EXPECT_EQ(redis_key_slot("foo{{bar}}zap"), redis_key_slot("{bar"));
  EXPECT_EQ(redis_key_slot("foo{bar}{zap}"), redis_key_slot("bar"));
}

// ---- standalone ------------------------------------------------------------------------------

TEST(RedisStandaloneClient, SetGetMissBinaryLargeAndTtl) {
  SKIP_WITHOUT_REDIS();
  RedisStandalone redis;
  auto c = make_redis_client(parse_redis_url(redis.url()));
  EXPECT_NE(c->describe().find("not connected yet"), std::string::npos) << c->describe();
  std::string binary("a\0b\0\0c\r\n$-1\r\n", 14);
  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  const std::vector<std::string> keys = {"plain", std::string("bin\0key", 7), "big", "empty"};
  const std::vector<std::string> values = {"hello", binary, big, ""};
  EXPECT_EQ(set_all(*c, keys, values, milliseconds(2000)), 4u);
  EXPECT_EQ(c->describe(), "redis standalone 127.0.0.1:" + std::to_string(redis.port()));

  std::vector<std::string> ask = keys;
  ask.push_back("absent");
  const Got g = get_all(*c, ask, milliseconds(2000));
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_EQ(g.status[i], KvStatus::kHit) << i;
    EXPECT_EQ(g.value[i], values[i]) << i;
  }
  EXPECT_EQ(g.status[4], KvStatus::kMiss);
  const KvClientStats s = c->stats();
  EXPECT_EQ(s.commands, 9);
  EXPECT_EQ(s.errors, 0);
  EXPECT_EQ(s.connects, 1);
  EXPECT_EQ(s.slot_map_reads, 1);  // the detection
  EXPECT_EQ(s.bytes_out, 5 + binary.size() + big.size());
  EXPECT_EQ(s.bytes_in, s.bytes_out);

  EXPECT_EQ(set_all(*c, {"ttl"}, {"v"}, milliseconds(1000), /*ttl=*/60000), 1u);
  const long pttl = std::stol(trim(redis.server().cli("PTTL ttl")));
  EXPECT_GT(pttl, 50000);
  EXPECT_LE(pttl, 60000);
  EXPECT_EQ(std::stol(trim(redis.server().cli("PTTL plain"))), -1);  // no TTL asked
  EXPECT_THROW(c->set(keys, {}, Clock::now() + milliseconds(100)), Error);
}

TEST(RedisStandaloneClient, ErrorReplyIsKErrorAndCounted) {
  SKIP_WITHOUT_REDIS();
  RedisStandalone redis;
  redis.server().cli("RPUSH alist x");
  auto c = make_redis_client(parse_redis_url(redis.url()));
  const Got g = get_all(*c, {"alist", "nothing"}, milliseconds(1000));
  EXPECT_EQ(g.status[0], KvStatus::kError);  // -WRONGTYPE
  EXPECT_EQ(g.status[1], KvStatus::kMiss);
  EXPECT_EQ(c->stats().errors, 1);
  EXPECT_EQ(c->stats().timeouts, 0);
}

TEST(RedisStandaloneClient, FirstSeedThatAnswersAndAuth) {
  SKIP_WITHOUT_REDIS();
  ScratchDir dir("redis-auth");
  RedisProcess p(free_port(), dir.path(), {});
  ASSERT_EQ(trim(p.cli("CONFIG SET requirepass s3cret")), "OK");  // (the harness PINGs first)
  const int dead = free_port();                                   // nothing listens
  RedisOptions o = parse_redis_url("redis://:s3cret@127.0.0.1:" + std::to_string(dead) +
                                   ",127.0.0.1:" + std::to_string(p.port()));
  auto c = make_redis_client(o);
  EXPECT_EQ(set_all(*c, {"k"}, {"v"}, milliseconds(1000)), 1u);
  EXPECT_EQ(c->describe(), "redis standalone 127.0.0.1:" + std::to_string(p.port()));
  EXPECT_EQ(get_all(*c, {"k"}, milliseconds(1000)).value[0], "v");

  // A paused first seed: its share of the deadline, then the next one answers.
  RedisStandalone paused;
  paused.server().pause();
  auto c2 = make_redis_client(
      parse_redis_url("redis://:s3cret@127.0.0.1:" + std::to_string(paused.port()) +
                      ",127.0.0.1:" + std::to_string(p.port())));
  const Got g2 = get_all(*c2, {"k"}, milliseconds(300));
  EXPECT_EQ(g2.value[0], "v");
  EXPECT_LT(g2.took, milliseconds(250));
  EXPECT_EQ(c2->describe(), "redis standalone 127.0.0.1:" + std::to_string(p.port()));
  EXPECT_EQ(c2->stats().timeouts, 1);  // the paused seed's share ran out
  paused.server().resume();

  o.password = "wrong";
  auto bad = make_redis_client(o);
  const Got g = get_all(*bad, {"k"}, milliseconds(500));
  EXPECT_EQ(g.status[0], KvStatus::kError);
  EXPECT_LT(g.took, milliseconds(400));  // a refused AUTH is an answer, not a timeout
}

TEST(RedisStandaloneClient, PausedServerReturnsByTheDeadline) {
  SKIP_WITHOUT_REDIS();
  RedisStandalone redis;
  RedisOptions o = parse_redis_url(redis.url());
  o.node_retry_seconds = 0.3;
  auto c = make_redis_client(o);
  ASSERT_EQ(set_all(*c, {"a", "b"}, {"1", "2"}, milliseconds(1000)), 2u);
  redis.server().pause();
  Got g = get_all(*c, {"a", "b"}, milliseconds(150));
  EXPECT_EQ(count(g, KvStatus::kError), 2u);
  EXPECT_GE(g.took, milliseconds(149));
  EXPECT_LT(g.took, milliseconds(150 + 50));
  EXPECT_EQ(c->stats().timeouts, 1);
  // Held back: the next call does not wait for it again.
  g = get_all(*c, {"a"}, milliseconds(150));
  EXPECT_EQ(g.status[0], KvStatus::kError);
  EXPECT_LT(g.took, milliseconds(50));
  EXPECT_EQ(set_all(*c, {"c"}, {"3"}, milliseconds(150)), 0u);
  redis.server().resume();
  std::this_thread::sleep_for(milliseconds(350));
  g = get_all(*c, {"a", "b"}, milliseconds(1000));
  EXPECT_EQ(g.value[0], "1");
  EXPECT_EQ(g.value[1], "2");
  EXPECT_EQ(c->stats().connects, 2);  // the timed-out connection was closed, one new
}

TEST(RedisStandaloneClient, ReconnectsToARestartedServer) {
  SKIP_WITHOUT_REDIS();
  ScratchDir dir("redis-restart");
  const int port = free_port();
  auto p = std::make_unique<RedisProcess>(port, dir.path() / "a", std::vector<std::string>{});
  auto c = make_redis_client(parse_redis_url("redis://127.0.0.1:" + std::to_string(port)));
  ASSERT_EQ(set_all(*c, {"k"}, {"before"}, milliseconds(1000)), 1u);
  p->kill();
  p = std::make_unique<RedisProcess>(port, dir.path() / "b", std::vector<std::string>{});
  // The idle connection is dead: the call notices, redials once and is answered.
  Got g = get_all(*c, {"k"}, milliseconds(1000));
  EXPECT_EQ(g.status[0], KvStatus::kMiss);  // a fresh server
  EXPECT_EQ(set_all(*c, {"k"}, {"after"}, milliseconds(1000)), 1u);
  EXPECT_EQ(get_all(*c, {"k"}, milliseconds(1000)).value[0], "after");
  EXPECT_EQ(c->stats().connects, 2);
  EXPECT_EQ(c->stats().errors, 0);
}

// ---- cluster ---------------------------------------------------------------------------------

std::vector<std::string> numbered_keys(int n) {
  std::vector<std::string> k;
  for (int i = 0; i < n; ++i) k.push_back("kv:" + std::to_string(i));
  return k;
}

TEST(RedisClusterClient, KeysSpreadOverAllMastersAndComeBack) {
  SKIP_WITHOUT_REDIS();
  RedisCluster cluster(3);
  auto c = make_redis_client(parse_redis_url(cluster.url()));
  const auto keys = numbered_keys(300);
  std::vector<std::string> values;
  for (const auto& k : keys) values.push_back("value of " + k + std::string(100, 'x'));
  EXPECT_EQ(set_all(*c, keys, values, milliseconds(2000)), keys.size());
  long total = 0;
  for (size_t i = 0; i < cluster.size(); ++i) {
    const long n = dbsize(cluster.node(i));
    EXPECT_GT(n, 50) << "node " << i;  // about 100 each
    total += n;
  }
  EXPECT_EQ(total, 300);
  const Got g = get_all(*c, keys, milliseconds(2000));
  EXPECT_EQ(count(g, KvStatus::kHit), keys.size());
  EXPECT_EQ(g.value, values);
  const KvClientStats s = c->stats();
  EXPECT_EQ(s.moved, 0);
  EXPECT_EQ(s.errors, 0);
  EXPECT_EQ(s.slot_map_reads, 1);
  EXPECT_EQ(s.connects, 3);
  EXPECT_EQ(s.commands, 600);
  EXPECT_NE(c->describe().find("redis cluster, 3 masters (127.0.0.1:"), std::string::npos)
      << c->describe();
  // Our slots are the server's.
  for (const std::string k : {"a", "kv:0123456789abcdef", "foo{}{bar}", "{x}y", "kv:299"})
    EXPECT_EQ(std::to_string(redis_key_slot(k)),
              trim(cluster.node(0).cli("CLUSTER KEYSLOT '" + k + "'")))
        << k;
}

// The node of `cluster` that owns `key` (the others answer -MOVED to redis-cli without -c).
size_t owner_of(RedisCluster& cluster, const std::string& key) {
  for (size_t i = 0; i < cluster.size(); ++i)
    if (cluster.node(i).cli("GET '" + key + "'").find("MOVED") == std::string::npos) return i;
  ADD_FAILURE() << "nobody owns " << key;
  return 0;
}

TEST(RedisClusterClient, FollowsAskWhileASlotMigratesAndMovedAfter) {
  SKIP_WITHOUT_REDIS();
  RedisCluster cluster(3);
  auto c = make_redis_client(parse_redis_url(cluster.url()));
  const std::vector<std::string> keys = {"{blk}a", "{blk}b", "{blk}c"};
  ASSERT_EQ(set_all(*c, keys, {"A", "B", "C"}, milliseconds(2000)), 3u);
  // A second client with the same (soon stale) map that may not follow any redirection.
  RedisOptions o = parse_redis_url(cluster.url());
  o.max_redirects = 0;
  auto strict = make_redis_client(o);
  ASSERT_EQ(count(get_all(*strict, keys, milliseconds(2000)), KvStatus::kHit), 3u);
  const int slot = redis_key_slot("blk");
  const size_t src = owner_of(cluster, keys[0]);
  const size_t dst = (src + 1) % cluster.size();
  RedisProcess& s = cluster.node(src);
  RedisProcess& d = cluster.node(dst);
  const std::string src_id = trim(s.cli("CLUSTER MYID")), dst_id = trim(d.cli("CLUSTER MYID"));
  const std::string sl = std::to_string(slot);
  ASSERT_EQ(trim(d.cli("CLUSTER SETSLOT " + sl + " IMPORTING " + src_id)), "OK");
  ASSERT_EQ(trim(s.cli("CLUSTER SETSLOT " + sl + " MIGRATING " + dst_id)), "OK");
  // {blk}a moves; {blk}b and {blk}c stay on the source for now.
  ASSERT_EQ(trim(s.cli("MIGRATE 127.0.0.1 " + std::to_string(d.port()) + " '{blk}a' 0 5000")),
            "OK");
  Got g = get_all(*c, keys, milliseconds(2000));
  EXPECT_EQ(g.value, (std::vector<std::string>{"A", "B", "C"}));
  EXPECT_EQ(c->stats().asked, 1);
  EXPECT_EQ(c->stats().moved, 0);
  // A new key of the migrating slot: the source says -ASK (not there), the target takes it.
  EXPECT_EQ(set_all(*c, {"{blk}new"}, {"N"}, milliseconds(2000)), 1u);
  EXPECT_EQ(c->stats().asked, 2);

  // Finish the move: the rest migrates, every master learns the new owner.
  ASSERT_EQ(trim(s.cli("MIGRATE 127.0.0.1 " + std::to_string(d.port()) +
                       " '' 0 5000 KEYS '{blk}b' '{blk}c'")),
            "OK");
  ASSERT_EQ(trim(d.cli("CLUSTER SETSLOT " + sl + " NODE " + dst_id)), "OK");
  ASSERT_EQ(trim(s.cli("CLUSTER SETSLOT " + sl + " NODE " + dst_id)), "OK");
  for (size_t i = 0; i < cluster.size(); ++i)
    if (i != src && i != dst) cluster.node(i).cli("CLUSTER SETSLOT " + sl + " NODE " + dst_id);
  // The client's map still says `src`: -MOVED for each key (all three were pipelined to src).
  const int64_t reads_before = c->stats().slot_map_reads;
  g = get_all(*c, keys, milliseconds(2000));
  EXPECT_EQ(g.value, (std::vector<std::string>{"A", "B", "C"}));
  EXPECT_EQ(c->stats().moved, 3);
  EXPECT_EQ(c->stats().errors, 0);
  EXPECT_EQ(set_all(*c, {"{blk}d"}, {"D"}, milliseconds(2000)), 1u);  // direct to dst now
  EXPECT_EQ(c->stats().moved, 3);
  EXPECT_EQ(c->stats().slot_map_reads, reads_before + 1);  // the scheduled re-read
  EXPECT_EQ(trim(d.cli("GET '{blk}d'")), "D");
  EXPECT_EQ(trim(s.cli("CLUSTER COUNTKEYSINSLOT " + sl)), "0");
  EXPECT_EQ(trim(d.cli("CLUSTER COUNTKEYSINSLOT " + sl)), "5");  // a b c new d

  // max_redirects 0: the stale slot's keys end kError (counted), no redirection followed.
  g = get_all(*strict, keys, milliseconds(2000));
  EXPECT_EQ(count(g, KvStatus::kError), 3u);
  EXPECT_EQ(strict->stats().errors, 3);
  EXPECT_EQ(strict->stats().moved, 0);
}

TEST(RedisClusterClient, KilledMasterFailsItsKeysOnlyAndIsHeldBack) {
  SKIP_WITHOUT_REDIS();
  RedisCluster cluster(3);
  RedisOptions o = parse_redis_url(cluster.url());
  o.node_retry_seconds = 2.0;
  auto c = make_redis_client(o);
  const auto keys = numbered_keys(300);
  std::vector<std::string> values(keys.size(), "v");
  ASSERT_EQ(set_all(*c, keys, values, milliseconds(2000)), keys.size());
  const long on_dead = dbsize(cluster.node(2));
  ASSERT_GT(on_dead, 0);
  cluster.node(2).kill();

  Got g = get_all(*c, keys, milliseconds(500));
  EXPECT_EQ(count(g, KvStatus::kError), static_cast<size_t>(on_dead));
  EXPECT_EQ(count(g, KvStatus::kHit), keys.size() - on_dead);
  EXPECT_LT(g.took, milliseconds(300));  // refused: no need to wait for the deadline
  const int64_t connects = c->stats().connects;

  // Within node_retry_seconds: the dead node is not dialled again, nothing waits for it.
  for (int round = 0; round < 3; ++round) {
    g = get_all(*c, keys, milliseconds(500));
    EXPECT_EQ(count(g, KvStatus::kError), static_cast<size_t>(on_dead));
    EXPECT_EQ(count(g, KvStatus::kHit), keys.size() - on_dead);
    EXPECT_LT(g.took, milliseconds(100));
  }
  EXPECT_EQ(set_all(*c, keys, values, milliseconds(500)), keys.size() - on_dead);
  EXPECT_EQ(c->stats().connects, connects);
  EXPECT_EQ(c->stats().timeouts, 0);

  // A paused master: its keys kError by the deadline, the live one still answers.
  cluster.node(1).pause();
  g = get_all(*c, keys, milliseconds(200));
  EXPECT_GE(g.took, milliseconds(199));
  EXPECT_LT(g.took, milliseconds(200 + 50));
  EXPECT_EQ(count(g, KvStatus::kHit), static_cast<size_t>(dbsize(cluster.node(0))));
  EXPECT_EQ(c->stats().timeouts, 1);
  cluster.node(1).resume();
}

}  // namespace
}  // namespace kvcache
