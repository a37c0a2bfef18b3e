// The attention skeleton (kernels/attention_skeleton.h) and the kernels' workspaces
// (kernels/attention_workspace.h).
//
// Merge: a minimal scalar kernel plugged into the skeleton (16-key tiles, plain FMA dot products
// and P.V) runs every row once in a single pass (kv_split = -1) and once cut into split-KV
// partitions whose partial (m, l, acc) states the skeleton merges. Only the order of the sums
// differs (each partition rescales its own accumulator, the merge rescales the partitions), so
// per output row max_d |split - single| <= 4e-6 * max_d |single|, on odd sizes (up to 1,001 keys
// in up to 63 partitions), queries of standard deviation 2 (peaked rows), with sinks, windows,
// masked partitions and rows that see nothing (those must stay exactly zero). Measured worst:
// 1.5e-6 at 1,001 keys, 1.2e-6 at 300, 4e-7 at 37 (the error grows with the number of
// partitions, here up to 63 of 16 keys; the kernels' automatic splits make at most a few dozen).
//
// Workspace: attention_workspace_bytes() of a call's shape is enough for that call and every
// smaller one, whatever the alignment of the bytes (the ASan build catches a kernel that carves
// past them), and a kernel refuses a smaller workspace with an Error naming both sizes before it
// writes anything.
#include "kernels/attention_skeleton.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/attention_quant.h"
#include "kernels/attention_workspace.h"
#include "kernels/kv_quant.h"
#include "kernels/paged_attention.h"

namespace kvcache {
namespace {

using detail::Arena;
using detail::CallPlan;
using detail::SeqPlan;
using detail::Task;
using detail::TaskRows;

std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ---- a scalar kernel in the skeleton: K and V f32 [B, H_kv, S_kv, D], 16-key tiles ----
constexpr int64_t kTile = 16;

struct RefParams {
  TensorView k, v;
  int64_t Dk = 0, Dv = 0;
  int64_t n_tiles(const SeqPlan& s) const { return (s.Skv + kTile - 1) / kTile; }
  int64_t tiles_per_split(const SeqPlan&, int64_t keys) const { return (keys + kTile - 1) / kTile; }
  std::pair<int64_t, int64_t> tile_keys(const SeqPlan& s, int64_t t) const {
    return {t * kTile, std::min(s.Skv, t * kTile + kTile)};
  }
  int64_t tile_at(const SeqPlan&, int64_t key) const { return key / kTile; }
  std::pair<int64_t, int64_t> partition_keys(const Task& t) const {
    return {t.t_begin * kTile, std::min(t.seq->Skv, t.t_end * kTile)};
  }
  static constexpr bool with_vis = false;
  int64_t acc_cols() const { return Dv; }
  int64_t s_cols() const { return kTile; }
  struct Extra {};
  Extra carve_extra(Arena&, int64_t, int64_t) const { return {}; }
};

struct RefTiles {
  using Params = RefParams;
  static constexpr bool kSimd = false, kRowTerms = false;
  RefTiles(const Params& kp, TaskRows& rows, Arena&) : kp(kp), rows(rows) {}
  void run(TaskRows& r) { detail::for_each_tile(r, kp, *this); }
  void fold(TaskRows&) {}
  void softcap(float* s, int64_t n, float c) const { detail::softcap_scalar(s, n, c); }
  void rescale_row(int64_t, float) {}
  void logits(int64_t, int64_t k0, int64_t k1, float* s) {
    for (int64_t r = 0; r < rows.t.R; ++r)
      for (int64_t j = k0; j < k1; ++j) {
        const float* q = rows.rs.qs + r * kp.Dk;
        const float* k = kp.k.ptr_as<const float>(rows.t.b, rows.t.hk, j);
        float a = 0;
        for (int64_t d = 0; d < kp.Dk; ++d) a = std::fma(q[d], k[d], a);
        s[r * kTile + (j - k0)] = a;
      }
  }
  void pv(int64_t, int64_t k0, int64_t k1, const float* s) {
    for (int64_t r = 0; r < rows.t.R; ++r)
      for (int64_t j = k0; j < k1; ++j) {
        const float p = s[r * kTile + (j - k0)];
        const float* v = kp.v.ptr_as<const float>(rows.t.b, rows.t.hk, j);
        float* a = rows.rs.acc + r * kp.Dv;
        for (int64_t d = 0; d < kp.Dv; ++d) a[d] = std::fma(p, v[d], a[d]);
      }
  }
  const Params& kp;
  TaskRows& rows;
};

// The reference kernel through the skeleton's whole call: plan, carve, tasks, merge.
void run_ref(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
             const AttentionOptions& o) {
  CallPlan P;
  detail::init_call(P, q, out, q.dim(0), k.dim(1), v.dim(3), o);
  const MaskGeometry geo = make_geometry(P.B, P.Hq, q.dim(2), k.dim(2), o.q_offset, o.kv_offset);
  P.kv_offset = geo.kv_offset;
  RefParams kp{k, v, P.Dk, P.Dv};
  constexpr detail::QueryTiling tiling{6};  // 6 rows per task: several query tiles per prefill
  std::vector<std::byte> ws(1 << 22);
  P.seqs = detail::carve_seqs(ws, P.B);
  detail::set_dense_seqs(P, q.dim(2), k.dim(2), geo.q_offset);
  detail::plan_call(P, kp, tiling, o.kv_split, ws);
  detail::run_call<RefTiles>(P, kp);
}

struct MergeCase {
  int64_t B = 1, Hkv = 1, G = 3, Sq = 1, Skv = 37, D = 29, Dv = 37, window = 0, split = 16;
  bool sinks = false;
};

void check_merge(const MergeCase& c, uint32_t seed) {
  SCOPED_TRACE("B" + std::to_string(c.B) + " G" + std::to_string(c.G) + " Sq" +
               std::to_string(c.Sq) + " Skv" + std::to_string(c.Skv) + " window" +
               std::to_string(c.window) + " split" + std::to_string(c.split) +
               (c.sinks ? " sinks" : ""));
  std::mt19937 rng(seed);
  const int64_t Hq = c.Hkv * c.G;
  Tensor q = Tensor::empty(DType::kF32, {c.B, Hq, c.Sq, c.D});
  Tensor k = Tensor::empty(DType::kF32, {c.B, c.Hkv, c.Skv, c.D});
  Tensor v = Tensor::empty(DType::kF32, {c.B, c.Hkv, c.Skv, c.Dv});
  for (Tensor* t : {&q, &k, &v}) {
    const std::vector<float> x = randn(static_cast<size_t>(t->numel()), rng, t == &q ? 2.0f : 1.0f);
    std::memcpy(t->data(), x.data(), t->size_bytes());
  }
  const std::vector<float> sinks = randn(static_cast<size_t>(Hq), rng, 2.0f);
  AttentionOptions o;
  o.sliding_window = c.window;
  if (c.sinks) o.sinks = sinks.data();
  Tensor single = Tensor::zeros(DType::kF32, {c.B, Hq, c.Sq, c.Dv});
  Tensor split = Tensor::zeros(DType::kF32, {c.B, Hq, c.Sq, c.Dv});
  o.kv_split = -1;
  run_ref(q.view(), k.view(), v.view(), single.view(), o);
  o.kv_split = c.split;
  run_ref(q.view(), k.view(), v.view(), split.view(), o);
  double worst = 0;
  for (int64_t row = 0; row < c.B * Hq * c.Sq; ++row) {
    const float* a = single.data_as<float>() + row * c.Dv;
    const float* b = split.data_as<float>() + row * c.Dv;
    double amax = 0, emax = 0;
    for (int64_t d = 0; d < c.Dv; ++d) {
      amax = std::max(amax, std::abs(double{a[d]}));
      emax = std::max(emax, std::abs(double{a[d]} - b[d]));
    }
    if (amax == 0)
      EXPECT_EQ(emax, 0.0) << "a row that sees nothing stays zero";
    else
      worst = std::max(worst, emax / amax);
  }
  EXPECT_LE(worst, 4e-6);
}

TEST(AttentionSkeleton, MergedPartitionsEqualSinglePass) {
  uint32_t seed = 1;
  for (int64_t Skv : {17, 37, 300, 1001})
    for (int64_t split : {16, 48, 80})
      for (int64_t Sq : {1, 3}) {
        MergeCase c;
        c.Skv = Skv;
        c.split = split;
        c.Sq = Sq;
        check_merge(c, seed++);
        c.sinks = true;
        c.B = 2;
        c.Hkv = 2;
        check_merge(c, seed++);
      }
  // A window that leaves whole partitions empty (their state stays m = -inf and the merge skips
  // it), and one that leaves a row nothing but a sink.
  MergeCase c;
  c.Skv = 1001;
  c.Sq = 5;
  c.window = 40;
  c.split = 48;
  check_merge(c, seed++);
  c.sinks = true;
  check_merge(c, seed++);
}

TEST(AttentionSkeleton, SplitDecisionFollowsTheSequence) {
  // One task's queries split automatically; more do not; a decode row always may.
  EXPECT_EQ(detail::split_keys(0, 1, 5000, 4, 192), detail::auto_split_keys(5000));
  EXPECT_EQ(detail::split_keys(0, 48, 5000, 4, 192), detail::auto_split_keys(5000));
  EXPECT_EQ(detail::split_keys(0, 49, 5000, 4, 192), 0);
  EXPECT_EQ(detail::split_keys(0, 1, 5000, 256, 192), detail::auto_split_keys(5000));
  EXPECT_EQ(detail::split_keys(0, 1, 1024, 4, 192), 0);
  EXPECT_EQ(detail::split_keys(-1, 1, 5000, 4, 192), 0);
  EXPECT_EQ(detail::split_keys(100, 300, 5000, 4, 192), 100);
  EXPECT_EQ(detail::split_keys(5000, 1, 5000, 4, 192), 0);
  // max_partitions bounds every automatic split of a shorter sequence.
  for (int64_t s = 0; s <= 70000; s += 7) {
    const int64_t keys = detail::auto_split_keys(s);
    const int64_t n = keys > 0 ? (s + keys - 1) / keys : 1;
    ASSERT_LE(n, detail::max_partitions(0, s)) << s;
  }
}

// ---- workspaces ----

struct Dense {
  Tensor q, k, v, out;
  AttentionOptions o;
  // seed 0: zeros (a call whose values do not matter)
  Dense(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Skv, int64_t D, DType kv,
        uint32_t seed) {
    std::mt19937 rng(seed);
    q = Tensor::zeros(DType::kF32, {B, Hq, Sq, D});
    k = Tensor::zeros(kv, {B, Hkv, Skv, D});
    v = Tensor::zeros(kv, {B, Hkv, Skv, D});
    out = Tensor::zeros(DType::kF32, {B, Hq, Sq, D});
    for (Tensor* t : {&q, &k, &v}) {
      if (seed == 0) break;
      const std::vector<float> x = randn(static_cast<size_t>(t->numel()), rng);
      convert_n(x.data(), DType::kF32, t->data(), t->dtype(), x.size());
    }
  }
  AttentionShape shape() const {
    KVSpan span;
    span.k = k.view();
    span.v = v.view();
    return attention_shape(q.view(), span, o);
  }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.size_bytes() == b.size_bytes() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

TEST(AttentionWorkspace, ExactlyThePlannedBytesGiveTheSameBits) {
  const AttentionFn fused = get_attention_kernel("fused");
  const AttentionFn scalar = get_attention_kernel("fused_scalar");
  // decode with split-KV, a prefill of several query tiles, odd sizes
  for (auto [Sq, Skv, split] : std::vector<std::array<int64_t, 3>>{
           {1, 5000, 0}, {1, 700, 130}, {133, 901, 0}, {7, 301, 64}})
    for (const AttentionFn fn : {fused, scalar}) {
      Dense d(2, 6, 2, Sq, Skv, 40, DType::kF16, 3);
      d.o.kv_split = split;
      fn(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.o);  // the kernel's own workspace
      const Tensor own = d.out.clone();
      const size_t bytes = attention_workspace_bytes(d.shape());
      // An exactly sized heap block, its start misaligned on purpose: ASan flags any byte
      // carved past it.
      std::vector<std::byte> block(bytes + 1);
      d.o.workspace = std::span<std::byte>(block).subspan(1);
      std::memset(d.out.data(), 0, d.out.size_bytes());
      fn(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.o);
      EXPECT_TRUE(same_bits(own, d.out)) << "Sq " << Sq << " Skv " << Skv;
    }
}

TEST(AttentionWorkspace, ServesEverySmallerCall) {
  AttentionShape s;
  s.batch = 2;
  s.heads_q = 8;
  s.heads_kv = 2;
  s.q_len = 300;
  s.kv_len = 20000;
  s.head_dim_k = s.head_dim_v = 64;
  std::vector<std::byte> block(attention_workspace_bytes(s));
  const AttentionFn fused = get_attention_kernel("fused");
  // Query counts around the automatic split's limit (48 positions of 4 heads) and the balanced
  // query tiles' sizes; key counts where the partitions are most numerous for their length
  // (4,355 keys: 5) and past 16,384 (more than 4); prefills, which never split, need no long
  // cache.
  for (int64_t B : {1, 2})
    for (int64_t Sq : {1, 2, 47, 48, 49, 71, 150, 300})
      for (int64_t Skv : {Sq, int64_t{1025}, int64_t{4355}, int64_t{20000}}) {
        if (Skv < Sq || (Sq > 48 && Skv > 1025)) continue;
        Dense d(B, 8, 2, Sq, Skv, 64, DType::kBF16, 0);
        d.o.workspace = block;
        EXPECT_NO_THROW(fused(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.o))
            << "B " << B << " Sq " << Sq << " Skv " << Skv;
      }
}

TEST(AttentionWorkspace, TooSmallIsRefusedBeforeAnyWrite) {
  Dense d(1, 8, 2, 1, 3000, 64, DType::kF32, 7);
  const size_t bytes = attention_workspace_bytes(d.shape());
  for (size_t n : {size_t{0} + 1, size_t{64}, bytes / 2}) {
    std::vector<std::byte> block(n);
    d.o.workspace = block;
    std::fill(d.out.data_as<float>(), d.out.data_as<float>() + d.out.numel(), 7.0f);
    try {
      get_attention_kernel("fused")(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.o);
      ADD_FAILURE() << "a workspace of " << n << " bytes was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      const std::string msg = e.what();
      EXPECT_NE(msg.find("holds " + std::to_string(n) + " bytes"), std::string::npos) << msg;
      EXPECT_NE(msg.find("attention_workspace_bytes"), std::string::npos) << msg;
    }
    for (int64_t i = 0; i < d.out.numel(); ++i) ASSERT_EQ(d.out.data_as<float>()[i], 7.0f);
  }
  // A workspace planned for fewer threads than the pool runs is too small as well.
  const int before = default_pool().n_threads();
  set_default_threads(3);
  AttentionShape s = d.shape();
  s.n_threads = 1;
  std::vector<std::byte> one_thread(attention_workspace_bytes(s));
  d.o.workspace = one_thread;
  EXPECT_THROW(get_attention_kernel("fused")(d.q.view(), d.k.view(), d.v.view(), d.out.view(), d.o),
               Error);
  set_default_threads(before);
}

TEST(AttentionWorkspace, QuantizedAndPagedKernels) {
  std::mt19937 rng(11);
  // A quantized span: 5 KIVI blocks of 32 tokens and a 20-token residual, D = 64.
  const int64_t Hkv = 2, Hq = 6, D = 64, G = 32, n_blocks = 5, n_res = 20;
  std::vector<std::byte> kbytes, vbytes;
  QuantKV kv;
  kv.bits = 4;
  kv.group = G;
  kv.v_group = 32;
  kv.batch = 1;
  kv.heads = Hkv;
  kv.head_dim_k = kv.head_dim_v = D;
  kv.n_blocks = n_blocks;
  KVBlockFormat f = make_kv_block_format(KVQuantScheme::kKivi, 4, G, D, D);
  f.v_group = kv.v_group;
  kv.k_block_bytes = kv_k_block_bytes(f);
  kv.v_block_bytes = kv_v_block_bytes(f);
  kv.k_head_stride = kv.k_block_bytes * n_blocks;
  kv.v_head_stride = kv.v_block_bytes * n_blocks;
  kbytes.resize(static_cast<size_t>(kv.k_head_stride * Hkv));
  vbytes.resize(static_cast<size_t>(kv.v_head_stride * Hkv));
  for (int64_t h = 0; h < Hkv; ++h)
    for (int64_t i = 0; i < n_blocks; ++i) {
      const std::vector<float> kf = randn(static_cast<size_t>(G * D), rng);
      const std::vector<float> vf = randn(static_cast<size_t>(G * D), rng);
      kv_quantize_k_block(f, kf.data(), D,
                          kbytes.data() + h * kv.k_head_stride + i * kv.k_block_bytes);
      kv_quantize_v_block(f, vf.data(), D,
                          vbytes.data() + h * kv.v_head_stride + i * kv.v_block_bytes);
    }
  kv.k_blocks = kbytes.data();
  kv.v_blocks = vbytes.data();
  Tensor kr = Tensor::empty(DType::kF16, {1, Hkv, n_res, D}),
         vr = Tensor::empty(DType::kF16, {1, Hkv, n_res, D});
  for (Tensor* t : {&kr, &vr}) {
    const std::vector<float> x = randn(static_cast<size_t>(t->numel()), rng);
    convert_n(x.data(), DType::kF32, t->data(), t->dtype(), x.size());
  }
  kv.k_residual = kr.view();
  kv.v_residual = vr.view();
  KVSpan span;
  span.kind = KVSpanKind::kQuantized;
  span.quant = kv;
  for (int64_t Sq : {1, 9}) {
    Tensor q = Tensor::empty(DType::kF32, {1, Hq, Sq, D});
    const std::vector<float> x = randn(static_cast<size_t>(q.numel()), rng);
    std::memcpy(q.data(), x.data(), q.size_bytes());
    Tensor own = Tensor::zeros(DType::kF32, {1, Hq, Sq, D}),
           given = Tensor::zeros(DType::kF32, {1, Hq, Sq, D});
    AttentionOptions o;
    o.kv_split = 40;
    quantized_attention(q.view(), kv, own.view(), o);
    std::vector<std::byte> block(attention_workspace_bytes(attention_shape(q.view(), span, o)));
    o.workspace = block;
    quantized_attention(q.view(), kv, given.view(), o);
    EXPECT_TRUE(same_bits(own, given)) << "Sq " << Sq;
    std::vector<std::byte> small(block.size() / 3);
    o.workspace = small;
    EXPECT_THROW(quantized_attention(q.view(), kv, given.view(), o), Error);
  }
  // Paged: two sequences in pages of 16, one decode row and a 5-query step.
  const int64_t page = 16;
  const std::vector<int64_t> len = {1200, 45};
  std::vector<int32_t> indptr{0}, indices, last, cu{0, 1, 6};
  for (int64_t L : len) {
    const int64_t pages = (L + page - 1) / page;
    for (int64_t p = 0; p < pages; ++p) indices.push_back(static_cast<int32_t>(indices.size()));
    indptr.push_back(static_cast<int32_t>(indices.size()));
    last.push_back(static_cast<int32_t>(L - (pages - 1) * page));
  }
  const int64_t np = static_cast<int64_t>(indices.size());
  Tensor kp = Tensor::empty(DType::kF32, {np, Hkv, page, D}),
         vp = Tensor::empty(DType::kF32, {np, Hkv, page, D});
  Tensor q = Tensor::empty(DType::kF32, {6, Hq, D});
  for (Tensor* t : {&kp, &vp, &q}) {
    const std::vector<float> x = randn(static_cast<size_t>(t->numel()), rng);
    std::memcpy(t->data(), x.data(), t->size_bytes());
  }
  Tensor own = Tensor::zeros(DType::kF32, {6, Hq, D}),
         given = Tensor::zeros(DType::kF32, {6, Hq, D});
  PagedAttentionArgs a;
  a.q = q.view();
  a.cu_seqlens_q = cu.data();
  a.kv.k_pages = kp.view();
  a.kv.v_pages = vp.view();
  a.kv.batch = 2;
  a.kv.block_tokens = page;
  a.kv.indptr = indptr.data();
  a.kv.indices = indices.data();
  a.kv.last_page_len = last.data();
  AttentionOptions o;
  a.out = own.view();
  paged_attention("fused", a, o);
  KVSpan pspan;
  pspan.kind = KVSpanKind::kPaged;
  pspan.paged = a.kv;
  std::vector<std::byte> block(attention_workspace_bytes(attention_shape(q.view(), pspan, o)));
  o.workspace = block;
  a.out = given.view();
  paged_attention("fused", a, o);
  EXPECT_TRUE(same_bits(own, given));
  std::vector<std::byte> small(256);
  o.workspace = small;
  EXPECT_THROW(paged_attention("fused", a, o), Error);
}

TEST(AttentionWorkspace, OwnedWorkspaceGrowsAndKeepsItsMemory) {
  AttentionWorkspace ws;
  const std::span<std::byte> a = ws.reserve(1000);
  EXPECT_GE(a.size(), 1000u);
  EXPECT_EQ(ws.reserve(500).data(), a.data());  // enough already: the same memory
  const std::span<std::byte> b = ws.reserve(1500);
  EXPECT_GE(b.size(), 2000u);  // at least doubled
}

}  // namespace
}  // namespace kvcache
