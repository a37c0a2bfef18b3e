#include "runtime/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"

namespace kvcache {
namespace {

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

TEST(Pcg32, MatchesThePublishedReferenceStream) {
  // pcg32-demo (pcg-c-basic) with pcg32_srandom(42, 54): the first six outputs.
  Pcg32 rng(42, 54);
  const uint32_t want[] = {0xa15c02b7, 0x7b47f409, 0xba1d3330, 0x83d2f293, 0xbfa4784b, 0xcbed606e};
  for (uint32_t w : want) EXPECT_EQ(rng.next_u32(), w);
  Pcg32 f(1);
  for (int i = 0; i < 1000; ++i) {
    const float x = f.next_f32();
    ASSERT_GE(x, 0.0f);
    ASSERT_LT(x, 1.0f);
  }
}

TEST(Sampler, GreedyIsArgmaxFirstOnTies) {
  Sampler s(SamplerParams{}, 5);
  const std::vector<float> l = {0.1f, 2.0f, -1.0f, 2.0f, 0.0f};
  EXPECT_EQ(s.sample(l, {}), 1);
}

TEST(Sampler, SeededAndDeterministic) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.seed = 1234;
  const std::vector<float> l = logits_of({0.3, 0.25, 0.2, 0.15, 0.1});
  Sampler a(p, 5), b(p, 5);
  p.seed = 99;
  Sampler c(p, 5);
  std::vector<int32_t> ra, rb, rc;
  for (int i = 0; i < 64; ++i) {
    ra.push_back(a.sample(l, {}));
    rb.push_back(b.sample(l, {}));
    rc.push_back(c.sample(l, {}));
  }
  EXPECT_EQ(ra, rb);
  EXPECT_NE(ra, rc);
}

TEST(Sampler, TemperatureOneFollowsTheSoftmax) {
  SamplerParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  const std::vector<double> probs = {0.5, 0.3, 0.15, 0.05};
  Sampler s(p, 4);
  const std::vector<float> l = logits_of(probs);
  const int n = 20000;
  std::vector<int> count(4, 0);
  for (int i = 0; i < n; ++i) ++count[static_cast<size_t>(s.sample(l, {}))];
  for (size_t i = 0; i < 4; ++i) {
    const double sigma = std::sqrt(n * probs[i] * (1 - probs[i]));
    EXPECT_NEAR(count[i], n * probs[i], 4 * sigma) << i;  // 4 sigma: fails by chance < 1e-4
  }
}

TEST(Sampler, LowTemperatureSharpens) {
  SamplerParams p;
  p.temperature = 0.02f;
  Sampler s(p, 4);
  const std::vector<float> l = logits_of({0.4, 0.35, 0.15, 0.1});
  int top = 0;
  for (int i = 0; i < 500; ++i) top += s.sample(l, {}) == 0;
  EXPECT_GT(top, 490);  // (0.35/0.4)^(1/0.02) = 0.0013: the runner-up is rare
}

TEST(Sampler, TopKTopPMinPRestrictTheSupport) {
  const std::vector<float> l = logits_of({0.05, 0.5, 0.15, 0.3});  // order: 1, 3, 2, 0
  auto support = [&](SamplerParams p) {
    p.temperature = 1.0f;
    p.seed = 3;
    Sampler s(p, 4);
    std::set<int32_t> seen;
    for (int i = 0; i < 2000; ++i) seen.insert(s.sample(l, {}));
    return seen;
  };
  SamplerParams k;
  k.top_k = 2;
  EXPECT_EQ(support(k), (std::set<int32_t>{1, 3}));
  k.top_k = 1;
  EXPECT_EQ(support(k), (std::set<int32_t>{1}));
  SamplerParams tp;
  tp.top_p = 0.7f;  // 0.5 < 0.7 <= 0.8: two tokens
  EXPECT_EQ(support(tp), (std::set<int32_t>{1, 3}));
  tp.top_p = 0.9f;  // 0.8 < 0.9 <= 0.95: three
  EXPECT_EQ(support(tp), (std::set<int32_t>{1, 2, 3}));
  SamplerParams mp;
  mp.min_p = 0.5f;  // keep p >= 0.25
  EXPECT_EQ(support(mp), (std::set<int32_t>{1, 3}));
  mp.min_p = 0.2f;  // keep p >= 0.1
  EXPECT_EQ(support(mp), (std::set<int32_t>{1, 2, 3}));
  EXPECT_EQ(support(SamplerParams{}), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplerParams p;
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 2;
  Sampler s(p, 3);
  // token 0: 3.0 -> 1.5 < 2.0, so greedy moves to token 1 once 0 is in the window.
  const std::vector<float> l = {3.0f, 2.0f, -1.0f};
  const std::vector<int32_t> hist = {0, 0};
  EXPECT_EQ(s.sample(l, hist), 1);
  EXPECT_EQ(s.sample(l, {}), 0);
  const std::vector<int32_t> old = {0, 2, 2};  // 0 left the last-2 window
  EXPECT_EQ(s.sample(l, old), 0);
  // A negative logit gets more negative: with 1 and 0 penalised, 2 (-1 -> -2) stays last.
  const std::vector<float> neg = {1.1f, 1.0f, -1.0f};
  const std::vector<int32_t> h2 = {2, 0};
  EXPECT_EQ(s.sample(neg, h2), 1);  // 0: 1.1 -> 0.55 < 1.0
}

TEST(Sampler, TokenLogprobIsTheLogSoftmaxAndTheTopK) {
  const std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f, 0.5f};
  double sum = 0;
  for (const float x : l) sum += std::exp(static_cast<double>(x));
  const TokenLogprob t = token_logprob(l, 4, 3);
  EXPECT_EQ(t.chosen.token, 4);
  EXPECT_NEAR(t.chosen.logprob, 0.5 - std::log(sum), 1e-6);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].token, 1);  // a tie goes to the lower id
  EXPECT_EQ(t.top[1].token, 2);
  EXPECT_EQ(t.top[2].token, 0);
  EXPECT_EQ(t.top[0].logprob, t.top[1].logprob);
  EXPECT_NEAR(t.top[2].logprob, 1.0 - std::log(sum), 1e-6);
  EXPECT_TRUE(token_logprob(l, 3, 0).top.empty());
  EXPECT_EQ(token_logprob(l, 3, 5).top.size(), 5u);  // k = the vocabulary: every token, sorted
  // Logits far from 0 neither overflow nor lose the difference.
  const std::vector<float> big = {1000.0f, 999.0f};
  EXPECT_NEAR(token_logprob(big, 1, 2).chosen.logprob, -1.0 - std::log1p(std::exp(-1.0)), 1e-6);
}

// NaN or +inf logits (a fault upstream, which the attention kernels now carry through) are
// refused with an error naming the first bad id, greedy or sampled, rather than turned into a
// token; -inf (a masked token) is valid.
TEST(Sampler, RefusesNaNAndInfiniteLogits) {
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  for (const float temp : {0.0f, 0.8f})
    for (const float bad : {nan, inf}) {
      SamplerParams p;
      p.temperature = temp;
      Sampler s(p, 6);
      const std::vector<float> logits = {0.5f, 1.0f, -inf, bad, 2.0f, 0.0f};
      try {
        s.sample(logits, {});
        FAIL() << "no error for " << bad << " at temperature " << temp;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(std::isnan(bad) ? "NaN" : "+inf"), std::string::npos)
            << e.what();
        EXPECT_NE(std::string(e.what()).find("token id 3"), std::string::npos) << e.what();
      }
      std::vector<float> out;
      EXPECT_THROW(s.probabilities(logits, {}, out), Error);
    }
  SamplerParams greedy;
  greedy.temperature = 0.0f;
  Sampler g(greedy, 3);
  EXPECT_EQ(g.sample(std::vector<float>{-inf, 1.0f, -inf}, {}), 1);
  // Every token masked: no token to give, greedy or sampled.
  for (const float temp : {0.0f, 0.8f}) {
    SamplerParams p;
    p.temperature = temp;
    Sampler s(p, 3);
    try {
      s.sample(std::vector<float>{-inf, -inf, -inf}, {});
      FAIL() << "no error at temperature " << temp;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("every logit is -inf"), std::string::npos) << e.what();
    }
  }
}

// The filters' survivors on vocabularies of thousands, where top-p works from bucketed masses
// and ranks only the bucket where the mass is reached: the same set as the plain chain that
// ranks every token (higher logit first, lower id on ties) and cuts top-k, top-p and min-p on
// that list, and weights proportional to exp((logit - max) / T). Logits include ties (rounded
// to quarters), masked tokens (-inf) and spreads from nearly flat to peaked.
TEST(Sampler, SurvivorsMatchTheFullyRankedChain) {
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(11);
  int compared = 0, skipped = 0;
  for (const int64_t V : {1, 2, 257, 5003})
    for (const float sd : {0.3f, 1.0f, 4.0f, 12.0f})
      for (const bool ties : {false, true}) {
        std::normal_distribution<float> nd(0.0f, sd);
        std::vector<float> l(static_cast<size_t>(V));
        for (float& x : l) x = ties ? std::round(nd(rng) * 4.0f) / 4.0f : nd(rng);
        if (V > 2)
          for (int m = 0; m < 5; ++m) l[rng() % static_cast<uint32_t>(V)] = -inf;
        if (std::all_of(l.begin(), l.end(), [&](float x) { return x == -inf; })) l[0] = 0.0f;
        // The plain chain's ranking.
        std::vector<int32_t> order(static_cast<size_t>(V));
        for (int32_t i = 0; i < V; ++i) order[static_cast<size_t>(i)] = i;
        std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
          return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)] ||
                 (l[static_cast<size_t>(a)] == l[static_cast<size_t>(b)] && a < b);
        });
        const float mx = l[static_cast<size_t>(order[0])];
        for (const int32_t k : {0, 7, 300})
          for (const float top_p : {1.0f, 0.3f, 0.9f, 0.99f})
            for (const float min_p : {0.0f, 0.01f, 0.3f}) {
              size_t n = order.size();
              if (k > 0) n = std::min(n, static_cast<size_t>(k));
              if (top_p < 1.0f) {
                double sum = 0.0;
                for (size_t i = 0; i < n; ++i)
                  sum += std::exp(double(l[static_cast<size_t>(order[i])] - mx));
                const double target = double(top_p) * sum;
                double cum = 0.0;
                size_t cut = 0;
                while (cut < n) {
                  const double before = cum;
                  cum += std::exp(double(l[static_cast<size_t>(order[cut])] - mx));
                  ++cut;
                  // A cut within rounding of the target depends on the summation order: skip.
                  if (std::fabs(cum - target) < 1e-9 * sum ||
                      std::fabs(before - target) < 1e-9 * sum)
                    cut = n + 1;
                  if (cum >= target) break;
                }
                if (cut > n) {
                  ++skipped;
                  continue;
                }
                n = cut;
              }
              std::set<int32_t> want;
              for (size_t i = 0; i < n; ++i) {
                const int32_t id = order[i];
                if (min_p > 0.0f && l[static_cast<size_t>(id)] < mx + std::log(min_p)) continue;
                if (l[static_cast<size_t>(id)] == -inf) continue;  // weight 0: never drawn
                want.insert(id);
              }
              SamplerParams p;
              p.temperature = 0.7f;
              p.top_k = k;
              p.top_p = top_p;
              p.min_p = min_p;
              Sampler s(p, V);
              std::vector<float> out;
              s.probabilities(l, {}, out);
              std::set<int32_t> got;
              double total = 0.0;
              const double t = p.temperature;  // 0.7f, as the sampler divides by it
              for (int32_t id : want)
                total += std::exp(double(l[static_cast<size_t>(id)] - mx) / t);
              for (int32_t i = 0; i < V; ++i) {
                const float o = out[static_cast<size_t>(i)];
                if (o == 0.0f) continue;
                got.insert(i);
                const double w = std::exp(double(l[static_cast<size_t>(i)] - mx) / t) / total;
                ASSERT_NEAR(o, w, 1e-6 * w + 1e-44) << "V " << V << " id " << i;  // + denormals
              }
              // Weights below float's normal range (1.2e-38) round to denormals or to 0: such
              // tokens are left out of the comparison on both sides.
              const auto tiny = [&](int32_t id) {
                return std::exp(double(l[static_cast<size_t>(id)] - mx) / t) / total < 1e-37;
              };
              std::erase_if(want, tiny);
              std::erase_if(got, tiny);
              ASSERT_EQ(got, want) << "V " << V << " sd " << sd << " ties " << ties << " k " << k
                                   << " top_p " << top_p << " min_p " << min_p;
              // A draw lands on a survivor.
              ASSERT_TRUE(want.count(s.sample(l, {}))) << "V " << V;
              ++compared;
            }
      }
  EXPECT_GT(compared, 20 * skipped + 300) << compared << " compared, " << skipped << " skipped";
}

TEST(Sampler, RejectsNonsenseParameters) {
  // Out of range on either side, or NaN: each an error naming the option.
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  struct Case {
    void (*set)(SamplerParams&, float);
    float value;
    const char* option;
  };
  const auto temp = [](SamplerParams& q, float v) { q.temperature = v; };
  const auto top_p = [](SamplerParams& q, float v) { q.top_p = v; };
  const auto min_p = [](SamplerParams& q, float v) { q.min_p = v; };
  const auto penalty = [](SamplerParams& q, float v) { q.repeat_penalty = v; };
  const Case cases[] = {
      {temp, -1.0f, "--temp"},
      {temp, nan, "--temp"},
      {temp, inf, "--temp"},
      {top_p, 0.0f, "--top-p"},
      {top_p, 1.5f, "--top-p"},
      {top_p, nan, "--top-p"},
      {min_p, 2.0f, "--min-p"},
      {min_p, nan, "--min-p"},
      {[](SamplerParams& q, float v) { q.top_k = static_cast<int32_t>(v); }, -3.0f, "--top-k"},
      {penalty, 0.0f, "--repeat-penalty"},
      {penalty, nan, "--repeat-penalty"},
      {[](SamplerParams& q, float v) { q.repeat_last_n = static_cast<int32_t>(v); }, -2.0f,
       "--repeat-last-n"},
  };
  for (const Case& c : cases) {
    SamplerParams q;
    c.set(q, c.value);
    try {
      Sampler s(q, 4);
      ADD_FAILURE() << c.option << " " << c.value << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.option), std::string::npos) << e.what();
    }
  }
  SamplerParams edges;
  edges.repeat_last_n = -1;  // the whole history
  edges.top_p = 1.0f;
  edges.min_p = 1.0f;
  EXPECT_NO_THROW(Sampler(edges, 4));
}

}  // namespace
}  // namespace kvcache
