// The gated delta rule (kernels/gated_delta.h): both forms against the double token-by-token
// reference (gated_delta_reference.h) on random inputs of odd sizes, against each other, split
// into several calls, on strided views, and its argument checks; the gates and the gated
// RMSNorm against double.
//
// Tolerance (the header's), per value head: max |o - o_ref| <= 2e-5 * max_{t,j} sum_i |q_i S_ij|
// (the magnitude of the outputs' terms; with T = 1 and d_k = 5 the terms of one output can
// cancel to ~1e-3 of their size, so its own value is no scale for a float sum) and
// max |S - S_ref| <= 2e-5 * max |S_ref| for the final state. The largest ratios measured are
// printed by the tests ("measured ...") so a change in the arithmetic shows up in the log.
#include "kernels/gated_delta.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "gated_delta_reference.h"
#include "kernel_test_util.h"

namespace kvcache {
namespace {

using testing_util::randn;

constexpr double kTol = 2e-5;

enum class Form { kRecurrent, kChunked };
const char* form_name(Form f) {
  return f == Form::kRecurrent ? "recurrent" : "chunked";
}

struct Case {
  gdn_ref::Sizes s;
  std::vector<float> q, k, v, g, beta, state0;
};

// g uniform in [g_lo, g_hi], beta uniform in (0, 1), a nonzero initial state.
Case make_case(int64_t T, int64_t Hk, int64_t Hv, int64_t dk, int64_t dv, uint32_t seed,
               float g_lo = -2.0f, float g_hi = -0.01f) {
  Case c;
  c.s = {T, Hk, Hv, dk, dv};
  c.q = randn(size_t(T * Hk * dk), seed);
  c.k = randn(size_t(T * Hk * dk), seed + 1);
  c.v = randn(size_t(T * Hv * dv), seed + 2);
  c.state0 = randn(size_t(Hv * dk * dv), seed + 3);
  std::mt19937 rng(seed + 4);
  std::uniform_real_distribution<float> ug(g_lo, g_hi), ub(0.02f, 0.98f);
  c.g.resize(size_t(T * Hv));
  c.beta.resize(c.g.size());
  for (float& x : c.g) x = ug(rng);
  for (float& x : c.beta) x = ub(rng);
  return c;
}

TensorView view(const std::vector<float>& v, const Shape& s) {
  return TensorView(const_cast<float*>(v.data()), DType::kF32, s);
}

struct Result {
  std::vector<float> out, state;
};

// Runs one form over tokens [t0, t1) of c from `state` (the whole [Hv, dk, dv]).
Result run(const Case& c, Form form, int64_t t0, int64_t t1, std::vector<float> state,
           int64_t chunk = 64, ThreadPool* pool = nullptr) {
  const auto& s = c.s;
  Result r;
  r.out.assign(size_t((t1 - t0) * s.Hv * s.dv), -1.0f);
  GatedDeltaParams p;
  p.q = view(c.q, {s.T, s.Hk, s.dk}).slice(0, t0, t1);
  p.k = view(c.k, {s.T, s.Hk, s.dk}).slice(0, t0, t1);
  p.v = view(c.v, {s.T, s.Hv, s.dv}).slice(0, t0, t1);
  p.g = view(c.g, {s.T, s.Hv}).slice(0, t0, t1);
  p.beta = view(c.beta, {s.T, s.Hv}).slice(0, t0, t1);
  p.state = view(state, {s.Hv, s.dk, s.dv});
  p.out = view(r.out, {t1 - t0, s.Hv, s.dv});
  p.chunk_size = chunk;
  p.pool = pool;
  if (form == Form::kRecurrent) {
    gated_delta_recurrent(p);
  } else {
    gated_delta_chunked(p);
  }
  r.state = std::move(state);
  return r;
}

struct Ref {
  std::vector<double> out, mag, state;  // mag: sum_i |q_i S_ij| per output
};
Ref reference(const Case& c) {
  Ref r;
  r.state.assign(c.state0.begin(), c.state0.end());
  r.out = gdn_ref::recurrent(c.s, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(),
                             r.state, true, 1e-6, 0.0, &r.mag);
  return r;
}

// max over heads of max |x - ref| / max mag within the head; x, ref and mag are [n, Hv, d]
// (n = numel / (Hv d)), or [Hv, ...] with heads_outer.
template <typename A, typename B>
double head_error(const A& x, const B& ref, const std::vector<double>& mag, int64_t Hv, int64_t d,
                  bool heads_outer) {
  const int64_t n = int64_t(ref.size()) / (Hv * d);
  double worst = 0;
  for (int64_t h = 0; h < Hv; ++h) {
    double err = 0, m = 0;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < d; ++j) {
        const size_t i = size_t(heads_outer ? (h * n + t) * d + j : (t * Hv + h) * d + j);
        err = std::max(err, std::fabs(double(x[i]) - double(ref[i])));
        m = std::max(m, mag[i]);
      }
    }
    worst = std::max(worst, err / std::max(m, 1e-30));
  }
  return worst;
}
template <typename B>
double out_error(const std::vector<float>& x, const B& ref, const Ref& r, const gdn_ref::Sizes& s) {
  return head_error(x, ref, r.mag, s.Hv, s.dv, false);
}
double out_error(const std::vector<float>& x, const Ref& r, const gdn_ref::Sizes& s) {
  return out_error(x, r.out, r, s);
}
template <typename B>
double state_error(const std::vector<float>& x, const B& ref, const gdn_ref::Sizes& s) {
  std::vector<double> mag(ref.size());
  for (size_t i = 0; i < ref.size(); ++i) mag[i] = std::fabs(double(ref[i]));
  return head_error(x, ref, mag, s.Hv, s.dk * s.dv, true);
}

struct Regime {
  const char* name;
  float g_lo, g_hi;
};
constexpr Regime kRegimes[] = {{"g in [-2, -0.01]", -2.0f, -0.01f},
                               {"g near 0", -1e-3f, 0.0f},
                               {"g very negative", -30.0f, -8.0f}};

// Every combination of the odd sizes, both head layouts and the decay regimes, both forms.
TEST(GatedDelta, BothFormsMatchDoubleOnOddSizes) {
  const int64_t Ts[] = {1, 7, 63, 64, 65, 130};
  const int64_t dims[][2] = {{5, 17}, {17, 33}, {33, 5}};
  const int64_t heads[][2] = {{2, 4}, {3, 3}};
  double worst[2][2] = {};  // [form][out, state]
  uint32_t seed = 100;
  for (int64_t T : Ts) {
    for (const auto& d : dims) {
      for (const auto& hh : heads) {
        for (const Regime& rg : kRegimes) {
          const Case c = make_case(T, hh[0], hh[1], d[0], d[1], seed += 10, rg.g_lo, rg.g_hi);
          const Ref ref = reference(c);
          for (Form f : {Form::kRecurrent, Form::kChunked}) {
            SCOPED_TRACE(std::string(form_name(f)) + " T=" + std::to_string(T) +
                         " Hk=" + std::to_string(hh[0]) + " Hv=" + std::to_string(hh[1]) + " dk=" +
                         std::to_string(d[0]) + " dv=" + std::to_string(d[1]) + " " + rg.name);
            const Result r = run(c, f, 0, T, c.state0);
            const double eo = out_error(r.out, ref, c.s), es = state_error(r.state, ref.state, c.s);
            EXPECT_LE(eo, kTol);
            EXPECT_LE(es, kTol);
            worst[int(f)][0] = std::max(worst[int(f)][0], eo);
            worst[int(f)][1] = std::max(worst[int(f)][1], es);
          }
        }
      }
    }
  }
  std::printf(
      "measured (max over cases and heads; out: relative to sum |q S|, state: to max |S|): "
      "recurrent out %.2e "
      "state %.2e; chunked out %.2e state %.2e\n",
      worst[0][0], worst[0][1], worst[1][0], worst[1][1]);
}

// Chunk sizes other than 64 (1: every chunk a single token; 7 and 16: odd and even splits of
// T), the two forms compared with each other as well as with the reference.
TEST(GatedDelta, ChunkSizesAgreeWithRecurrent) {
  const Case c = make_case(130, 2, 4, 17, 33, 7);
  const Ref ref = reference(c);
  const Result rec = run(c, Form::kRecurrent, 0, c.s.T, c.state0);
  double worst = 0;
  for (int64_t chunk : {1, 7, 16, 64}) {
    SCOPED_TRACE("chunk_size " + std::to_string(chunk));
    const Result ch = run(c, Form::kChunked, 0, c.s.T, c.state0, chunk);
    EXPECT_LE(out_error(ch.out, ref, c.s), kTol);
    EXPECT_LE(state_error(ch.state, ref.state, c.s), kTol);
    // f32 against f32: the same bound, taken against the recurrent form's values.
    const double e =
        std::max(out_error(ch.out, rec.out, ref, c.s), state_error(ch.state, rec.state, c.s));
    EXPECT_LE(e, kTol);
    worst = std::max(worst, e);
  }
  std::printf("measured chunked vs recurrent (f32 both): %.2e\n", worst);
}

// The state matters: the check above would catch a kernel that ignored the initial state or
// dropped the decay (the errors they make are far above the tolerance).
TEST(GatedDelta, ToleranceCatchesAWrongStateOrDecay) {
  const Case c = make_case(65, 2, 4, 17, 33, 8);
  const Ref ref = reference(c);
  const Result zero_state =
      run(c, Form::kChunked, 0, c.s.T, std::vector<float>(c.state0.size(), 0.0f));
  EXPECT_GT(out_error(zero_state.out, ref, c.s), 100 * kTol);
  Case no_decay = c;
  std::fill(no_decay.g.begin(), no_decay.g.end(), 0.0f);
  const Result nd = run(no_decay, Form::kRecurrent, 0, c.s.T, c.state0);
  EXPECT_GT(out_error(nd.out, ref, c.s), 100 * kTol);
}

// A prefill by the chunked form, then decode steps by the recurrent form, equals the
// recurrence over all tokens (the handover of the state between the forms).
TEST(GatedDelta, ChunkedPrefillThenRecurrentDecode) {
  const Case c = make_case(130, 3, 6, 33, 17, 9);
  const Ref ref = reference(c);
  for (int64_t split : {1, 63, 64, 65, 129}) {
    SCOPED_TRACE("prefill " + std::to_string(split));
    const Result pre = run(c, Form::kChunked, 0, split, c.state0);
    std::vector<float> out = pre.out;
    std::vector<float> state = pre.state;
    for (int64_t t = split; t < c.s.T; ++t) {  // one decode call per token
      const Result step = run(c, Form::kRecurrent, t, t + 1, state);
      out.insert(out.end(), step.out.begin(), step.out.end());
      state = step.state;
    }
    EXPECT_LE(out_error(out, ref, c.s), kTol);
    EXPECT_LE(state_error(state, ref.state, c.s), kTol);
  }
}

// A prefill split into two chunked calls (state carried) equals one call: within the tolerance
// at any token, bit for bit where the split falls on a chunk boundary (same chunks, same
// arithmetic). The recurrent form is bit for bit the same however its tokens are split.
TEST(GatedDelta, SplitCallsEqualOneCall) {
  const Case c = make_case(130, 2, 4, 17, 33, 11);
  const Ref ref = reference(c);
  const Result whole_ch = run(c, Form::kChunked, 0, c.s.T, c.state0);
  const Result whole_rec = run(c, Form::kRecurrent, 0, c.s.T, c.state0);
  for (int64_t split : {1, 30, 64, 65, 128}) {
    SCOPED_TRACE("split at " + std::to_string(split));
    for (Form f : {Form::kChunked, Form::kRecurrent}) {
      const Result a = run(c, f, 0, split, c.state0);
      const Result b = run(c, f, split, c.s.T, a.state);
      std::vector<float> out = a.out;
      out.insert(out.end(), b.out.begin(), b.out.end());
      if (f == Form::kRecurrent) {
        EXPECT_EQ(out, whole_rec.out);
        EXPECT_EQ(b.state, whole_rec.state);
      } else if (split % 64 == 0) {
        EXPECT_EQ(out, whole_ch.out);
        EXPECT_EQ(b.state, whole_ch.state);
      } else {
        EXPECT_LE(out_error(out, whole_ch.out, ref, c.s), kTol);
        EXPECT_LE(state_error(b.state, whole_ch.state, c.s), kTol);
      }
    }
  }
}

// q, k and v as column slices of one row per token [T, 2 Hk dk + Hv dv] (the conv output the
// model hands over), out written over v's slice in place, on 1 and 3 threads: the same bits
// as contiguous inputs on the default pool.
TEST(GatedDelta, StridedViewsInPlaceAndThreadsGiveTheSameBits) {
  const Case c = make_case(70, 2, 6, 17, 9, 12);
  const auto& s = c.s;
  const int64_t width = 2 * s.Hk * s.dk + s.Hv * s.dv + 3;  // + 3: rows not a multiple of 8
  std::vector<float> mixed(size_t(s.T * width), 0.0f);
  for (int64_t t = 0; t < s.T; ++t) {
    std::copy_n(c.q.begin() + t * s.Hk * s.dk, s.Hk * s.dk, mixed.begin() + t * width);
    std::copy_n(c.k.begin() + t * s.Hk * s.dk, s.Hk * s.dk,
                mixed.begin() + t * width + s.Hk * s.dk);
    std::copy_n(c.v.begin() + t * s.Hv * s.dv, s.Hv * s.dv,
                mixed.begin() + t * width + 2 * s.Hk * s.dk);
  }
  for (Form f : {Form::kRecurrent, Form::kChunked}) {
    SCOPED_TRACE(form_name(f));
    const Result want = run(c, f, 0, s.T, c.state0);
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      std::vector<float> m = mixed, state = c.state0;
      float* base = m.data();
      GatedDeltaParams p;
      p.q = TensorView(base, DType::kF32, {s.T, s.Hk, s.dk}, {width, s.dk, 1, 0});
      p.k = TensorView(base + s.Hk * s.dk, DType::kF32, {s.T, s.Hk, s.dk}, {width, s.dk, 1, 0});
      p.v = TensorView(base + 2 * s.Hk * s.dk, DType::kF32, {s.T, s.Hv, s.dv}, {width, s.dv, 1, 0});
      p.out = p.v;
      p.g = view(c.g, {s.T, s.Hv});
      p.beta = view(c.beta, {s.T, s.Hv});
      p.state = view(state, {s.Hv, s.dk, s.dv});
      p.pool = &pool;
      if (f == Form::kRecurrent) {
        gated_delta_recurrent(p);
      } else {
        gated_delta_chunked(p);
      }
      std::vector<float> out;
      for (int64_t t = 0; t < s.T; ++t) {
        const float* o = base + t * width + 2 * s.Hk * s.dk;
        out.insert(out.end(), o, o + s.Hv * s.dv);
      }
      EXPECT_EQ(out, want.out) << threads << " threads";
      EXPECT_EQ(state, want.state) << threads << " threads";
    }
  }
}

// Without the in-kernel l2norm (keys already small: the rule is stable for beta |k|^2 < 2) and
// with an explicit scale.
TEST(GatedDelta, WithoutL2NormAndExplicitScale) {
  Case c = make_case(65, 1, 2, 16, 17, 13);
  const float ks = 1.0f / std::sqrt(float(c.s.dk));
  for (float& x : c.k) x *= ks;
  Ref ref;
  ref.state.assign(c.state0.begin(), c.state0.end());
  ref.out = gdn_ref::recurrent(c.s, c.q.data(), c.k.data(), c.v.data(), c.g.data(), c.beta.data(),
                               ref.state, false, 0.0, 0.3, &ref.mag);
  for (Form f : {Form::kRecurrent, Form::kChunked}) {
    SCOPED_TRACE(form_name(f));
    std::vector<float> state = c.state0, out(size_t(c.s.T * c.s.Hv * c.s.dv));
    GatedDeltaParams p;
    p.q = view(c.q, {c.s.T, 1, 16});
    p.k = view(c.k, {c.s.T, 1, 16});
    p.v = view(c.v, {c.s.T, 2, 17});
    p.g = view(c.g, {c.s.T, 2});
    p.beta = view(c.beta, {c.s.T, 2});
    p.state = view(state, {2, 16, 17});
    p.out = view(out, {c.s.T, 2, 17});
    p.qk_l2norm = false;
    p.scale = 0.3f;
    if (f == Form::kRecurrent) {
      gated_delta_recurrent(p);
    } else {
      gated_delta_chunked(p);
    }
    EXPECT_LE(out_error(out, ref, c.s), kTol);
    EXPECT_LE(state_error(state, ref.state, c.s), kTol);
  }
}

// T = 0 writes nothing and keeps the state.
TEST(GatedDelta, NoTokensKeepsTheState) {
  const Case c = make_case(3, 1, 1, 5, 5, 14);
  for (Form f : {Form::kRecurrent, Form::kChunked}) {
    const Result r = run(c, f, 1, 1, c.state0);
    EXPECT_TRUE(r.out.empty());
    EXPECT_EQ(r.state, c.state0);
  }
}

void expect_error(const GatedDeltaParams& p, const std::string& needle) {
  testing_util::expect_invalid_argument([&] { gated_delta_recurrent(p); },
                                        "gated_delta_recurrent: " + needle);
  testing_util::expect_invalid_argument([&] { gated_delta_chunked(p); },
                                        "gated_delta_chunked: " + needle);
}

TEST(GatedDelta, BadArgumentsThrowClearErrors) {
  const Case c = make_case(5, 2, 4, 5, 7, 15);
  std::vector<float> state = c.state0, out(size_t(5 * 4 * 7));
  GatedDeltaParams good;
  good.q = view(c.q, {5, 2, 5});
  good.k = view(c.k, {5, 2, 5});
  good.v = view(c.v, {5, 4, 7});
  good.g = view(c.g, {5, 4});
  good.beta = view(c.beta, {5, 4});
  good.state = view(state, {4, 5, 7});
  good.out = view(out, {5, 4, 7});
  gated_delta_recurrent(good);  // the baseline is valid
  gated_delta_chunked(good);

  GatedDeltaParams p = good;
  p.k = view(c.k, {5, 2, 4});
  expect_error(p, "k must be [5, 2, 5], got [5, 2, 4]");
  p = good;
  p.q = view(c.q, {5, 3, 5});  // H_k = 3 does not divide H_v = 4
  p.k = view(c.k, {5, 3, 5});
  expect_error(p, "H_v (4, v's heads) must be a multiple of H_k (3");
  p = good;
  p.v = view(c.v, {4, 4, 7});
  expect_error(p, "v has 4 tokens, q has 5");
  p = good;
  p.state = view(state, {4, 7, 5});
  expect_error(p, "state must be [4, 5, 7], got [4, 7, 5]");
  p = good;
  p.out = view(out, {5, 4, 6});
  expect_error(p, "out must be [5, 4, 7]");
  p = good;
  p.g = view(c.g, {5, 2});
  expect_error(p, "g must be [5, 4], got [5, 2]");
  p = good;
  p.beta = view(c.beta, {20});
  expect_error(p, "beta must be 2-d");
  p = good;
  p.q = TensorView(const_cast<float*>(c.q.data()), DType::kF32, {5, 2, 5}, {10, 5, 2, 0});
  expect_error(p, "q: the innermost stride must be 1");
  p = good;
  p.v = TensorView(const_cast<float*>(c.v.data()), DType::kF16, {5, 4, 7});
  expect_error(p, "v must be f32");
  p = good;
  p.chunk_size = 0;
  testing_util::expect_invalid_argument([&] { gated_delta_chunked(p); },
                                        "gated_delta_chunked: chunk_size must be > 0, got 0");
}

TEST(GatedDeltaGates, MatchDouble) {
  const int64_t T = 7, Hv = 5;
  std::vector<float> a = randn(size_t(T * Hv), 21), b = randn(a.size(), 22), a_log = randn(Hv, 23),
                     dt = randn(Hv, 24);
  a[3] = 25.0f;  // past softplus's threshold
  a[4] = -30.0f;
  std::vector<float> g(a.size()), beta(a.size());
  GatedDeltaGateParams p;
  p.a = view(a, {T, Hv});
  p.b = view(b, {T, Hv});
  p.a_log = view(a_log, {Hv});
  p.dt_bias = view(dt, {Hv});
  p.g = view(g, {T, Hv});
  p.beta = view(beta, {T, Hv});
  gated_delta_gates(p);
  std::vector<double> rg, rb;
  gdn_ref::gates(T, Hv, a.data(), b.data(), a_log.data(), dt.data(), rg, rb);
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(g[i], rg[i], 1e-6 * std::fabs(rg[i]) + 1e-7) << i;
    EXPECT_NEAR(beta[i], rb[i], 1e-6 * std::fabs(rb[i]) + 1e-7) << i;
  }
  // In place over a and b.
  p.g = p.a;
  p.beta = p.b;
  gated_delta_gates(p);
  EXPECT_EQ(a, g);
  EXPECT_EQ(b, beta);
  p.a_log = view(a_log, {Hv - 1});
  EXPECT_THROW(gated_delta_gates(p), Error);
}

TEST(RmsNormGated, MatchesDoubleInPlaceToo) {
  const int64_t T = 3, H = 5, D = 37;
  const std::vector<float> x = randn(size_t(T * H * D), 31), z = randn(x.size(), 32),
                           w = randn(D, 33);
  std::vector<float> y(x.size());
  RmsNormGatedParams p;
  p.x = view(x, {T, H, D});
  p.z = view(z, {T, H, D});
  p.weight = view(w, {D});
  p.y = view(y, {T, H, D});
  p.eps = 1e-6f;
  rms_norm_gated(p);
  const std::vector<double> ref =
      gdn_ref::rms_norm_gated(T * H, D, x.data(), z.data(), w.data(), 1e-6);
  for (size_t i = 0; i < y.size(); ++i)
    EXPECT_NEAR(y[i], ref[i], 1e-5 * std::fabs(ref[i]) + 1e-6) << i;
  std::vector<float> inplace = x;
  p.x = view(inplace, {T, H, D});
  p.y = p.x;
  rms_norm_gated(p);
  EXPECT_EQ(inplace, y);
  p.weight = view(w, {D - 1});
  EXPECT_THROW(rms_norm_gated(p), Error);
}

}  // namespace
}  // namespace kvcache
