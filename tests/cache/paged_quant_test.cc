// Quantized pages in the paged store (issue 43, item 1; cache/paged_store.h "Quantized pages"):
// the paged quantized cache equals the dense quantized container with group = residual = G bit
// for bit (attention outputs and dequantized spans; KIVI 2/4/8, q8_0, q4_0; full and sliding
// layers; prefill, chunked prefill, decodes; batch rows at different lengths), prefix blocks
// are shared and counted once in the pool, the format is part of every block key, fork / crop /
// abort keep the residual consistent, the byte accounting is exact, and the refusals say why.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/disk_tier.h"
#include "cache/paged_layer.h"
#include "cache/paged_store.h"
#include "cache_test_util.h"
#include "core/error.h"
#include "kernels/attention_kernel.h"
#include "kernels/attention_quant.h"
#include "kernels/kv_quant.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

using testing_util::random_tensor;

struct Fmt {
  KVQuantScheme scheme;
  int bits;
};

const Fmt kFormats[] = {{KVQuantScheme::kKivi, 2},
                        {KVQuantScheme::kKivi, 4},
                        {KVQuantScheme::kKivi, 8},
                        {KVQuantScheme::kQ8_0, 8},
                        {KVQuantScheme::kQ4_0, 4}};

std::string fmt_name(const Fmt& f) {
  return std::string(kv_quant_scheme_name(f.scheme)) + "/" + std::to_string(f.bits);
}

CacheConfig dense_config(const Fmt& f, int64_t G, const std::string& type, int64_t W, DType dt) {
  CacheConfig c;
  c.options.implementation = "quantized";
  c.layer_types = {type};
  c.sliding_window = W;
  c.options.quantized.scheme = f.scheme;
  c.options.quantized.bits = f.bits;
  c.options.quantized.group = G;
  c.options.quantized.residual = G;
  c.options.kv_dtype = dt;
  return c;
}

CacheConfig paged_config(const Fmt& f, int64_t G, const std::string& type, int64_t W, DType dt,
                         int64_t batch = 0) {
  CacheConfig c;
  c.options.implementation = "paged";
  c.layer_types = {type};
  c.sliding_window = W;
  c.options.paged.block_tokens = G;
  c.options.paged.quant = PagedQuantFormat{f.scheme, f.bits};
  c.options.kv_dtype = dt;
  c.options.max_cache_len = 256;
  c.options.max_batch_size = batch;
  return c;
}

// Bitwise equality of two f32 tensors' bytes.
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  if (!(a.shape() == b.shape()))
    return ::testing::AssertionFailure() << a.shape().str() << " vs " << b.shape().str();
  if (std::memcmp(a.data(), b.data(), a.size_bytes()) != 0) {
    for (int64_t i = 0; i < a.numel(); ++i)
      if (std::memcmp(a.data_as<float>() + i, b.data_as<float>() + i, 4) != 0)
        return ::testing::AssertionFailure() << "element " << i << ": " << a.data_as<float>()[i]
                                             << " vs " << b.data_as<float>()[i];
  }
  return ::testing::AssertionSuccess();
}

// One batch row of a span as a QuantKV (the dense kind is one row already).
const QuantKV& row_of(const KVSpan& s, int64_t b) {
  return s.kind == KVSpanKind::kQuantized ? s.quant : s.paged_quant.rows[b];
}
int64_t offset_of(const KVSpan& s, int64_t b) {
  return s.kind == KVSpanKind::kQuantized ? s.kv_offset : s.paged_quant.kv_offset[b];
}

// Attention of q [B, Hq, n, D] over the span at positions at.
Tensor attend(const TensorView& q, const KVSpan& span, int64_t dv, int64_t W,
              const QueryPositions& at) {
  AttentionKernel kernel("eager");
  Tensor out = Tensor::zeros(DType::kF32, {q.dim(0), q.dim(1), q.dim(2), dv});
  AttentionOptions o;
  o.sliding_window = W;
  kernel.attend(q, span, out.view(), o, at);
  return out;
}

struct Shape4 {
  int64_t H, Hq, dk, dv;
};

Shape4 shape_for(const Fmt& f) {
  // Odd head dims for KIVI (K and V widths differ); multiples of 32 for the per-token schemes.
  return f.scheme == KVQuantScheme::kKivi ? Shape4{2, 4, 40, 24} : Shape4{2, 4, 64, 64};
}

// Feeds the same steps through a dense quantized cache and a paged quantized one, comparing
// every step's attention output and the dequantized spans bit for bit.
void run_equal(const Fmt& f, int64_t G, const std::vector<int64_t>& steps,
               const std::string& type = "full_attention", int64_t W = 0, DType dt = DType::kF32) {
  SCOPED_TRACE(fmt_name(f) + " G=" + std::to_string(G) + " " + type + " " + dtype_name(dt));
  const Shape4 sh = shape_for(f);
  Cache dense(dense_config(f, G, type, W, dt));
  Cache paged(paged_config(f, G, type, W, dt));
  std::mt19937 rng(static_cast<uint32_t>(G * 31 + f.bits));
  int64_t pos = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const int64_t n = steps[i];
    SCOPED_TRACE("step " + std::to_string(i) + " (" + std::to_string(n) + " tokens at " +
                 std::to_string(pos) + ")");
    const Tensor k = random_tensor(DType::kF32, {1, sh.H, n, sh.dk}, rng);
    const Tensor v = random_tensor(DType::kF32, {1, sh.H, n, sh.dv}, rng);
    const Tensor q = random_tensor(DType::kF32, {1, sh.Hq, n, sh.dk}, rng);
    const KVSpan sd = dense.update(0, k.view(), v.view());
    const KVSpan sp = paged.update(0, k.view(), v.view());
    ASSERT_EQ(sd.kind, KVSpanKind::kQuantized);
    ASSERT_EQ(sp.kind, KVSpanKind::kPagedQuantized);
    ASSERT_EQ(sp.paged_quant.batch, 1);
    const QuantKV &qd = row_of(sd, 0), &qp = row_of(sp, 0);
    ASSERT_EQ(qp.n_blocks, qd.n_blocks);
    ASSERT_EQ(qp.residual_len(), qd.residual_len());
    ASSERT_EQ(offset_of(sp, 0), offset_of(sd, 0));
    QueryPositions at;
    at.pos0 = pos;
    EXPECT_TRUE(same_bits(attend(q.view(), sd, sh.dv, W, at), attend(q.view(), sp, sh.dv, W, at)));
    Tensor kd, vd, kp, vp;
    dequantize_quant_kv(qd, &kd, &vd);
    dequantize_quant_kv(qp, &kp, &vp);
    EXPECT_TRUE(same_bits(kd, kp));
    EXPECT_TRUE(same_bits(vd, vp));
    pos += n;
    EXPECT_EQ(paged.layer(0).seq_length(), pos);
  }
  auto& store = dynamic_cast<PagedLayer&>(paged.layer(0)).store();
  EXPECT_EQ(store.check_invariants(), "");
}

std::vector<int64_t> prefill_then_decodes(std::vector<int64_t> prefill, int decodes) {
  for (int i = 0; i < decodes; ++i) prefill.push_back(1);
  return prefill;
}

TEST(PagedQuant, EqualsDenseQuantizedBitForBit) {
  for (const Fmt& f : kFormats)
    for (const int64_t G : {16, 32}) {
      run_equal(f, G, prefill_then_decodes({37}, 40));
      run_equal(f, G, prefill_then_decodes({20, 17}, 40));  // chunked prefill
    }
}

TEST(PagedQuant, EqualsDenseQuantizedWithF16Residual) {
  run_equal({KVQuantScheme::kKivi, 4}, 16, prefill_then_decodes({37}, 20), "full_attention", 0,
            DType::kF16);
  run_equal({KVQuantScheme::kQ4_0, 4}, 16, prefill_then_decodes({5, 40, 3}, 20), "full_attention",
            0, DType::kBF16);
}

TEST(PagedQuant, SlidingLayersEqualDense) {
  // Decodes and chunks smaller than W - G: the dense layer drops a block at the step after its
  // last key left the window, when the paged group releases it (the big-chunk corner below).
  for (const Fmt& f : {kFormats[1], kFormats[3]})
    for (const int64_t G : {16, 32}) {
      run_equal(f, G, prefill_then_decodes({37}, 60), "sliding_attention", 40);
      run_equal(f, G, prefill_then_decodes({20, 17}, 60), "sliding_attention", 40);
    }
}

// The one corner where the spans differ: a step right after a chunk that filled blocks already
// out of the window. The dense layer drops blocks before its deferred flush, so it keeps them
// one step longer (a span starting earlier); the paged group released them when the chunk's
// step closed. The extra keys are masked: the attention output is the same bits, and the paged
// span is the tail of the dense one.
TEST(PagedQuant, SlidingSpanAfterABigChunkStartsLaterWithTheSameOutput) {
  const Fmt f{KVQuantScheme::kKivi, 4};
  const int64_t G = 16, W = 16;
  const Shape4 sh = shape_for(f);
  Cache dense(dense_config(f, G, "sliding_attention", W, DType::kF32));
  Cache paged(paged_config(f, G, "sliding_attention", W, DType::kF32));
  std::mt19937 rng(1);
  int64_t pos = 0, later = 0;
  for (const int64_t n : {37, 1, 1, 1, 1, 40, 1, 1}) {
    SCOPED_TRACE("at " + std::to_string(pos));
    const Tensor k = random_tensor(DType::kF32, {1, sh.H, n, sh.dk}, rng);
    const Tensor v = random_tensor(DType::kF32, {1, sh.H, n, sh.dv}, rng);
    const Tensor q = random_tensor(DType::kF32, {1, sh.Hq, n, sh.dk}, rng);
    const KVSpan sd = dense.update(0, k.view(), v.view());
    const KVSpan sp = paged.update(0, k.view(), v.view());
    QueryPositions at;
    at.pos0 = pos;
    EXPECT_TRUE(same_bits(attend(q.view(), sd, sh.dv, W, at), attend(q.view(), sp, sh.dv, W, at)));
    const int64_t skip = offset_of(sp, 0) - offset_of(sd, 0);
    ASSERT_GE(skip, 0);
    later += skip > 0;
    Tensor kd, vd, kp, vp;
    dequantize_quant_kv(row_of(sd, 0), &kd, &vd);
    dequantize_quant_kv(row_of(sp, 0), &kp, &vp);
    Tensor tail = Tensor::empty(DType::kF32, kp.shape());
    copy_view(kd.view().slice(2, skip, kd.dim(2)), tail.view());
    EXPECT_TRUE(same_bits(tail, kp));
    pos += n;
  }
  EXPECT_EQ(later, 2);  // after the 37-token prefill and after the 40-token chunk
}

// Batch rows at different lengths: each row equals the dense cache run on that row alone.
TEST(PagedQuant, BatchRowsEqualDenseRowsAlone) {
  const Fmt f{KVQuantScheme::kKivi, 4};
  const int64_t G = 16;
  const Shape4 sh = shape_for(f);
  PagedStoreConfig sc;
  sc.block_tokens = G;
  sc.layer_types = {"full_attention"};
  sc.dtype = DType::kF32;
  sc.kv_heads = sh.H;
  sc.head_dim = sh.dk;
  sc.head_dim_v = sh.dv;
  sc.max_tokens = 1024;
  sc.linear_slots = 3;
  sc.quant = PagedQuantFormat{f.scheme, f.bits};
  PagedKVStore store(sc);
  std::mt19937 rng(7);
  const int64_t prompt[3] = {37, 16, 5};
  std::vector<SeqId> seqs;
  std::vector<std::unique_ptr<Cache>> dense;
  for (int r = 0; r < 3; ++r) {
    seqs.push_back(store.add_sequence());
    dense.push_back(std::make_unique<Cache>(dense_config(f, G, "full_attention", 0, DType::kF32)));
    const SeqId one[1] = {seqs.back()};
    store.set_batch(one);
    const Tensor k = random_tensor(DType::kF32, {1, sh.H, prompt[r], sh.dk}, rng);
    const Tensor v = random_tensor(DType::kF32, {1, sh.H, prompt[r], sh.dv}, rng);
    ASSERT_EQ(store.plan_step(prompt[r]), StepStatus::kOk);
    store.write(0, k.view(), v.view());
    dense.back()->update(0, k.view(), v.view());
  }
  store.set_batch(seqs);
  int64_t pos[3] = {prompt[0], prompt[1], prompt[2]};
  for (int step = 0; step < 30; ++step) {
    SCOPED_TRACE("decode " + std::to_string(step));
    const Tensor k = random_tensor(DType::kF32, {3, sh.H, 1, sh.dk}, rng);
    const Tensor v = random_tensor(DType::kF32, {3, sh.H, 1, sh.dv}, rng);
    const Tensor q = random_tensor(DType::kF32, {3, sh.Hq, 1, sh.dk}, rng);
    ASSERT_EQ(store.plan_step(1), StepStatus::kOk);
    const KVSpan sp = store.write(0, k.view(), v.view());
    QueryPositions at;
    at.row_pos0 = pos;
    const Tensor out = attend(q.view(), sp, sh.dv, 0, at);
    for (int64_t r = 0; r < 3; ++r) {
      const KVSpan sd = dense[static_cast<size_t>(r)]->update(0, k.view().slice(0, r, r + 1),
                                                              v.view().slice(0, r, r + 1));
      QueryPositions one;
      one.pos0 = pos[r];
      const Tensor want = attend(q.view().slice(0, r, r + 1), sd, sh.dv, 0, one);
      Tensor got = Tensor::empty(DType::kF32, {1, sh.Hq, 1, sh.dv});
      copy_view(out.view().slice(0, r, r + 1), got.view());
      EXPECT_TRUE(same_bits(want, got)) << "row " << r;
      ++pos[r];
    }
  }
  EXPECT_EQ(store.check_invariants(), "");
}

PagedStoreConfig quant_store_config(int bits, int64_t G = 16, int32_t seqs = 4,
                                    KVQuantScheme scheme = KVQuantScheme::kKivi) {
  PagedStoreConfig sc;
  sc.block_tokens = static_cast<int32_t>(G);
  sc.layer_types = {"full_attention", "full_attention"};
  sc.dtype = DType::kF16;
  sc.kv_heads = 2;
  sc.head_dim = 64;
  sc.head_dim_v = 64;
  sc.max_tokens = 2048;
  sc.linear_slots = seqs;
  sc.max_step_tokens = 512;
  if (bits > 0) sc.quant = PagedQuantFormat{scheme, bits};
  return sc;
}

// Feeds `tokens` (from the sequence's length on) through every layer of the store in one step.
void feed(PagedKVStore& store, SeqId seq, const std::vector<int32_t>& tokens, int64_t from,
          uint32_t seed) {
  const SeqId one[1] = {seq};
  store.set_batch(one);
  const auto n = static_cast<int64_t>(tokens.size()) - from;
  ASSERT_EQ(store.plan_step(n, std::span<const int32_t>(tokens).subspan(static_cast<size_t>(from))),
            StepStatus::kOk);
  const PagedStoreConfig& c = store.config();
  for (int l = 0; l < static_cast<int>(c.layer_types.size()); ++l) store.attach_layer(l);
  for (int l = 0; l < static_cast<int>(c.layer_types.size()); ++l) {
    // K/V a function of (token, position): what a model computes, so equal prefixes give equal
    // rows whichever sequence computes them.
    Tensor k = Tensor::empty(DType::kF32, {1, c.kv_heads, n, c.head_dim});
    Tensor v = Tensor::empty(DType::kF32, {1, c.kv_heads, n, c.head_dim_v});
    for (int64_t h = 0; h < c.kv_heads; ++h)
      for (int64_t t = 0; t < n; ++t) {
        std::mt19937 rng(seed + static_cast<uint32_t>(tokens[static_cast<size_t>(from + t)] * 977 +
                                                      (from + t) * 31 + h * 7 + l));
        std::normal_distribution<float> d(0.0f, 1.0f);
        for (int64_t i = 0; i < c.head_dim; ++i) k.view().ptr_as<float>(0, h, t)[i] = d(rng);
        for (int64_t i = 0; i < c.head_dim_v; ++i) v.view().ptr_as<float>(0, h, t)[i] = d(rng);
      }
    store.write(l, k.view(), v.view());
  }
}

std::vector<int32_t> prompt_tokens(int n, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 13 + salt) % 251;
  return t;
}

// Two sequences sharing a 90% prefix at 4 bits: the pool holds one copy of its blocks.
TEST(PagedQuant, SharedPrefixBlocksAreCountedOnce) {
  PagedKVStore store(quant_store_config(4));
  const std::vector<int32_t> a = prompt_tokens(160, 0);
  std::vector<int32_t> b = a;
  for (size_t i = 144; i < b.size(); ++i) b[i] = 1000 + static_cast<int32_t>(i);  // 90% shared
  const SeqId sa = store.add_sequence();
  feed(store, sa, a, 0, 1);
  const SeqId sb = store.add_sequence();
  EXPECT_EQ(store.attach_prefix(sb, b), 144);  // 9 full blocks, no tail copy (quantized)
  feed(store, sb, b, 144, 1);
  const PagedGroupStats st = store.stats(0);
  const KVBlockFormat f = store.quant_format();
  const size_t block = 2 * 2 * static_cast<size_t>(kv_k_block_bytes(f) + kv_v_block_bytes(f));
  EXPECT_EQ(st.block_bytes, block);
  EXPECT_EQ(st.pool.used, 10 + 1);  // a's 10 blocks + b's own last one
  EXPECT_EQ(st.used_bytes, (10 + 1) * block);
  EXPECT_EQ(store.check_invariants(), "");
  // The hit reads what recomputing b gives, bit for bit: same packed blocks, same residual.
  PagedKVStore fresh(quant_store_config(4));
  const SeqId sf = fresh.add_sequence();
  feed(fresh, sf, b, 0, 1);
  const SeqId one_b[1] = {sb}, one_f[1] = {sf};
  store.set_batch(one_b);
  fresh.set_batch(one_f);
  for (int l = 0; l < 2; ++l) {
    Tensor k1, v1, k2, v2;
    dequantize_quant_kv(store.peek_span(l).paged_quant.rows[0], &k1, &v1);
    dequantize_quant_kv(fresh.peek_span(l).paged_quant.rows[0], &k2, &v2);
    EXPECT_TRUE(same_bits(k1, k2));
    EXPECT_TRUE(same_bits(v1, v2));
  }
}

// The format is part of every block key and of the layout digest.
TEST(PagedQuant, FormatIsPartOfBlockKeys) {
  const std::vector<int32_t> t = prompt_tokens(65, 3);
  PagedKVStore f16(quant_store_config(0)), q4(quant_store_config(4)), q4b(quant_store_config(4)),
      q2(quant_store_config(2)), q8_0(quant_store_config(8, 16, 4, KVQuantScheme::kQ8_0)),
      q4g32(quant_store_config(4, 32));
  const auto k_f16 = f16.prefix_block_keys(t), k4 = q4.prefix_block_keys(t),
             k4b = q4b.prefix_block_keys(t), k2 = q2.prefix_block_keys(t),
             k8 = q8_0.prefix_block_keys(t);
  ASSERT_EQ(k4[0].size(), 4u);
  EXPECT_EQ(k4, k4b);  // deterministic
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NE(k_f16[0][i], k4[0][i]);
    EXPECT_NE(k2[0][i], k4[0][i]);
    EXPECT_NE(k8[0][i], k4[0][i]);
  }
  EXPECT_NE(f16.layout_digest(), q4.layout_digest());
  EXPECT_NE(q2.layout_digest(), q4.layout_digest());
  EXPECT_EQ(q4.layout_digest(), q4b.layout_digest());
  // A 4-bit store's blocks are never found under f16 keys (and the reverse).
  const SeqId s = q4.add_sequence();
  feed(q4, s, t, 0, 5);
  q4.free_sequence(s);
  EXPECT_EQ(q4.match_prefix(t), 64);
  const SeqId s16 = f16.add_sequence();
  feed(f16, s16, t, 0, 5);
  f16.free_sequence(s16);
  EXPECT_EQ(f16.match_prefix(t, {}, PagedKVStore::PrefixMatch::kFullBlocks), 64);
  EXPECT_NE(f16.prefix_block_keys(t)[0].back(), q4.prefix_block_keys(t)[0].back());
}

// Packed blocks spilled to the disk tier and loaded by another store read as computed.
TEST(PagedQuant, DiskTierRoundTripsPackedBlocks) {
  testing_util::ScratchDir dir("pq_disk");
  const std::vector<int32_t> t = prompt_tokens(70, 4);
  const auto tier = [&](const PagedKVStore& s) {
    DiskTierOptions o;
    o.dir = dir.str();
    o.budget_bytes = 64ull << 20;
    o.fingerprint = s.layout_digest();
    o.block_tokens = s.block_tokens();
    return std::make_shared<DiskTier>(o);
  };
  PagedKVStore a(quant_store_config(4));
  a.set_disk_tier(tier(a));
  const SeqId sa = a.add_sequence();
  feed(a, sa, t, 0, 3);
  const SeqId one_a[1] = {sa};
  a.set_batch(one_a);
  Tensor ka, va;
  dequantize_quant_kv(a.peek_span(1).paged_quant.rows[0], &ka, &va);
  a.free_sequence(sa);
  EXPECT_EQ(a.spill_to_disk(), 4);
  a.set_disk_tier(nullptr);

  PagedKVStore b(quant_store_config(4));
  b.set_disk_tier(tier(b));
  const SeqId sb = b.add_sequence();
  EXPECT_EQ(b.attach_prefix(sb, t), 64);
  EXPECT_EQ(b.last_prefix_disk_tokens(), 64);
  feed(b, sb, t, 64, 3);
  const SeqId one_b[1] = {sb};
  b.set_batch(one_b);
  Tensor kb, vb;
  dequantize_quant_kv(b.peek_span(1).paged_quant.rows[0], &kb, &vb);
  EXPECT_TRUE(same_bits(ka, kb));
  EXPECT_TRUE(same_bits(va, vb));
  EXPECT_EQ(b.check_invariants(), "");
  // An f16 store's digest differs: its tier never reads these files.
  EXPECT_NE(PagedKVStore(quant_store_config(0)).layout_digest(), b.layout_digest());
}

TEST(PagedQuant, BytesArePredictedExactly) {
  for (const int bits : {2, 4, 8}) {
    const PagedStoreConfig c = quant_store_config(bits);
    PagedKVStore store(c);
    EXPECT_EQ(store.pool_bytes(), predict_pool_bytes(c));
    EXPECT_EQ(store.quant_state_bytes(), predict_quant_state_bytes(c));
    EXPECT_GT(store.quant_state_bytes(), 0u);
    // The packed pages are smaller than f16 pages of the same blocks.
    EXPECT_LT(predict_pool_bytes(c), predict_pool_bytes(quant_store_config(0)));
    const KVBlockFormat f = store.quant_format();
    EXPECT_EQ(paged_block_bytes(c, store.group(0)),
              2u * 2u * static_cast<size_t>(kv_k_block_bytes(f) + kv_v_block_bytes(f)));
    // Residual slots [4, H, G, D] of K and V + the workspace (4 * 15 + 512 tokens) per layer,
    // f16, plus one block of f32 scratch.
    EXPECT_EQ(predict_quant_state_bytes(c),
              2u * 2u * ((4 * 16 + 4 * 15 + 512) * 2 * 64 * 2) + 16u * 64u * 4u);
    EXPECT_GE(store.bytes(), store.pool_bytes() + store.quant_state_bytes());
  }
}

TEST(PagedQuant, ForkCropAbortKeepResiduals) {
  const Fmt f{KVQuantScheme::kKivi, 4};
  PagedKVStore store(quant_store_config(4));
  const std::vector<int32_t> t = prompt_tokens(45, 1);
  const SeqId a = store.add_sequence();
  feed(store, a, t, 0, 9);  // 2 full blocks + 13 residual tokens
  std::vector<SeqId> kids;
  ASSERT_TRUE(store.fork(a, 1, kids));
  EXPECT_EQ(store.check_invariants(), "");
  const SeqId both[2] = {a, kids[0]};
  store.set_batch(both);
  {
    const KVSpan s = store.peek_span(1);
    ASSERT_EQ(s.paged_quant.batch, 2);
    Tensor k1, v1, k2, v2;
    dequantize_quant_kv(s.paged_quant.rows[0], &k1, &v1);
    dequantize_quant_kv(s.paged_quant.rows[1], &k2, &v2);
    EXPECT_TRUE(same_bits(k1, k2));
    EXPECT_TRUE(same_bits(v1, v2));
    EXPECT_EQ(s.paged_quant.rows[1].n_blocks, 2);
    EXPECT_EQ(s.paged_quant.rows[1].residual_len(), 13);
    EXPECT_EQ(s.paged_quant.rows[0].block_ids[0], s.paged_quant.rows[1].block_ids[0]);
  }
  // Crop into a full block: its kept tokens come back dequantized (as the dense crop does).
  const SeqId one[1] = {kids[0]};
  store.set_batch(one);
  Tensor before_k, before_v;
  dequantize_quant_kv(store.peek_span(0).paged_quant.rows[0], &before_k, &before_v);
  store.crop(20);
  EXPECT_EQ(store.length(kids[0]), 20);
  {
    const QuantKV& r = store.peek_span(0).paged_quant.rows[0];
    EXPECT_EQ(r.n_blocks, 1);
    EXPECT_EQ(r.residual_len(), 4);
    Tensor k, v;
    dequantize_quant_kv(r, &k, &v);
    // Block 0 as it read before; tokens 16..19 dequantized from block 1 into the f16 residual.
    Tensor want32 = Tensor::empty(DType::kF32, {1, 2, 20, 64});
    copy_view(before_k.view().slice(2, 0, 20), want32.view());
    Tensor f16 = Tensor::empty(DType::kF16, {1, 2, 4, 64});
    copy_view(before_k.view().slice(2, 16, 20), f16.view());
    copy_view(f16.view(), want32.view().slice(2, 16, 20));
    EXPECT_TRUE(same_bits(k, want32));
  }
  EXPECT_EQ(store.check_invariants(), "");
  // Crop within the residual just shortens it.
  store.crop(18);
  EXPECT_EQ(store.peek_span(0).paged_quant.rows[0].residual_len(), 2);
  // An aborted step leaves the residual as it was.
  ASSERT_EQ(store.plan_step(30), StepStatus::kOk);
  store.abort_step();
  EXPECT_EQ(store.length(kids[0]), 18);
  EXPECT_EQ(store.peek_span(0).paged_quant.rows[0].residual_len(), 2);
  EXPECT_EQ(store.check_invariants(), "");
  store.free_sequence(kids[0]);
  store.free_sequence(a);
  EXPECT_EQ(store.free_sequence_slots(), 4);
  EXPECT_EQ(store.check_invariants(), "");
  (void)f;
}

void expect_refused(const std::function<void()>& fn, ErrorKind kind, const std::string& part) {
  try {
    fn();
    ADD_FAILURE() << "not refused: " << part;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(PagedQuant, RefusesWhatItCannotHold) {
  {
    PagedStoreConfig c = quant_store_config(4);
    c.shared_kv = true;
    expect_refused([&] { PagedKVStore s(c); }, ErrorKind::kUnsupported, "K == V");
  }
  for (const char* type :
       {"linear_attention", "compressed_sparse_attention", "deepseek_sparse_attention"}) {
    PagedStoreConfig c = quant_store_config(4);
    c.layer_types = {"full_attention", type};
    expect_refused([&] { PagedKVStore st(c); }, ErrorKind::kUnsupported, type);
  }
  {  // MLA through the protocol
    CacheConfig c = paged_config({KVQuantScheme::kKivi, 4}, 16, "full_attention", 0, DType::kF32);
    c.kv_content = CacheConfig::KVContent::kMlaLatent;
    expect_refused([&] { Cache cache(c); }, ErrorKind::kUnsupported, "MLA");
  }
  {  // q8_0 needs head dims that are multiples of 32
    PagedStoreConfig c = quant_store_config(8, 16, 4, KVQuantScheme::kQ8_0);
    c.head_dim = c.head_dim_v = 40;
    expect_refused([&] { PagedKVStore s(c); }, ErrorKind::kInvalidArgument, "32");
  }
  {  // one residual slot per live sequence
    PagedKVStore s(quant_store_config(4, 16, 2));
    s.add_sequence();
    s.add_sequence();
    expect_refused([&] { s.add_sequence(); }, ErrorKind::kOutOfRange, "residual slots");
  }
  {  // a step larger than the workspaces
    PagedKVStore s(quant_store_config(4));
    const SeqId one[1] = {s.add_sequence()};
    s.set_batch(one);
    expect_refused([&] { (void)s.plan_step(513); }, ErrorKind::kInvalidArgument, "max_step_tokens");
  }
}

}  // namespace
}  // namespace kvcache
