// The indexer top-k and the sparse attention (kernels/sparse_attention.h).
//
// Tolerance: the fast sparse_attention matches sparse_attention_reference (double arithmetic)
// within |fast - ref| <= 2e-5 * (1 + |ref|) per output element, whatever the storage (f16 and
// bf16 rows are widened to f32 exactly by both). The fast indexer_topk's scores are f32 sums in
// another order than the reference's double ones: on integer-valued inputs (every score exact
// in both) the selections are equal, index for index, ties included; on random inputs the
// fast selection is a top-k of the reference scores within 1e-4 relative.
// The reference itself is checked against a brute-force dense softmax over an explicit mask
// built the way transformers' DeepseekV4Attention builds it (sliding causal mask, block_bias
// from the selected entries, the sink as an extra column).
#include "kernels/sparse_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernel_test_util.h"

namespace kvcache {
namespace {

using testing_util::expect_invalid_argument;
using testing_util::randn;

const float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<std::byte> to_bytes(const std::vector<float>& x, DType t) {
  std::vector<std::byte> out(dtype_bytes(t, static_cast<int64_t>(x.size())));
  convert_n(x.data(), DType::kF32, out.data(), t, x.size());
  return out;
}

// A span over values [B, H, T, D] (k) and [B, H, T, Dv] (v, or none: K == V) stored as `dt`,
// dense, or paged with `bt` slots per page (pages in a shuffled order, NaN in every slot past a
// row's length). Row b holds its first len[b] tokens (dense: all T).
struct Store {
  std::vector<std::byte> k, v;
  std::vector<int32_t> indptr, indices, last;
  KVSpan span;
};

enum class VMode { kOwn, kAlias, kEmpty };

Store make_store(const std::vector<float>& kf, const std::vector<float>* vf, DType dt, int64_t B,
                 int64_t H, int64_t T, int64_t D, int64_t Dv, int64_t kv_offset, int64_t bt,
                 const std::vector<int64_t>& len, VMode vmode, uint32_t seed = 7) {
  Store s;
  s.span.kv_offset = kv_offset;
  if (bt == 0) {
    s.k = to_bytes(kf, dt);
    s.span.kind = KVSpanKind::kDense;
    s.span.k = TensorView(s.k.data(), dt, Shape{B, H, T, D});
    if (vmode == VMode::kOwn) {
      s.v = to_bytes(*vf, dt);
      s.span.v = TensorView(s.v.data(), dt, Shape{B, H, T, Dv});
    } else if (vmode == VMode::kAlias) {
      s.span.v = s.span.k;
    }
    return s;
  }
  s.span.kind = KVSpanKind::kPaged;
  std::vector<int64_t> np(static_cast<size_t>(B));
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) total += np[b] = (len[b] + bt - 1) / bt;
  const int64_t P = total + 2;  // two pages nobody owns
  std::vector<int32_t> perm(static_cast<size_t>(P));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<float> kp(static_cast<size_t>(P * H * bt * D), kNaN);
  std::vector<float> vp(static_cast<size_t>(P * H * bt * Dv), kNaN);
  s.indptr.push_back(0);
  int64_t next = 0;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < np[b]; ++i) {
      const int32_t page = perm[static_cast<size_t>(next++)];
      s.indices.push_back(page);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t slot = 0; slot < bt; ++slot) {
          const int64_t j = i * bt + slot;
          if (j >= len[b]) continue;
          for (int64_t d = 0; d < D; ++d)
            kp[((page * H + h) * bt + slot) * D + d] = kf[((b * H + h) * T + j) * D + d];
          if (vmode == VMode::kOwn)
            for (int64_t d = 0; d < Dv; ++d)
              vp[((page * H + h) * bt + slot) * Dv + d] = (*vf)[((b * H + h) * T + j) * Dv + d];
        }
    }
    s.indptr.push_back(static_cast<int32_t>(s.indices.size()));
    s.last.push_back(np[b] == 0 ? 0 : static_cast<int32_t>(len[b] - (np[b] - 1) * bt));
  }
  s.k = to_bytes(kp, dt);
  PagedKV& pk = s.span.paged;
  pk.k_pages = TensorView(s.k.data(), dt, Shape{P, H, bt, D});
  if (vmode == VMode::kOwn) {
    s.v = to_bytes(vp, dt);
    pk.v_pages = TensorView(s.v.data(), dt, Shape{P, H, bt, Dv});
  } else if (vmode == VMode::kAlias) {
    pk.v_pages = pk.k_pages;
  }
  pk.batch = B;
  pk.block_tokens = bt;
  pk.indptr = s.indptr.data();
  pk.indices = s.indices.data();
  pk.last_page_len = s.last.data();
  return s;
}

// The rows values survive storage as (what both kernels read).
std::vector<float> stored(const std::vector<float>& x, DType t) {
  std::vector<float> out(x.size());
  const std::vector<std::byte> b = to_bytes(x, t);
  convert_n(b.data(), t, out.data(), DType::kF32, x.size());
  return out;
}

// Distinct entries below lim per query (some -1 slots among them), deterministic.
std::vector<int32_t> random_selection(int64_t B, int64_t S, int64_t k,
                                      const std::vector<int64_t>& pos, int64_t rate,
                                      uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> sel(static_cast<size_t>(B * S * k), -1);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < S; ++t) {
      const int64_t lim = (pos[b] + t + 1) / rate;
      std::vector<int32_t> all(static_cast<size_t>(lim));
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      int32_t* out = sel.data() + (b * S + t) * k;
      for (int64_t i = 0, n = 0; i < k && n < lim; ++i) {
        if (rng() % 5 == 0) continue;  // a -1 hole
        out[i] = all[static_cast<size_t>(n++)];
      }
    }
  return sel;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = rtol * (1.0 + std::fabs(want[i]));
    if (!(std::fabs(got[i] - want[i]) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

// One sparse attention problem (V4-like by default: one KV head, K == V, window + entries).
struct Case {
  int64_t B = 2, Hq = 6, Hkv = 1, S = 1, D = 37, Dv = 37, W = 5, rate = 3, top_k = 7;
  std::vector<int64_t> pos{40, 40};
  DType dt = DType::kF32;
  int64_t bt = 0;       // 0: dense spans; else paged with bt slots per page
  bool window = true;   // a window span
  bool entries = true;  // an entries span
  bool select = true;   // selected entries (else every visible one: HCA)
  bool sinks = true;
  bool full_history = false;  // the window span holds every position from 0 (recompute-like)
  VMode vmode = VMode::kAlias;
  uint32_t seed = 1;
};

struct Built {
  Case c;
  std::vector<float> q, sinks, wk, wv, ek, ev;  // values as stored
  std::vector<int32_t> sel;
  int64_t Tw = 0, w_off = 0, Te = 0;
  Store win, ent;
  SparseAttentionParams params;
};

Built build(const Case& c) {
  Built x;
  x.c = c;
  const int64_t B = c.B, Hkv = c.Hkv;
  int64_t last_max = 0, first_min = std::numeric_limits<int64_t>::max();
  for (int64_t b = 0; b < B; ++b) {
    last_max = std::max(last_max, c.pos[b] + c.S - 1);
    first_min = std::min(first_min, c.pos[b]);
  }
  x.q = randn(static_cast<size_t>(B * c.Hq * c.S * c.D), c.seed);
  x.sinks = randn(static_cast<size_t>(c.Hq), c.seed + 1);
  // Window: positions w_off .. last (rows of a row b past its own last are NaN, never read).
  x.w_off = c.full_history ? 0 : std::max<int64_t>(first_min - c.W + 1, 0);
  x.Tw = last_max + 1 - x.w_off;
  std::vector<int64_t> wlen(static_cast<size_t>(B)), elen(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    wlen[b] = c.pos[b] + c.S - x.w_off;
    elen[b] = (c.pos[b] + c.S) / c.rate;
  }
  x.Te = (last_max + 1) / c.rate;
  x.wk = stored(randn(static_cast<size_t>(B * Hkv * x.Tw * c.D), c.seed + 2), c.dt);
  x.wv = stored(randn(static_cast<size_t>(B * Hkv * x.Tw * c.Dv), c.seed + 3), c.dt);
  x.ek = stored(randn(static_cast<size_t>(B * Hkv * x.Te * c.D), c.seed + 4), c.dt);
  x.ev = stored(randn(static_cast<size_t>(B * Hkv * x.Te * c.Dv), c.seed + 5), c.dt);
  // Window rows before the first query's window: NaN, so a read of them shows.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hkv; ++h)
      for (int64_t j = 0; j < x.Tw; ++j)
        if (x.w_off + j < c.pos[b] - c.W + 1 || x.w_off + j > c.pos[b] + c.S - 1) {
          for (int64_t d = 0; d < c.D; ++d) x.wk[((b * Hkv + h) * x.Tw + j) * c.D + d] = kNaN;
          for (int64_t d = 0; d < c.Dv; ++d) x.wv[((b * Hkv + h) * x.Tw + j) * c.Dv + d] = kNaN;
        }
  if (c.vmode != VMode::kOwn) {  // K == V
    x.wv = x.wk;
    x.ev = x.ek;
  }
  if (c.window)
    x.win = make_store(x.wk, &x.wv, c.dt, B, Hkv, x.Tw, c.D, c.Dv, x.w_off, c.bt, wlen, c.vmode);
  if (c.entries)
    x.ent = make_store(x.ek, &x.ev, c.dt, B, Hkv, x.Te, c.D, c.Dv, 0, c.bt, elen, c.vmode, 11);
  if (c.select) x.sel = random_selection(B, c.S, c.top_k, c.pos, c.rate, c.seed + 6);
  x.params.sliding_window = c.W;
  x.params.sinks = c.sinks ? x.sinks.data() : nullptr;
  x.params.rate = c.rate;
  x.params.selected = c.select ? x.sel.data() : nullptr;
  x.params.top_k = c.top_k;
  return x;
}

using Fn = void (*)(const TensorView&, const KVSpan&, const KVSpan&, std::span<const int64_t>,
                    const SparseAttentionParams&, const TensorView&);

std::vector<float> run(Fn fn, Built& x) {
  const Case& c = x.c;
  std::vector<float> out(static_cast<size_t>(c.B * c.Hq * c.S * c.Dv), 12345.0f);
  fn(TensorView(x.q.data(), DType::kF32, Shape{c.B, c.Hq, c.S, c.D}), x.win.span, x.ent.span, c.pos,
     x.params, TensorView(out.data(), DType::kF32, Shape{c.B, c.Hq, c.S, c.Dv}));
  return out;
}

void expect_fast_matches_reference(const Case& c, const char* what) {
  Built x = build(c);
  const std::vector<float> ref = run(&sparse_attention_reference, x);
  const std::vector<float> fast = run(&sparse_attention, x);
  for (float v : ref) ASSERT_TRUE(std::isfinite(v)) << what << ": the reference read a NaN row";
  expect_close(fast, ref, 2e-5, what);
}

TEST(SparseAttention, FastMatchesReferenceCsaDecodeAndPrefill) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t S : {1, 7})
      for (int64_t bt : {0, 3}) {
        Case c;
        c.dt = dt;
        c.S = S;
        c.bt = bt;
        if (bt) c.pos = {40, 29};  // paged rows sit at different positions
        expect_fast_matches_reference(c, "csa");
      }
}

TEST(SparseAttention, FastMatchesReferenceShapes) {
  Case c;
  c.Hq = 9;  // not a multiple of the 4-head register block
  c.D = c.Dv = 53;
  c.W = 11;
  c.top_k = 19;  // more than the visible entries of the early queries
  c.S = 13;
  c.pos = {3, 3};  // the first queries see no entry at all
  expect_fast_matches_reference(c, "odd shapes, early positions");
  c.sinks = false;
  expect_fast_matches_reference(c, "no sinks");
  c.full_history = true;
  expect_fast_matches_reference(c, "window span from position 0");
  c.vmode = VMode::kEmpty;
  expect_fast_matches_reference(c, "empty v view (v == k)");
}

TEST(SparseAttention, FastMatchesReferenceLongDecodeSplit) {
  Case c;  // V4-like decode: the key list is cut into parts and merged
  c.B = 1;
  c.pos = {4100};
  c.Hq = 16;
  c.D = c.Dv = 64;
  c.W = 128;
  c.rate = 4;
  c.top_k = 300;
  for (DType dt : {DType::kF32, DType::kBF16}) {
    c.dt = dt;
    c.select = true;
    expect_fast_matches_reference(c, "csa decode");
    c.select = false;  // HCA: every visible entry
    c.rate = 128;
    expect_fast_matches_reference(c, "hca decode");
    c.rate = 4;
  }
}

TEST(SparseAttention, FastMatchesReferenceHcaSlidingAndDsa) {
  Case c;
  c.select = false;
  expect_fast_matches_reference(c, "hca");
  c.bt = 4;
  c.pos = {40, 31};
  expect_fast_matches_reference(c, "hca paged");
  Case sl;
  sl.entries = false;
  sl.select = false;
  sl.S = 5;
  expect_fast_matches_reference(sl, "sliding only");
  Case dsa;  // no window; the entries are the full-attention span, GQA, separate V, D_v != D
  dsa.window = false;
  dsa.rate = 1;
  dsa.Hq = 8;
  dsa.Hkv = 2;
  dsa.Dv = 29;
  dsa.vmode = VMode::kOwn;
  dsa.S = 6;
  dsa.top_k = 13;
  for (int64_t bt : {0, 5}) {
    dsa.bt = bt;
    if (bt) dsa.pos = {40, 17};
    expect_fast_matches_reference(dsa, "dsa");
  }
  dsa.select = false;  // full causal attention over the span
  expect_fast_matches_reference(dsa, "dsa, all entries");
}

TEST(SparseAttention, PagedEqualsDenseBitForBit) {
  for (DType dt : {DType::kF32, DType::kF16}) {
    Case c;
    c.dt = dt;
    c.S = 3;
    Built dense = build(c);
    c.bt = 4;
    Built paged = build(c);
    const std::vector<float> a = run(&sparse_attention, dense), b = run(&sparse_attention, paged);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  }
}

// The reference against a dense softmax over an explicit mask, built as transformers does:
// keys = cat(window keys, entries), mask = sliding causal mask on the first part and the
// selected entries' block_bias on the second, then the sink column; softmax; drop the sink.
TEST(SparseAttention, ReferenceMatchesMaskedDenseSoftmax) {
  Case c;
  c.S = 6;
  c.B = 1;
  c.pos = {17};
  c.full_history = true;  // window rows = positions 0..last
  Built x = build(c);
  const std::vector<float> ref = run(&sparse_attention_reference, x);
  const int64_t Tw = x.Tw, Te = x.Te, D = c.D;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  for (int64_t h = 0; h < c.Hq; ++h)
    for (int64_t t = 0; t < c.S; ++t) {
      const int64_t p = c.pos[0] + t;
      std::vector<double> logit(static_cast<size_t>(Tw + Te + 1));
      std::vector<bool> masked(logit.size(), true);
      for (int64_t j = 0; j < Tw; ++j) masked[j] = !(j <= p && j > p - c.W);
      for (int64_t i = 0; i < c.top_k; ++i) {
        const int32_t e = x.sel[t * c.top_k + i];
        if (e >= 0) masked[Tw + e] = false;
      }
      masked[Tw + Te] = false;  // the sink
      double mx = -1e300;
      for (int64_t j = 0; j < Tw + Te; ++j) {
        if (masked[j]) continue;
        const float* kr = j < Tw ? &x.wk[j * D] : &x.ek[(j - Tw) * D];
        double dot = 0;
        for (int64_t d = 0; d < D; ++d) dot += double{x.q[(h * c.S + t) * D + d]} * kr[d];
        logit[j] = dot * scale;
        mx = std::max(mx, logit[j]);
      }
      logit[Tw + Te] = x.sinks[h];
      mx = std::max(mx, logit[Tw + Te]);
      double den = 0;
      for (size_t j = 0; j < logit.size(); ++j)
        if (!masked[j]) den += std::exp(logit[j] - mx);
      for (int64_t d = 0; d < c.Dv; ++d) {
        double o = 0;
        for (int64_t j = 0; j < Tw + Te; ++j)
          if (!masked[j])
            o +=
                std::exp(logit[j] - mx) / den * (j < Tw ? x.wk[j * D + d] : x.ek[(j - Tw) * D + d]);
        EXPECT_NEAR(ref[(h * c.S + t) * c.Dv + d], o, 1e-6) << "h " << h << " t " << t;
      }
    }
}

TEST(SparseAttention, RejectsBadArgumentsBeforeWriting) {
  const auto expect_rejected = [](Case c, auto&& mutate, const char* needle) {
    Built x = build(c);
    mutate(x);
    for (Fn fn : {Fn{&sparse_attention}, Fn{&sparse_attention_reference}}) {
      std::vector<float> out;
      expect_invalid_argument([&] { out = run(fn, x); }, needle);
      EXPECT_TRUE(out.empty());
      std::vector<float> sentinel(static_cast<size_t>(c.B * c.Hq * c.S * c.Dv), 7.0f);
      try {
        fn(TensorView(x.q.data(), DType::kF32, Shape{c.B, c.Hq, c.S, c.D}), x.win.span, x.ent.span,
           x.c.pos, x.params,
           TensorView(sentinel.data(), DType::kF32, Shape{c.B, c.Hq, c.S, c.Dv}));
      } catch (const Error&) {
      }
      for (float v : sentinel) ASSERT_EQ(v, 7.0f) << needle << ": written before the error";
    }
  };
  Case c;
  c.S = 2;
  expect_rejected(
      c, [](Built& x) { x.sel[3] = -2; }, "is outside");
  expect_rejected(
      c, [](Built& x) { x.sel[0] = static_cast<int32_t>(x.Te); }, "is outside");
  expect_rejected(
      c, [](Built& x) { x.sel[1] = x.sel[0] = 2; }, "twice");
  expect_rejected(
      c, [](Built& x) { x.win.span.kv_offset += 1; }, "must end at the last query");
  expect_rejected(
      c, [](Built& x) { x.win.span.kv_offset -= 1; }, "must end at the last query");
  expect_rejected(
      c,
      [](Built& x) {
        x.ent.span.k = x.ent.span.k.slice(2, 0, x.Te - 1);
        x.ent.span.v = x.ent.span.k;
      },
      "the entries span holds");
  expect_rejected(
      c, [](Built& x) { x.params.rate = 0; }, "rate");
  expect_rejected(
      c, [](Built& x) { x.params.sliding_window = 0; }, "sliding_window");
  expect_rejected(
      c, [](Built& x) { x.win.span.k = x.win.span.k.slice(3, 0, 5); }, "rows are 5 wide");
  expect_rejected(
      c, [](Built& x) { x.c.pos.pop_back(); }, "pos has 1 entries");
  c.bt = 3;
  c.pos = {40, 29};
  expect_rejected(
      c, [](Built& x) { x.ent.indices[1] = 999; }, "page id 999");
  expect_rejected(
      c, [](Built& x) { x.ent.last[0] = 0; }, "last_page_len");
}

// ---- the indexer ----

struct IndexerCase {
  int64_t B = 2, S = 1, H = 5, C = 19, rate = 4, top_k = 6;
  std::vector<int64_t> pos{57, 57};
  DType dt = DType::kF32;
  int64_t bt = 0;
  bool integers = false;  // small integer values: every score exact in any order
  int dup_every = 0;      // > 0: key s copies key s % dup_every (forced ties)
  uint32_t seed = 3;
};

struct IndexerBuilt {
  std::vector<float> q, w, k;
  Store keys;
  IndexerParams params;
  int64_t T = 0;
};

IndexerBuilt build_indexer(const IndexerCase& c) {
  IndexerBuilt x;
  std::mt19937 rng(c.seed);
  const auto fill = [&](size_t n, float lo_int, float hi_int) {
    std::vector<float> v = randn(n, static_cast<uint32_t>(rng()));
    if (c.integers) {
      std::uniform_int_distribution<int> d(static_cast<int>(lo_int), static_cast<int>(hi_int));
      for (float& e : v) e = static_cast<float>(d(rng));
    }
    return v;
  };
  int64_t last_max = 0;
  std::vector<int64_t> len(static_cast<size_t>(c.B));
  for (int64_t b = 0; b < c.B; ++b) {
    last_max = std::max(last_max, c.pos[b] + c.S - 1);
    len[b] = (c.pos[b] + c.S) / c.rate;
  }
  x.T = (last_max + 1) / c.rate;
  x.q = fill(static_cast<size_t>(c.B * c.S * c.H * c.C), -3, 3);
  x.w = fill(static_cast<size_t>(c.B * c.S * c.H), -2, 3);
  x.k = stored(fill(static_cast<size_t>(c.B * x.T * c.C), -3, 3), c.dt);
  if (c.dup_every > 0)
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t s = c.dup_every; s < x.T; ++s)
        std::copy_n(&x.k[(b * x.T + s % c.dup_every) * c.C], c.C, &x.k[(b * x.T + s) * c.C]);
  x.keys = make_store(x.k, nullptr, c.dt, c.B, 1, x.T, c.C, c.C, 0, c.bt, len, VMode::kEmpty);
  x.params.rate = c.rate;
  x.params.top_k = c.top_k;
  x.params.index_scale = c.integers ? 0.25f : 1.0f / std::sqrt(static_cast<float>(c.C));
  return x;
}

using IndexerFn = void (*)(const TensorView&, const TensorView&, const KVSpan&,
                           std::span<const int64_t>, const IndexerParams&, int32_t*);

std::vector<int32_t> run_indexer(IndexerFn fn, const IndexerCase& c, IndexerBuilt& x) {
  std::vector<int32_t> sel(static_cast<size_t>(c.B * c.S * c.top_k), 777);
  fn(TensorView(x.q.data(), DType::kF32, Shape{c.B, c.S, c.H, c.C}),
     TensorView(x.w.data(), DType::kF32, Shape{c.B, c.S, c.H}), x.keys.span, c.pos, x.params,
     sel.data());
  return sel;
}

// Score of entry s for query (b, t), in double (the definition).
double score(const IndexerCase& c, const IndexerBuilt& x, int64_t b, int64_t t, int64_t s) {
  double sum = 0;
  for (int64_t h = 0; h < c.H; ++h) {
    double dot = 0;
    for (int64_t d = 0; d < c.C; ++d)
      dot += double{x.q[((b * c.S + t) * c.H + h) * c.C + d]} * x.k[(b * x.T + s) * c.C + d];
    sum += x.w[(b * c.S + t) * c.H + h] * std::max(dot, 0.0) * x.params.index_scale;
  }
  return sum;
}

TEST(IndexerTopk, ExactOnIntegerScoresWithTies) {
  for (DType dt : {DType::kF32, DType::kBF16})
    for (int64_t bt : {0, 5})
      for (int64_t S : {1, 9}) {
        IndexerCase c;
        c.dt = dt;
        c.bt = bt;
        c.S = S;
        c.integers = true;
        c.dup_every = 7;  // every score appears several times
        c.top_k = 11;
        if (bt) c.pos = {57, 20};
        IndexerBuilt x = build_indexer(c);
        const std::vector<int32_t> ref = run_indexer(&indexer_topk_reference, c, x);
        const std::vector<int32_t> fast = run_indexer(&indexer_topk, c, x);
        EXPECT_EQ(fast, ref);
        // The order is (-score, index): ties by the lower index, and -1 past the visible.
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t t = 0; t < S; ++t) {
            const int32_t* r = ref.data() + (b * S + t) * c.top_k;
            const int64_t lim = (c.pos[b] + t + 1) / c.rate;
            for (int64_t i = 0; i < c.top_k; ++i) {
              if (i >= lim) {
                EXPECT_EQ(r[i], -1);
                continue;
              }
              ASSERT_GE(r[i], 0);
              ASSERT_LT(r[i], lim);
              if (i > 0) {
                const double a = score(c, x, b, t, r[i - 1]), z = score(c, x, b, t, r[i]);
                EXPECT_TRUE(a > z || (a == z && r[i - 1] < r[i])) << "order at " << i;
              }
            }
            // Nothing unselected beats the last selected one.
            if (lim > c.top_k) {
              const double kth = score(c, x, b, t, r[c.top_k - 1]);
              for (int64_t s = 0; s < lim; ++s)
                if (std::find(r, r + c.top_k, s) == r + c.top_k) {
                  const double v = score(c, x, b, t, s);
                  EXPECT_TRUE(v < kth || (v == kth && s > r[c.top_k - 1])) << "entry " << s;
                }
            }
          }
      }
}

TEST(IndexerTopk, HandComputedTies) {
  // One query, one head, c = 1: score(s) = relu(q * k_s) * w * scale.
  IndexerCase c;
  c.B = 1;
  c.H = 1;
  c.C = 1;
  c.rate = 1;
  c.pos = {5};
  c.top_k = 8;
  IndexerBuilt x = build_indexer(c);
  x.q = {1.0f};
  x.w = {1.0f};
  x.k = {2, -1, 3, 2, -5, 3};  // relu: 2 0 3 2 0 3
  std::vector<int64_t> len{6};
  x.keys = make_store(x.k, nullptr, c.dt, 1, 1, 6, 1, 1, 0, 0, len, VMode::kEmpty);
  x.params.index_scale = 1.0f;
  const std::vector<int32_t> want{2, 5, 0, 3, 1, 4, -1, -1};
  EXPECT_EQ(run_indexer(&indexer_topk_reference, c, x), want);
  EXPECT_EQ(run_indexer(&indexer_topk, c, x), want);
}

TEST(IndexerTopk, RandomScoresSelectATopK) {
  for (int64_t bt : {0, 7}) {
    IndexerCase c;
    c.B = 2;
    c.S = 5;
    c.H = 13;
    c.C = 33;
    c.bt = bt;
    c.top_k = 17;
    c.pos = {3000, bt ? 2011 : 3000};  // a dense span's rows share one length
    IndexerBuilt x = build_indexer(c);
    const std::vector<int32_t> fast = run_indexer(&indexer_topk, c, x);
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.S; ++t) {
        const int32_t* r = fast.data() + (b * c.S + t) * c.top_k;
        const int64_t lim = (c.pos[b] + t + 1) / c.rate;
        std::vector<double> sc(static_cast<size_t>(lim));
        for (int64_t s = 0; s < lim; ++s) sc[s] = score(c, x, b, t, s);
        std::vector<double> sorted = sc;
        std::sort(sorted.begin(), sorted.end(), std::greater<double>());
        for (int64_t i = 0; i < c.top_k; ++i) {
          ASSERT_GE(r[i], 0);
          const double tol = 1e-4 * (1.0 + std::fabs(sorted[i]));
          EXPECT_NEAR(sc[r[i]], sorted[i], tol) << "rank " << i;
        }
      }
  }
}

TEST(IndexerTopk, RejectsBadArguments) {
  IndexerCase c;
  IndexerBuilt x = build_indexer(c);
  c.pos = {60, 57};  // row 0's last query sees 15 entries, the span holds 14
  expect_invalid_argument([&] { run_indexer(&indexer_topk, c, x); }, "the keys span holds");
  c.pos = {57, 57};
  x.params.rate = 0;
  expect_invalid_argument([&] { run_indexer(&indexer_topk, c, x); }, "rate");
  x.params.rate = 4;
  c.C = 18;
  expect_invalid_argument([&] { run_indexer(&indexer_topk_reference, c, x); }, "wide");
}

}  // namespace
}  // namespace kvcache
