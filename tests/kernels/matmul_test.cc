#include "kernels/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernel_test_util.h"

namespace kvcache {
namespace {

struct Case {
  int64_t m, n, k;
};

using testing_util::make_weights;
using testing_util::randn;

// Tolerance stated in matmul.h: 1e-5 * sum_j |x_j w_j| + 1e-6 per output.
void expect_close(const MatmulParams& p, const std::vector<float>& y, const std::vector<float>& ref,
                  const std::vector<float>& x) {
  std::vector<float> wrow(static_cast<size_t>(p.k));
  const size_t rb = dtype_bytes(p.w_dtype, p.k);
  for (int64_t r = 0; r < p.n; ++r) {
    dequantize_row(static_cast<const std::byte*>(p.w) + r * rb, p.w_dtype, wrow.data(), p.k);
    for (int64_t i = 0; i < p.m; ++i) {
      double mag = 0;
      for (int64_t j = 0; j < p.k; ++j) mag += std::fabs(wrow[j] * x[i * p.ldx + j]);
      const size_t at = static_cast<size_t>(i * p.ldy + r);
      ASSERT_NEAR(y[at], ref[at], 1e-5 * mag + 1e-6) << "row " << i << " col " << r;
    }
  }
}

class MatmulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTest, MatchesReferenceOnOddSizes) {
  const DType t = GetParam();
  ThreadPool pool(3);
  const Case cases[] = {{1, 37, 96},  {1, 301, 160}, {2, 61, 32},
                        {3, 129, 64}, {5, 77, 224},  {9, 200, 96}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const int64_t ldx = c.k + 3, ldy = c.n + 5;  // strided rows
    std::vector<float> x = randn(static_cast<size_t>(c.m * ldx), seed++);
    const std::vector<float> wf = randn(static_cast<size_t>(c.n * c.k), seed++);
    const std::vector<float> bias = randn(static_cast<size_t>(c.n), seed++);
    const std::vector<std::byte> w = make_weights(wf, t, c.n, c.k);
    MatmulParams p;
    p.x = x.data();
    p.ldx = ldx;
    p.w = w.data();
    p.w_dtype = t;
    p.bias = (c.m % 2 == 1) ? bias.data() : nullptr;
    p.ldy = ldy;
    p.m = c.m;
    p.n = c.n;
    p.k = c.k;
    p.pool = &pool;
    std::vector<float> ref(static_cast<size_t>(c.m * ldy), -7.0f);
    std::vector<float> y(ref.size(), -7.0f);
    p.y = ref.data();
    matmul_reference(p);
    p.y = y.data();
    matmul(p);
    expect_close(p, y, ref, x);
    for (int64_t i = 0; i < c.m; ++i)  // padding between rows untouched
      for (int64_t r = c.n; r < ldy; ++r) EXPECT_EQ(y[i * ldy + r], -7.0f);
    // Threads only split rows: one thread gives the same bits (sgemm paths excepted).
    if (c.m < kBlasMinRows) {
      ThreadPool one(1);
      std::vector<float> y1(ref.size(), -7.0f);
      p.y = y1.data();
      p.pool = &one;
      matmul(p);
      EXPECT_EQ(y1, y);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllWeightTypes, MatmulTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Matmul, OwnKernelAndBlasAgreeForPrefill) {
  const int64_t m = 7, n = 45, k = 83;
  std::vector<float> x = randn(m * k, 11), w = randn(n * k, 12);
  MatmulParams p;
  p.x = x.data();
  p.ldx = k;
  p.w = w.data();
  p.ldy = n;
  p.m = m;
  p.n = n;
  p.k = k;
  std::vector<float> a(m * n), b(m * n);
  p.y = a.data();
  matmul(p);
  p.allow_blas = false;
  p.y = b.data();
  matmul(p);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4) << i;
}

TEST(Matmul, ReferenceIsSequentialFloat) {
  // llama2.c's order: acc += w[j] * x[j], j ascending, in float. 1 + 1e-8 rounds back to 1 at
  // every step, so the sequential sum is exactly 1 while an exact sum would be 1 + 3e-8.
  std::vector<float> x = {1.0f, 1e-8f, 1e-8f, 1e-8f};
  std::vector<float> w = {1.0f, 1.0f, 1.0f, 1.0f};
  float y = 0;
  MatmulParams p;
  p.x = x.data();
  p.ldx = 4;
  p.w = w.data();
  p.y = &y;
  p.ldy = 1;
  p.m = 1;
  p.n = 1;
  p.k = 4;
  matmul_reference(p);
  EXPECT_EQ(y, 1.0f);
}

TEST(QuantQ8_0, RoundTripWithinHalfAStep) {
  const int64_t k = 96;
  const std::vector<float> x = randn(k, 5);
  std::vector<BlockQ8_0> q(k / 32);
  quantize_row_q8_0(x.data(), q.data(), k);
  std::vector<float> back(k);
  dequantize_row(q.data(), DType::kQ8_0, back.data(), k);
  for (int64_t b = 0; b < k / 32; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    const float d = f16_to_f32(q[b].d);
    EXPECT_NEAR(d, amax / 127.0f, amax / 127.0f * 1e-3);  // f16 scale
    for (int j = 0; j < 32; ++j)
      EXPECT_NEAR(back[b * 32 + j], x[b * 32 + j], 0.5f * d + 1e-3f * amax);
  }
  std::vector<float> zeros(32, 0.0f);
  quantize_row_q8_0(zeros.data(), q.data(), 32);
  EXPECT_EQ(f16_to_f32(q[0].d), 0.0f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[0].qs[j], 0);
}

}  // namespace
}  // namespace kvcache

namespace kvcache {
namespace {

// matmul_group = matmul on each product, bit for bit, whether the group runs as one GEMV loop
// (m < kBlasMinRows) or one product after the other (prefill).
TEST(MatmulGroup, EqualsSeparateMatmulsForEveryDtype) {
  ThreadPool pool(3);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    for (int64_t m : {int64_t{1}, int64_t{2}, int64_t{6}}) {
      const int64_t k = 96, ns[3] = {67, 16, 301};
      std::vector<float> x = randn(static_cast<size_t>(m * k), 21);
      std::vector<std::vector<std::byte>> ws;
      std::vector<std::vector<float>> biases, ys, want;
      MatmulParams ps[3];
      for (int g = 0; g < 3; ++g) {
        ws.push_back(make_weights(randn(static_cast<size_t>(ns[g] * k), 30 + g), t, ns[g], k));
        biases.push_back(randn(static_cast<size_t>(ns[g]), 40 + g));
        ys.emplace_back(static_cast<size_t>(m * ns[g]), -1.0f);
        want.emplace_back(static_cast<size_t>(m * ns[g]), -2.0f);
      }
      for (int g = 0; g < 3; ++g) {
        MatmulParams& p = ps[g];
        p.x = x.data();
        p.ldx = k;
        p.w = ws[g].data();
        p.w_dtype = t;
        p.bias = g == 1 ? biases[g].data() : nullptr;
        p.ldy = ns[g];
        p.m = m;
        p.n = ns[g];
        p.k = k;
        p.pool = &pool;
        p.y = want[g].data();
        matmul(p);
        p.y = ys[g].data();
      }
      matmul_group(ps);
      for (int g = 0; g < 3; ++g)
        EXPECT_EQ(ys[g], want[g]) << dtype_name(t) << " m=" << m << " product " << g;
    }
  }
}

}  // namespace
}  // namespace kvcache

namespace kvcache {
namespace {

// Batch invariance of the GEMV path (allow_blas = false, what batched decode uses): M rows in
// one call give, for every row, the bits of that row multiplied alone — and the bits of
// dot_row — whatever M (tile remainders 1..3 rows), N (remainders of 1 and 2 rows of the 3-row
// W tiles), K (tails of 8-chunks and of single elements; 2080 and 1139 cross the tiles' K
// segments of 512, 1139 ending on a short segment, two 8-chunks and 3 elements; with AVX-512's
// 32-element steps 1139 ends on 16 + 3, 43 on 8 + 3 and 57 on 16 + 8 + 1) and dtype.
TEST(MatmulGemv, RowsOfABatchEqualEachRowAloneBitForBit) {
  ThreadPool pool(3);
  uint32_t seed = 100;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    for (int64_t k : {int64_t{64}, int64_t{96}, int64_t{2048 + 32}, int64_t{1139}, int64_t{43},
                      int64_t{57}, int64_t{7}}) {
      if (t == DType::kQ8_0 && k % 32 != 0) continue;
      for (int64_t m :
           {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{8}, int64_t{16}, int64_t{37}}) {
        const int64_t n = k > 1000 ? 33 : 71, ldx = k + 5, ldy = n + 2;
        const std::vector<float> x = randn(static_cast<size_t>(m * ldx), seed++);
        const std::vector<std::byte> w =
            make_weights(randn(static_cast<size_t>(n * k), seed++), t, n, k);
        const std::vector<float> bias = randn(static_cast<size_t>(n), seed++);
        MatmulParams p;
        p.x = x.data();
        p.ldx = ldx;
        p.w = w.data();
        p.w_dtype = t;
        p.bias = m % 2 == 1 ? bias.data() : nullptr;
        p.ldy = ldy;
        p.m = m;
        p.n = n;
        p.k = k;
        p.pool = &pool;
        p.allow_blas = false;
        std::vector<float> y(static_cast<size_t>(m * ldy), -7.0f), ref(y.size(), -7.0f);
        p.y = y.data();
        matmul(p);
        p.y = ref.data();
        matmul_reference(p);
        expect_close(p, y, ref, x);
        const size_t rb = dtype_bytes(t, k);
        for (int64_t i = 0; i < m; ++i) {
          std::vector<float> alone(static_cast<size_t>(n), -9.0f);
          MatmulParams one = p;
          one.x = x.data() + i * ldx;
          one.m = 1;
          one.y = alone.data();
          one.ldy = n;
          matmul(one);
          for (int64_t r = 0; r < n; ++r) {
            const float dot =
                dot_row(w.data() + static_cast<size_t>(r) * rb, t, x.data() + i * ldx, k) +
                (p.bias != nullptr ? bias[static_cast<size_t>(r)] : 0.0f);
            ASSERT_EQ(y[static_cast<size_t>(i * ldy + r)], alone[static_cast<size_t>(r)])
                << dtype_name(t) << " m=" << m << " k=" << k << " row " << i << " col " << r;
            ASSERT_EQ(alone[static_cast<size_t>(r)], dot) << dtype_name(t) << " k=" << k;
          }
          for (int64_t r = n; r < ldy; ++r) ASSERT_EQ(y[static_cast<size_t>(i * ldy + r)], -7.0f);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvcache
