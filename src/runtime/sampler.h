// Token sampler: greedy, temperature, top-k, top-p, min-p and repetition penalty, seeded and
// deterministic (same seed + same logits -> same ids on every machine). The chain follows
// llama.cpp's default order: repetition penalty -> top-k -> top-p -> min-p (filters on the
// untempered distribution) -> temperature -> draw. temperature 0 is greedy (argmax after
// the penalty; the first index wins ties, as llama2.c). The filters rank only as far as they
// cut (top-k: one pass keeping a heap of the k best; top-p: masses bucketed by logit, only the
// bucket where the mass is reached ranked), and the draw walks the survivors as the filters
// leave them, so with no filter on it is one pass over the vocabulary and no sort (a sort of
// the whole vocabulary per token cost more than a 125M model's decode step). Owns its workspaces
// (no allocation per token); one Sampler per sequence.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvcache {

struct SamplerParams {
  float temperature = 0.0f;     // >= 0; 0: greedy
  int32_t top_k = 0;            // >= 0; 0: off
  float top_p = 1.0f;           // (0, 1]; 1: off; keep the smallest prefix with mass >= top_p
  float min_p = 0.0f;           // [0, 1]; 0: off; keep p >= min_p * p_max
  float repeat_penalty = 1.0f;  // 1: off; CTRL-style: logit > 0 ? logit / r : logit * r
  int32_t repeat_last_n = 64;   // how many recent tokens the penalty looks at (-1: all)
  uint64_t seed = 0;
};

// Throws Error (kInvalidArgument, naming the CLI option) unless every field is in its range
// above; NaN is never in range. The Sampler constructor calls it; a CLI calls it before any output.
void validate_sampler_params(const SamplerParams& params);

// PCG32 (O'Neill 2014, XSH-RR output, 64-bit LCG state): small, fast, and fully specified, so
// a seed gives the same stream everywhere.
class Pcg32 {
 public:
  explicit Pcg32(uint64_t seed, uint64_t stream = 0x5851f42d4c957f2dull);
  uint32_t next_u32();
  float next_f32();  // uniform in [0, 1), 24 random bits

 private:
  uint64_t state_ = 0, inc_ = 0;
};

// A generated token's log-probability under the model: the log-softmax of the raw logits, before
// temperature, penalties and truncation (the model's distribution, what vLLM reports by
// default), with the `top` most likely tokens (highest first, ties by lower id).
struct LogprobEntry {
  int32_t token = -1;
  float logprob = 0.0f;
  std::string piece;  // the token's text (a tokenizer's decode), or "token_id:N" without one
};
struct TokenLogprob {
  LogprobEntry chosen;
  std::vector<LogprobEntry> top;
};
inline constexpr int32_t kMaxTopLogprobs = 20;

// log_softmax(logits)[token] and the top k entries (k in [0, kMaxTopLogprobs]); pieces left
// empty. log_sum_exp sums the vocabulary in double, so a logprob is exact to float rounding.
TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t k);

class Sampler {
 public:
  Sampler(const SamplerParams& params, int64_t vocab_size);

  // logits: [vocab]; history: ids seen so far (prompt and generated) for the penalty.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);
  // The distribution sample() draws from, over the whole vocabulary: out [vocab] sums to 1 and is
  // 0 outside the survivors of the penalty, top-k, top-p and min-p; greedy (temperature 0):
  // one-hot at the penalised argmax. Speculative sampling's p and q (runtime/speculative.h).
  // The generator does not move.
  void probabilities(std::span<const float> logits, std::span<const int32_t> history,
                     std::vector<float>& out);
  const SamplerParams& params() const { return params_; }

 private:
  // work_ = logits with the repetition penalty over `history` applied; returns work_'s max.
  // Throws Error on NaN or +inf logits, and when every logit is -inf.
  float penalise(std::span<const float> logits, std::span<const int32_t> history);
  // cand_ = (logit, id) of the survivors of top-k, top-p and min-p over work_, whose max is mx
  // (the filters rank by logit, the lower id first on ties), in the order the filters leave
  // them: by id with no filter or min-p alone; by rank after top-k; after top-p over the
  // vocabulary, its whole buckets by id, then the edge bucket's by rank.
  void survivors(float mx);
  // cand_ = the k best (k < vocabulary) in rank order.
  void top_k_best(int64_t k);
  // top-p with no top-k before it: cand_ = the survivors, from bucketed masses (no full sort).
  void top_p_over_vocabulary(float mx);
  // Cuts cand_ after the first rank-ordered entry from n on at which cum, plus the masses
  // exp(logit - mx) from n, reaches target (or at its end).
  void keep_mass_prefix(size_t n, double cum, double target, float mx);
  // cand_'s logits become the tempered weights exp((logit - mx) / T); returns their sum, added
  // in cand_'s order.
  double weigh(float mx);

  SamplerParams params_;
  int64_t vocab_;
  Pcg32 rng_;
  std::vector<float> work_;                      // [vocab] penalised logits
  std::vector<std::pair<float, int32_t>> cand_;  // [vocab] (logit or weight, id)
  std::vector<double> bucket_mass_;              // top_p_over_vocabulary's buckets
  std::vector<uint8_t> seen_;                    // [vocab] penalty bookkeeping
};

}  // namespace kvcache
