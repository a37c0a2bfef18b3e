// Hybrid models in the paged cache (issue 38): "paged/linear_attention" keeps each sequence's
// linear-attention state in a slot outside the block pool (allocated with the sequence, freed
// with it, copied by fork/select/reorder, zeroed by reset and crop to 0), and the store
// snapshots it at block boundaries so that a prefix hit restores the latest snapshot at or
// before the hit. A toy "model" drives the cache: attention layers write K/V that are a
// function of (token, position); linear layers feed conv inputs that are a function of the
// token and fold every token into the recurrent state, so the state is a function of the whole
// prefix and an independent per-sequence reference tells what it must be.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "cache/cache.h"
#include "cache/linear_state_layer.h"
#include "cache/paged_linear_layer.h"
#include "cache/paged_linear_state.h"
#include "cache/paged_store.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

constexpr int64_t kK = 3, kC = 5, kHv = 2, kDk = 3, kDv = 2, kHkv = 1, kD = 4;

LinearStateShape shape() {
  return {.conv_kernel = kK, .conv_dim = kC, .heads_v = kHv, .head_dim_k = kDk, .head_dim_v = kDv};
}

PagedStoreConfig store_config(int32_t slots, int32_t snapshots, int32_t every = 2) {
  PagedStoreConfig c;
  c.block_tokens = 4;
  c.layer_types = {"linear_attention", "full_attention", "linear_attention", "full_attention"};
  c.kv_heads = kHkv;
  c.head_dim = kD;
  c.head_dim_v = kD;
  c.group_blocks = {24};
  c.linear = shape();
  c.linear_slots = slots;
  c.snapshot_every_blocks = every;
  c.max_snapshots = snapshots;
  return c;
}

float conv_input(int32_t tok, int64_t c) {
  return static_cast<float>(tok) * 0.25f + static_cast<float>(c);
}
float rec_input(int32_t tok, int64_t i) {
  return static_cast<float>((tok * 7 + i * 3) % 11) - 5.0f;
}

// What a linear layer's state must be after `tokens` (layer-independent in this toy).
struct RefState {
  std::vector<float> conv = std::vector<float>((kK - 1) * kC, 0.0f);
  std::vector<float> rec = std::vector<float>(kHv * kDk * kDv, 0.0f);
};
RefState reference(const std::vector<int32_t>& tokens, size_t n) {
  RefState r;
  for (size_t t = 0; t < n; ++t) {
    std::rotate(r.conv.begin(), r.conv.begin() + kC, r.conv.end());
    for (int64_t c = 0; c < kC; ++c)
      r.conv[static_cast<size_t>((kK - 2) * kC + c)] = conv_input(tokens[t], c);
    for (size_t i = 0; i < r.rec.size(); ++i)
      r.rec[i] = r.rec[i] * 0.5f + rec_input(tokens[t], static_cast<int64_t>(i));
  }
  return r;
}

struct Hybrid {
  std::shared_ptr<PagedKVStore> store;
  std::unique_ptr<Cache> cache;
  explicit Hybrid(const PagedStoreConfig& sc) {
    store = std::make_shared<PagedKVStore>(sc);
    CacheConfig cc = testing_util::paged_config_over(store);
    cc.linear = shape();
    cache = std::make_unique<Cache>(cc);
  }
};

// One forward of the toy model over the store's batch: rows[b] are the new tokens of row b.
void step(Hybrid& h, const std::vector<std::vector<int32_t>>& rows, bool plan = true) {
  const auto B = static_cast<int64_t>(rows.size());
  const auto T = static_cast<int64_t>(rows[0].size());
  std::vector<int32_t> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  std::vector<int64_t> pos0;
  for (const SeqId id : h.store->batch()) pos0.push_back(h.store->length(id));
  if (plan) {
    ASSERT_EQ(h.store->plan_step(T, flat), StepStatus::kOk);
  }
  for (int layer = 0; layer < h.cache->num_layers(); ++layer) {
    if (h.cache->is_linear(layer)) {
      Tensor x = Tensor::zeros(DType::kF32, {B, T, kC});
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t c = 0; c < kC; ++c)
            *x.view().ptr_as<float>(b, t, c) =
                conv_input(rows[static_cast<size_t>(b)][static_cast<size_t>(t)], c);
      const ConvStateUpdate u = h.cache->update_conv_state(layer, x.view());
      EXPECT_EQ(u.previous.dim(0), B);
      TensorView s = h.cache->linear_layer(layer).recurrent_state();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t i = 0; i < kHv * kDk * kDv; ++i) {
            float* p = s.ptr_as<float>(b, i / (kDk * kDv), (i / kDv) % kDk, i % kDv);
            *p = *p * 0.5f + rec_input(rows[static_cast<size_t>(b)][static_cast<size_t>(t)], i);
          }
      h.cache->update_recurrent_state(layer, s);
    } else {
      Tensor k = Tensor::zeros(DType::kF32, {B, kHkv, T, kD});
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < kD; ++d)
            *k.view().ptr_as<float>(b, 0, t, d) =
                static_cast<float>(rows[static_cast<size_t>(b)][static_cast<size_t>(t)] * 100 +
                                   pos0[static_cast<size_t>(b)] + t);
      h.cache->update(layer, k.view(), k.view());
    }
  }
}

// Sequence `seq`'s state in every linear layer equals the reference after tokens[0, n).
void expect_state(Hybrid& h, SeqId seq, const std::vector<int32_t>& tokens, size_t n) {
  const RefState r = reference(tokens, n);
  const int32_t slot = h.store->slot_of(seq);
  ASSERT_GE(slot, 0);
  for (int layer : {0, 2}) {
    const SeqId one[1] = {seq};
    const std::vector<SeqId> keep(h.store->batch().begin(), h.store->batch().end());
    h.store->set_batch(one);
    const TensorView conv = h.cache->linear_layer(layer).conv_state();
    const TensorView rec = h.cache->linear_layer(layer).recurrent_state();
    h.store->set_batch(keep);
    for (int64_t i = 0; i < (kK - 1) * kC; ++i)
      EXPECT_EQ(*conv.ptr_as<float>(0, i / kC, i % kC), r.conv[static_cast<size_t>(i)])
          << "layer " << layer << " conv " << i << " after " << n;
    for (int64_t i = 0; i < kHv * kDk * kDv; ++i)
      EXPECT_EQ(*rec.ptr_as<float>(0, i / (kDk * kDv), (i / kDv) % kDk, i % kDv),
                r.rec[static_cast<size_t>(i)])
          << "layer " << layer << " rec " << i << " after " << n;
  }
}

std::vector<int32_t> prompt(int32_t base, size_t n) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = base + static_cast<int32_t>(i % 13);
  return t;
}

TEST(PagedLinearLayer, IsRegisteredAndRefusesAPrivateStore) {
  EXPECT_TRUE(LayerRegistry::contains("paged", "linear_attention"));
  CacheConfig cc;
  cc.options.implementation = "paged";
  cc.options.max_cache_len = 64;
  cc.layer_types = {"linear_attention", "full_attention"};
  cc.linear = shape();
  try {
    Cache c(cc);
    FAIL() << "a paged linear layer without the shared store must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CacheOptions::paged.store"), std::string::npos)
        << e.what();
  }
  PagedStoreConfig bad = store_config(1, 0);
  bad.linear = {};
  EXPECT_THROW(PagedKVStore{bad}, Error);
}

TEST(PagedLinearLayer, SlotsFollowSequencesAllocateFreeResetFork) {
  Hybrid h(store_config(3, 0));
  EXPECT_EQ(h.store->free_linear_slots(), 3);
  const SeqId a = h.store->add_sequence(), b = h.store->add_sequence();
  EXPECT_EQ(h.store->free_linear_slots(), 1);
  const std::vector<int32_t> ta = prompt(1, 6), tb = prompt(40, 6);
  const SeqId ab[2] = {a, b};
  h.store->set_batch(ab);
  step(h, {{ta.begin(), ta.begin() + 5}, {tb.begin(), tb.begin() + 5}});
  step(h, {{ta[5]}, {tb[5]}});
  expect_state(h, a, ta, 6);
  expect_state(h, b, tb, 6);
  EXPECT_EQ(h.store->check_invariants(), "");
  // Fork copies the state into the child's own slot.
  std::vector<SeqId> kids;
  ASSERT_TRUE(h.store->fork(a, 1, kids));
  EXPECT_EQ(h.store->free_linear_slots(), 0);
  expect_state(h, kids[0], ta, 6);
  EXPECT_NE(h.store->slot_of(kids[0]), h.store->slot_of(a));
  // No slot left: fork says no and changes nothing, add_sequence is an Error.
  std::vector<SeqId> none;
  EXPECT_FALSE(h.store->fork(b, 1, none));
  EXPECT_TRUE(none.empty());
  try {
    (void)h.store->add_sequence();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOutOfRange);
    EXPECT_NE(std::string(e.what()).find("linear-attention state slots"), std::string::npos);
  }
  // The child continues on its own: its state diverges, the parent's stays.
  const SeqId k1[1] = {kids[0]};
  h.store->set_batch(k1);
  std::vector<int32_t> tk = ta;
  tk.push_back(99);
  step(h, {{99}});
  expect_state(h, kids[0], tk, 7);
  expect_state(h, a, ta, 6);
  // Freeing gives the slot back; a new sequence starts from zeros in it.
  h.store->free_sequence(kids[0]);
  EXPECT_EQ(h.store->free_linear_slots(), 1);
  const SeqId c = h.store->add_sequence();
  expect_state(h, c, {}, 0);
  EXPECT_EQ(h.store->check_invariants(), "");
  // Reset frees every sequence and slot.
  h.cache->reset();
  EXPECT_EQ(h.store->free_linear_slots(), 3);
  EXPECT_EQ(h.store->check_invariants(), "");
}

TEST(PagedLinearLayer, SelectReorderAndTheGatherPathKeepEachRowsState) {
  Hybrid h(store_config(4, 0));
  const SeqId s0 = h.store->add_sequence(), s1 = h.store->add_sequence(),
              s2 = h.store->add_sequence();
  const std::vector<int32_t> t0 = prompt(1, 5), t1 = prompt(20, 5), t2 = prompt(50, 5);
  // Rows in slot order 2, 0, 1: not consecutive, so the layers read gathered copies.
  const SeqId rev[3] = {s2, s0, s1};
  h.store->set_batch(rev);
  step(h,
       {{t2.begin(), t2.begin() + 4}, {t0.begin(), t0.begin() + 4}, {t1.begin(), t1.begin() + 4}});
  step(h, {{t2[4]}, {t0[4]}, {t1[4]}});
  expect_state(h, s0, t0, 5);
  expect_state(h, s1, t1, 5);
  expect_state(h, s2, t2, 5);
  // reorder: row 0 becomes old row 2 (s1), rows 1 and 2 both old row 1 (s0 and a fork of it).
  const int64_t beam[3] = {2, 1, 1};
  h.cache->reorder(beam);
  ASSERT_EQ(h.store->batch().size(), 3u);
  EXPECT_EQ(h.store->batch()[0], s1);
  expect_state(h, h.store->batch()[1], t0, 5);
  expect_state(h, h.store->batch()[2], t0, 5);
  EXPECT_FALSE(h.store->is_live(s2));
  EXPECT_EQ(h.store->free_linear_slots(), 1);
  const int64_t keep[1] = {0};
  h.cache->select(keep);
  expect_state(h, s1, t1, 5);
  EXPECT_EQ(h.store->free_linear_slots(), 3);
  EXPECT_EQ(h.store->check_invariants(), "");
}

TEST(PagedLinearLayer, CropGoesToZeroOnlyAndAnAbortedStepLosesTheState) {
  Hybrid h(store_config(2, 0));
  const SeqId a = h.store->add_sequence();
  const SeqId one[1] = {a};
  h.store->set_batch(one);
  const std::vector<int32_t> t = prompt(3, 6);
  step(h, {t});
  try {
    h.cache->crop(-1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot go back"), std::string::npos) << e.what();
  }
  EXPECT_EQ(h.store->length(a), 6);  // refused before anything changed
  expect_state(h, a, t, 6);
  h.cache->crop(0);  // v5: removes nothing
  EXPECT_EQ(h.store->length(a), 6);
  h.cache->crop(-6);
  EXPECT_EQ(h.store->length(a), 0);
  expect_state(h, a, {}, 0);
  step(h, {t});
  expect_state(h, a, t, 6);
  // A step that fails after a linear layer updated in place cannot be undone for the state.
  ASSERT_EQ(h.store->plan_step(1, std::vector<int32_t>{7}), StepStatus::kOk);
  Tensor x = Tensor::zeros(DType::kF32, {1, 1, kC});
  h.cache->update_conv_state(0, x.view());
  h.store->abort_step();
  EXPECT_EQ(h.store->length(a), 6);
  try {
    (void)h.store->plan_step(1, std::vector<int32_t>{7});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lost its linear-attention state"), std::string::npos);
  }
  h.cache->crop(-6);  // back to a known state (the zero state): usable again
  step(h, {t});
  expect_state(h, a, t, 6);
}

TEST(LinearSnapshotStore, PutGetLatestEvictionAndExactBytes) {
  LinearSnapshotStore s(3, 2);
  EXPECT_EQ(s.bytes(), LinearSnapshotStore::predict_bytes(3, 2));
  const size_t bytes = s.bytes();
  const BlockKey k1{1, 1}, k2{2, 2}, k3{3, 3}, k4{4, 4};
  const float a[3] = {1, 2, 3}, b[3] = {4, 5, 6}, c[3] = {7, 8, 9};
  EXPECT_TRUE(s.put(k1, 8, a));
  EXPECT_TRUE(s.put(k3, 24, b));
  EXPECT_EQ(s.size(), 2);
  const BlockKey chain[4] = {k1, k2, k3, k4};
  EXPECT_EQ(s.latest_at_or_before(std::span<const BlockKey>(chain, 4)), 3);
  EXPECT_EQ(s.latest_at_or_before(std::span<const BlockKey>(chain, 2)), 1);
  EXPECT_EQ(s.latest_at_or_before(std::span<const BlockKey>(chain + 1, 1)), 0);
  ASSERT_NE(s.get(k1), nullptr);  // k1 now most recently used
  EXPECT_EQ(s.get(k1)[2], 3.0f);
  EXPECT_EQ(s.position(k3), 24);
  EXPECT_TRUE(s.put(k4, 32, c));  // full: evicts the least recently used, k3
  EXPECT_FALSE(s.contains(k3));
  EXPECT_TRUE(s.contains(k1));
  EXPECT_EQ(s.get(k4)[0], 7.0f);
  EXPECT_EQ(s.stats().evictions, 1);
  EXPECT_TRUE(s.drop_with_block(k1));
  EXPECT_FALSE(s.drop_with_block(k1));
  EXPECT_EQ(s.stats().dropped_with_block, 1);
  EXPECT_EQ(s.size(), 1);
  EXPECT_EQ(s.bytes(), bytes);  // preallocated: constant
  LinearSnapshotStore none(3, 0);
  EXPECT_FALSE(none.put(k1, 8, a));
  EXPECT_EQ(none.bytes(), 0u);
}

TEST(PagedLinearLayer, PrefixHitRestoresTheLatestSnapshotAtOrBeforeIt) {
  // Snapshots every 2 blocks of 4 tokens: at 8, 16, 24 ...
  Hybrid h(store_config(2, 8));
  const std::vector<int32_t> a = prompt(1, 22);
  const SeqId sa = h.store->add_sequence();
  const SeqId one[1] = {sa};
  h.store->set_batch(one);
  // Chunks ending at 8 and 16 (snapshot boundaries), then the rest: 22 tokens.
  step(h, {{a.begin(), a.begin() + 8}});
  step(h, {{a.begin() + 8, a.begin() + 16}});
  step(h, {{a.begin() + 16, a.end()}});
  EXPECT_EQ(h.store->snapshots()->size(), 2);
  h.store->free_sequence(sa);
  // B shares 21 tokens with A: 5 full blocks (20 tokens) are cached, the latest snapshot at
  // or before them is at 16 blocks... tokens; the hit is cut there (never a wrong state).
  std::vector<int32_t> b(a.begin(), a.begin() + 21);
  b.insert(b.end(), {90, 91, 92, 93});
  EXPECT_EQ(h.store->match_prefix(b), 16);
  const SeqId sb = h.store->add_sequence();
  EXPECT_EQ(h.store->attach_prefix(sb, b), 16);
  expect_state(h, sb, b, 16);
  const SeqId ob[1] = {sb};
  h.store->set_batch(ob);
  step(h, {{b.begin() + 16, b.end()}});
  expect_state(h, sb, b, b.size());
  EXPECT_EQ(h.store->check_invariants(), "");
  // A prompt diverging before the first snapshot boundary: no hit at all.
  std::vector<int32_t> c(a.begin(), a.begin() + 6);
  c.insert(c.end(), {70, 71, 72, 73, 74, 75});
  EXPECT_EQ(h.store->match_prefix(c), 0);
  // Hit in the middle (shares 12 tokens: blocks 0-2 cached, snapshot at 8).
  std::vector<int32_t> d(a.begin(), a.begin() + 12);
  d.insert(d.end(), {60, 61, 62});
  EXPECT_EQ(h.store->match_prefix(d), 8);
}

TEST(PagedLinearLayer, NoSnapshotMeansNoHitAndSnapshotsGoWithTheirBlocks) {
  {
    Hybrid h(store_config(1, 0));  // snapshots off
    const std::vector<int32_t> a = prompt(1, 17);
    const SeqId sa = h.store->add_sequence();
    const SeqId one[1] = {sa};
    h.store->set_batch(one);
    step(h, {{a.begin(), a.begin() + 16}});
    h.store->free_sequence(sa);
    EXPECT_EQ(h.store->match_prefix(a), 0);  // the blocks are cached, the state is not
  }
  PagedStoreConfig sc = store_config(1, 4, 1);
  sc.group_blocks = {6};
  Hybrid h(sc);
  const std::vector<int32_t> a = prompt(1, 9);
  SeqId s = h.store->add_sequence();
  SeqId one[1] = {s};
  h.store->set_batch(one);
  step(h, {{a.begin(), a.begin() + 4}});
  step(h, {{a.begin() + 4, a.begin() + 8}});
  EXPECT_EQ(h.store->snapshots()->size(), 2);
  h.store->free_sequence(s);
  EXPECT_EQ(h.store->match_prefix(a), 8);
  // Another prompt takes every block: A's cached blocks are evicted, and their snapshots too.
  const std::vector<int32_t> z = prompt(200, 23);
  s = h.store->add_sequence();
  one[0] = s;
  h.store->set_batch(one);
  step(h, {z});
  EXPECT_EQ(h.store->snapshots()->stats().dropped_with_block, 2);
  h.store->free_sequence(s);
  EXPECT_EQ(h.store->match_prefix(a), 0);
  EXPECT_EQ(h.store->check_invariants(), "");
}

TEST(PagedLinearLayer, BytesAreExactAndPredicted) {
  const PagedStoreConfig sc = store_config(3, 5);
  Hybrid h(sc);
  const int64_t per_layer = (kK - 1) * kC + kHv * kDk * kDv;
  EXPECT_EQ(paged_linear_bytes_per_sequence(sc), static_cast<size_t>(2 * per_layer) * 4);
  EXPECT_EQ(h.store->linear_state_bytes(), predict_linear_state_bytes(sc));
  EXPECT_EQ(h.store->snapshot_bytes(), predict_snapshot_bytes(sc));
  EXPECT_EQ(h.store->snapshot_bytes(), LinearSnapshotStore::predict_bytes(2 * per_layer, 5));
  const SeqId a = h.store->add_sequence();
  const SeqId one[1] = {a};
  h.store->set_batch(one);
  step(h, {prompt(1, 9)});
  size_t sum = 0;
  for (int l = 0; l < h.cache->num_layers(); ++l) sum += h.cache->layer(l).bytes();
  EXPECT_EQ(sum, h.store->bytes());
  EXPECT_EQ(h.cache->bytes(), h.store->bytes());
  // A linear layer's own share: its state in every slot and every snapshot.
  EXPECT_EQ(h.store->layer_state_bytes(2), static_cast<size_t>(per_layer * (3 + 5)) * 4);
  // Constant: states never grow with the sequence.
  const size_t before = h.store->linear_state_bytes() + h.store->snapshot_bytes();
  step(h, {prompt(5, 16)});
  EXPECT_EQ(h.store->linear_state_bytes() + h.store->snapshot_bytes(), before);
}

}  // namespace
}  // namespace kvcache
