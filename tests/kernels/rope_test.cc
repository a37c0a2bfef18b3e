#include "kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "kernel_test_util.h"

namespace kvcache {
namespace {

using testing_util::randn;

RopeParams params(std::vector<float>& x, int64_t tokens, int64_t heads, int64_t hd,
                  const std::vector<float>& inv, RopeStyle style, int64_t pos0) {
  RopeParams p;
  p.x = x.data();
  p.n_tokens = tokens;
  p.n_heads = heads;
  p.head_dim = hd;
  p.pos0 = pos0;
  p.inv_freq = inv.data();
  p.rot_dim = static_cast<int64_t>(inv.size()) * 2;
  p.style = style;
  return p;
}

TEST(Rope, ApplyIsBitIdenticalToReference) {
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalf}) {
    const int64_t T = 7, H = 3, D = 18;
    const std::vector<float> inv = rope_inv_freq(D, 10000.0f, nullptr);
    std::vector<float> a = randn(T * H * D, 1), b = a;
    rope_apply(params(a, T, H, D, inv, style, 13));
    rope_reference(params(b, T, H, D, inv, style, 13));
    EXPECT_EQ(a, b);
  }
}

TEST(Rope, MatchesDoublePrecisionRotation) {
  const int64_t T = 5, H = 2, D = 10;
  const std::vector<float> inv = rope_inv_freq(D, 10000.0f, nullptr);
  const std::vector<float> x0 = randn(T * H * D, 2);
  std::vector<float> x = x0;
  rope_apply(params(x, T, H, D, inv, RopeStyle::kInterleaved, 3));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const double ang = (3 + t) * std::pow(10000.0, -2.0 * i / D);
        const double a = x0[(t * H + h) * D + 2 * i], b = x0[(t * H + h) * D + 2 * i + 1];
        EXPECT_NEAR(x[(t * H + h) * D + 2 * i], a * std::cos(ang) - b * std::sin(ang), 1e-5);
        EXPECT_NEAR(x[(t * H + h) * D + 2 * i + 1], a * std::sin(ang) + b * std::cos(ang), 1e-5);
      }
}

TEST(Rope, HalfStyleIsInterleavedUnderPermutation) {
  // HF's rotate_half on a head whose dims are permuted (even dims first, then odd) equals the
  // interleaved rotation: the reason llama.cpp's converter permutes q/k rows.
  const int64_t T = 4, H = 2, D = 12;
  const std::vector<float> inv = rope_inv_freq(D, 500000.0f, nullptr);
  std::vector<float> a = randn(T * H * D, 3), b(a.size());
  for (int64_t r = 0; r < T * H; ++r)
    for (int64_t i = 0; i < D / 2; ++i) {
      b[r * D + i] = a[r * D + 2 * i];
      b[r * D + D / 2 + i] = a[r * D + 2 * i + 1];
    }
  rope_apply(params(a, T, H, D, inv, RopeStyle::kInterleaved, 100));
  rope_apply(params(b, T, H, D, inv, RopeStyle::kHalf, 100));
  for (int64_t r = 0; r < T * H; ++r)
    for (int64_t i = 0; i < D / 2; ++i) {
      EXPECT_EQ(b[r * D + i], a[r * D + 2 * i]);
      EXPECT_EQ(b[r * D + D / 2 + i], a[r * D + 2 * i + 1]);
    }
}

TEST(Rope, RelativePositionAndNorm) {
  // <rope(q, m), rope(k, n)> depends on m - n only; rotations keep the norm; position 0 is
  // identity.
  const int64_t D = 16;
  const std::vector<float> inv = rope_inv_freq(D, 10000.0f, nullptr);
  const std::vector<float> q0 = randn(D, 4), k0 = randn(D, 5);
  auto rot = [&](std::vector<float> v, int64_t pos) {
    rope_apply(params(v, 1, 1, D, inv, RopeStyle::kHalf, pos));
    return v;
  };
  auto dot = [&](const std::vector<float>& a, const std::vector<float>& b) {
    double s = 0;
    for (int64_t i = 0; i < D; ++i) s += a[i] * b[i];
    return s;
  };
  EXPECT_NEAR(dot(rot(q0, 9), rot(k0, 4)), dot(rot(q0, 25), rot(k0, 20)), 1e-4);
  EXPECT_NEAR(dot(rot(q0, 37), rot(q0, 37)), dot(q0, q0), 1e-4);
  EXPECT_EQ(rot(q0, 0), q0);
}

TEST(Rope, PartialRotaryPassesTheRestThrough) {
  const int64_t D = 12;
  const std::vector<float> inv = rope_inv_freq(8, 10000.0f, nullptr);
  const std::vector<float> x0 = randn(D, 6);
  std::vector<float> x = x0;
  rope_apply(params(x, 1, 1, D, inv, RopeStyle::kInterleaved, 5));
  for (int64_t i = 8; i < D; ++i) EXPECT_EQ(x[i], x0[i]);
  EXPECT_NE(x[0], x0[0]);
}

TEST(Rope, FreqFactorsDivide) {
  std::vector<float> f(4, 4.0f);
  const std::vector<float> base = rope_inv_freq(8, 10000.0f, nullptr);
  const std::vector<float> lin = rope_inv_freq(8, 10000.0f, f.data());
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(lin[i], base[i] / 4.0f);
}

TEST(Rope, Llama3FactorsFollowTransformers) {
  // transformers' _compute_llama3_parameters, evaluated in double here.
  RopeLlama3Params p;
  p.rot_dim = 128;
  p.theta = 500000.0f;
  p.factor = 8.0f;
  p.low_freq_factor = 1.0f;
  p.high_freq_factor = 4.0f;
  p.original_max_position_embeddings = 8192;
  const std::vector<float> factors = rope_llama3_freq_factors(p);
  const std::vector<float> inv = rope_inv_freq(p.rot_dim, p.theta, factors.data());
  int n_low = 0, n_high = 0, n_mid = 0;
  for (int64_t i = 0; i < p.rot_dim / 2; ++i) {
    const double f = std::pow(500000.0, -2.0 * i / 128.0);
    const double wl = 2 * std::numbers::pi / f;
    double want;
    if (wl < 8192.0 / 4.0) {
      want = f, ++n_high;
    } else if (wl > 8192.0 / 1.0) {
      want = f / 8.0, ++n_low;
    } else {
      const double s = (8192.0 / wl - 1.0) / (4.0 - 1.0);
      want = (1 - s) * f / 8.0 + s * f, ++n_mid;
    }
    EXPECT_NEAR(inv[i], want, want * 2e-6) << i;
  }
  EXPECT_GT(n_low, 0);
  EXPECT_GT(n_high, 0);
  EXPECT_GT(n_mid, 0);
}

}  // namespace
}  // namespace kvcache
