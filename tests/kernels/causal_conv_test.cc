// The causal depthwise conv1d with a carried window (kernels/causal_conv.h) against the double
// reference on odd sizes; prefill split at every token, token by token, in place and on
// several threads give the same bits as one call; bad views throw clear errors.
//
// Tolerance (the header's): |y - y_ref| <= 1e-6 * (|bias| + sum_j |w x|) + 1e-7 per output.
#include "kernels/causal_conv.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gated_delta_reference.h"
#include "kernel_test_util.h"

namespace kvcache {
namespace {

using testing_util::randn;

TensorView view(const std::vector<float>& v, const Shape& s) {
  return TensorView(const_cast<float*>(v.data()), DType::kF32, s);
}

struct Conv {
  int64_t T, C, K;
  std::vector<float> x, w, bias, state0;
};

Conv make_conv(int64_t T, int64_t C, int64_t K, uint32_t seed) {
  return {T,
          C,
          K,
          randn(size_t(T * C), seed),
          randn(size_t(C * K), seed + 1),
          randn(size_t(C), seed + 2),
          randn(size_t((K - 1) * C), seed + 3)};
}

// Runs tokens [t0, t1) from `state`; returns y [t1 - t0, C] and updates state.
std::vector<float> run(const Conv& c, int64_t t0, int64_t t1, std::vector<float>& state, bool bias,
                       bool silu, ThreadPool* pool = nullptr) {
  std::vector<float> y(size_t((t1 - t0) * c.C), -7.0f);
  CausalConv1dParams p;
  p.x = view(c.x, {c.T, c.C}).slice(0, t0, t1);
  p.y = view(y, {t1 - t0, c.C});
  p.weight = view(c.w, {c.K, c.C});
  if (bias) p.bias = view(c.bias, {c.C});
  p.state = view(state, {c.K - 1, c.C});
  p.silu = silu;
  p.pool = pool;
  causal_conv1d(p);
  return y;
}

TEST(CausalConv, MatchesDoubleOnOddSizes) {
  double worst = 0;
  uint32_t seed = 500;
  for (int64_t T : {1, 7, 63, 130}) {
    for (int64_t C : {1, 5, 17, 37}) {
      for (int64_t K : {1, 2, 4, 5}) {
        for (int flags = 0; flags < 4; ++flags) {
          const bool bias = flags & 1, silu = flags & 2;
          SCOPED_TRACE("T=" + std::to_string(T) + " C=" + std::to_string(C) +
                       " K=" + std::to_string(K) + (bias ? " bias" : "") + (silu ? " silu" : ""));
          const Conv c = make_conv(T, C, K, seed += 10);
          std::vector<float> state = c.state0;
          const std::vector<float> y = run(c, 0, T, state, bias, silu);
          std::vector<double> rs(c.state0.begin(), c.state0.end());
          const std::vector<double> ref = gdn_ref::causal_conv(
              T, C, K, c.x.data(), c.w.data(), bias ? c.bias.data() : nullptr, rs, silu);
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t ch = 0; ch < C; ++ch) {
              double mag = bias ? std::fabs(c.bias[size_t(ch)]) : 0.0;  // |bias| + sum |w x|
              for (int64_t j = 0; j < K; ++j) {
                const int64_t s = t - (K - 1) + j;
                const float in =
                    s >= 0 ? c.x[size_t(s * C + ch)] : c.state0[size_t((K - 1 + s) * C + ch)];
                mag += std::fabs(double(c.w[size_t(j * C + ch)]) * in);
              }
              const double err = std::fabs(y[size_t(t * C + ch)] - ref[size_t(t * C + ch)]);
              EXPECT_LE(err, 1e-6 * mag + 1e-7) << "t=" << t << " c=" << ch;
              worst = std::max(worst, (err - 1e-7) / std::max(mag, 1e-30));
            }
          }
          // The new window is the inputs themselves: exact.
          for (size_t i = 0; i < state.size(); ++i) EXPECT_EQ(double(state[i]), rs[i]);
        }
      }
    }
  }
  std::printf("measured: max (|y - y_ref| - 1e-7) / (|bias| + sum |w x|) = %.2e\n", worst);
}

// A prefill split at any token (the window carried in state), and the same tokens one decode
// call each, give the bits of one call; so does the threaded path (T * C * K >= 65,536).
TEST(CausalConv, SplitsAndThreadsGiveTheSameBits) {
  const Conv c = make_conv(33, 21, 4, 7);
  std::vector<float> s_whole = c.state0;
  const std::vector<float> whole = run(c, 0, c.T, s_whole, true, true);
  for (int64_t split = 0; split <= c.T; ++split) {
    std::vector<float> state = c.state0;
    std::vector<float> y = run(c, 0, split, state, true, true);
    const std::vector<float> rest = run(c, split, c.T, state, true, true);
    y.insert(y.end(), rest.begin(), rest.end());
    EXPECT_EQ(y, whole) << "split at " << split;
    EXPECT_EQ(state, s_whole) << "split at " << split;
  }
  std::vector<float> state = c.state0, y;
  for (int64_t t = 0; t < c.T; ++t) {
    const std::vector<float> step = run(c, t, t + 1, state, true, true);
    y.insert(y.end(), step.begin(), step.end());
  }
  EXPECT_EQ(y, whole);
  EXPECT_EQ(state, s_whole);

  const Conv big = make_conv(300, 67, 4, 8);  // 80,400 multiply-adds: the pool's path
  std::vector<float> serial_state = big.state0;
  std::vector<float> serial;
  for (int64_t t0 = 0; t0 < big.T; t0 += 50) {  // 50 x 67 x 4 < 65,536: the serial path
    const std::vector<float> part = run(big, t0, t0 + 50, serial_state, true, true);
    serial.insert(serial.end(), part.begin(), part.end());
  }
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    std::vector<float> st = big.state0;
    EXPECT_EQ(run(big, 0, big.T, st, true, true, &pool), serial) << threads << " threads";
    EXPECT_EQ(st, serial_state);
  }
}

// y written over x (same view), with x rows strided: the same bits as a separate output.
TEST(CausalConv, InPlaceOnStridedRows) {
  const int64_t T = 19, C = 13, K = 4, ld = 20;
  const Conv c = make_conv(T, C, K, 9);
  std::vector<float> s1 = c.state0;
  const std::vector<float> want = run(c, 0, T, s1, false, true);
  std::vector<float> buf(size_t(T * ld), 0.0f), s2 = c.state0;
  for (int64_t t = 0; t < T; ++t) std::copy_n(c.x.begin() + t * C, C, buf.begin() + t * ld);
  CausalConv1dParams p;
  p.x = TensorView(buf.data(), DType::kF32, {T, C}, {ld, 1, 0, 0});
  p.y = p.x;
  p.weight = view(c.w, {K, C});
  p.state = view(s2, {K - 1, C});
  causal_conv1d(p);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t ch = 0; ch < C; ++ch)
      EXPECT_EQ(buf[size_t(t * ld + ch)], want[size_t(t * C + ch)]);
  EXPECT_EQ(s2, s1);
}

void expect_error(const CausalConv1dParams& p, const std::string& needle) {
  testing_util::expect_invalid_argument([&] { causal_conv1d(p); }, needle);
}

TEST(CausalConv, BadArgumentsThrowClearErrors) {
  const Conv c = make_conv(6, 10, 4, 10);
  std::vector<float> y(60), state = c.state0;
  CausalConv1dParams good;
  good.x = view(c.x, {6, 10});
  good.y = view(y, {6, 10});
  good.weight = view(c.w, {4, 10});
  good.state = view(state, {3, 10});
  causal_conv1d(good);

  CausalConv1dParams p = good;
  p.state = view(state, {4, 10});
  expect_error(p, "state must be [K - 1, C] = [3, 10]");
  p = good;
  p.y = view(y, {6, 9});
  expect_error(p, "y must be [6, 10] like x, got [6, 9]");
  p = good;
  p.weight = view(c.w, {5, 8});
  expect_error(p, "weight must be [K, C] = [K, 10] (HF's [C, 1, K] transposed), got [5, 8]");
  p = good;
  p.bias = view(c.bias, {9});
  expect_error(p, "bias must be an f32 [C] = [10]");
  std::vector<float> wide(17 * 10), st16(16 * 10);
  p = good;
  p.weight = view(wide, {17, 10});
  p.state = view(st16, {16, 10});
  expect_error(p, "kernel size K (weight's dim 0) must be in [1, 16], got 17");
  std::vector<float> x2(70);
  p = good;
  p.x = view(x2, {6, 10});
  p.y = TensorView(x2.data() + 1, DType::kF32, {6, 10});
  expect_error(p, "y overlaps x");
  p = good;
  p.state = view(c.x, {3, 10});
  expect_error(p, "state overlaps x or y");
  p = good;
  p.x = TensorView(const_cast<float*>(c.x.data()), DType::kF32, {6, 5}, {10, 2, 0, 0});
  p.y = view(y, {6, 5});
  p.weight = view(c.w, {4, 5});
  p.state = view(state, {3, 5});
  expect_error(p, "x: the innermost stride must be 1");
}

}  // namespace
}  // namespace kvcache
