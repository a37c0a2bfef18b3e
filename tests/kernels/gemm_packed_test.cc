#include "kernels/gemm_packed.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernel_test_util.h"

namespace kvcache {
namespace {

using testing_util::make_weights;
using testing_util::randn;

struct Problem {
  int64_t m, n, k;
  DType t;
  std::vector<float> x, bias;
  std::vector<std::byte> w;
  int64_t ldx, ldy;
  Problem(int64_t m_, int64_t n_, int64_t k_, DType t_, uint32_t seed)
      : m(m_), n(n_), k(k_), t(t_), ldx(k_ + 3), ldy(n_ + 5) {
    x = randn(static_cast<size_t>(m * ldx), seed);
    bias = randn(static_cast<size_t>(n), seed + 1);
    w = make_weights(randn(static_cast<size_t>(n * k), seed + 2), t, n, k);
  }
  MatmulParams params(float* y, const float* b) const {
    MatmulParams p;
    p.x = x.data();
    p.ldx = ldx;
    p.w = w.data();
    p.w_dtype = t;
    p.bias = b;
    p.y = y;
    p.ldy = ldy;
    p.m = m;
    p.n = n;
    p.k = k;
    return p;
  }
};

// The contract in gemm_packed.h: every output is fmaf(x_j, w_j, acc) for j ascending from
// acc = 0, then + bias — exactly, for any M, tile position, block of k and thread count.
float fma_chain(const Problem& pr, int64_t i, int64_t r) {
  std::vector<float> wrow(static_cast<size_t>(pr.k));
  dequantize_row(pr.w.data() + static_cast<size_t>(r) * dtype_bytes(pr.t, pr.k), pr.t, wrow.data(),
                 pr.k);
  float acc = 0.0f;
  for (int64_t j = 0; j < pr.k; ++j) acc = std::fmaf(pr.x[i * pr.ldx + j], wrow[j], acc);
  return acc;
}

class GemmPackedTest : public ::testing::TestWithParam<DType> {};

TEST_P(GemmPackedTest, EachOutputIsOneFmaChainOverK) {
  if (!gemm_packed_available()) GTEST_SKIP() << "build without AVX2/FMA/F16C: matmul keeps sgemm";
  const DType t = GetParam();
  ThreadPool pool(3);
  // Odd M (a last tile of every height 1-5, computed by its own micro-kernel; 100 and 200 rows
  // split into equal passes of whole tiles), N past a 128-row block and not a multiple of 16, K
  // past one 256-wide block (multiples of 32 only for q8_0). With AVX-512, pairs of full 16-row
  // micro-panels take the 32-column kernel: an odd count of full panels (50 = 3 x 16 + 2) leaves
  // one to the 16-column kernel, and every last-tile height 1-5 meets a pair. Full panels of
  // f16/f32 W are packed 16 columns at a time (zmm transposes) where the chunk's width allows,
  // 8 at a time otherwise: K = 264 ends on an 8-wide chunk (not for q8_0's 32-wide blocks).
  struct Case {
    int64_t m, n, k;
  };
  const Case cases[] = {{1, 17, 64},  {7, 131, 288}, {13, 269, 544}, {100, 45, 96},
                        {6, 16, 800}, {8, 33, 96},   {15, 40, 288},  {200, 20, 64},
                        {10, 50, 96}, {11, 64, 320}, {9, 96, 64},    {14, 48, 264}};
  uint32_t seed = 40;
  for (const Case& c : cases) {
    if (t == DType::kQ8_0 && c.k % 32 != 0) continue;
    const Problem pr(c.m, c.n, c.k, t, seed += 3);
    std::vector<float> y(static_cast<size_t>(c.m * pr.ldy), -7.0f);
    gemm_packed(pr.params(y.data(), c.m % 2 ? pr.bias.data() : nullptr), &pool);
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t r = 0; r < c.n; ++r) {
        const float want = fma_chain(pr, i, r) + (c.m % 2 ? pr.bias[r] : 0.0f);
        ASSERT_EQ(y[i * pr.ldy + r], want)
            << "m " << c.m << " n " << c.n << " k " << c.k << " at " << i << "," << r;
      }
      for (int64_t r = c.n; r < pr.ldy; ++r)
        ASSERT_EQ(y[i * pr.ldy + r], -7.0f) << "padding written";
    }
  }
}

TEST_P(GemmPackedTest, RowsOfABatchEqualEachRowAloneForAnyThreadCount) {
  if (!gemm_packed_available()) GTEST_SKIP() << "build without AVX2/FMA/F16C: matmul keeps sgemm";
  const Problem pr(23, 150, 320, GetParam(), 7);
  ThreadPool two(2), one(1);
  std::vector<float> batch(static_cast<size_t>(pr.m * pr.ldy), 0.0f);
  gemm_packed(pr.params(batch.data(), pr.bias.data()), &two);
  std::vector<float> serial(batch.size(), 0.0f);
  gemm_packed(pr.params(serial.data(), pr.bias.data()), &one);
  EXPECT_EQ(batch, serial);
  for (int64_t i = 0; i < pr.m; ++i) {
    MatmulParams p = pr.params(nullptr, pr.bias.data());
    std::vector<float> alone(static_cast<size_t>(pr.n));
    p.x = pr.x.data() + i * pr.ldx;
    p.m = 1;
    p.y = alone.data();
    gemm_packed(p, nullptr);
    for (int64_t r = 0; r < pr.n; ++r)
      ASSERT_EQ(alone[r], batch[i * pr.ldy + r]) << "row " << i << " col " << r;
  }
}

TEST(GemmPackedGroup, EqualsEachProductAloneBitForBit) {
  if (!gemm_packed_available()) GTEST_SKIP() << "build without AVX2/FMA/F16C: matmul keeps sgemm";
  // Q/K/V-like: one x, three weight matrices of different heights and dtypes; plus matmul_group
  // routing prefill products through the same path.
  const Problem q(31, 200, 288, DType::kF16, 90), k(31, 70, 288, DType::kBF16, 91),
      v(31, 133, 288, DType::kQ8_0, 92);
  ThreadPool pool(2);
  std::vector<float> yq(31 * q.ldy), yk(31 * k.ldy), yv(31 * v.ldy);
  MatmulParams ps[3] = {q.params(yq.data(), q.bias.data()), k.params(yk.data(), nullptr),
                        v.params(yv.data(), nullptr)};
  for (MatmulParams& p : ps) {
    p.x = q.x.data();  // one shared x
    p.pool = &pool;
  }
  gemm_packed(ps, &pool);
  const std::vector<float>* got[3] = {&yq, &yk, &yv};
  for (int g = 0; g < 3; ++g) {
    std::vector<float> alone(got[g]->size());
    MatmulParams p = ps[g];
    p.y = alone.data();
    gemm_packed(p, nullptr);
    EXPECT_EQ(alone, *got[g]) << "product " << g;
    std::vector<float> via_group(got[g]->size());
    MatmulParams again[3] = {ps[0], ps[1], ps[2]};
    std::vector<float> scratch0(yq.size()), scratch1(yk.size()), scratch2(yv.size());
    float* ys[3] = {scratch0.data(), scratch1.data(), scratch2.data()};
    for (int h = 0; h < 3; ++h) again[h].y = ys[h];
    again[g].y = via_group.data();
    matmul_group(again);
    // matmul_group equals matmul on each product. For q8_0 both round x to int8 per 32 first
    // (matmul.h), which gemm_packed itself does not: the f16 / bf16 products equal the GEMM
    // above, the q8_0 one matmul's.
    std::vector<float> via_matmul(got[g]->size());
    MatmulParams m = ps[g];
    m.y = via_matmul.data();
    matmul(m);
    EXPECT_EQ(via_group, via_matmul) << "matmul_group, product " << g;
    if (ps[g].w_dtype != DType::kQ8_0) {
      EXPECT_EQ(via_group, *got[g]) << "product " << g;
    }
  }
  ps[1].x = k.x.data();  // different x: a broken invariant stops the process, never a wrong y
  EXPECT_DEATH(gemm_packed(ps, nullptr), "must share x");
}

TEST(GemmPackedScratch, CallerOwnedScratchIsUsedAndChangesNothing) {
  if (!gemm_packed_available()) GTEST_SKIP() << "build without AVX2/FMA/F16C: matmul keeps sgemm";
  const Problem pr(19, 40, 352, DType::kF16, 77);
  std::vector<float> own(19 * pr.ldy), given(own.size()), small(own.size());
  gemm_packed(pr.params(own.data(), nullptr), nullptr);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> scratch(gemm_packed_scratch_floats(pr.m, pr.k), nan);
  MatmulParams p = pr.params(given.data(), nullptr);
  p.pack_scratch = scratch.data();
  p.pack_scratch_floats = scratch.size();
  gemm_packed(p, nullptr);
  EXPECT_EQ(given, own);
  size_t written = 0;
  for (float v : scratch) written += !std::isnan(v);
  EXPECT_GE(written, static_cast<size_t>(pr.m * pr.k)) << "the caller's scratch was not used";
  std::vector<float> too_small(scratch.size() - 17, nan);  // refused: the kernel's own buffer
  p.y = small.data();
  p.pack_scratch = too_small.data();
  p.pack_scratch_floats = too_small.size();
  gemm_packed(p, nullptr);
  EXPECT_EQ(small, own);
  for (float v : too_small) ASSERT_TRUE(std::isnan(v)) << "a too-small scratch was written";
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, GemmPackedTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace kvcache
