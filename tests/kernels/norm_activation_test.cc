#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/activation.h"
#include "kernels/norm.h"
#include "kernels/softmax.h"

namespace kvcache {
namespace {

using testing_util::randn;

TEST(RmsNorm, MatchesDoubleOnOddRowsInPlaceToo) {
  const int64_t rows = 3, dim = 37, ld = 41;
  const std::vector<float> x = randn(rows * ld, 1), w = randn(dim, 2);
  std::vector<float> y(rows * dim);
  RmsNormParams p;
  p.x = x.data();
  p.weight = w.data();
  p.y = y.data();
  p.rows = rows;
  p.dim = dim;
  p.ld_x = ld;
  p.eps = 1e-5f;
  rms_norm(p);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += double(x[r * ld + j]) * x[r * ld + j];
    const double s = 1.0 / std::sqrt(ss / dim + 1e-5);
    for (int64_t j = 0; j < dim; ++j)  // tolerance: a few float ulps of the sum
      EXPECT_NEAR(y[r * dim + j], w[j] * s * x[r * ld + j],
                  1e-5 * std::fabs(w[j] * s * x[r * ld + j]) + 1e-7);
  }
  std::vector<float> inplace(x.begin(), x.begin() + dim);
  p.x = inplace.data();
  p.y = inplace.data();
  p.rows = 1;
  p.ld_x = 0;
  rms_norm(p);
  for (int64_t j = 0; j < dim; ++j) EXPECT_EQ(inplace[j], y[j]);
}

TEST(SwiGlu, MatchesDouble) {
  const int64_t n = 53;
  const std::vector<float> g = randn(n, 3), u = randn(n, 4);
  std::vector<float> out(n);
  swiglu(g.data(), u.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double want = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
    EXPECT_NEAR(out[i], want, 1e-6 * std::fabs(want) + 1e-7);
  }
  // An element's value does not depend on n or where it sits (vector body or tail).
  std::vector<float> shifted(n - 3);
  swiglu(g.data() + 3, u.data() + 3, shifted.data(), n - 3);
  EXPECT_EQ(shifted, std::vector<float>(out.begin() + 3, out.end()));
  swiglu(g.data(), u.data(), const_cast<float*>(g.data()), n);  // in place over gate
  EXPECT_EQ(std::vector<float>(g.begin(), g.end()), out);
}

TEST(SwiGlu, WholeRangeOfGates) {
  // Gates where exp(-g) underflows, overflows and everything between, in steps of 1/64.
  std::vector<float> g, u;
  for (float x = -120.0f; x <= 120.0f; x += 1.0f / 64) g.push_back(x), u.push_back(1.5f);
  std::vector<float> out(g.size());
  swiglu(g.data(), u.data(), out.data(), static_cast<int64_t>(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const double want = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
    ASSERT_TRUE(std::isfinite(out[i])) << g[i];
    ASSERT_NEAR(out[i], want, 1e-6 * std::fabs(want) + 1e-7) << "gate " << g[i];
  }
}

// max_value and argmax against the plain scan on odd sizes: ties (the first wins), +0 against
// -0, -inf, and NaN (passed over; in front, argmax stays at 0).
TEST(Softmax, MaxAndArgmaxMatchTheScan) {
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(5);
  for (const int64_t n : {1, 2, 15, 16, 17, 31, 33, 100, 1001}) {
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 7) - 3);  // many ties
      const int specials = static_cast<int>(rng() % 4);
      for (int s = 0; s < specials; ++s) {
        const float pick[] = {nan, -inf, 0.0f, -0.0f, 3.5f};
        x[rng() % static_cast<uint32_t>(n)] = pick[rng() % 5];
      }
      if (trial % 5 == 0) x[0] = nan;
      int64_t best = 0;
      for (int64_t i = 1; i < n; ++i)
        if (x[static_cast<size_t>(i)] > x[static_cast<size_t>(best)]) best = i;
      ASSERT_EQ(argmax(x.data(), n), best) << "n " << n << " trial " << trial;
      float m = -inf;
      for (const float v : x) m = v > m ? v : m;
      ASSERT_EQ(max_value(x.data(), n), m) << "n " << n << " trial " << trial;
    }
  }
  const std::vector<float> all_nan = {nan, nan, nan};
  EXPECT_EQ(max_value(all_nan.data(), 3), -inf);
  EXPECT_EQ(argmax(all_nan.data(), 3), 0);
}

TEST(Softmax, NormalisedStableAndArgmaxFirstTie) {
  std::vector<float> x = {1000.0f, 1001.0f, 999.0f, 1001.0f, -1e30f};
  EXPECT_EQ(argmax(x.data(), 5), 1);
  const float lse = log_sum_exp(x.data(), 5);
  softmax_inplace(x.data(), 5);
  double sum = 0;
  for (float v : x) sum += v;
  EXPECT_NEAR(sum, 1.0, 1e-6);
  EXPECT_FLOAT_EQ(x[1], x[3]);
  EXPECT_EQ(x[4], 0.0f);
  const double z = 2.0 + std::exp(-1.0) + std::exp(-2.0);  // sum of exp(x - max)
  EXPECT_NEAR(x[0], std::exp(-1.0) / z, 1e-6);
  EXPECT_NEAR(lse, 1001.0 + std::log(z), 1e-4);  // float ulp at 1001 is 6e-5
}

}  // namespace
}  // namespace kvcache
