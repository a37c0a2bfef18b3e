#include "runtime/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/error.h"
#include "kernels/softmax.h"

namespace kvcache {

Pcg32::Pcg32(uint64_t seed, uint64_t stream) : inc_((stream << 1u) | 1u) {
  next_u32();
  state_ += seed;
  next_u32();
}

uint32_t Pcg32::next_u32() {
  const uint64_t old = state_;
  state_ = old * 6364136223846793005ull + inc_;
  const auto xorshifted = static_cast<uint32_t>(((old >> 18u) ^ old) >> 27u);
  const auto rot = static_cast<uint32_t>(old >> 59u);
  return (xorshifted >> rot) | (xorshifted << ((32u - rot) & 31u));
}

float Pcg32::next_f32() {
  return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f);
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t k) {
  const auto n = static_cast<int64_t>(logits.size());
  KV_CHECK(token >= 0 && token < n, "token_logprob: token outside the vocabulary");
  KV_CHECK(k >= 0 && k <= kMaxTopLogprobs, "token_logprob: k outside [0, kMaxTopLogprobs]");
  const double lse = log_sum_exp(logits.data(), n);
  const auto lp = [&](int32_t id) {
    return static_cast<float>(logits[static_cast<size_t>(id)] - lse);
  };
  TokenLogprob r;
  r.chosen = {token, lp(token), {}};
  // The k best in one pass: a small list kept sorted (k <= 20, so insertion beats a heap).
  const auto better = [&](int32_t a, int32_t b) {
    const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  std::vector<int32_t> best;
  best.reserve(static_cast<size_t>(k) + 1);
  for (int32_t id = 0; k > 0 && id < n; ++id) {
    if (static_cast<int32_t>(best.size()) == k && !better(id, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), id, better), id);
    if (static_cast<int32_t>(best.size()) > k) best.pop_back();
  }
  for (const int32_t id : best) r.top.push_back({id, lp(id), {}});
  return r;
}

void validate_sampler_params(const SamplerParams& params) {
  // Each range written so that NaN fails it too.
  const auto bad = [](const std::string& what, double got) {
    throw Error(ErrorKind::kInvalidArgument,
                "sampler: " + what + ", got " + fmt::format("{}", got));
  };
  if (!(params.temperature >= 0.0f && std::isfinite(params.temperature)))
    bad("--temp must be >= 0 (0 = greedy)", params.temperature);
  if (params.top_k < 0) bad("--top-k must be >= 0 (0 = off)", params.top_k);
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    bad("--top-p must be in (0, 1] (1 = off)", params.top_p);
  if (!(params.min_p >= 0.0f && params.min_p <= 1.0f))
    bad("--min-p must be in [0, 1] (0 = off)", params.min_p);
  if (!(params.repeat_penalty > 0.0f && std::isfinite(params.repeat_penalty)))
    bad("--repeat-penalty must be positive (1 = off)", params.repeat_penalty);
  if (params.repeat_last_n < -1)
    bad("--repeat-last-n must be >= -1 (-1 = all)", params.repeat_last_n);
}

Sampler::Sampler(const SamplerParams& params, int64_t vocab_size)
    : params_(params), vocab_(vocab_size), rng_(params.seed) {
  if (vocab_size <= 0)
    throw Error(ErrorKind::kInvalidArgument, "sampler: vocabulary size must be positive");
  validate_sampler_params(params);
  work_.resize(static_cast<size_t>(vocab_size));
  cand_.reserve(static_cast<size_t>(vocab_size));
  seen_.assign(static_cast<size_t>(vocab_size), 0);
}

float Sampler::penalise(std::span<const float> logits, std::span<const int32_t> history) {
  KV_CHECK(static_cast<int64_t>(logits.size()) == vocab_, "sampler: logits size != vocabulary");
  // NaN or +inf logits come from a fault upstream (a NaN in a weight, an activation or the
  // cache, or an overflow; the kernels carry a NaN through instead of hiding it). argmax and the
  // draws would still return some id, a token that looks right: refuse instead. -inf is a
  // masked token, valid.
  bool finite = true;
  for (const float x : logits) finite &= x < std::numeric_limits<float>::infinity();
  if (!finite) {
    const auto bad = std::find_if(logits.begin(), logits.end(), [](float x) {
      return !(x < std::numeric_limits<float>::infinity());
    });
    throw Error(ErrorKind::kInvalidArgument,
                "sampler: the model's logits hold " +
                    std::string(std::isnan(*bad) ? "NaN" : "+inf") + " (first at token id " +
                    std::to_string(bad - logits.begin()) +
                    "): a weight, an activation or a cache entry is not finite (a corrupt model "
                    "file, an overflow, or NaN keys or values in the cache); no token is sampled "
                    "from them");
  }
  std::copy(logits.begin(), logits.end(), work_.begin());
  if (params_.repeat_penalty != 1.0f && !history.empty()) {
    const size_t n = params_.repeat_last_n < 0
                         ? history.size()
                         : std::min(history.size(), static_cast<size_t>(params_.repeat_last_n));
    const auto recent = history.subspan(history.size() - n);
    for (int32_t id : recent) {  // each distinct id once
      if (id < 0 || id >= vocab_ || seen_[static_cast<size_t>(id)]) continue;
      seen_[static_cast<size_t>(id)] = 1;
      float& l = work_[static_cast<size_t>(id)];
      l = l > 0.0f ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
    for (int32_t id : recent)
      if (id >= 0 && id < vocab_) seen_[static_cast<size_t>(id)] = 0;
  }
  // The penalty keeps a logit finite or -inf, so this is the logits' max's check too.
  const float mx = max_value(work_.data(), vocab_);
  if (mx == -std::numeric_limits<float>::infinity())
    throw Error(ErrorKind::kInvalidArgument,
                "sampler: every logit is -inf (every token is masked); no token can be sampled");
  return mx;
}

namespace {

// The rank order of the filters: higher logit first, the lower id first on ties. (A lambda, not
// a function: std::sort inlines a closure's call, a function pointer it calls per comparison.)
constexpr auto ranks_before = [](const std::pair<float, int32_t>& a,
                                 const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
};

}  // namespace

void Sampler::survivors(float mx) {
  const float* w = work_.data();
  if (params_.top_k > 0 && params_.top_k < vocab_) {
    top_k_best(params_.top_k);
    if (params_.top_p < 1.0f) {  // the smallest rank prefix of the k holding top_p of their mass
      double sum = 0.0;
      for (const auto& c : cand_) sum += std::exp(static_cast<double>(c.first - mx));
      keep_mass_prefix(0, 0.0, static_cast<double>(params_.top_p) * sum, mx);
    }
  } else if (params_.top_p < 1.0f) {
    top_p_over_vocabulary(mx);
  } else {  // every token, by id (no sort)
    cand_.resize(static_cast<size_t>(vocab_));
    for (int64_t i = 0; i < vocab_; ++i)
      cand_[static_cast<size_t>(i)] = {w[i], static_cast<int32_t>(i)};
  }
  if (params_.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p); the best token always stays.
    const float cut = mx + std::log(params_.min_p);
    std::erase_if(cand_, [&](const std::pair<float, int32_t>& c) { return c.first < cut; });
  }
}

void Sampler::keep_mass_prefix(size_t n, double cum, double target, float mx) {
  while (n < cand_.size()) {
    cum += std::exp(static_cast<double>(cand_[n].first - mx));
    ++n;
    if (cum >= target) break;
  }
  cand_.resize(n);
}

void Sampler::top_k_best(int64_t k) {
  // The k best in one pass: a heap of the k best so far whose front is the worst of them. A
  // later id never wins a tie, so only a logit above the front's enters; a block of 16 logits
  // none of which does is passed over with one vector compare.
  using V16 = float __attribute__((vector_size(64)));
  const float* w = work_.data();
  cand_.clear();
  for (int64_t i = 0; i < k; ++i) cand_.emplace_back(w[i], static_cast<int32_t>(i));
  std::make_heap(cand_.begin(), cand_.end(), ranks_before);
  const auto offer = [&](int64_t i) {
    if (!(w[i] > cand_.front().first)) return;
    std::pop_heap(cand_.begin(), cand_.end(), ranks_before);
    cand_.back() = {w[i], static_cast<int32_t>(i)};
    std::push_heap(cand_.begin(), cand_.end(), ranks_before);
  };
  int64_t i = k;
  for (; i + 16 <= vocab_; i += 16) {
    V16 v;
    std::memcpy(&v, w + i, sizeof v);
    const auto above = v > cand_.front().first;  // lanes: -1 where the logit is above the front's
    bool any = false;
    for (int j = 0; j < 16; ++j) any |= above[j] != 0;
    if (!any) continue;
    for (int64_t j = i; j < i + 16; ++j) offer(j);
  }
  for (; i < vocab_; ++i) offer(i);
  std::sort_heap(cand_.begin(), cand_.end(), ranks_before);  // best first
}

void Sampler::top_p_over_vocabulary(float mx) {
  // The smallest rank prefix of the vocabulary holding top_p of its mass, without ranking the
  // vocabulary. Tokens go to buckets by how far their logit lies below the max (kBuckets
  // buckets over kSpan nats, then one for everything further). Bucket order is rank order (the
  // distance is monotone in the logit), so the buckets above the one where the mass reaches
  // top_p are kept whole and unranked, and only that bucket's tokens are ranked, to find where
  // inside it the prefix ends.
  constexpr int kBuckets = 2048;
  constexpr float kSpan = 32.0f;  // e^-32: the mass per token below that is ~1e-14 of the max's
  constexpr float kScale = kBuckets / kSpan;
  const float* w = work_.data();
  cand_.clear();
  const auto bucket = [mx](float l) {
    const float d = mx - l;  // >= 0; +inf for a masked token
    return d < kSpan ? static_cast<int>(d * kScale) : kBuckets;
  };
  bucket_mass_.assign(kBuckets + 1, 0.0);
  double sum = 0.0;
  for (int64_t i = 0; i < vocab_; ++i) {
    const double e = std::exp(static_cast<double>(w[i] - mx));
    sum += e;
    bucket_mass_[static_cast<size_t>(bucket(w[i]))] += e;
  }
  const double target = static_cast<double>(params_.top_p) * sum;
  double cum = 0.0;
  int edge = 0;  // the bucket where the mass reaches the target
  while (edge < kBuckets && cum + bucket_mass_[static_cast<size_t>(edge)] < target)
    cum += bucket_mass_[static_cast<size_t>(edge++)];
  for (int64_t i = 0; i < vocab_; ++i)
    if (bucket(w[i]) < edge) cand_.emplace_back(w[i], static_cast<int32_t>(i));
  const size_t whole = cand_.size();
  for (int64_t i = 0; i < vocab_; ++i)
    if (bucket(w[i]) == edge) cand_.emplace_back(w[i], static_cast<int32_t>(i));
  std::sort(cand_.begin() + static_cast<std::ptrdiff_t>(whole), cand_.end(), ranks_before);
  // Inside the edge bucket, in rank order, until the target (or its end: its mass was added in
  // id order, so the walk may end a rounding short of it).
  keep_mass_prefix(whole, cum, target, mx);
}

double Sampler::weigh(float mx) {
  double total = 0.0;
  for (auto& c : cand_) {
    c.first = static_cast<float>(std::exp(static_cast<double>(c.first - mx) / params_.temperature));
    total += c.first;
  }
  return total;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  const float mx = penalise(logits, history);
  if (params_.temperature <= 0.0f) return static_cast<int32_t>(argmax(work_.data(), vocab_));
  survivors(mx);
  const double total = weigh(mx);
  // One draw: the first survivor (in the order survivors() holds them) whose cumulative weight
  // passes the coin. The cdf adds the same floats in the same order as the total, so it reaches
  // the total exactly and the coin (< total) always lands.
  const double coin = static_cast<double>(rng_.next_f32()) * total;
  double cdf = 0.0;
  for (const auto& c : cand_) {
    cdf += c.first;
    if (coin < cdf) return c.second;
  }
  return cand_.back().second;  // not reached (see above); the last survivor if it were
}

void Sampler::probabilities(std::span<const float> logits, std::span<const int32_t> history,
                            std::vector<float>& out) {
  const float mx = penalise(logits, history);
  out.assign(static_cast<size_t>(vocab_), 0.0f);
  if (params_.temperature <= 0.0f) {
    out[static_cast<size_t>(argmax(work_.data(), vocab_))] = 1.0f;
    return;
  }
  // The weights sample() draws with, normalised.
  survivors(mx);
  const double total = weigh(mx);
  for (const auto& c : cand_)
    out[static_cast<size_t>(c.second)] = static_cast<float>(c.first / total);
}

}  // namespace kvcache
