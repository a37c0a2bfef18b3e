// StreamingLLM on the paged store (issue 43, item 3; cache/paged_store.h, "StreamingLLM"): a
// streaming sequence keeps its sink blocks and the blocks of its last W - 1 tokens, releases the
// rest between steps, and its memory stays flat over a 16K-token decode; attention over its
// compacted table equals attention over the kept positions listed independently; its block
// keys fold the policy in, and only blocks completed before it evicted anything are keyed, so an
// exact request (or another policy) never hits them; what the store cannot run is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "cache/paged_store.h"
#include "cache_test_util.h"
#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/paged_attention.h"

namespace kvcache {
namespace {

PagedStoreConfig streaming_config(int32_t bt, int64_t max_tokens, int64_t heads, int64_t dim) {
  PagedStoreConfig c;
  c.block_tokens = bt;
  c.layer_types = {"full_attention"};
  c.dtype = DType::kF32;
  c.kv_heads = heads;
  c.head_dim = dim;
  c.max_tokens = max_tokens;
  c.streaming = true;
  return c;
}

KVPolicy streaming(int64_t sink, int64_t window) {
  return KVPolicy::parse("streaming:sink=" + std::to_string(sink) +
                         ",window=" + std::to_string(window));
}

// The positions a streaming row holds once a step closed at `len`, computed from the policy's
// definition: every block holding a sink (< S) or one of the last W - 1 positions.
std::vector<int64_t> kept_positions(int64_t len, int64_t bt, int64_t S, int64_t W) {
  std::vector<int64_t> out;
  const int64_t lo = len - W + 1;
  for (int64_t j = 0; j * bt < len; ++j) {
    const bool sink = j * bt<S, window = (j + 1) * bt> lo;
    if (!sink && !window) continue;
    for (int64_t p = j * bt; p < std::min(len, (j + 1) * bt); ++p) out.push_back(p);
  }
  return out;
}

// Row 0's keys in span order, channel 0 of head 0 (the tests store the position there).
std::vector<int64_t> span_positions(const KVSpan& span) {
  const PagedKV& kv = span.paged;
  std::vector<int64_t> out;
  for (int64_t j = 0; j < kv.seq_len(0); ++j) {
    const int32_t page = kv.indices[kv.indptr[0] + j / kv.block_tokens];
    out.push_back(static_cast<int64_t>(
        *static_cast<const float*>(kv.k_pages.ptr(page, 0, j % kv.block_tokens))));
  }
  return out;
}

// One token per step whose K and V rows are all `pos`.
void write_positions(PagedKVStore& store, int64_t pos0, int64_t n, int64_t H, int64_t D) {
  Tensor k = Tensor::zeros(DType::kF32, {1, H, n, D});
  for (int64_t h = 0; h < H; ++h)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t d = 0; d < D; ++d)
        static_cast<float*>(k.view().ptr(0, h, t))[d] = static_cast<float>(pos0 + t);
  store.write(0, k.view(), k.view());
}

TEST(PagedStreaming, KeepsSinkAndWindowBlocksAndMemoryStaysFlatOver16K) {
  constexpr int32_t bt = 16;
  constexpr int64_t S = 4, W = 256, n = 16384;
  // 1,024 tokens of blocks (65 with the null block): far less than the 16K decoded.
  PagedKVStore store(streaming_config(bt, 1024, 1, 4));
  const SeqId seq = store.add_sequence({}, streaming(S, W));
  const std::vector<SeqId> batch = {seq};
  store.set_batch(batch);
  int32_t peak = 0, at_1k = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t tok = static_cast<int32_t>(t % 97) + 3;
    ASSERT_EQ(store.plan_step(1, std::span<const int32_t>(&tok, 1)), StepStatus::kOk) << t;
    write_positions(store, t, 1, 1, 4);
    peak = std::max(peak, store.stats(0).pool.used);
    if (t + 1 == 1024) at_1k = store.stats(0).pool.used;
    if ((t + 1) % 1999 == 0 || t + 1 == n || t + 1 == 300) {
      store.set_batch(batch);  // the tables are rebuilt when a step opens, or here
      EXPECT_EQ(span_positions(store.peek_span(0)), kept_positions(t + 1, bt, S, W)) << t + 1;
      EXPECT_EQ(store.check_invariants(), "") << t + 1;
    }
  }
  // The null block, one sink block and the 17 blocks the last 255 tokens straddle (16 right
  // after a block filled): flat from the first eviction on.
  EXPECT_EQ(store.length(seq), n);
  EXPECT_EQ(peak, 1 + 1 + 17);
  EXPECT_EQ(store.stats(0).pool.used, at_1k);
  EXPECT_EQ(store.evicted_blocks(seq), n / bt - 1 - 16);
  store.free_sequence(seq);
  EXPECT_EQ(store.stats(0).pool.used, 1);  // the null block alone
  EXPECT_EQ(store.check_invariants(), "");
}

TEST(PagedStreaming, AttentionOverTheCompactedTableEqualsTheKeptPositions) {
  constexpr int32_t bt = 4;
  constexpr int64_t S = 3, W = 10, H = 2, Hq = 4, D = 8;
  std::mt19937 rng(11);
  PagedKVStore store(streaming_config(bt, 256, H, D));
  const SeqId seq = store.add_sequence({}, streaming(S, W));
  const std::vector<SeqId> batch = {seq};
  store.set_batch(batch);
  // Every position's K/V rows, [pos][H][D], to build the reference from.
  std::vector<std::vector<float>> ks, vs;
  const AttentionFn eager = get_attention_kernel("eager");
  int64_t len = 0;
  for (const int64_t n : {5, 1, 1, 7, 1, 1, 1, 1, 1, 9, 1, 1, 1, 1, 1, 1, 1, 1, 3, 1, 1, 1, 1}) {
    const std::vector<int64_t> old = kept_positions(len, bt, S, W);
    ASSERT_EQ(store.plan_step(n), StepStatus::kOk);
    const Tensor k = testing_util::random_tensor(DType::kF32, {1, H, n, D}, rng);
    const Tensor v = testing_util::random_tensor(DType::kF32, {1, H, n, D}, rng);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> kr, vr;
      for (int64_t h = 0; h < H; ++h) {
        const auto* kp = static_cast<const float*>(k.view().ptr(0, h, t));
        const auto* vp = static_cast<const float*>(v.view().ptr(0, h, t));
        kr.insert(kr.end(), kp, kp + D);
        vr.insert(vr.end(), vp, vp + D);
      }
      ks.push_back(kr);
      vs.push_back(vr);
    }
    const KVSpan span = store.write(0, k.view(), v.view());
    // The reference keys: what the rule kept before the step, then the step's tokens.
    std::vector<int64_t> keys = old;
    for (int64_t t = 0; t < n; ++t) keys.push_back(len + t);
    const auto nk = static_cast<int64_t>(keys.size());
    ASSERT_EQ(span.paged.seq_len(0), nk) << "len " << len;
    Tensor rk = Tensor::zeros(DType::kF32, {1, H, nk, D}),
           rv = Tensor::zeros(DType::kF32, {1, H, nk, D});
    for (int64_t j = 0; j < nk; ++j)
      for (int64_t h = 0; h < H; ++h) {
        std::copy_n(ks[static_cast<size_t>(keys[static_cast<size_t>(j)])].begin() + h * D, D,
                    static_cast<float*>(rk.view().ptr(0, h, j)));
        std::copy_n(vs[static_cast<size_t>(keys[static_cast<size_t>(j)])].begin() + h * D, D,
                    static_cast<float*>(rv.view().ptr(0, h, j)));
      }
    const Tensor q = testing_util::random_tensor(DType::kF32, {1, Hq, n, D}, rng);
    Tensor want = Tensor::zeros(DType::kF32, {1, Hq, n, D});
    AttentionOptions o;
    eager(q.view(), rk.view(), rv.view(), want.view(), o);
    // The paged kernels take q as [total_q, H_q, D].
    Tensor qp = Tensor::zeros(DType::kF32, {n, Hq, D}),
           got = Tensor::zeros(DType::kF32, {n, Hq, D});
    for (int64_t t = 0; t < n; ++t)
      for (int64_t h = 0; h < Hq; ++h)
        std::copy_n(static_cast<const float*>(q.view().ptr(0, h, t)), D,
                    static_cast<float*>(qp.view().ptr(t, h)));
    const int32_t cu[2] = {0, static_cast<int32_t>(n)};
    for (const char* kernel : {"eager", "fused"}) {
      paged_attention(kernel, PagedAttentionArgs{qp.view(), span.paged, cu, got.view()}, o);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < Hq; ++h)
          for (int64_t d = 0; d < D; ++d)
            ASSERT_NEAR(static_cast<const float*>(got.view().ptr(t, h))[d],
                        static_cast<const float*>(want.view().ptr(0, h, t))[d], 1e-5)
                << kernel << " len " << len << " query " << t;
    }
    len += n;
    EXPECT_EQ(store.check_invariants(), "");
  }
  EXPECT_GT(store.evicted_blocks(seq), 0);
}

TEST(PagedStreaming, AStreamingBlockNeverServesAnExactRequest) {
  constexpr int32_t bt = 16;
  PagedKVStore store(streaming_config(bt, 1024, 1, 4));
  const KVPolicy policy = streaming(4, 256);
  std::vector<int32_t> tokens;
  for (int i = 0; i < 400; ++i) tokens.push_back(i % 251 + 3);
  const SeqId seq = store.add_sequence({}, policy);
  const std::vector<SeqId> batch = {seq};
  store.set_batch(batch);
  ASSERT_EQ(store.plan_step(100, std::span<const int32_t>(tokens).first(100)), StepStatus::kOk);
  write_positions(store, 0, 100, 1, 4);
  for (int64_t t = 100; t < 400; ++t) {
    ASSERT_EQ(store.plan_step(1, std::span<const int32_t>(tokens).subspan(t, 1)), StepStatus::kOk);
    write_positions(store, t, 1, 1, 4);
  }
  // The first eviction came when the step reaching 287 tokens closed (block 1 left the window):
  // the 17 blocks full by then are keyed; the blocks after were computed without block 1.
  EXPECT_GT(store.evicted_blocks(seq), 0);
  store.free_sequence(seq);
  using M = PagedKVStore::PrefixMatch;
  EXPECT_EQ(store.match_prefix(tokens, {}, M::kFullBlocks, policy), 17 * bt);
  EXPECT_EQ(store.match_prefix(tokens, {}, M::kFullBlocks), 0);  // exact
  EXPECT_EQ(store.match_prefix(tokens, {}, M::kCopyTail), 0);
  EXPECT_EQ(store.match_prefix(tokens, {}, M::kFullBlocks, streaming(4, 128)), 0);
  EXPECT_EQ(store.match_prefix(tokens, {}, M::kFullBlocks, streaming(8, 256)), 0);
  // And the reverse: an exact sequence's blocks never serve a streaming request.
  const SeqId exact = store.add_sequence();
  const std::vector<SeqId> b2 = {exact};
  store.set_batch(b2);
  std::vector<int32_t> other(tokens.begin(), tokens.begin() + 64);
  other[0] = 2;
  ASSERT_EQ(store.plan_step(64, other), StepStatus::kOk);
  write_positions(store, 0, 64, 1, 4);
  store.free_sequence(exact);
  EXPECT_EQ(store.match_prefix(other, {}, M::kFullBlocks), 48);
  EXPECT_EQ(store.match_prefix(other, {}, M::kFullBlocks, policy), 0);
  // A streaming sequence attached to its own policy's blocks continues from them.
  const SeqId again = store.add_sequence({}, policy);
  EXPECT_EQ(store.attach_prefix(again, tokens, M::kFullBlocks), 17 * bt);
  EXPECT_EQ(store.check_invariants(), "");
}

TEST(PagedStreaming, RefusesWhatItCannotRun) {
  {
    PagedKVStore store(streaming_config(16, 256, 1, 4));
    try {
      store.add_sequence({}, KVPolicy::parse("h2o"));
      FAIL() << "h2o accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("per KV head by attention"), std::string::npos);
    }
  }
  {
    PagedStoreConfig c = streaming_config(16, 256, 1, 4);
    c.streaming = false;
    PagedKVStore store(c);
    try {
      store.add_sequence({}, streaming(4, 64));
      FAIL() << "streaming accepted without null blocks";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("PagedStoreConfig::streaming"), std::string::npos);
    }
    EXPECT_EQ(store.stats(0).pool.used, 0);  // no null block reserved
  }
  {
    PagedStoreConfig c = streaming_config(16, 256, 1, 4);
    c.layer_types = {"linear_attention", "full_attention"};
    try {
      PagedKVStore store(c);
      FAIL() << "streaming store with a linear layer";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("linear_attention"), std::string::npos);
    }
  }
  {
    PagedStoreConfig c = streaming_config(16, 256, 1, 32);
    c.quant = PagedQuantFormat{KVQuantScheme::kKivi, 4};
    EXPECT_THROW(PagedKVStore{c}, Error);
  }
  {  // crop back into released blocks: the keys are gone
    PagedKVStore store(streaming_config(4, 256, 1, 4));
    const SeqId seq = store.add_sequence({}, streaming(2, 8));
    const std::vector<SeqId> batch = {seq};
    store.set_batch(batch);
    for (int64_t t = 0; t < 40; ++t) {
      ASSERT_EQ(store.plan_step(1), StepStatus::kOk);
      write_positions(store, t, 1, 1, 4);
    }
    EXPECT_THROW(store.crop(-20), Error);
    EXPECT_EQ(store.length(seq), 40);
    store.crop(-1);  // the window a query at 39 needs is all there
    EXPECT_EQ(store.length(seq), 39);
    store.crop(-39);
    EXPECT_EQ(store.length(seq), 0);
    EXPECT_EQ(store.evicted_blocks(seq), 0);
    EXPECT_EQ(store.check_invariants(), "");
  }
}

}  // namespace
}  // namespace kvcache
