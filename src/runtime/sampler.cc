#include "runtime/sampler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
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

void Sampler::penalise(std::span<const float> logits, std::span<const int32_t> history) {
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
}

float Sampler::survivors() {
  // Candidates sorted by logit, descending (ties: lower id first, for determinism).
  cand_.clear();
  for (int64_t i = 0; i < vocab_; ++i)
    cand_.emplace_back(work_[static_cast<size_t>(i)], static_cast<int32_t>(i));
  auto desc = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = cand_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
    keep = static_cast<size_t>(params_.top_k);
    std::partial_sort(cand_.begin(), cand_.begin() + static_cast<std::ptrdiff_t>(keep), cand_.end(),
                      desc);
    cand_.resize(keep);
  } else {
    std::sort(cand_.begin(), cand_.end(), desc);
  }
  // Untempered probabilities of the survivors for top-p and min-p.
  const float mx = cand_[0].first;
  double sum = 0.0;
  for (const auto& c : cand_) sum += std::exp(static_cast<double>(c.first - mx));
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    size_t n = 0;
    while (n < cand_.size()) {
      cum += std::exp(static_cast<double>(cand_[n].first - mx)) / sum;
      ++n;
      if (cum >= params_.top_p) break;
    }
    cand_.resize(n);
  }
  if (params_.min_p > 0.0f) {
    // p_i >= min_p * p_max  <=>  logit_i >= logit_max + log(min_p)
    const float cut = mx + std::log(params_.min_p);
    size_t n = 1;
    while (n < cand_.size() && cand_[n].first >= cut) ++n;
    cand_.resize(n);
  }
  return mx;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  penalise(logits, history);
  if (params_.temperature <= 0.0f) return static_cast<int32_t>(argmax(work_.data(), vocab_));
  const float mx = survivors();
  // Temperature, then one draw from the renormalised survivors.
  double total = 0.0;
  for (auto& c : cand_) {
    const double p = std::exp(static_cast<double>(c.first - mx) / params_.temperature);
    c.first = static_cast<float>(p);
    total += p;
  }
  const double coin = static_cast<double>(rng_.next_f32()) * total;
  double cdf = 0.0;
  for (const auto& c : cand_) {
    cdf += c.first;
    if (coin < cdf) return c.second;
  }
  return cand_.back().second;  // rounding left the coin past the end
}

void Sampler::probabilities(std::span<const float> logits, std::span<const int32_t> history,
                            std::vector<float>& out) {
  penalise(logits, history);
  out.assign(static_cast<size_t>(vocab_), 0.0f);
  if (params_.temperature <= 0.0f) {
    out[static_cast<size_t>(argmax(work_.data(), vocab_))] = 1.0f;
    return;
  }
  const float mx = survivors();
  // The weights sample() draws with, normalised.
  double total = 0.0;
  for (const auto& c : cand_)
    total += std::exp(static_cast<double>(c.first - mx) / params_.temperature);
  for (const auto& c : cand_)
    out[static_cast<size_t>(c.second)] = static_cast<float>(
        std::exp(static_cast<double>(c.first - mx) / params_.temperature) / total);
}

}  // namespace kvcache
