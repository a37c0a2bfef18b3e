// DeepSeek-V4 / V3.2 layers in the paged cache (issue 39): "paged/compressed_sparse_attention",
// "paged/heavily_compressed_attention" and "paged/deepseek_sparse_attention" over one store.
// A toy driver feeds every layer the way the model does (the sliding K==V window through
// update(kv, kv), then per batch row and stream store_compression_weights, CSA's
// update_overlap_state, update_compressor_states) with fresh values, and an independent
// per-sequence reference of the contract (compressed_cache_layer.h) says what every chunk,
// prior overlap, window and entry series must be: sequences of different lengths batched
// together, chunks of any length (no window alignment), fork, crop, abort, prefix refusal.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "cache/cache.h"
#include "cache/compressed_cache_layer.h"
#include "cache/paged_compressed_layer.h"
#include "cache/paged_store.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

constexpr int64_t kHd = 8, kIdx = 4, kW = 6;
const std::vector<std::string> kTypes = {"sliding_attention", "compressed_sparse_attention",
                                         "heavily_compressed_attention",
                                         "compressed_sparse_attention"};

PagedStoreConfig v4_config(int32_t slots = 6) {
  PagedStoreConfig c;
  c.block_tokens = 4;
  c.layer_types = kTypes;
  c.sliding_window = kW;
  c.kv_heads = 1;
  c.head_dim = kHd;
  c.head_dim_v = kHd;
  c.shared_kv = true;
  c.compressed.rates = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 8}};
  c.compressed.index_head_dim = kIdx;
  c.max_tokens = 400;
  c.linear_slots = slots;
  return c;
}

using Rows = std::vector<std::vector<float>>;

// What one sequence fed so far: per layer its window rows, per (layer, stream) its kv and gate
// rows (gate as the model passed it to update_overlap_state: +1) and its entries.
struct Ref {
  std::map<int, Rows> window;
  std::map<std::pair<int, int>, Rows> kv, gate, entries;
  int64_t len = 0;
};

struct V4 {
  std::shared_ptr<PagedKVStore> store;
  std::unique_ptr<Cache> cache;
  std::map<SeqId, Ref> refs;
  float counter = 0;

  explicit V4(const PagedStoreConfig& sc) {
    store = std::make_shared<PagedKVStore>(sc);
    CacheConfig cc = testing_util::paged_config_over(store);
    cc.kv_content = CacheConfig::KVContent::kSharedKV;
    cache = std::make_unique<Cache>(cc);
  }
  float next() {
    counter += 1;
    return static_cast<float>(static_cast<int>(counter) % 997) * 0.01f - 4.0f;
  }
  Tensor fresh(const Shape& s) {
    Tensor t = Tensor::empty(DType::kF32, s);
    auto* p = static_cast<float*>(t.data());
    for (int64_t i = 0; i < t.view().numel(); ++i) p[i] = next();
    return t;
  }
  static std::vector<float> row(const TensorView& v, int64_t i) {
    const auto* p = static_cast<const float*>(v.ptr(i));
    return std::vector<float>(p, p + v.dim(1));
  }

  // One step of n tokens over the store's batch (planned here when plan is true); checks
  // everything the layers return against the references.
  void step(int64_t n, bool plan = true, std::span<const int32_t> tokens = {}) {
    const std::vector<SeqId> batch(store->batch().begin(), store->batch().end());
    if (plan) {
      ASSERT_EQ(store->plan_step(n, tokens), StepStatus::kOk);
    }
    const auto B = static_cast<int64_t>(batch.size());
    for (int l = 0; l < static_cast<int>(kTypes.size()); ++l) {
      Tensor kv = fresh({B, 1, n, kHd});
      const KVSpan span = cache->update(l, kv.view(), kv.view());
      ASSERT_EQ(span.kind, KVSpanKind::kPaged);
      EXPECT_EQ(span.paged.v_pages.data(), span.paged.k_pages.data());  // K==V: one page set
      const Tensor got = gather_paged(span.paged, false);
      for (int64_t b = 0; b < B; ++b) {
        Ref& r = refs[batch[static_cast<size_t>(b)]];
        Rows& w = r.window[l];
        for (int64_t t = 0; t < n; ++t) {
          const float* p = kv.view().ptr_as<float>(b, 0, t);
          w.emplace_back(p, p + kHd);
        }
        const auto len = static_cast<int64_t>(w.size());
        ASSERT_EQ(span.paged.seq_len(b), len);
        for (int64_t p = std::max<int64_t>(0, len - kW); p < len; ++p)
          for (int64_t d = 0; d < kHd; ++d)
            ASSERT_EQ(got.view().ptr_as<float>(b, 0, p)[d],
                      w[static_cast<size_t>(p)][static_cast<size_t>(d)])
                << "layer " << l << " row " << b << " position " << p;
      }
      if (l == 0) continue;
      // Cache::compressed_layer is v4cache's; the layer object is the same.
      auto& cl = dynamic_cast<CompressedCacheLayer&>(cache->layer(l));
      const int64_t r = cl.compress_rate();
      for (int s = 0; s < (cl.has_indexer() ? 2 : 1); ++s) {
        const auto stream = static_cast<CompressedStream>(s);
        const int64_t w = s == 0 ? (cl.has_overlap() ? 2 * kHd : kHd) : 2 * kIdx;
        const int64_t d = s == 0 ? kHd : kIdx;
        for (int64_t b = 0; b < B; ++b) {
          Ref& ref = refs[batch[static_cast<size_t>(b)]];
          Rows& hkv = ref.kv[{l, s}];
          Rows& hgate = ref.gate[{l, s}];
          Rows& hent = ref.entries[{l, s}];
          const auto base = static_cast<int64_t>(hkv.size());
          Tensor kvb = fresh({n, w}), gate = fresh({n, w});
          const CompressionChunk chunk =
              cl.store_compression_weights(stream, b, kvb.view(), gate.view());
          for (int64_t t = 0; t < n; ++t) {
            hkv.push_back(row(kvb.view(), t));
            hgate.push_back(row(gate.view(), t));
            for (float& x : hgate.back()) x += 1.0f;  // the model's position bias
          }
          const int64_t e0 = base / r, e1 = (base + n) / r;
          ASSERT_EQ(chunk.n_windows, e1 - e0);
          ASSERT_EQ(chunk.first_window_position, e0 * r);
          ASSERT_EQ(chunk.kv.dim(0), (e1 - e0) * r);
          for (int64_t i = 0; i < chunk.kv.dim(0); ++i) {
            ASSERT_EQ(row(chunk.kv, i), hkv[static_cast<size_t>(e0 * r + i)])
                << "layer " << l << " stream " << s << " row " << b;
            std::vector<float> g = row(chunk.gate, i);
            for (float& x : g) x += 1.0f;
            ASSERT_EQ(g, hgate[static_cast<size_t>(e0 * r + i)]);
          }
          if (chunk.n_windows == 0) {
            cl.update_compressor_states(stream, b, Tensor::empty(DType::kF32, {0, d}).view());
            continue;
          }
          if (cl.has_overlap()) {
            Tensor biased = Tensor::empty(DType::kF32, {chunk.gate.dim(0), w});
            copy_view(chunk.gate, biased.view());
            auto* bp = static_cast<float*>(biased.data());
            for (int64_t i = 0; i < biased.view().numel(); ++i) bp[i] += 1.0f;
            CompressionChunk passed = chunk;
            passed.gate = biased.view();
            const OverlapPrior prior = cl.update_overlap_state(stream, b, passed);
            if (e0 == 0) {
              EXPECT_EQ(prior.kv.ndim(), 0);
            } else {
              ASSERT_EQ(prior.kv.dim(0), r);
              ASSERT_EQ(prior.kv.dim(1), w / 2);
              for (int64_t i = 0; i < r; ++i) {
                const auto& hk = hkv[static_cast<size_t>((e0 - 1) * r + i)];
                const auto& hg = hgate[static_cast<size_t>((e0 - 1) * r + i)];
                ASSERT_EQ(row(prior.kv, i), std::vector<float>(hk.begin(), hk.begin() + w / 2));
                ASSERT_EQ(row(prior.gate, i), std::vector<float>(hg.begin(), hg.begin() + w / 2));
              }
            }
          }
          Tensor ent = fresh({chunk.n_windows, d});
          for (int64_t i = 0; i < chunk.n_windows; ++i) hent.push_back(row(ent.view(), i));
          cl.update_compressor_states(stream, b, ent.view());
        }
        // Every row's entries so far, in place.
        const KVSpan cs = cl.compressed(stream);
        ASSERT_EQ(cs.kind, KVSpanKind::kPaged);
        EXPECT_EQ(cs.paged.block_tokens, store->block_tokens());
        const Tensor all = gather_paged(cs.paged, true);
        for (int64_t b = 0; b < B; ++b) {
          const Rows& hent = refs[batch[static_cast<size_t>(b)]].entries[{l, s}];
          ASSERT_EQ(cs.paged.seq_len(b), static_cast<int64_t>(hent.size()));
          ASSERT_EQ(cl.entry_count(stream, b), static_cast<int64_t>(hent.size()));
          for (size_t e = 0; e < hent.size(); ++e)
            for (int64_t x = 0; x < d; ++x)
              ASSERT_EQ(all.view().ptr_as<float>(b, 0, static_cast<int64_t>(e))[x],
                        hent[e][static_cast<size_t>(x)]);
        }
      }
    }
    EXPECT_FALSE(store->step_open()) << "every layer's part done closes the step";
    for (const SeqId id : batch) refs[id].len += n;
    EXPECT_EQ(store->check_invariants(), "");
  }
};

TEST(PagedCompressed, MixedLengthBatchesAndAnyChunkingMatchTheContract) {
  V4 v(v4_config());
  const SeqId a = v.store->add_sequence(), b = v.store->add_sequence();
  const std::vector<SeqId> only_a = {a}, only_b = {b}, ab = {a, b}, ba = {b, a};
  v.store->set_batch(only_a);
  for (const int64_t n : {7, 1, 2}) v.step(n);
  v.store->set_batch(only_b);
  for (const int64_t n : {5, 5, 3, 17}) v.step(n);
  v.store->set_batch(ab);
  for (int i = 0; i < 12; ++i) v.step(1);  // decode at different positions
  v.store->set_batch(ba);
  for (const int64_t n : {6, 9}) v.step(n);
  EXPECT_EQ(v.store->length(a), 10 + 12 + 15);
  // Blocks of the compressed groups hold entries: ceil(floor(len / r) / block_tokens) each.
  for (int g = 0; g < v.store->num_groups(); ++g) {
    const PagedGroup& grp = v.store->group(g);
    if (grp.kind != GroupKind::kCompressed) continue;
    const int64_t entries = v.store->length(b) / grp.rate;
    EXPECT_EQ(v.store->stats(g).live_tokens, entries + v.store->length(a) / grp.rate);
  }
  // Freed, every block goes back.
  v.store->free_sequence(a);
  v.store->free_sequence(b);
  for (int g = 0; g < v.store->num_groups(); ++g)
    EXPECT_EQ(v.store->stats(g).pool.used, v.store->group(g).kind == GroupKind::kSliding ? 1 : 0);
  EXPECT_EQ(v.store->free_linear_slots(), 6);
}

TEST(PagedCompressed, ProtocolUseOpensTheBatchAndFeedsRowsOneByOne) {
  V4 v(v4_config());
  // No runtime: the first update's rows become sequences; steps are planned by the first layer.
  {
    const int64_t B = 3, n = 5;
    Tensor kv = v.fresh({B, 1, n, kHd});
    (void)v.cache->update(0, kv.view(), kv.view());
    // The other layers follow the same step through the driver (plan = false).
  }
  // Finish the step opened above: layers 1..3, then the refs of layer 0 are stale, so start
  // over with reset() and drive whole steps.
  EXPECT_TRUE(v.store->step_open());
  v.store->abort_step();
  v.cache->reset();
  EXPECT_EQ(v.store->free_linear_slots(), 6);
  const SeqId s = v.store->add_sequence();
  const std::vector<SeqId> one = {s};
  v.store->set_batch(one);
  for (const int64_t n : {3, 4, 9, 1}) v.step(n);
  // K==V: the sliding layer keeps K pages only.
  const PagedStoreConfig& sc = v.store->config();
  EXPECT_EQ(v.store->layer_page_bytes(0),
            static_cast<size_t>(sc.group_blocks[0]) * 4 * kHd * sizeof(float));
}

TEST(PagedCompressed, ForkCopiesStateAndPartialEntryBlocks) {
  V4 v(v4_config());
  const SeqId a = v.store->add_sequence();
  const std::vector<SeqId> only_a = {a};
  v.store->set_batch(only_a);
  for (const int64_t n : {13, 6}) v.step(n);  // 19 tokens: partial buffers and entry blocks
  std::vector<SeqId> kids;
  ASSERT_TRUE(v.store->fork(a, 2, kids));
  for (const SeqId k : kids) v.refs[k] = v.refs[a];
  const std::vector<SeqId> all = {kids[0], a, kids[1]};
  v.store->set_batch(all);
  for (const int64_t n : {1, 3, 5, 1}) v.step(n);
  // select() through the cache (remap): row 1 twice, the others freed.
  const std::vector<int64_t> pick = {1, 1};
  v.cache->select(pick);
  const std::vector<SeqId> now(v.store->batch().begin(), v.store->batch().end());
  ASSERT_EQ(now.size(), 2u);
  v.refs[now[1]] = v.refs[now[0]];
  for (const int64_t n : {2, 7}) v.step(n);
  EXPECT_EQ(v.store->check_invariants(), "");
}

TEST(PagedCompressed, CropOnlyToZeroAbortLosesTheStateResetFrees) {
  V4 v(v4_config());
  const SeqId a = v.store->add_sequence();
  const std::vector<SeqId> only_a = {a};
  v.store->set_batch(only_a);
  v.step(10);
  try {
    v.cache->crop(-1);
    FAIL() << "crop into a compressed layer's history must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
  EXPECT_EQ(v.store->length(a), 10);
  v.cache->crop(0);  // v5: removes nothing
  EXPECT_EQ(v.store->length(a), 10);
  v.cache->crop(-10);  // back to the zero state: a fresh sequence
  EXPECT_EQ(v.store->length(a), 0);
  v.refs[a] = Ref{};
  v.step(9);
  // A step that fails halfway leaves the compressors' buffers changed: refused until cropped.
  ASSERT_EQ(v.store->plan_step(2), StepStatus::kOk);
  Tensor kv = v.fresh({1, 1, 2, kHd});
  (void)v.cache->update(0, kv.view(), kv.view());
  v.store->abort_step();
  EXPECT_EQ(v.store->length(a), 9);
  EXPECT_THROW((void)v.store->plan_step(1), Error);
  v.cache->crop(-9);
  v.refs[a] = Ref{};
  v.step(5);
  v.cache->reset();
  EXPECT_EQ(v.store->free_linear_slots(), 6);
  for (int g = 0; g < v.store->num_groups(); ++g)
    EXPECT_EQ(v.store->stats(g).pool.used, v.store->group(g).kind == GroupKind::kSliding ? 1 : 0);
}

TEST(PagedCompressed, PrefixHitsAreRefusedAndCounted) {
  V4 v(v4_config());
  std::vector<int32_t> tokens(21);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(100 + i);
  const SeqId a = v.store->add_sequence();
  const std::vector<SeqId> only_a = {a};
  v.store->set_batch(only_a);
  v.step(static_cast<int64_t>(tokens.size()), true, tokens);
  v.store->free_sequence(a);
  const SeqId b = v.store->add_sequence();
  EXPECT_EQ(v.store->match_prefix(tokens), 0);
  EXPECT_EQ(v.store->attach_prefix(b, tokens), 0);
  EXPECT_EQ(v.store->length(b), 0);
  EXPECT_EQ(v.store->prefix_refused_compressed(), 1);
  EXPECT_EQ(v.store->check_invariants(), "");
}

TEST(PagedCompressed, PredictedBytesAreExact) {
  for (const int32_t slots : {1, 6}) {
    PagedStoreConfig c = v4_config(slots);
    const PagedKVStore store(c);
    EXPECT_EQ(store.pool_bytes(), predict_pool_bytes(c));
    EXPECT_EQ(store.linear_state_bytes(), predict_linear_state_bytes(c));
    EXPECT_EQ(store.snapshot_bytes(), predict_snapshot_bytes(c));
    // Per sequence: CSA (compressor 2·8 wide + indexer 2·4 wide, rate 4, overlaps) x 2, HCA (8
    // wide, rate 8, no overlap).
    const int64_t csa = 2 * 3 * 16 + 2 * 4 * 8 + 2 * 3 * 8 + 2 * 4 * 4;
    const int64_t hca = 2 * 7 * 8;
    EXPECT_EQ(paged_compressor_state_elems(c), 2 * csa + hca);
    EXPECT_EQ(paged_linear_bytes_per_sequence(c), static_cast<size_t>(2 * csa + hca) * 4);
    // Entry blocks: max_tokens / (rate · block_tokens) + one partial block per slot.
    const std::vector<int32_t> blocks = default_group_blocks(c);
    ASSERT_EQ(blocks.size(), 3u);  // sliding, rate 4, rate 8
    EXPECT_EQ(blocks[1], 400 / 16 + slots);
    EXPECT_EQ(blocks[2], (400 + 31) / 32 + slots);
  }
  // Without K==V on the sliding layer, its V pages come back.
  PagedStoreConfig c = v4_config();
  c.shared_kv = false;
  const PagedKVStore store(c);
  EXPECT_EQ(store.pool_bytes(), predict_pool_bytes(c));
  EXPECT_EQ(store.layer_page_bytes(0),
            2 *
                static_cast<size_t>(c.group_blocks.empty() ? default_group_blocks(c)[0]
                                                           : c.group_blocks[0]) *
                4 * kHd * sizeof(float));
}

// The same feed through the dense containers (dynamic/CSA, dynamic/HCA) and the paged ones,
// two rows, chunks of every length: equal chunks, priors, entry counts and entries.
TEST(PagedCompressed, SameFeedAsTheDynamicContainers) {
  V4 v(v4_config());
  CacheConfig dc;
  dc.options.implementation = "dynamic";
  dc.layer_types = kTypes;
  dc.sliding_window = kW;
  dc.kv_content = CacheConfig::KVContent::kSharedKV;
  dc.compressed = v.store->config().compressed;
  Cache dense(dc);
  const int64_t B = 2;
  auto rows = [](const TensorView& t) {
    std::vector<float> out;
    for (int64_t i = 0; i < t.dim(0); ++i) {
      const auto* p = static_cast<const float*>(t.ptr(i));
      out.insert(out.end(), p, p + t.dim(1));
    }
    return out;
  };
  auto as_rows = [](const KVSpan& sp) {  // [B][T * D] of a k == v entry span
    const Tensor t = sp.kind == KVSpanKind::kPaged ? gather_paged(sp.paged, false)
                                                   : Tensor::empty(DType::kF32, {0, 0, 0, 0});
    const TensorView k = sp.kind == KVSpanKind::kPaged ? t.view() : sp.k;
    std::vector<std::vector<float>> out(static_cast<size_t>(k.ndim() == 4 ? k.dim(0) : 0));
    for (size_t b = 0; b < out.size(); ++b)
      for (int64_t j = 0; j < k.dim(2); ++j) {
        const float* p = k.ptr_as<float>(static_cast<int64_t>(b), 0, j);
        out[b].insert(out[b].end(), p, p + k.dim(3));
      }
    return out;
  };
  for (const int64_t n : {3, 1, 6, 1, 1, 9, 2, 17, 1}) {
    for (int l = 0; l < static_cast<int>(kTypes.size()); ++l) {
      Tensor kv = v.fresh({B, 1, n, kHd});
      (void)dense.update(l, kv.view(), kv.view());
      (void)v.cache->update(l, kv.view(), kv.view());
      if (l == 0) continue;
      auto& dl = dynamic_cast<CompressedCacheLayer&>(dense.layer(l));
      auto& pl = dynamic_cast<CompressedCacheLayer&>(v.cache->layer(l));
      ASSERT_EQ(dl.compress_rate(), pl.compress_rate());
      ASSERT_EQ(dl.has_overlap(), pl.has_overlap());
      for (int s = 0; s < (pl.has_indexer() ? 2 : 1); ++s) {
        const auto st = static_cast<CompressedStream>(s);
        const int64_t w = s == 0 ? (pl.has_overlap() ? 2 * kHd : kHd) : 2 * kIdx;
        const int64_t d = s == 0 ? kHd : kIdx;
        for (int64_t b = 0; b < B; ++b) {
          Tensor x = v.fresh({n, w}), g = v.fresh({n, w});
          const CompressionChunk a = dl.store_compression_weights(st, b, x.view(), g.view());
          const CompressionChunk c = pl.store_compression_weights(st, b, x.view(), g.view());
          ASSERT_EQ(a.n_windows, c.n_windows) << "layer " << l << " n " << n;
          ASSERT_EQ(a.first_window_position, c.first_window_position);
          if (a.n_windows == 0) continue;
          ASSERT_EQ(rows(a.kv), rows(c.kv));
          ASSERT_EQ(rows(a.gate), rows(c.gate));
          if (pl.has_overlap()) {
            const OverlapPrior pa = dl.update_overlap_state(st, b, a);
            const OverlapPrior pc = pl.update_overlap_state(st, b, c);
            ASSERT_EQ(pa.kv.ndim() == 2, pc.kv.ndim() == 2);
            if (pa.kv.ndim() == 2) {
              ASSERT_EQ(rows(pa.kv), rows(pc.kv));
              ASSERT_EQ(rows(pa.gate), rows(pc.gate));
            }
          }
          Tensor e = v.fresh({a.n_windows, d});
          dl.update_compressor_states(st, b, e.view());
          pl.update_compressor_states(st, b, e.view());
        }
        for (int64_t b = 0; b < B; ++b) ASSERT_EQ(dl.entry_count(st, b), pl.entry_count(st, b));
        if (dl.entry_count(st, 0) > 0) {
          const auto want = as_rows(dl.compressed(st));
          ASSERT_EQ(want.at(0).size(), static_cast<size_t>(dl.entry_count(st, 0) * d));
          ASSERT_EQ(want, as_rows(pl.compressed(st)));
        }
      }
    }
    EXPECT_FALSE(v.store->step_open());
  }
  EXPECT_EQ(dense.layer(1).seq_length(), v.cache->layer(1).seq_length());
}

// DSA: a full-attention layer plus one indexer key per token in the same blocks; prefixes are
// shared as usual and the hit's indexer keys are the cached ones.
TEST(PagedIndexed, IndexerKeysPerTokenSharedByPrefixHits) {
  PagedStoreConfig c;
  c.block_tokens = 4;
  c.layer_types = {"full_attention", "deepseek_sparse_attention"};
  c.kv_heads = 1;
  c.head_dim = 6;
  c.head_dim_v = 2;  // MLA-like: c_kv and k_rot
  c.compressed.index_head_dim = kIdx;
  c.max_tokens = 64;
  auto store = std::make_shared<PagedKVStore>(c);
  EXPECT_EQ(store->pool_bytes(), predict_pool_bytes(c));
  Cache cache(testing_util::paged_config_over(store));
  std::vector<int32_t> tokens(11);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(7 + i);
  Tensor keys = Tensor::empty(DType::kF32, {1, 1, 11, kIdx});
  for (int64_t i = 0; i < 11 * kIdx; ++i)
    static_cast<float*>(keys.data())[i] = static_cast<float>(i);
  const SeqId a = store->add_sequence();
  const std::vector<SeqId> only_a = {a};
  store->set_batch(only_a);
  ASSERT_EQ(store->plan_step(11, tokens), StepStatus::kOk);
  Tensor k = Tensor::zeros(DType::kF32, {1, 1, 11, 6}),
         v = Tensor::zeros(DType::kF32, {1, 1, 11, 2});
  (void)cache.update(0, k.view(), v.view());
  (void)cache.update(1, k.view(), v.view());
  EXPECT_TRUE(store->step_open()) << "the DSA layer still owes its indexer keys";
  const KVSpan span = dynamic_cast<IndexedCacheLayer&>(cache.layer(1)).update_indexer(keys.view());
  EXPECT_FALSE(store->step_open());
  Tensor got = gather_paged(span.paged, false);
  for (int64_t i = 0; i < 11 * kIdx; ++i)
    EXPECT_EQ(static_cast<float*>(got.data())[i], static_cast<float>(i));
  store->free_sequence(a);
  const SeqId b = store->add_sequence();
  std::vector<int32_t> longer = tokens;
  longer.push_back(99);
  ASSERT_EQ(store->attach_prefix(b, longer, PagedKVStore::PrefixMatch::kFullBlocks), 8);
  const std::vector<SeqId> only_b = {b};
  store->set_batch(only_b);
  ASSERT_EQ(store->plan_step(4), StepStatus::kOk);
  Tensor k4 = Tensor::zeros(DType::kF32, {1, 1, 4, 6}),
         v4 = Tensor::zeros(DType::kF32, {1, 1, 4, 2});
  Tensor keys4 = Tensor::zeros(DType::kF32, {1, 1, 4, kIdx});
  (void)cache.update(0, k4.view(), v4.view());
  const KVSpan hit = dynamic_cast<IndexedCacheLayer&>(cache.layer(1)).update_indexer(keys4.view());
  (void)cache.update(1, k4.view(), v4.view());
  got = gather_paged(hit.paged, false);
  ASSERT_EQ(got.view().dim(2), 12);
  for (int64_t i = 0; i < 8 * kIdx; ++i)
    EXPECT_EQ(static_cast<float*>(got.data())[i], static_cast<float>(i));
  for (int64_t i = 8 * kIdx; i < 12 * kIdx; ++i)
    EXPECT_EQ(static_cast<float*>(got.data())[i], 0.0f);
  EXPECT_EQ(store->check_invariants(), "");
}

}  // namespace
}  // namespace kvcache
