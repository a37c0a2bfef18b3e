// Paged attention against the dense kernels on the same K/V gathered into contiguous storage,
// and against the double reference, for random page tables (shuffled page ids, odd page sizes,
// sequences of different lengths, decode and prefill, GQA, window and sinks).
// Tolerances:
//   - paged "eager" vs dense "eager" on the gathered K/V: bit-identical (same operations in the
//     same order: dot_f32, scale, softcap, max, exp, key-ordered sums, 1/den, key-ordered P.V).
//   - paged "fused" / "fused_scalar" vs dense "fused" / "fused_scalar" on each sequence's
//     gathered K/V run alone: bit-identical (pages only cut a tile into runs of rows; the split
//     of long decode rows is decided per sequence, never from the batch).
//   - every paged kernel vs attention_reference on the same (rounded) K/V: row error <= 1e-5.
#include "kernels/paged_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/attention_reference.h"

namespace kvcache {
namespace {

struct PCase {
  int64_t B = 3, Hq = 2, Hkv = 1, D = 64, page = 16, max_len = 300, max_q = 1;  // max_q 1: decode
  DType kv = DType::kF32;
  int64_t window = 0, kv_offset = 0;
  bool sinks = false, causal = true;
  std::string str() const {
    std::ostringstream o;
    o << "B" << B << " Hq" << Hq << " Hkv" << Hkv << " D" << D << " page" << page << " max_len"
      << max_len << " max_q" << max_q << " " << dtype_name(kv) << " window" << window
      << " kv_offset" << kv_offset << (sinks ? " sinks" : "") << (causal ? " causal" : "");
    return o.str();
  }
};

// A random paged batch: a pool with spare pages, page ids shuffled over the pool.
struct Paged {
  PCase c;
  std::vector<int64_t> len, nq;
  std::vector<int32_t> indptr, indices, last, cu;
  Tensor kpool, vpool, qbuf, obuf;
  std::vector<float> sinks;
  PagedAttentionArgs args;
  AttentionOptions opts;
};

Paged make_paged(const PCase& c, uint32_t seed) {
  Paged p;
  p.c = c;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  p.indptr.push_back(0);
  p.cu.push_back(0);
  for (int64_t b = 0; b < c.B; ++b) {
    const int64_t L = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(c.max_len));
    const int64_t n = 1 + static_cast<int64_t>(rng() % static_cast<uint32_t>(std::min(c.max_q, L)));
    p.len.push_back(L);
    p.nq.push_back(n);
    const int64_t pages = (L + c.page - 1) / c.page;
    p.indptr.push_back(p.indptr.back() + static_cast<int32_t>(pages));
    p.last.push_back(static_cast<int32_t>(L - (pages - 1) * c.page));
    p.cu.push_back(p.cu.back() + static_cast<int32_t>(n));
  }
  const int64_t used = p.indptr.back(), num_pages = used + 5;
  std::vector<int32_t> ids(static_cast<size_t>(num_pages));
  for (int64_t i = 0; i < num_pages; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.indices.assign(ids.begin(), ids.begin() + used);

  auto fill = [&](Tensor& pool) {
    pool = Tensor::empty(c.kv, {num_pages, c.Hkv, c.page, c.D});
    std::vector<float> tmp(static_cast<size_t>(pool.numel()));
    for (float& x : tmp) x = nd(rng);
    convert_n(tmp.data(), DType::kF32, pool.data(), c.kv, tmp.size());
  };
  fill(p.kpool);
  fill(p.vpool);
  const int64_t total_q = p.cu.back();
  p.qbuf = Tensor::empty(DType::kF32, {total_q, c.Hq, c.D});
  for (int64_t i = 0; i < p.qbuf.numel(); ++i) p.qbuf.data_as<float>()[i] = nd(rng);
  p.obuf = Tensor::zeros(DType::kF32, {total_q, c.Hq, c.D});

  p.args.q = p.qbuf.view();
  p.args.out = p.obuf.view();
  p.args.cu_seqlens_q = p.cu.data();
  PagedKV& kv = p.args.kv;
  kv.k_pages = p.kpool.view();
  kv.v_pages = p.vpool.view();
  kv.batch = c.B;
  kv.block_tokens = c.page;
  kv.indptr = p.indptr.data();
  kv.indices = p.indices.data();
  kv.last_page_len = p.last.data();
  p.opts.causal = c.causal;
  p.opts.sliding_window = c.window;
  p.opts.kv_offset = c.kv_offset;
  if (c.sinks) {
    for (int64_t h = 0; h < c.Hq; ++h) p.sinks.push_back(2.0f * nd(rng));
    p.opts.sinks = p.sinks.data();
  }
  return p;
}

// Sequence b's K (or V) copied byte for byte out of the pages: [1, H_kv, L, D].
Tensor gather(const Paged& p, const Tensor& pool, int64_t b) {
  const int64_t L = p.len[static_cast<size_t>(b)], ps = p.c.page, D = p.c.D;
  Tensor t = Tensor::empty(p.c.kv, {1, p.c.Hkv, L, D});
  const TensorView pv = pool.view(), tv = t.view();
  const size_t row = static_cast<size_t>(D) * dtype_elem_size(p.c.kv);
  for (int64_t h = 0; h < p.c.Hkv; ++h)
    for (int64_t j = 0; j < L; ++j)
      std::memcpy(tv.ptr(0, h, j),
                  pv.ptr(p.indices[static_cast<size_t>(p.indptr[b] + j / ps)], h, j % ps), row);
  return t;
}

// Sequence b's rows of a packed [total_q, H, D] buffer as a [1, H, S_q, D] view.
TensorView seq_view(const Paged& p, const Tensor& packed, int64_t b) {
  const int64_t H = p.c.Hq, D = p.c.D, n = p.nq[static_cast<size_t>(b)];
  return TensorView(packed.view().ptr(p.cu[static_cast<size_t>(b)]), DType::kF32, {1, H, n, D},
                    {n * H * D, D, H * D, 1});
}

void check_case(const PCase& c, uint32_t seed, const char* kernel = "eager") {
  SCOPED_TRACE(c.str() + " kernel " + kernel);
  Paged p = make_paged(c, seed);
  paged_attention(kernel, p.args, p.opts);
  for (int64_t b = 0; b < c.B; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const Tensor k = gather(p, p.kpool, b), v = gather(p, p.vpool, b);
    const TensorView q = seq_view(p, p.qbuf, b), got = seq_view(p, p.obuf, b);
    const int64_t n = q.dim(2);
    Tensor dense = Tensor::zeros(DType::kF32, {1, c.Hq, n, c.D});
    get_attention_kernel(kernel)(q, k.view(), v.view(), dense.view(), p.opts);
    const ReferenceResult ref = attention_reference(q, k.view(), v.view(), p.opts);
    double worst = 0;
    int64_t mismatches = 0;
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < n; ++i) {
        const float* g = got.ptr_as<const float>(0, h, i);
        const float* d = dense.view().ptr_as<const float>(0, h, i);
        const double* r = ref.out.data() + ((h * n + i) * c.D);
        double rmax = 0, emax = 0;
        for (int64_t e = 0; e < c.D; ++e) {
          if (std::memcmp(&g[e], &d[e], sizeof(float)) != 0) ++mismatches;
          rmax = std::max(rmax, std::abs(r[e]));
          emax = std::max(emax, std::abs(g[e] - r[e]));
        }
        if (rmax == 0)
          EXPECT_EQ(emax, 0.0) << "row sees no key: must be zero";
        else
          worst = std::max(worst, emax / rmax);
      }
    EXPECT_EQ(mismatches, 0) << "paged " << kernel << " must equal dense " << kernel
                             << " bit for bit";
    EXPECT_LE(worst, 1e-5) << "vs double reference";
  }
}

TEST(PagedAttention, EagerMatchesDenseDecode) {
  uint32_t seed = 1;
  for (int64_t page : {16, 7})
    for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {8, 1}})
      for (int64_t D : {64, 80, 128})
        for (DType dt : {DType::kF32, DType::kF16}) {
          PCase c;
          c.page = page;
          c.Hq = Hq;
          c.Hkv = Hkv;
          c.D = D;
          c.kv = dt;
          c.B = 4;
          check_case(c, seed++);
        }
}

// `base` over every page size, window and sink setting (kv_offset 5 with a window) and each of
// `dtypes`, checked with `kernel`; `seed` advances once per case.
void check_window_sinks(const PCase& base, std::initializer_list<DType> dtypes, const char* kernel,
                        uint32_t& seed) {
  for (int64_t page : {16, 7})
    for (int64_t window : {0, 37})
      for (bool sinks : {false, true})
        for (DType dt : dtypes) {
          PCase c = base;
          c.page = page;
          c.kv = dt;
          c.window = window;
          c.sinks = sinks;
          c.kv_offset = window ? 5 : 0;
          check_case(c, seed++, kernel);
        }
}

TEST(PagedAttention, EagerMatchesDensePrefillWindowSinks) {
  uint32_t seed = 100;
  check_window_sinks({.B = 3, .Hq = 4, .Hkv = 2, .D = 80, .max_len = 120, .max_q = 40},
                     {DType::kF32, DType::kF16}, "eager", seed);
}

TEST(PagedAttention, SingleTokenSequencesAndFullPages) {
  PCase c;
  c.B = 5;
  c.max_len = 1;  // every sequence one token: one page with last_page_len 1
  check_case(c, 7);
  c.page = 1;  // every page full
  c.max_len = 30;
  c.max_q = 30;
  check_case(c, 8);
}

TEST(PagedAttention, FusedMatchesDenseDecode) {
  uint32_t seed = 200;
  for (const char* kernel : {"fused", "fused_scalar"})
    for (int64_t page : {16, 7, 100})
      for (auto [Hq, Hkv] : {std::pair<int64_t, int64_t>{2, 2}, {8, 2}, {8, 1}})
        for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
          PCase c;
          c.page = page;
          c.Hq = Hq;
          c.Hkv = Hkv;
          c.D = page == 7 ? 80 : 128;
          c.kv = dt;
          c.B = 4;
          check_case(c, seed++, kernel);
        }
}

// Sequences longer than one split-KV partition (1,024 keys): split decode rows, merged.
TEST(PagedAttention, FusedLongDecodeSplits) {
  uint32_t seed = 300;
  for (int64_t page : {16, 64, 129}) {
    PCase c;
    c.page = page;
    c.Hq = 8;
    c.Hkv = 2;
    c.D = 64;
    c.kv = DType::kF16;
    c.B = 3;
    c.max_len = 3000;
    check_case(c, seed++, "fused");
    c.sinks = true;
    c.window = 700;
    c.kv_offset = 11;
    check_case(c, seed++, "fused");
  }
}

TEST(PagedAttention, FusedMatchesDensePrefillWindowSinks) {
  uint32_t seed = 400;
  for (const char* kernel : {"fused", "fused_scalar"}) {
    // max_q 70 mixes decode-like and prefill sequences in one batch.
    check_window_sinks({.B = 3, .Hq = 4, .Hkv = 2, .D = 80, .max_len = 150, .max_q = 70},
                       {DType::kF32, DType::kBF16}, kernel, seed);
  }
}

// Batch and thread-count invariance: the output of a long decode row is the same bits whether
// the kernel runs on 1 or 3 threads (the split-KV partitions are fixed per sequence).
TEST(PagedAttention, FusedDecodeIndependentOfThreadCount) {
  PCase c;
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 1;
  c.max_len = 5000;
  c.kv = DType::kF16;
  Paged p = make_paged(c, 77);
  std::vector<Tensor> outs;
  const int before = default_pool().n_threads();
  for (int threads : {1, 3}) {
    set_default_threads(threads);
    std::fill(p.obuf.data_as<float>(), p.obuf.data_as<float>() + p.obuf.numel(), 0.0f);
    paged_attention("fused", p.args, p.opts);
    outs.push_back(p.obuf.clone());
  }
  set_default_threads(before);
  EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size_bytes()), 0);
}

TEST(PagedAttention, FusedEdgeShapes) {
  PCase c;
  c.B = 5;
  c.max_len = 1;
  check_case(c, 17, "fused");
  c.page = 1;
  c.max_len = 30;
  c.max_q = 30;
  check_case(c, 18, "fused");
  c.page = 16;
  c.D = 256;
  c.Hq = 3;
  c.Hkv = 1;
  c.max_len = 90;
  check_case(c, 19, "fused");
}

// A NaN key reaches exactly the rows that see it, in every paged kernel, including a row whose
// only visible key it is (window 1: each decode row sees its own position), where a max that
// drops the NaN would leave the row at zeros.
TEST(PagedAttention, NaNKeyPoisonsExactlyTheRowsThatSeeIt) {
  for (const std::string& kernel : paged_attention_kernel_names())
    for (int64_t window : {1, 0}) {
      PCase c;
      c.B = 2;
      c.Hq = 4;
      c.Hkv = 2;
      c.window = window;
      Paged p = make_paged(c, 11);
      const int64_t last = p.len[0] - 1;  // sequence 0's newest key, KV head 1
      float* k = p.kpool.view().ptr_as<float>(p.indices[static_cast<size_t>(last / c.page)], 1,
                                              last % c.page);
      k[3] = std::numeric_limits<float>::quiet_NaN();
      paged_attention(kernel, p.args, p.opts);
      for (int64_t b = 0; b < c.B; ++b) {
        const TensorView got = seq_view(p, p.obuf, b);
        for (int64_t h = 0; h < c.Hq; ++h) {
          const bool sees = b == 0 && h / (c.Hq / c.Hkv) == 1;
          for (int64_t e = 0; e < c.D; ++e)
            ASSERT_EQ(std::isnan(got.ptr_as<const float>(0, h, 0)[e]), sees)
                << kernel << " window " << window << " sequence " << b << " head " << h;
        }
      }
    }
}

TEST(PagedAttention, BadTablesThrow) {
  PCase c;
  c.B = 3;
  c.max_len = 50;
  auto expect_error = [](Paged& p, const char* what) {
    EXPECT_THROW(paged_attention("eager", p.args, p.opts), Error) << what;
  };
  {
    Paged p = make_paged(c, 3);
    p.indices[0] = static_cast<int32_t>(p.kpool.dim(0));  // one past the pool
    expect_error(p, "page id out of range");
    p.indices[0] = -1;
    expect_error(p, "negative page id");
  }
  {
    Paged p = make_paged(c, 4);
    std::swap(p.indptr[1], p.indptr[2]);
    if (p.indptr[1] == p.indptr[2]) p.indptr[2] = p.indptr[1] - 1;
    expect_error(p, "indptr not monotone");
  }
  {
    Paged p = make_paged(c, 5);
    p.last[1] = static_cast<int32_t>(c.page + 1);
    expect_error(p, "last_page_len > block_tokens");
    p.last[1] = 0;
    expect_error(p, "last_page_len 0 on a non-empty sequence");
  }
  {
    Paged p = make_paged(c, 6);
    p.args.kv.block_tokens = c.page + 1;
    expect_error(p, "block_tokens disagrees with the pool");
  }
  {
    Paged p = make_paged(c, 9);
    EXPECT_THROW(paged_attention("nope", p.args, p.opts), Error);
    AttentionOptions o = p.opts;
    o.q_offset = 0;
    EXPECT_THROW(paged_attention("eager", p.args, o), Error);
  }
}

}  // namespace
}  // namespace kvcache
