// RemoteTier over an in-memory KvClient: write-behind and lookup round trips are exact; a record
// corrupted, of another layout fingerprint, or of other tokens is a counted miss; the circuit
// breaker opens, drops, half-opens and closes; writes past the budget are dropped; a store
// slower than the deadline is a miss.
#include "cache/remote_tier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cache/block_record.h"
#include "core/error.h"
#include "fake_kv_client.h"

namespace kvcache {
namespace {

using testing_util::fake_client_factory;
using testing_util::FakeKvStore;

constexpr int32_t kBt = 4;
const Digest128 kFingerprint{0xabc, 0xdef};

RemoteTierOptions options_for(const std::shared_ptr<FakeKvStore>& store,
                              Digest128 fingerprint = kFingerprint) {
  RemoteTierOptions o;
  o.make_client = fake_client_factory(store);
  o.fingerprint = fingerprint;
  o.block_tokens = kBt;
  o.deadline_seconds = 0.5;  // generous: only the deadline test is about time
  o.write_deadline_seconds = 1.0;
  return o;
}

// A chain of blocks in G groups, each group's block two pages of random bytes.
struct Chain {
  int32_t groups = 1;
  std::vector<int32_t> tokens;                             // [n * kBt]
  std::vector<std::vector<BlockKey>> keys;                 // [group][n]
  std::vector<std::vector<std::vector<std::byte>>> pages;  // [group][n * 2]
  size_t page_bytes = 96;

  Chain(int32_t n, int32_t g, uint32_t seed, std::span<const uint8_t> salt = {}) : groups(g) {
    std::mt19937 rng(seed);
    for (int32_t i = 0; i < n * kBt; ++i) tokens.push_back(static_cast<int32_t>(rng() % 1000));
    keys.resize(static_cast<size_t>(g));
    pages.resize(static_cast<size_t>(g));
    for (int32_t gi = 0; gi < g; ++gi) {
      BlockKey parent;
      for (int32_t i = 0; i < n; ++i) {
        parent = block_key(parent, gi, salt, block_tokens(i));
        keys[static_cast<size_t>(gi)].push_back(parent);
        for (int p = 0; p < 2; ++p) {
          std::vector<std::byte> page(page_bytes);
          for (auto& b : page) b = static_cast<std::byte>(rng());
          pages[static_cast<size_t>(gi)].push_back(std::move(page));
        }
      }
    }
  }
  std::span<const int32_t> block_tokens(int32_t i) const {
    return std::span<const int32_t>(tokens).subspan(static_cast<size_t>(i * kBt), kBt);
  }
  int32_t blocks() const { return static_cast<int32_t>(keys[0].size()); }
  void store_all(RemoteTier& tier, BlockSource source = BlockSource::kComputed) {
    for (int32_t g = 0; g < groups; ++g)
      for (int32_t i = 0; i < blocks(); ++i) {
        std::vector<std::span<std::byte>> parts;
        for (int p = 0; p < 2; ++p)
          parts.emplace_back(pages[static_cast<size_t>(g)][static_cast<size_t>(2 * i + p)]);
        StoredBlock b;
        b.group = g;
        b.key = keys[static_cast<size_t>(g)][static_cast<size_t>(i)];
        b.parent = i == 0 ? BlockKey{} : keys[static_cast<size_t>(g)][static_cast<size_t>(i - 1)];
        b.tokens = block_tokens(i);
        b.source = source;
        b.pages = parts;
        tier.on_stored(b);
      }
  }
  RemoteLookup request(uint64_t id, int32_t first = 0) const {
    RemoteLookup r;
    r.id = id;
    r.first_block = first;
    for (int32_t g = 0; g < groups; ++g) {
      const auto& k = keys[static_cast<size_t>(g)];
      r.keys.emplace_back(k.begin() + first, k.end());
      r.payload_bytes.push_back(2 * page_bytes);
    }
    r.tokens.assign(tokens.begin() + first * kBt, tokens.end());
    return r;
  }
  std::vector<std::byte> payload(int32_t g, int32_t i) const {
    std::vector<std::byte> out;
    for (int p = 0; p < 2; ++p) {
      const auto& page = pages[static_cast<size_t>(g)][static_cast<size_t>(2 * i + p)];
      out.insert(out.end(), page.begin(), page.end());
    }
    return out;
  }
};

RemoteResult lookup_one(RemoteTier& tier, RemoteLookup req) {
  const uint64_t id = req.id;
  tier.lookup(std::move(req));
  tier.flush();
  std::vector<RemoteResult> r = tier.take_results();
  EXPECT_EQ(r.size(), 1u);
  if (r.empty()) return {};
  EXPECT_EQ(r[0].id, id);
  return std::move(r[0]);
}

TEST(RemoteTier, RoundTripIsExactAcrossGroupsAndTiers) {
  auto store = std::make_shared<FakeKvStore>();
  Chain chain(5, 2, 1);
  {
    RemoteTier writer(options_for(store));
    chain.store_all(writer);
    writer.flush();
    const RemoteTierStats ws = writer.stats();
    EXPECT_EQ(ws.writes_stored, 10);
    EXPECT_EQ(ws.writes_dropped, 0);
    EXPECT_GT(ws.bytes_out, 10u * 2 * chain.page_bytes);
    EXPECT_EQ(ws.pending_write_bytes, 0u);
  }
  EXPECT_EQ(store->size(), 10u);
  // Keys: prefix, fingerprint, block key, group.
  RemoteTier reader(options_for(store));
  const std::string k0 = reader.object_key(chain.keys[1][0], 1);
  const Digest128 key_digest{chain.keys[1][0].hi, chain.keys[1][0].lo};
  EXPECT_EQ(k0, "kvc:" + kFingerprint.hex() + ":" + key_digest.hex() + ":g1");
  const RemoteResult r = lookup_one(reader, chain.request(7, 1));
  EXPECT_EQ(r.first_block, 1);
  ASSERT_EQ(r.blocks, 4);
  for (int32_t g = 0; g < 2; ++g)
    for (int32_t i = 0; i < 4; ++i) {
      const auto got = r.payload(static_cast<size_t>(g), static_cast<size_t>(i));
      const auto want = chain.payload(g, i + 1);
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0) << g << " " << i;
    }
  const RemoteTierStats s = reader.stats();
  EXPECT_EQ(s.lookups, 1);
  EXPECT_EQ(s.hit_blocks, 4);
  EXPECT_EQ(s.miss_blocks, 0);
  EXPECT_EQ(s.corrupt, 0);
  EXPECT_EQ(s.errors, 0);
  EXPECT_GT(s.bytes_in, 8u * 2 * chain.page_bytes);
  // A block read is known: storing it again sends nothing.
  const int64_t sets = store->sets;
  chain.store_all(reader);
  reader.flush();
  EXPECT_EQ(store->sets, sets + 2);  // block 0 of each group was never read here
  EXPECT_EQ(reader.stats().writes_skipped, 8);
}

TEST(RemoteTier, BlocksLoadedFromTheTierAreNotWrittenBack) {
  auto store = std::make_shared<FakeKvStore>();
  Chain chain(2, 1, 2);
  RemoteTier tier(options_for(store));
  chain.store_all(tier, BlockSource::kRemote);
  tier.flush();
  EXPECT_EQ(store->size(), 0u);
  chain.store_all(tier, BlockSource::kDisk);
  tier.flush();
  EXPECT_EQ(store->size(), 2u);
}

TEST(RemoteTier, TheRunStopsAtTheFirstBlockMissingInAnyGroup) {
  auto store = std::make_shared<FakeKvStore>();
  Chain chain(4, 2, 3);
  RemoteTier tier(options_for(store));
  chain.store_all(tier);
  tier.flush();
  {
    std::lock_guard<std::mutex> lock(store->mu);
    store->map.erase(tier.object_key(chain.keys[1][2], 1));
  }
  RemoteTier reader(options_for(store));
  const RemoteResult r = lookup_one(reader, chain.request(1));
  EXPECT_EQ(r.blocks, 2);
  EXPECT_EQ(reader.stats().miss_blocks, 2);
  EXPECT_EQ(reader.stats().corrupt, 0);
}

TEST(RemoteTier, CorruptOtherFingerprintOrOtherTokensIsACountedMiss) {
  auto store = std::make_shared<FakeKvStore>();
  Chain chain(3, 1, 4);
  RemoteTier tier(options_for(store));
  chain.store_all(tier);
  tier.flush();
  RemoteTier reader(options_for(store));
  // One payload byte flipped in block 1: blocks 0 only.
  {
    std::lock_guard<std::mutex> lock(store->mu);
    std::vector<std::byte>& v = store->map.at(tier.object_key(chain.keys[0][1], 0));
    v[v.size() / 2] ^= std::byte{0x01};
  }
  RemoteResult r = lookup_one(reader, chain.request(1));
  EXPECT_EQ(r.blocks, 1);
  EXPECT_EQ(reader.stats().corrupt, 1);
  // A truncated value.
  {
    std::lock_guard<std::mutex> lock(store->mu);
    store->map.at(tier.object_key(chain.keys[0][0], 0)).resize(20);
  }
  r = lookup_one(reader, chain.request(2));
  EXPECT_EQ(r.blocks, 0);
  EXPECT_EQ(reader.stats().corrupt, 3);  // blocks 0 and 1 now
  // Another layout's record under this layout's key (copied by hand): its fingerprint fails.
  const Digest128 other{0x111, 0x222};
  auto store2 = std::make_shared<FakeKvStore>();
  RemoteTier other_tier(options_for(store2, other));
  chain.store_all(other_tier);
  other_tier.flush();
  {
    std::lock_guard<std::mutex> l1(store->mu);
    std::lock_guard<std::mutex> l2(store2->mu);
    store->map[tier.object_key(chain.keys[0][0], 0)] =
        store2->map.at(other_tier.object_key(chain.keys[0][0], 0));
  }
  r = lookup_one(reader, chain.request(3));
  EXPECT_EQ(r.blocks, 0);
  EXPECT_EQ(reader.stats().corrupt, 5);
  // Other tokens under the same key (a caller whose tokens do not hash to the key).
  auto store3 = std::make_shared<FakeKvStore>();
  RemoteTier t3(options_for(store3));
  chain.store_all(t3);
  t3.flush();
  RemoteLookup req = chain.request(4);
  req.tokens[0] += 1;
  RemoteTier reader3(options_for(store3));
  r = lookup_one(reader3, std::move(req));
  EXPECT_EQ(r.blocks, 0);
  EXPECT_EQ(reader3.stats().corrupt, 1);
  EXPECT_EQ(reader3.stats().errors, 0);
}

TEST(RemoteTier, BreakerOpensDropsHalfOpensAndCloses) {
  auto store = std::make_shared<FakeKvStore>();
  Chain chain(2, 1, 5);
  RemoteTierOptions o = options_for(store);
  o.breaker_failures = 3;
  o.breaker_open_seconds = 0.2;
  RemoteTier tier(o);
  store->fail = true;
  for (uint64_t i = 1; i <= 3; ++i) EXPECT_EQ(lookup_one(tier, chain.request(i)).blocks, 0);
  RemoteTierStats s = tier.stats();
  EXPECT_EQ(s.errors, 3);
  EXPECT_EQ(s.breaker, BreakerState::kOpen);
  EXPECT_EQ(s.breaker_opens, 1);
  // Open: lookups are answered at once without a call, writes dropped.
  store->fail = false;
  const int64_t gets = store->gets;
  EXPECT_EQ(lookup_one(tier, chain.request(4)).blocks, 0);
  EXPECT_EQ(store->gets, gets);
  chain.store_all(tier);
  tier.flush();
  s = tier.stats();
  EXPECT_EQ(s.lookups_refused, 1);
  EXPECT_EQ(s.writes_dropped, 2);
  EXPECT_EQ(store->size(), 0u);
  // After the open time: half-open; a failing probe reopens it.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_EQ(tier.stats().breaker, BreakerState::kHalfOpen);
  store->fail = true;
  EXPECT_EQ(lookup_one(tier, chain.request(5)).blocks, 0);
  s = tier.stats();
  EXPECT_EQ(s.breaker, BreakerState::kOpen);
  EXPECT_EQ(s.breaker_opens, 2);
  // A probe that succeeds closes it: writes go through again.
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  store->fail = false;
  EXPECT_EQ(lookup_one(tier, chain.request(6)).blocks, 0);  // nothing stored yet: a miss
  EXPECT_EQ(tier.stats().breaker, BreakerState::kClosed);
  chain.store_all(tier);
  tier.flush();
  EXPECT_EQ(store->size(), 2u);
  EXPECT_EQ(lookup_one(tier, chain.request(7)).blocks, 2);
}

TEST(RemoteTier, WritesPastTheBudgetAreDropped) {
  auto store = std::make_shared<FakeKvStore>();
  Chain chain(10, 1, 6);
  RemoteTierOptions o = options_for(store);
  const size_t record = block_record::record_bytes(kBt, 2 * chain.page_bytes);
  o.max_pending_write_bytes = 3 * record;
  o.write_batch = 1;
  store->delay_ms = 100;  // the writer holds its first record while the rest arrive
  RemoteTier tier(o);
  const auto t0 = std::chrono::steady_clock::now();
  chain.store_all(tier);
  // The store's thread never waited for the slow store.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(50));
  tier.flush();
  const RemoteTierStats s = tier.stats();
  EXPECT_EQ(s.writes_stored, 3);
  EXPECT_EQ(s.writes_dropped, 7);
  EXPECT_EQ(store->size(), 3u);
}

TEST(RemoteTier, AStoreSlowerThanTheDeadlineIsAMiss) {
  auto store = std::make_shared<FakeKvStore>();
  Chain chain(3, 1, 7);
  RemoteTierOptions o = options_for(store);
  o.deadline_seconds = 0.02;
  RemoteTier tier(o);
  chain.store_all(tier);
  tier.flush();
  store->delay_ms = 500;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(lookup_one(tier, chain.request(1)).blocks, 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(300));
  const RemoteTierStats s = tier.stats();
  EXPECT_EQ(s.timeouts, 1);
  EXPECT_EQ(s.errors, 1);
  EXPECT_EQ(s.miss_blocks, 3);
  store->delay_ms = 0;
  EXPECT_EQ(lookup_one(tier, chain.request(2)).blocks, 3);
}

TEST(RemoteTier, AFactoryThatThrowsIsAFailedCallNotAThrow) {
  RemoteTierOptions o;
  o.make_client = []() -> std::unique_ptr<KvClient> {
    throw Error(ErrorKind::kIo, "no connection");
  };
  o.block_tokens = kBt;
  RemoteTier tier(o);
  Chain chain(1, 1, 8);
  EXPECT_EQ(lookup_one(tier, chain.request(1)).blocks, 0);
  EXPECT_EQ(tier.stats().errors, 1);
  EXPECT_THROW(RemoteTier(RemoteTierOptions{}), Error);
}

TEST(BlockRecord, EncodeVerifyRoundTripAndEveryFieldChecked) {
  std::vector<int32_t> tokens = {1, 2, 3, 4};
  std::vector<std::byte> payload(64, std::byte{7});
  const std::span<const std::byte> parts[1] = {payload};
  const BlockKey key{5, 6};
  std::vector<std::byte> rec(block_record::record_bytes(4, payload.size()));
  block_record::encode({kFingerprint, key, BlockKey{1, 2}, 3, tokens}, parts, rec);
  block_record::Expect e{kFingerprint, key, 3, tokens, payload.size()};
  std::span<const std::byte> got;
  ASSERT_EQ(block_record::verify(e, rec, &got), block_record::Verdict::kOk);
  EXPECT_EQ(std::memcmp(got.data(), payload.data(), payload.size()), 0);
  auto bad = e;
  bad.group = 4;
  EXPECT_EQ(block_record::verify(bad, rec), block_record::Verdict::kCorrupt);
  bad = e;
  bad.key = BlockKey{5, 7};
  EXPECT_EQ(block_record::verify(bad, rec), block_record::Verdict::kCorrupt);
  bad = e;
  bad.payload_bytes = 63;
  EXPECT_EQ(block_record::verify(bad, rec), block_record::Verdict::kCorrupt);
  std::vector<int32_t> other = {1, 2, 3, 5};
  bad = e;
  bad.tokens = other;
  EXPECT_EQ(block_record::verify(bad, rec), block_record::Verdict::kOtherTokens);
  rec[rec.size() - 1] ^= std::byte{1};
  EXPECT_EQ(block_record::verify(e, rec), block_record::Verdict::kCorrupt);
}

}  // namespace
}  // namespace kvcache
