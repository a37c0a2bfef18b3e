// The sampler's cost per token against a decode step's (issue 45: the step's serial work). A
// draw with temperature ranks the vocabulary only as far as its filters cut
// (runtime/sampler.h); BM_SampleSortingAll is the chain it replaced (every logit sorted unless
// top-k cuts first with a partial sort), run beside it on the same logits.
//
//   build/bench/bench_sampler
//   build/bench/bench_sampler --benchmark_filter='/151936/'
//
// Args: vocabulary size, filter (0: temperature only; 1: top-k 40; 2: top-p 0.95; 3: min-p
// 0.05), and the logits' spread (standard deviation x 10: 10 is nearly flat, a random model's
// case; 40 is peaked like a trained model's).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "runtime/sampler.h"

namespace {

using namespace kvcache;

std::vector<float> logits(int64_t vocab, double sd) {
  std::mt19937 g(1);
  std::normal_distribution<float> nd(0.0f, static_cast<float>(sd));
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& x : l) x = nd(g);
  return l;
}

SamplerParams params(int64_t filter) {
  SamplerParams p;
  p.temperature = 0.8f;
  p.seed = 7;
  if (filter == 1) p.top_k = 40;
  if (filter == 2) p.top_p = 0.95f;
  if (filter == 3) p.min_p = 0.05f;
  return p;
}

// The chain ranking first: every logit sorted (top-k: the best k, partially sorted), top-p and
// min-p cut on the ranked list, then a draw with temperature over the survivors.
int32_t sample_sorting_all(const SamplerParams& p, const std::vector<float>& l,
                           std::vector<std::pair<float, int32_t>>& cand, std::mt19937& g) {
  cand.clear();
  for (size_t i = 0; i < l.size(); ++i) cand.emplace_back(l[i], static_cast<int32_t>(i));
  const auto desc = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < cand.size()) {
    std::partial_sort(cand.begin(), cand.begin() + p.top_k, cand.end(), desc);
    cand.resize(static_cast<size_t>(p.top_k));
  } else {
    std::sort(cand.begin(), cand.end(), desc);
  }
  const float mx = cand[0].first;
  double sum = 0.0;
  for (const auto& c : cand) sum += std::exp(static_cast<double>(c.first - mx));
  if (p.top_p < 1.0f) {
    double cum = 0.0;
    size_t n = 0;
    while (n < cand.size()) {
      cum += std::exp(static_cast<double>(cand[n].first - mx)) / sum;
      ++n;
      if (cum >= p.top_p) break;
    }
    cand.resize(n);
  }
  if (p.min_p > 0.0f) {
    const float cut = mx + std::log(p.min_p);
    size_t n = 1;
    while (n < cand.size() && cand[n].first >= cut) ++n;
    cand.resize(n);
  }
  double total = 0.0;
  for (auto& c : cand) {
    c.first = static_cast<float>(std::exp(static_cast<double>(c.first - mx) / p.temperature));
    total += c.first;
  }
  const double coin = std::uniform_real_distribution<double>(0.0, total)(g);
  double cdf = 0.0;
  for (const auto& c : cand)
    if (coin < (cdf += c.first)) return c.second;
  return cand.back().second;
}

void BM_Sample(benchmark::State& state) {
  const std::vector<float> l = logits(state.range(0), static_cast<double>(state.range(2)) / 10);
  Sampler s(params(state.range(1)), state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(l, {}));
}

void BM_SampleSortingAll(benchmark::State& state) {
  const std::vector<float> l = logits(state.range(0), static_cast<double>(state.range(2)) / 10);
  const SamplerParams p = params(state.range(1));
  std::vector<std::pair<float, int32_t>> cand;
  cand.reserve(l.size());
  std::mt19937 g(7);
  for (auto _ : state) benchmark::DoNotOptimize(sample_sorting_all(p, l, cand, g));
}

// Llama-2's and Qwen2's vocabularies.
void args(benchmark::internal::Benchmark* b) {
  for (int64_t vocab : {32000, 151936})
    for (int64_t filter : {0, 1, 2, 3})
      for (int64_t spread : {10, 40}) b->Args({vocab, filter, spread});
}

BENCHMARK(BM_Sample)->Apply(args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SampleSortingAll)->Apply(args)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
