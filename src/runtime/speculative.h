// Speculative decoding (issue 45, item 4) over any cache container that can crop: a drafter
// proposes up to k tokens, the target model runs the last accepted token and the drafts in one
// forward (k + 1 logits rows), keeps the longest prefix it agrees with plus one token of its own,
// and the rejected drafts leave the caches through crop(-num_rejected) (cache/crop_rule.h).
//
// Drafters: prompt lookup (`ngram`: the tokens that followed the latest earlier occurrence of the
// context's last n tokens, n from the maximum down to 1; q is one-hot) and a draft model of the
// same vocabulary (`draft`: k tokens from its own session and cache, drawn from its own sampler
// distribution, q). Acceptance: greedy keeps drafts while they equal the target's token (so the
// output is plain greedy decoding's, token for token); sampling uses the rejection rule of
// Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding", Algorithm 1)
// and Chen et al. 2023 ("Accelerating Large Language Model Decoding with Speculative Sampling",
// Algorithm 2): accept x with probability min(1, p(x) / q(x)), else draw from max(0, p - q)
// normalised, which makes every emitted token follow p exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/generate.h"
#include "runtime/sampler.h"
#include "runtime/session.h"

namespace kvcache {

enum class SpecMode { kNgram, kDraft };

struct SpecParams {
  SpecMode mode = SpecMode::kNgram;
  int64_t k = 4;      // drafts per target forward
  int64_t ngram = 3;  // prompt lookup: the longest n-gram matched
};

struct SpecStats {
  int64_t target_forwards = 0;  // verification forwards (the prompt's prefill not counted)
  int64_t drafted = 0;          // draft tokens proposed to the target
  int64_t accepted = 0;         // of them, accepted
  int64_t draft_forwards = 0;   // draft model forwards (draft mode)
  double acceptance_rate() const { return drafted > 0 ? double(accepted) / drafted : 0.0; }
};

// Prompt lookup: for n = max_n down to 1, the latest earlier occurrence of the last n tokens of
// `context` (not the suffix itself); returns up to k tokens that followed it (fewer when the
// context ends first), empty when no n-gram recurs.
std::vector<int32_t> ngram_propose(std::span<const int32_t> context, int64_t max_n, int64_t k);

// One draw from weights over the vocabulary (>= 0, positive sum): the first id whose cumulative
// weight exceeds a uniform coin in [0, sum).
int32_t draw_from(std::span<const float> weights, Pcg32& rng);

// The rejection rule for one draft token x drawn from q, against the target's p (both [vocab],
// summing to 1). q empty: a deterministic drafter (prompt lookup), q = one-hot at x. Returns x
// when accepted, else a token drawn from max(0, p - q) normalised. `scratch` holds the residual.
struct SpecDecision {
  bool accepted = false;
  int32_t token = -1;
};
SpecDecision speculative_accept(std::span<const float> p, std::span<const float> q, int32_t x,
                                Pcg32& rng, std::vector<float>& scratch);

// Throws Error(kUnsupported) naming the first layer whose container cannot take crop(-n) back
// over tokens it has just written (linear-attention states, compressed or indexed layers, lossy
// KV policies, which evict, sliding layers of a container that cannot keep the keys past its
// window, a sliding_window_override, which the model's mask does not follow), before anything
// is generated; `what` names the session ("target", "draft") in the message. Then sets every
// sliding and chunked layer's rollback bound (WindowLayer / QuantizedLayer::reserve_rollback,
// PagedKVStore::set_rollback_tokens) to `rollback` tokens, so that crops removing at most that
// many tokens since the last forward find the keys their windows need.
void prepare_speculative_cache(Session& session, const std::string& what, int64_t rollback);

// generate() (runtime/generate.h) with speculative decoding: same parameters, same streaming
// and stop rules; `draft` is the draft model's session for SpecMode::kDraft (nullptr for
// kNgram), at the same position as `target` (both empty, or both holding params.history).
// --verify is refused (it audits one token per step). The prompt goes through Session::prefill,
// each verification through Session::forward_all with batch_invariant (each row's logits are the
// bits a one-token decode gives) and the rejected drafts through Session::rollback. Afterwards
// the session holds the prompt and every generated token but the last, as after generate().
GenerateStats generate_speculative(Session& target, Session* draft, std::span<const int32_t> prompt,
                                   const GenerateParams& params, const SpecParams& spec,
                                   const std::function<void(int32_t)>& on_token,
                                   std::vector<int32_t>* generated, SpecStats* spec_stats);

}  // namespace kvcache
