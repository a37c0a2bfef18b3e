// PagedKVStore / PagedLayer: spans read through the page table equal the dense containers'
// spans; fork, prefix sharing, sliding groups, crop/reorder/select; out of blocks is a status;
// and a randomized end-to-end property test whose K/V content is a function of (token, pos),
// so that every shared, forked or cropped block can be checked for content.
#include "cache/paged_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "cache/cache.h"
#include "cache/paged_layer.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

// Sequence b of a paged span gathered to f32 [S, H, D] (K or V).
std::vector<float> gather(const PagedKV& kv, int64_t b, bool values) {
  const TensorView& pages = values ? kv.v_pages : kv.k_pages;
  const int64_t H = pages.dim(1), D = pages.dim(3), S = kv.seq_len(b);
  std::vector<float> out(static_cast<size_t>(S * H * D));
  for (int64_t j = 0; j < S; ++j) {
    const int32_t page = kv.indices[kv.indptr[b] + j / kv.block_tokens];
    for (int64_t h = 0; h < H; ++h)
      convert_n(pages.ptr(page, h, j % kv.block_tokens), pages.dtype(),
                out.data() + (j * H + h) * D, DType::kF32, static_cast<size_t>(D));
  }
  return out;
}

// Row b of a dense span, positions [from, S), as f32 [S - from, H, D].
std::vector<float> dense_rows(const TensorView& t, int64_t b, int64_t from = 0) {
  const int64_t H = t.dim(1), S = t.dim(2), D = t.dim(3);
  std::vector<float> out;
  for (int64_t j = from; j < S; ++j)
    for (int64_t h = 0; h < H; ++h) {
      std::vector<float> row(static_cast<size_t>(D));
      convert_n(t.ptr(b, h, j), t.dtype(), row.data(), DType::kF32, static_cast<size_t>(D));
      out.insert(out.end(), row.begin(), row.end());
    }
  return out;
}

CacheConfig two_layer_config(const std::string& impl) {
  CacheConfig c;
  c.options.implementation = impl;
  c.layer_types = {"full_attention", "full_attention"};
  c.options.max_cache_len = 96;
  c.options.max_batch_size = 3;
  c.options.paged.block_tokens = 4;
  return c;
}

TEST(PagedLayer, SpansEqualTheDynamicCacheThroughLifecycleCalls) {
  for (const DType dt : {DType::kF32, DType::kF16}) {
    std::mt19937 rng(7);
    CacheConfig pc = two_layer_config("paged"), dc = two_layer_config("dynamic");
    pc.options.kv_dtype = dc.options.kv_dtype = dt;
    PagedStoreConfig sc;
    sc.block_tokens = 4;
    sc.layer_types = pc.layer_types;
    sc.dtype = dt;
    sc.max_tokens = 3 * 96;
    pc.options.paged.store = std::make_shared<PagedKVStore>(sc);
    PagedKVStore& store = *pc.options.paged.store;
    Cache paged(pc), dense(dc);
    EXPECT_EQ(paged.layer(0).name(), "paged/full_attention");
    auto step = [&](int64_t B, int64_t S) {
      for (int l = 0; l < 2; ++l) {
        const Tensor k = testing_util::random_tensor(DType::kF32, {B, 2, S, 8}, rng);
        const Tensor v = testing_util::random_tensor(DType::kF32, {B, 2, S, 8}, rng);
        ASSERT_EQ(paged.mask_sizes(l, S).kv_length, dense.mask_sizes(l, S).kv_length);
        const KVSpan ps = paged.update(l, k.view(), v.view());
        const KVSpan ds = dense.update(l, k.view(), v.view());
        ASSERT_EQ(ps.kind, KVSpanKind::kPaged);
        ASSERT_EQ(ps.paged.batch, B);
        for (int64_t b = 0; b < B; ++b) {
          ASSERT_EQ(ps.paged.seq_len(b), ds.k.dim(2));
          ASSERT_EQ(gather(ps.paged, b, false), dense_rows(ds.k, b));
          ASSERT_EQ(gather(ps.paged, b, true), dense_rows(ds.v, b));
        }
      }
      ASSERT_EQ(store.check_invariants(), "");
    };
    step(2, 7);
    step(2, 1);
    step(2, 5);  // 13 tokens: 3 full blocks + 1 partial
    for (auto* c : {&paged, &dense}) c->repeat_interleave(2);  // rows 0 0 1 1: forks
    EXPECT_EQ(store.batch().size(), 4u);
    step(4, 2);
    const std::vector<int64_t> beams = {3, 0, 0, 1};
    for (auto* c : {&paged, &dense}) c->reorder(beams);
    step(4, 3);
    for (auto* c : {&paged, &dense}) c->crop(-6);  // 18 -> 12 tokens
    EXPECT_EQ(paged.seq_length(), 12);
    step(4, 1);
    for (auto* c : {&paged, &dense}) c->crop(9);  // into a block shared by forks: copied
    step(4, 2);
    const std::vector<int64_t> keep = {2, 0};
    for (auto* c : {&paged, &dense}) c->select(keep);
    step(2, 4);
    EXPECT_EQ(store.check_invariants(), "");
    // Waste: at most one partial block per sequence and group.
    const PagedGroupStats st = store.stats(0);
    EXPECT_LT(st.allocated_slots - st.live_tokens, 2 * 4);
    paged.reset();
    EXPECT_EQ(store.stats(0).pool.used, 0);
    EXPECT_GT(store.bytes(), store.pool_bytes());
    EXPECT_EQ(paged.bytes(), store.bytes());  // leader counts the shared parts once
  }
}

TEST(PagedLayer, PrivateStoreFromTheRegistryAndClearErrors) {
  CacheConfig c = two_layer_config("paged");
  Cache cache(c);  // no store: one private store per layer
  std::mt19937 rng(1);
  const Tensor k = testing_util::random_tensor(DType::kF32, {1, 2, 5, 8}, rng);
  const KVSpan s = cache.update(0, k.view(), k.view());
  EXPECT_EQ(s.paged.seq_len(0), 5);
  EXPECT_EQ(cache.seq_length(0), 5);
  const Tensor k3 = testing_util::random_tensor(DType::kF32, {3, 2, 1, 8}, rng);
  EXPECT_THROW(cache.update(0, k3.view(), k3.view()), Error);  // batch changed
  c.options.max_cache_len = 0;
  EXPECT_THROW(Cache{c}, Error);  // no store, nothing to size one from
  c.layer_types = {"chunked_attention", "full_attention"};
  c.attention_chunk_size = 4;
  EXPECT_THROW(Cache{c}, Error);  // not served (the registry names what is)
}

// MLA's pair (latent c_kv [B, 1, S, d_c] as K, rotated key k_rot [B, 1, S, d_r] as V: rows of
// different widths) and KV-shared layers (no pages) in one store, through the lifecycle calls
// that copy blocks (fork by repeat_interleave, crop into a shared block): spans equal the
// dynamic cache's, and the pages are exactly blocks · bt · (d_c + d_r) · b per storing layer.
TEST(PagedStore, KAndVOfDifferentWidthsAndSharedLayersWithoutPages) {
  const int64_t dc = 7, dr = 3, bt = 4, blocks = 30;
  std::mt19937 rng(5);
  CacheConfig pc;
  pc.options.implementation = "paged";
  pc.layer_types = {"full_attention", "sliding_attention", "full_attention", "sliding_attention"};
  pc.sliding_window = 6;
  pc.num_kv_shared_layers = 2;  // layer 2 reads 0, layer 3 reads 1
  pc.options.paged.block_tokens = bt;
  CacheConfig dc_cfg = pc;
  dc_cfg.options.implementation = "dynamic";
  PagedStoreConfig sc;
  sc.block_tokens = static_cast<int32_t>(bt);
  sc.layer_types = pc.layer_types;
  sc.sliding_window = pc.sliding_window;
  sc.num_kv_shared_layers = 2;
  sc.kv_heads = 1;
  sc.head_dim = dc;
  sc.head_dim_v = dr;
  sc.group_blocks = {blocks, blocks};
  pc.options.paged.store = std::make_shared<PagedKVStore>(sc);
  PagedKVStore& store = *pc.options.paged.store;
  // Allocated up front (shapes given): storing layers only, K and V at their own widths.
  EXPECT_EQ(store.layer_page_bytes(0), static_cast<size_t>(blocks * bt * (dc + dr) * 4));
  EXPECT_EQ(store.layer_page_bytes(1), static_cast<size_t>(blocks * bt * (dc + dr) * 4));
  EXPECT_EQ(store.layer_page_bytes(2), 0u);
  EXPECT_EQ(store.layer_page_bytes(3), 0u);
  EXPECT_EQ(store.stats(0).block_bytes, static_cast<size_t>(bt * (dc + dr) * 4));
  EXPECT_EQ(predict_pool_bytes(sc), store.pool_bytes());
  Cache paged(pc), dense(dc_cfg);
  dense.activate_past_recording();  // the window container may then crop back (paged always can)
  EXPECT_TRUE(paged.is_shared(2) && paged.is_shared(3));
  auto step = [&](int64_t B, int64_t S) {
    for (int l = 0; l < 2; ++l) {
      const Tensor k = testing_util::random_tensor(DType::kF32, {B, 1, S, dc}, rng);
      const Tensor v = testing_util::random_tensor(DType::kF32, {B, 1, S, dr}, rng);
      const KVSpan ps = paged.update(l, k.view(), v.view());
      const KVSpan ds = dense.update(l, k.view(), v.view());
      ASSERT_EQ(ps.paged.k_pages.dim(3), dc);
      ASSERT_EQ(ps.paged.v_pages.dim(3), dr);
      for (int64_t b = 0; b < B; ++b) {
        // Sliding layers: the dense window keeps positions [kv_offset, S); compare those.
        const std::vector<float> pk = gather(ps.paged, b, false), pv = gather(ps.paged, b, true);
        const auto from = static_cast<size_t>(ds.kv_offset);
        ASSERT_EQ(std::vector<float>(pk.begin() + static_cast<int64_t>(from * dc), pk.end()),
                  dense_rows(ds.k, b))
            << l;
        ASSERT_EQ(std::vector<float>(pv.begin() + static_cast<int64_t>(from * dr), pv.end()),
                  dense_rows(ds.v, b))
            << l;
      }
      // The shared layers read exactly their source's span.
      const KVSpan sh = paged.shared_kv(l + 2);
      EXPECT_EQ(sh.paged.k_pages.data(), ps.paged.k_pages.data());
    }
    ASSERT_EQ(store.check_invariants(), "");
  };
  step(1, 5);
  step(1, 1);
  for (auto* c : {&paged, &dense})
    c->repeat_interleave(2);  // the partial block is copied (both widths)
  step(2, 2);
  for (auto* c : {&paged, &dense}) c->crop(-1);
  step(2, 3);
  // Rows of the wrong width are refused, naming both widths.
  const Tensor k = testing_util::random_tensor(DType::kF32, {2, 1, 1, dc}, rng);
  const Tensor bad_v = testing_util::random_tensor(DType::kF32, {2, 1, 1, dc}, rng);
  try {
    paged.update(0, k.view(), bad_v.view());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K 7 / V 3"), std::string::npos) << e.what();
  }
  // A store and a cache config that disagree on the shared layers are refused.
  CacheConfig mismatched = pc;
  mismatched.num_kv_shared_layers = 0;
  EXPECT_THROW(Cache{mismatched}, Error);
}

TEST(PagedStore, OutOfBlocksIsAStatusAndChangesNothing) {
  PagedStoreConfig sc;
  sc.block_tokens = 4;
  sc.layer_types = {"full_attention"};
  sc.kv_heads = 1;
  sc.head_dim = 4;
  sc.group_blocks = {3};
  PagedKVStore store(sc);
  store.attach_layer(0);
  const SeqId a = store.add_sequence(), b = store.add_sequence();
  const SeqId batch[] = {a, b};
  store.set_batch(batch);
  EXPECT_EQ(store.plan_step(5), StepStatus::kOutOfBlocks);  // 2 + 2 blocks > 3
  EXPECT_EQ(store.length(a), 0);
  EXPECT_EQ(store.check_invariants(), "");
  const std::vector<int32_t> ids(8, 3);
  EXPECT_EQ(store.plan_step(4, ids), StepStatus::kOk);
  const Tensor k = Tensor::zeros(DType::kF32, {2, 1, 4, 4});
  store.write(0, k.view(), k.view());
  std::vector<SeqId> kids;
  EXPECT_TRUE(store.fork(a, 3, kids));  // aligned: shares everything, no block needed
  EXPECT_EQ(kids.size(), 3u);
  EXPECT_EQ(store.plan_step(1), StepStatus::kOutOfBlocks);  // 2 new blocks, 1 left
  // Unplanned protocol use: the capacity error of update().
  EXPECT_THROW(store.write(0, Tensor::zeros(DType::kF32, {2, 1, 1, 4}).view(),
                           Tensor::zeros(DType::kF32, {2, 1, 1, 4}).view()),
               Error);
  EXPECT_EQ(store.check_invariants(), "");
}

// K/V content as a function of (token, position, head, dim): equal prefixes give equal K/V,
// so prefix sharing is semantically right exactly when contents match.
float content(int32_t token, int64_t pos, int64_t h, int64_t d, bool v) {
  return static_cast<float>(token * 1000 + pos) + 0.25f * static_cast<float>(h) +
         0.01f * static_cast<float>(d) + (v ? 0.5f : 0.0f);
}

struct Harness {
  static constexpr int64_t kH = 2, kD = 3;
  PagedKVStore store;
  std::map<SeqId, std::vector<int32_t>> tokens;  // the model: each live sequence's tokens

  explicit Harness(const PagedStoreConfig& c) : store(c) {
    for (size_t l = 0; l < c.layer_types.size(); ++l) store.attach_layer(static_cast<int>(l));
  }

  // Feeds `ids` (one row each) to the batch `seqs` as one step. false: out of blocks.
  bool step(const std::vector<SeqId>& seqs, const std::vector<std::vector<int32_t>>& ids) {
    store.set_batch(seqs);
    const auto S = static_cast<int64_t>(ids[0].size());
    std::vector<int32_t> flat;
    for (const auto& r : ids) flat.insert(flat.end(), r.begin(), r.end());
    if (store.plan_step(S, flat) == StepStatus::kOutOfBlocks) return false;
    const auto B = static_cast<int64_t>(seqs.size());
    Tensor k = Tensor::empty(DType::kF32, {B, kH, S, kD}),
           v = Tensor::empty(DType::kF32, {B, kH, S, kD});
    for (int64_t b = 0; b < B; ++b) {
      const int64_t pos0 = static_cast<int64_t>(tokens[seqs[static_cast<size_t>(b)]].size());
      for (int64_t h = 0; h < kH; ++h)
        for (int64_t s = 0; s < S; ++s)
          for (int64_t d = 0; d < kD; ++d) {
            const int32_t t = ids[static_cast<size_t>(b)][static_cast<size_t>(s)];
            k.view().ptr_as<float>(b, h, s)[d] = content(t, pos0 + s, h, d, false);
            v.view().ptr_as<float>(b, h, s)[d] = content(t, pos0 + s, h, d, true);
          }
    }
    for (int l = 0; l < static_cast<int>(store.config().layer_types.size()); ++l) {
      const KVSpan span = store.write(l, k.view(), v.view());
      EXPECT_EQ(span.paged.batch, B);
    }
    for (int64_t b = 0; b < B; ++b) {
      auto& t = tokens[seqs[static_cast<size_t>(b)]];
      t.insert(t.end(), ids[static_cast<size_t>(b)].begin(), ids[static_cast<size_t>(b)].end());
    }
    return true;
  }

  // Every live sequence's pages hold content(tokens) at every position its groups keep.
  ::testing::AssertionResult contents_ok() {
    for (const auto& [seq, toks] : tokens) {
      if (store.length(seq) != static_cast<int64_t>(toks.size()))
        return ::testing::AssertionFailure() << "sequence " << seq << " length";
      const SeqId one[] = {seq};
      store.set_batch(one);
      // A zero-token view of the tables: plan nothing, read the span through a fresh batch.
      for (int l = 0; l < static_cast<int>(store.config().layer_types.size()); ++l) {
        const int g = store.group_of_layer(l);
        const PagedKV kv = span_of(l);
        const int64_t lo = store.group(g).kind == GroupKind::kSliding
                               ? std::max<int64_t>(0, static_cast<int64_t>(toks.size()) -
                                                          store.group(g).window + 1)
                               : 0;
        const std::vector<float> kg = gather(kv, 0, false), vg = gather(kv, 0, true);
        for (int64_t j = lo; j < static_cast<int64_t>(toks.size()); ++j)
          for (int64_t h = 0; h < kH; ++h)
            for (int64_t d = 0; d < kD; ++d) {
              const size_t at = static_cast<size_t>((j * kH + h) * kD + d);
              if (kg[at] != content(toks[static_cast<size_t>(j)], j, h, d, false) ||
                  vg[at] != content(toks[static_cast<size_t>(j)], j, h, d, true))
                return ::testing::AssertionFailure() << "sequence " << seq << " layer " << l
                                                     << " position " << j << " holds wrong K/V";
            }
      }
    }
    return ::testing::AssertionSuccess();
  }

  PagedKV span_of(int layer) { return store.peek_span(layer).paged; }
};

PagedStoreConfig harness_config(int32_t blocks) {
  PagedStoreConfig c;
  c.block_tokens = 4;
  c.layer_types = {"full_attention", "sliding_attention", "full_attention"};
  c.sliding_window = 6;
  c.kv_heads = Harness::kH;
  c.head_dim = Harness::kD;
  c.group_blocks = {blocks, blocks};
  return c;
}

TEST(PagedStore, ForkToFourBranchesCostsOnlyThePartialBlocks) {
  Harness hx(harness_config(64));
  const SeqId a = hx.store.add_sequence();
  std::vector<int32_t> prompt(37);
  std::iota(prompt.begin(), prompt.end(), 5);
  ASSERT_TRUE(hx.step({a}, {prompt}));  // 9 full blocks + 1 token
  const size_t before = hx.store.used_bytes();
  std::vector<SeqId> kids;
  ASSERT_TRUE(hx.store.fork(a, 4, kids));
  const size_t block_bytes = hx.store.stats(0).block_bytes + hx.store.stats(1).block_bytes;
  // One partial block per branch and group; the sliding group also shares its null blocks.
  EXPECT_EQ(hx.store.used_bytes() - before, 4 * block_bytes);
  for (const SeqId k : kids) hx.tokens[k] = prompt;
  EXPECT_TRUE(hx.contents_ok());
  // A block-aligned sequence forks for free.
  const SeqId b = hx.store.add_sequence();
  ASSERT_TRUE(hx.step({b}, {std::vector<int32_t>(16, 9)}));
  const size_t before2 = hx.store.used_bytes();
  kids.clear();
  ASSERT_TRUE(hx.store.fork(b, 4, kids));
  EXPECT_EQ(hx.store.used_bytes(), before2);
  for (const SeqId k : kids) hx.tokens[k] = hx.tokens[b];
  // Branches diverge: each writes its own continuation.
  std::vector<std::vector<int32_t>> next;
  for (int i = 0; i < 4; ++i) next.push_back({100 + i, 200 + i});
  ASSERT_TRUE(hx.step(kids, next));
  EXPECT_TRUE(hx.contents_ok());
  EXPECT_EQ(hx.store.check_invariants(), "");
}

TEST(PagedStore, PrefixHitSharesBlocksAndSlidingGroupsDropOutOfWindowBlocks) {
  Harness hx(harness_config(40));
  std::vector<int32_t> prompt(30);
  std::iota(prompt.begin(), prompt.end(), 1);
  const SeqId a = hx.store.add_sequence();
  ASSERT_TRUE(hx.step({a}, {prompt}));
  // The sliding group (W = 6, blocks of 4) keeps only blocks a query at 30 can see: [25, 30).
  EXPECT_LE(hx.store.stats(1).pool.used, 1 + 2);  // null block + 2 blocks
  EXPECT_EQ(hx.store.stats(0).pool.used, 8);
  hx.store.free_sequence(a);
  hx.tokens.erase(a);
  // Full blocks stay in the index; the partial last one [28, 30) is kept as a tail.
  EXPECT_EQ(hx.store.stats(0).pool.cached, 8);
  std::vector<int32_t> p2(prompt.begin(), prompt.begin() + 26);
  p2.push_back(77);
  // Every group must serve the hit: a query at 24 sees [19, 24], and the sliding group's
  // dropped blocks [16, 24) are still cached under their keys.
  EXPECT_EQ(hx.store.match_prefix(p2, {}, PagedKVStore::PrefixMatch::kFullBlocks), 24);
  // Then the tail: tokens 24, 25 sit in the cached block [24, 28) of both groups (26 itself is
  // the last token, always computed), so their rows are copied into a fresh block.
  EXPECT_EQ(hx.store.match_prefix(p2), 26);
  const SeqId b = hx.store.add_sequence();
  const int32_t used0 = hx.store.stats(0).pool.used;
  EXPECT_EQ(hx.store.attach_prefix(b, p2), 26);
  EXPECT_EQ(hx.store.stats(0).pool.used, used0 + 7);  // 6 shared blocks revived + 1 copy
  hx.tokens[b] = std::vector<int32_t>(p2.begin(), p2.begin() + 26);
  EXPECT_TRUE(hx.contents_ok());
  ASSERT_TRUE(hx.step({b}, {std::vector<int32_t>(p2.begin() + 26, p2.end())}));
  EXPECT_TRUE(hx.contents_ok());
  // A continuation of a's whole prompt (a chat's next turn) reuses a's kept partial block too:
  // 7 blocks shared, the 2 tokens of [28, 30) copied.
  std::vector<int32_t> next = prompt;
  next.insert(next.end(), {91, 92, 93});
  EXPECT_EQ(hx.store.match_prefix(next, {}, PagedKVStore::PrefixMatch::kFullBlocks), 28);
  const SeqId c = hx.store.add_sequence();
  EXPECT_EQ(hx.store.attach_prefix(c, next), 30);
  hx.tokens[c] = prompt;
  EXPECT_TRUE(hx.contents_ok());
  ASSERT_TRUE(hx.step({c}, {{91, 92, 93}}));
  EXPECT_TRUE(hx.contents_ok());
  // A different salt (tenant) never matches.
  const uint8_t salt[] = {1};
  EXPECT_EQ(hx.store.match_prefix(p2, salt), 0);
  EXPECT_EQ(hx.store.check_invariants(), "");
}

TEST(PagedStore, TailCopyNeedsABlockLeftInEveryGroup) {
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8}, p2 = {1, 2, 3, 4, 5, 6, 99};
  // 3 blocks per group: a holds 2 in each (the sliding group's third is its null block).
  Harness hx(harness_config(3));
  const SeqId a = hx.store.add_sequence();
  ASSERT_TRUE(hx.step({a}, {prompt}));
  EXPECT_EQ(hx.store.match_prefix(p2), 4);  // tokens 5, 6 are cached, but no sliding block is free
  hx.store.free_sequence(a);
  hx.tokens.erase(a);
  // Now both of the sliding group's blocks are cached: the hit revives one, holds the other as
  // the copy's source, and nothing is left to copy into.
  EXPECT_EQ(hx.store.match_prefix(p2), 4);
  const SeqId b = hx.store.add_sequence();
  EXPECT_EQ(hx.store.attach_prefix(b, p2), 4);
  hx.tokens[b] = {1, 2, 3, 4};
  EXPECT_TRUE(hx.contents_ok());
  EXPECT_EQ(hx.store.check_invariants(), "");

  Harness roomy(harness_config(4));  // one more block per group: the tail is copied
  const SeqId c = roomy.store.add_sequence();
  ASSERT_TRUE(roomy.step({c}, {prompt}));
  const SeqId d = roomy.store.add_sequence();
  EXPECT_EQ(roomy.store.attach_prefix(d, p2), 6);
  roomy.tokens[d] = {1, 2, 3, 4, 5, 6};
  EXPECT_TRUE(roomy.contents_ok());
  ASSERT_TRUE(roomy.step({d}, {{99}}));
  EXPECT_TRUE(roomy.contents_ok());
  EXPECT_EQ(roomy.store.check_invariants(), "");
}

TEST(PagedStore, RandomizedOperationsKeepInvariantsAndContents) {
  std::mt19937 rng(99);
  Harness hx(harness_config(48));
  auto rnd = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto live = [&] {
    std::vector<SeqId> v;
    for (const auto& [s, t] : hx.tokens) v.push_back(s);
    return v;
  };
  int refused = 0, hits = 0;
  for (int it = 0; it < 600; ++it) {
    const int op = rnd(0, 9);
    std::vector<SeqId> seqs = live();
    if (op <= 2 || seqs.empty()) {  // new request with a prefix from a tiny alphabet
      std::vector<int32_t> p(static_cast<size_t>(rnd(1, 22)));
      for (auto& t : p) t = rnd(0, 1);
      const SeqId s = hx.store.add_sequence();
      const int64_t m = hx.store.attach_prefix(s, p);
      hits += m > 0;
      hx.tokens[s] = std::vector<int32_t>(p.begin(), p.begin() + m);
      if (!hx.step({s}, {std::vector<int32_t>(p.begin() + m, p.end())})) {
        ++refused;
        hx.store.free_sequence(s);
        hx.tokens.erase(s);
      }
    } else if (op <= 4) {  // decode a random subset
      std::shuffle(seqs.begin(), seqs.end(), rng);
      seqs.resize(static_cast<size_t>(rnd(1, static_cast<int>(seqs.size()))));
      std::vector<std::vector<int32_t>> ids;
      const int n = rnd(1, 3);
      for (size_t i = 0; i < seqs.size(); ++i) {
        ids.emplace_back();
        for (int j = 0; j < n; ++j) ids.back().push_back(rnd(0, 1));
      }
      refused += !hx.step(seqs, ids);
    } else if (op == 5) {
      const SeqId s = seqs[static_cast<size_t>(rnd(0, static_cast<int>(seqs.size()) - 1))];
      std::vector<SeqId> kids;
      if (hx.store.fork(s, rnd(1, 3), kids))
        for (const SeqId k : kids) hx.tokens[k] = hx.tokens[s];
      else
        ++refused;
    } else if (op <= 7) {
      const SeqId s = seqs[static_cast<size_t>(rnd(0, static_cast<int>(seqs.size()) - 1))];
      hx.store.free_sequence(s);
      hx.tokens.erase(s);
    } else if (op == 8) {  // crop within what every group still holds
      const SeqId s = seqs[static_cast<size_t>(rnd(0, static_cast<int>(seqs.size()) - 1))];
      const SeqId one[] = {s};
      hx.store.set_batch(one);
      const auto len = static_cast<int64_t>(hx.tokens[s].size());
      const int64_t drop = rnd(1, 3);
      try {
        hx.store.crop(-drop);
        hx.tokens[s].resize(static_cast<size_t>(std::max<int64_t>(0, len - drop)));
      } catch (const Error&) {  // the window already dropped the keys: refused, unchanged
        EXPECT_EQ(hx.store.length(s), len);
      }
    } else {
      hx.store.pool(rnd(0, 1)).evict(rnd(1, 4));
    }
    ASSERT_EQ(hx.store.check_invariants(), "") << "iteration " << it << " op " << op;
    ASSERT_TRUE(hx.contents_ok()) << "iteration " << it << " op " << op;
    for (int g = 0; g < 2; ++g) {
      const PagedGroupStats st = hx.store.stats(g);
      ASSERT_LE(st.allocated_slots - st.live_tokens, 3 * static_cast<int64_t>(hx.tokens.size()));
    }
  }
  EXPECT_GT(hits, 10);
  EXPECT_GT(refused, 0);  // the pool ran dry at times: a status, never a crash
}

// Speculative decoding's rollback on a sliding group (W = 6, blocks of 4): without a bound
// the step's close releases the blocks its window left, so a crop of 3 after 4 one-token steps
// is refused; with set_rollback_tokens(4) the crop succeeds, every kept position holds its
// K/V, and later steps stay exact. The blocks held stay bounded.
TEST(PagedStore, RollbackBoundKeepsTheSlidingBlocksACropNeeds) {
  for (const bool bounded : {false, true}) {
    Harness hx(harness_config(40));
    if (bounded) hx.store.set_rollback_tokens(4);
    const SeqId a = hx.store.add_sequence();
    std::vector<int32_t> prompt(21);
    std::iota(prompt.begin(), prompt.end(), 1);
    ASSERT_TRUE(hx.step({a}, {prompt}));
    int refused = 0;
    for (int it = 0; it < 12; ++it) {
      for (int i = 0; i < 4; ++i) ASSERT_TRUE(hx.step({a}, {{50 + it * 4 + i}}));
      hx.store.set_batch(std::vector<SeqId>{a});
      try {
        hx.store.crop(-3);
        auto& t = hx.tokens[a];
        t.resize(t.size() - 3);
      } catch (const Error& e) {
        ++refused;
        EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
      }
      EXPECT_TRUE(hx.contents_ok());
      EXPECT_EQ(hx.store.check_invariants(), "");
      // Window (6) + bound (4) within blocks of 4: at most 4 blocks, plus the null block.
      if (bounded) {
        EXPECT_LE(hx.store.stats(1).pool.used, 1 + 4);
      }
    }
    if (bounded) {
      EXPECT_EQ(refused, 0);
    } else {
      EXPECT_GT(refused, 0);
    }
  }
  Harness hx(harness_config(8));
  EXPECT_THROW(hx.store.set_rollback_tokens(-1), Error);
}

}  // namespace
}  // namespace kvcache
