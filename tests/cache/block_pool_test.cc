// BlockPool: free list / ref counts / lazy LRU eviction / prefix index, unit tests and a
// randomized property test against a plain model of the pool.
#include "cache/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <random>
#include <span>
#include <vector>

#include "core/error.h"

namespace kvcache {
namespace {

std::vector<int32_t> iota_tokens(int32_t n, int32_t start) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = start + i;
  return t;
}

TEST(BlockKey, ChainsParentGroupExtraAndTokens) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  const BlockKey ka = block_key({}, 0, {}, a);
  EXPECT_EQ(ka, block_key({}, 0, {}, a));  // deterministic
  EXPECT_NE(ka, block_key({}, 0, {}, b));
  EXPECT_NE(ka, block_key({}, 1, {}, a));  // layer group
  const std::vector<uint8_t> salt = {7};
  EXPECT_NE(ka, block_key({}, 0, salt, a));                     // tenant salt
  EXPECT_NE(block_key(ka, 0, {}, a), block_key({}, 0, {}, a));  // parent
  EXPECT_FALSE(ka == BlockKey{});
}

// The disk tier's write-behind: told of LRU evictions only (allocate, evict), with the block's
// key, parent and tokens while it still holds them; not of forget() or clear_index().
TEST(BlockPool, TheEvictHookSeesLruEvictionsOnly) {
  BlockPool pool({.num_blocks = 3, .block_tokens = 2});
  struct Seen {
    int32_t id;
    BlockKey key, parent;
    std::vector<int32_t> tokens;
  };
  std::vector<Seen> seen;
  int dropped = 0;
  pool.set_evict_hook([&](int32_t id, const BlockKey& key, const BlockKey& parent,
                          std::span<const int32_t> tokens) {
    EXPECT_TRUE(pool.is_keyed(id));  // called before the key goes
    seen.push_back({id, key, parent, std::vector<int32_t>(tokens.begin(), tokens.end())});
  });
  pool.set_key_drop_hook([&](const BlockKey&) { ++dropped; });
  std::vector<int32_t> ids;
  ASSERT_TRUE(pool.allocate(3, ids));
  const std::vector<int32_t> t0 = iota_tokens(2, 10), t1 = iota_tokens(2, 20),
                             t2 = iota_tokens(2, 30);
  const BlockKey k0 = block_key({}, 0, {}, t0), k1 = block_key(k0, 0, {}, t1),
                 k2 = block_key({}, 0, {}, t2);
  ASSERT_TRUE(pool.commit(ids[0], k0, {}, t0));
  ASSERT_TRUE(pool.commit(ids[1], k1, k0, t1));
  ASSERT_TRUE(pool.commit(ids[2], k2, {}, t2));
  pool.forget(ids[2]);  // a crop: no write-behind
  EXPECT_TRUE(seen.empty());
  EXPECT_EQ(dropped, 1);
  pool.release_table(std::vector<int32_t>{ids[0], ids[1]});  // k1 released first: LRU
  pool.release(ids[2]);
  std::vector<int32_t> more;
  ASSERT_TRUE(pool.allocate(2, more));  // the free block, then k1's
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].id, ids[1]);
  EXPECT_EQ(seen[0].key, k1);
  EXPECT_EQ(seen[0].parent, k0);
  EXPECT_EQ(seen[0].tokens, t1);
  EXPECT_EQ(pool.evict(1), 1);  // k0
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1].key, k0);
  EXPECT_EQ(seen[1].parent, BlockKey{});
  ASSERT_TRUE(pool.commit(more[0], k2, {}, t2));
  pool.clear_index();  // no write-behind either
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(dropped, 4);
}

TEST(BlockPool, AllocateReleaseAndOutOfBlocksIsAStatus) {
  BlockPool pool({.num_blocks = 4, .block_tokens = 2});
  std::vector<int32_t> ids;
  ASSERT_TRUE(pool.allocate(3, ids));
  EXPECT_EQ(pool.stats().used, 3);
  EXPECT_FALSE(pool.allocate(2, ids));  // only one left: refused, nothing changed
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(pool.stats().free, 1);
  pool.retain(ids[0]);
  EXPECT_EQ(pool.ref_count(ids[0]), 2);
  pool.release_table(ids);
  EXPECT_EQ(pool.stats().used, 1);
  pool.release(ids[0]);
  const BlockPoolStats s = pool.stats();
  EXPECT_EQ(s.free, 4);
  EXPECT_EQ(s.used + s.cached, 0);
  EXPECT_EQ(pool.check_invariants(), "");
  EXPECT_THROW(BlockPool({.num_blocks = 0, .block_tokens = 2}), Error);
}

TEST(BlockPool, FreedBlocksKeepTheirKeyUntilReusedLeastRecentlyReleasedFirst) {
  BlockPool pool({.num_blocks = 4, .block_tokens = 4});
  const std::vector<int32_t> tokens = iota_tokens(12, 100);  // 3 full blocks
  std::vector<int32_t> table;
  ASSERT_TRUE(pool.allocate(3, table));
  BlockKey parent;
  for (size_t i = 0; i < 3; ++i) {
    const std::span<const int32_t> blk(tokens.data() + 4 * i, 4);
    const BlockKey key = block_key(parent, 0, {}, blk);
    ASSERT_TRUE(pool.commit(table[i], key, parent, blk));
    parent = key;
  }
  EXPECT_EQ(pool.match_prefix(tokens), table);
  pool.release_table(table);  // tail first: block 2 is the oldest cached one
  EXPECT_EQ(pool.stats().cached, 3);
  EXPECT_EQ(pool.match_prefix(tokens).size(), 3u);  // content kept
  // One unkeyed block goes first, then the tail of the released table.
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(2, got));
  EXPECT_FALSE(pool.is_keyed(got[0]));
  EXPECT_EQ(got[1], table[2]);
  EXPECT_EQ(pool.stats().evictions, 1);
  EXPECT_EQ(pool.match_prefix(tokens), std::vector<int32_t>(table.begin(), table.begin() + 2));
  // A prefix hit revives a cached block from the middle of the free list.
  pool.acquire(table[1]);
  EXPECT_EQ(pool.stats().cached, 1);
  EXPECT_EQ(pool.check_invariants(), "");
  // Equal keys with different stored tokens are refused (the collision check).
  const BlockKey k0 = block_key({}, 0, {}, std::span<const int32_t>(tokens.data(), 4));
  const std::vector<int32_t> other = {1, 1, 1, 1};
  EXPECT_EQ(pool.lookup(k0, other), -1);
  EXPECT_EQ(pool.lookup(k0, std::span<const int32_t>(tokens.data(), 4)), table[0]);
  // Content computed twice while the indexed copy is only cached: the live copy takes the key
  // over and the cached one becomes free (a prefix must not hang on the block evicted first).
  const std::span<const int32_t> blk0(tokens.data(), 4);
  EXPECT_TRUE(pool.commit(got[0], k0, {}, blk0));
  EXPECT_TRUE(pool.is_keyed(got[0]));
  EXPECT_FALSE(pool.is_keyed(table[0]));
  EXPECT_EQ(pool.ref_count(table[0]), 0);
  EXPECT_EQ(pool.stats().cached, 0);
  EXPECT_EQ(pool.lookup(k0, blk0), got[0]);
  EXPECT_EQ(pool.match_prefix(tokens), (std::vector<int32_t>{got[0], table[1]}));
  EXPECT_EQ(pool.check_invariants(), "");
  // While the indexed copy is held, a second copy is refused and stays unkeyed.
  std::vector<int32_t> third;
  ASSERT_TRUE(pool.allocate(1, third));
  EXPECT_EQ(third[0], table[0]);  // the freed copy is handed out first
  EXPECT_FALSE(pool.commit(third[0], k0, {}, blk0));
  EXPECT_FALSE(pool.is_keyed(third[0]));
  EXPECT_EQ(pool.lookup(k0, blk0), got[0]);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, LongestChildIsTheCachedContinuationSharingTheMostTokens) {
  BlockPool pool({.num_blocks = 4, .block_tokens = 4});
  const std::vector<int32_t> first = {1, 2, 3, 4}, a = {5, 6, 7, 8}, b = {5, 6, 9, 9};
  std::vector<int32_t> table;
  ASSERT_TRUE(pool.allocate(3, table));
  const BlockKey k0 = block_key({}, 0, {}, first);
  ASSERT_TRUE(pool.commit(table[0], k0, {}, first));
  ASSERT_TRUE(pool.commit(table[1], block_key(k0, 0, {}, a), k0, a));
  ASSERT_TRUE(pool.commit(table[2], block_key(k0, 0, {}, b), k0, b));
  int32_t n = -1;
  EXPECT_EQ(pool.longest_child(k0, {}, std::vector<int32_t>{5, 6, 7}, n), table[1]);
  EXPECT_EQ(n, 3);
  EXPECT_EQ(pool.longest_child(k0, {}, std::vector<int32_t>{5, 6, 9}, n), table[2]);
  EXPECT_EQ(n, 3);
  const int32_t either = pool.longest_child(k0, {}, std::vector<int32_t>{5, 1, 1}, n);
  EXPECT_TRUE(either == table[1] || either == table[2]);
  EXPECT_EQ(n, 1);
  EXPECT_EQ(pool.longest_child(k0, {}, std::vector<int32_t>{7}, n), -1);  // no first token shared
  EXPECT_EQ(n, 0);
  // The root's children: only those keyed under the same extra keys (a tenant's salt).
  EXPECT_EQ(pool.longest_child({}, {}, std::vector<int32_t>{1, 2}, n), table[0]);
  EXPECT_EQ(n, 2);
  const uint8_t salt[] = {7};
  EXPECT_EQ(pool.longest_child({}, salt, std::vector<int32_t>{1, 2}, n), -1);
  // Released blocks still serve (content kept) until evicted.
  pool.release_table(table);
  EXPECT_EQ(pool.longest_child(k0, {}, std::vector<int32_t>{5, 6, 7}, n), table[1]);
  pool.evict(3);
  EXPECT_EQ(pool.longest_child(k0, {}, std::vector<int32_t>{5, 6, 7}, n), -1);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, AKeptTailIsCachedFoundByLongestChildAndEvictedLikeAKeyedBlock) {
  BlockPool pool({.num_blocks = 3, .block_tokens = 4});
  const std::vector<int32_t> first = {1, 2, 3, 4}, part = {5, 6};
  std::vector<int32_t> table;
  ASSERT_TRUE(pool.allocate(2, table));
  const BlockKey k0 = block_key({}, 0, {}, first);
  ASSERT_TRUE(pool.commit(table[0], k0, {}, first));
  pool.keep_tail(table[1], k0, {}, part);
  EXPECT_TRUE(pool.is_tail(table[1]));
  EXPECT_FALSE(pool.is_keyed(table[1]));
  pool.release_table(table);
  EXPECT_EQ(pool.stats().cached, 2);
  EXPECT_EQ(pool.check_invariants(), "");
  int32_t n = -1;
  // At most the tail's own tokens match, whatever the head's length.
  EXPECT_EQ(pool.longest_child(k0, {}, std::vector<int32_t>{5, 6, 7}, n), table[1]);
  EXPECT_EQ(n, 2);
  EXPECT_EQ(pool.longest_child(k0, {}, std::vector<int32_t>{5, 9}, n), table[1]);
  EXPECT_EQ(n, 1);
  const uint8_t salt[] = {3};
  EXPECT_EQ(pool.longest_child(k0, salt, std::vector<int32_t>{5, 6}, n), -1);  // another tenant
  pool.acquire(table[1]);  // the copy's source is held, then let go: still kept
  pool.release(table[1]);
  EXPECT_TRUE(pool.is_tail(table[1]));
  // Allocation takes the free block first, then evicts least recently released first.
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(3, got));
  EXPECT_FALSE(pool.is_tail(table[1]));
  EXPECT_EQ(pool.longest_child(k0, {}, std::vector<int32_t>{5, 6}, n), -1);
  EXPECT_EQ(pool.stats().evictions, 2);
  EXPECT_EQ(pool.check_invariants(), "");
}

TEST(BlockPool, BytesMatchThePrediction) {
  const BlockPoolConfig c{.num_blocks = 37, .block_tokens = 16};
  BlockPool pool(c);
  EXPECT_EQ(pool.bytes(), BlockPool::predict_bytes(c));
  EXPECT_GT(pool.bytes(), 37u * 16u * sizeof(int32_t));
}

// The model: who holds what (tables), which keys are indexed, the release order of cached
// blocks. The pool must agree with it after every operation.
struct Model {
  std::vector<std::vector<int32_t>> tables;  // each entry holds one reference
  std::map<int32_t, BlockKey> keyed;         // block -> key
  std::deque<int32_t> cached_order;          // keyed ref-0 blocks, least recently released first
  int32_t n = 0;

  std::vector<int32_t> refs() const {
    std::vector<int32_t> r(static_cast<size_t>(n), 0);
    for (const auto& t : tables)
      for (const int32_t id : t) ++r[static_cast<size_t>(id)];
    return r;
  }
};

void expect_agree(const BlockPool& pool, const Model& m, const std::string& op) {
  ASSERT_EQ(pool.check_invariants(), "") << "after " << op;
  const std::vector<int32_t> refs = m.refs();
  int32_t used = 0;
  for (int32_t id = 0; id < m.n; ++id) {
    ASSERT_EQ(pool.ref_count(id), refs[static_cast<size_t>(id)])
        << "block " << id << " after " << op;
    ASSERT_EQ(pool.is_keyed(id), m.keyed.count(id) > 0) << "block " << id << " after " << op;
    used += refs[static_cast<size_t>(id)] > 0;
  }
  const BlockPoolStats s = pool.stats();
  ASSERT_EQ(s.used, used) << op;
  ASSERT_EQ(s.cached, static_cast<int32_t>(m.cached_order.size())) << op;
  ASSERT_EQ(s.free + s.used + s.cached, s.total) << op;
}

TEST(BlockPool, RandomizedAgainstAModel) {
  constexpr int32_t kBlocks = 24, kTok = 3;
  std::mt19937 rng(1234);
  BlockPool pool({.num_blocks = kBlocks, .block_tokens = kTok});
  Model m;
  m.n = kBlocks;
  auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto on_zero = [&](int32_t id) {  // a block's last reference went away
    if (m.keyed.count(id)) m.cached_order.push_back(id);
  };
  auto release_table = [&](size_t t) {
    std::vector<int32_t> ids = m.tables[t];
    m.tables.erase(m.tables.begin() + static_cast<ptrdiff_t>(t));
    pool.release_table(ids);
    const std::vector<int32_t> refs = m.refs();
    for (auto it = ids.rbegin(); it != ids.rend(); ++it) {  // tail first, as the pool does
      const int32_t later = static_cast<int32_t>(std::count(ids.begin(), it.base() - 1, *it));
      if (refs[static_cast<size_t>(*it)] == 0 && later == 0) on_zero(*it);
    }
  };
  auto allocate = [&](int32_t k, std::vector<int32_t>& out) {
    const size_t before = out.size();
    const int32_t free_before = pool.stats().free;
    if (!pool.allocate(k, out)) return false;
    // Unkeyed blocks first, then cached ones least recently released first.
    for (size_t i = before; i < out.size(); ++i) {
      const int32_t id = out[i];
      if (static_cast<int32_t>(i - before) < free_before) {
        EXPECT_EQ(m.keyed.count(id), 0u) << "a cached block was evicted while free ones remained";
      } else {
        EXPECT_FALSE(m.cached_order.empty());
        EXPECT_EQ(id, m.cached_order.front()) << "eviction not in LRU order";
        m.cached_order.pop_front();
        m.keyed.erase(id);
      }
    }
    return true;
  };

  for (int step = 0; step < 3000; ++step) {
    const int op = rnd(0, 9);
    std::string name;
    if (op <= 3) {  // a request: match its prefix, take the hit, allocate the rest, commit
      name = "request";
      const int32_t n_tok = rnd(1, 4 * kTok + 2);
      std::vector<int32_t> tokens(static_cast<size_t>(n_tok));
      for (auto& t : tokens) t = rnd(0, 1);  // tiny alphabet: prefixes repeat often
      const std::vector<int32_t> hit = pool.match_prefix(tokens);
      // The model's answer: walk the key chain through its own index.
      size_t expect_hit = 0;
      BlockKey parent;
      for (size_t off = 0; off + kTok <= tokens.size(); off += kTok) {
        parent = block_key(parent, 0, {}, std::span<const int32_t>(tokens.data() + off, kTok));
        bool found = false;
        for (const auto& [id, key] : m.keyed) found |= key == parent;
        if (!found) break;
        ++expect_hit;
      }
      ASSERT_EQ(hit.size(), expect_hit) << "step " << step;
      {  // longest_child (the family index) against a scan of every keyed block
        BlockKey up;
        for (size_t b = 0; b < hit.size(); ++b)
          up = block_key(up, 0, {}, std::span<const int32_t>(tokens.data() + b * kTok, kTok));
        const size_t off = hit.size() * kTok;
        const std::span<const int32_t> head(tokens.data() + off,
                                            std::min<size_t>(kTok - 1, tokens.size() - off));
        int32_t best = 0;
        for (int32_t id = 0; id < kBlocks; ++id) {
          if (!pool.is_keyed(id) || block_key(up, 0, {}, pool.tokens(id)) != pool.key(id)) continue;
          const std::span<const int32_t> st = pool.tokens(id);
          best = std::max(
              best, static_cast<int32_t>(std::mismatch(head.begin(), head.end(), st.begin()).first -
                                         head.begin()));
        }
        int32_t got = -1;
        const int32_t id = pool.longest_child(up, {}, head, got);
        ASSERT_EQ(got, best) << "step " << step;
        ASSERT_EQ(id >= 0, best > 0) << "step " << step;
      }
      const int32_t n_blocks = (n_tok + kTok - 1) / kTok;
      int32_t hit_cached = 0;
      for (const int32_t id : hit) hit_cached += pool.ref_count(id) == 0;
      const int32_t need = n_blocks - static_cast<int32_t>(hit.size());
      if (need > pool.num_available() - hit_cached) {
        std::vector<int32_t> dummy;
        EXPECT_FALSE(pool.allocate(pool.num_available() + 1, dummy));
        name += " (refused)";
      } else {
        std::vector<int32_t> table;
        for (const int32_t id : hit) {
          if (pool.ref_count(id) == 0) {
            auto it = std::find(m.cached_order.begin(), m.cached_order.end(), id);
            ASSERT_NE(it, m.cached_order.end());
            m.cached_order.erase(it);
          }
          pool.acquire(id);
          table.push_back(id);
        }
        ASSERT_TRUE(allocate(need, table));
        parent = {};
        for (int32_t b = 0; b < n_blocks; ++b) {
          const size_t off = static_cast<size_t>(b) * kTok;
          if (off + kTok > tokens.size()) break;  // partial block: never keyed
          const std::span<const int32_t> blk(tokens.data() + off, kTok);
          const BlockKey up = parent;
          parent = block_key(parent, 0, {}, blk);
          const int32_t id = table[static_cast<size_t>(b)];
          if (b < static_cast<int32_t>(hit.size())) continue;
          int32_t holder = -1;
          for (const auto& [kid, key] : m.keyed)
            if (key == parent) holder = kid;
          // A held copy keeps the key; a cached one hands it over and becomes free.
          const bool held = holder >= 0 && m.refs()[static_cast<size_t>(holder)] > 0;
          EXPECT_EQ(pool.commit(id, parent, up, blk), !held);
          if (holder >= 0 && !held) {
            m.keyed.erase(holder);
            auto it = std::find(m.cached_order.begin(), m.cached_order.end(), holder);
            ASSERT_NE(it, m.cached_order.end());
            m.cached_order.erase(it);
          }
          if (!held) m.keyed[id] = parent;
        }
        m.tables.push_back(std::move(table));
      }
    } else if (op <= 5 && !m.tables.empty()) {  // finish a request
      name = "release";
      release_table(static_cast<size_t>(rnd(0, static_cast<int>(m.tables.size()) - 1)));
    } else if (op == 6 && !m.tables.empty()) {  // fork: share every block but copy the last
      name = "fork";
      const auto& src =
          m.tables[static_cast<size_t>(rnd(0, static_cast<int>(m.tables.size()) - 1))];
      std::vector<int32_t> child;
      if (pool.num_available() >= 1 && !src.empty()) {
        for (size_t i = 0; i + 1 < src.size(); ++i) {
          pool.retain(src[i]);
          child.push_back(src[i]);
        }
        ASSERT_TRUE(allocate(1, child));
        m.tables.push_back(std::move(child));
      }
    } else if (op == 7) {  // explicit eviction
      name = "evict";
      const int32_t k = rnd(0, 3);
      const int32_t done = pool.evict(k);
      ASSERT_EQ(done, std::min<int32_t>(k, static_cast<int32_t>(m.cached_order.size())));
      for (int32_t i = 0; i < done; ++i) {
        m.keyed.erase(m.cached_order.front());
        m.cached_order.pop_front();
      }
    } else if (op == 8) {  // raw allocation under pressure, released at once
      name = "burst";
      std::vector<int32_t> ids;
      const int32_t k = rnd(0, kBlocks);
      if (allocate(k, ids)) {
        m.tables.push_back(ids);
        release_table(m.tables.size() - 1);
      } else {
        ASSERT_GT(k, pool.num_available());
      }
    } else if (op == 9 && rnd(0, 20) == 0) {
      name = "clear_index";
      pool.clear_index();
      m.keyed.clear();
      m.cached_order.clear();
    }
    expect_agree(pool, m, name.empty() ? "noop" : name);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(pool.stats().hits, 0);
  EXPECT_GT(pool.stats().evictions, 0);
}

}  // namespace
}  // namespace kvcache
