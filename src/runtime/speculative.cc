#include "runtime/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <utility>

#include "cache/paged_layer.h"
#include "cache/paged_store.h"
#include "cache/quantized_layer.h"
#include "cache/window_layer.h"
#include "core/error.h"
#include "kernels/softmax.h"
#include "model/forward.h"

namespace kvcache {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

std::vector<int32_t> ngram_propose(std::span<const int32_t> context, int64_t max_n, int64_t k) {
  const auto len = static_cast<int64_t>(context.size());
  for (int64_t n = std::min(max_n, len - 1); n >= 1 && k > 0; --n) {
    const auto suffix = context.subspan(static_cast<size_t>(len - n));
    // The latest earlier occurrence: starts from len - n - 1 down to 0 (the suffix itself, at
    // len - n, is not a match).
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + s)) continue;
      const int64_t from = s + n;
      const int64_t take = std::min(k, len - from);
      return {context.begin() + from, context.begin() + from + take};
    }
  }
  return {};
}

int32_t draw_from(std::span<const float> weights, Pcg32& rng) {
  double total = 0.0;
  for (float w : weights) total += w;
  KV_CHECK(total > 0.0, "draw_from: weights that sum to 0");
  const double coin = static_cast<double>(rng.next_f32()) * total;
  double cdf = 0.0;
  int32_t last = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (weights[i] <= 0.0f) continue;
    cdf += weights[i];
    last = static_cast<int32_t>(i);
    if (coin < cdf) return last;
  }
  return last;  // rounding left the coin past the end: the last id with weight
}

SpecDecision speculative_accept(std::span<const float> p, std::span<const float> q, int32_t x,
                                Pcg32& rng, std::vector<float>& scratch) {
  KV_CHECK(x >= 0 && static_cast<size_t>(x) < p.size(), "speculative_accept: draft outside p");
  KV_CHECK(q.empty() || q.size() == p.size(), "speculative_accept: p and q sizes differ");
  const auto ux = static_cast<size_t>(x);
  const double qx = q.empty() ? 1.0 : static_cast<double>(q[ux]);
  const double px = p[ux];
  // Accept with probability min(1, p(x) / q(x)); a coin u in [0, 1) accepts when u * q(x) < p(x)
  // (no division: q(x) > 0 since x was drawn from q).
  const double u = rng.next_f32();
  if (u * qx < px) return {true, x};
  scratch.resize(p.size());
  double total = 0.0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double qi = q.empty() ? (i == ux ? 1.0 : 0.0) : static_cast<double>(q[i]);
    const double r = std::max(0.0, static_cast<double>(p[i]) - qi);
    scratch[i] = static_cast<float>(r);
    total += r;
  }
  // p == q on every id (rounding only) leaves nothing: then rejection had probability 0 and the
  // residual is undefined; p itself is the right draw.
  if (!(total > 0.0)) return {false, draw_from(p, rng)};
  return {false, draw_from(scratch, rng)};
}

void prepare_speculative_cache(Session& session, const std::string& what, int64_t rollback) {
  const SessionConfig& sc = session.config();
  if (!sc.cache.policy.exact())
    throw Error(ErrorKind::kUnsupported,
                "speculative decoding: the " + what + " cache's --kv-policy " +
                    sc.cache.policy.key() +
                    " evicts keys, and crop cannot bring them back to roll rejected drafts back; "
                    "use --kv-policy exact");
  if (sc.sliding_window_override > 0)
    // The override windows the cache only: the model's attention keeps no window mask, so a
    // forward of several tokens lets its later queries see keys a one-token decode's window
    // has dropped, and verification would not reproduce plain decoding.
    throw Error(ErrorKind::kUnsupported,
                "speculative decoding: the " + what + " session's sliding_window_override (" +
                    std::to_string(sc.sliding_window_override) +
                    ") windows the cache but not the model's attention mask, so a verification "
                    "forward of several tokens sees keys a one-token decode does not; use a model "
                    "whose config declares its sliding layers, or no override");
  if (rollback < 0)
    throw Error(ErrorKind::kInvalidArgument,
                "speculative decoding: rollback bound " + std::to_string(rollback) + " < 0");
  Cache& cache = session.cache();
  const std::vector<std::string>& types = cache.config().layer_types;
  // Check every layer before changing any.
  std::vector<WindowLayer*> windows;
  std::vector<QuantizedLayer*> quantized;
  bool paged_window = false;
  for (int l = 0; l < cache.num_layers(); ++l) {
    const std::string& t = types[static_cast<size_t>(l)];
    if (t == "full_attention") continue;
    const std::string name =
        cache.is_shared(l) ? t : std::string(cache.layer(cache.source_layer(l)).name());
    if (t == "sliding_attention" || t == "chunked_attention") {
      if (cache.is_shared(l)) continue;  // reads its source layer, which is checked itself
      CacheLayer& layer = cache.layer(l);
      // Windows evict the keys a rollback returns to: each keeps those of the last `rollback`
      // positions' queries (bounded, unlike past recording, so static storage can be sized).
      if (auto* w = dynamic_cast<WindowLayer*>(&layer)) {
        windows.push_back(w);
        continue;
      }
      if (auto* q = dynamic_cast<QuantizedLayer*>(&layer)) {
        quantized.push_back(q);
        continue;
      }
      if (dynamic_cast<PagedLayer*>(&layer) != nullptr && session.paged_store() != nullptr) {
        paged_window = true;
        continue;
      }
      throw Error(ErrorKind::kUnsupported,
                  "speculative decoding: the " + what + " cache's layer " + std::to_string(l) +
                      " (" + name +
                      ") cannot keep the keys a rollback of rejected drafts returns to; use "
                      "--cache dynamic, static, quantized or paged for this model, or drop --spec");
    }
    throw Error(ErrorKind::kUnsupported,
                "speculative decoding: the " + what + " cache's layer " + std::to_string(l) + " (" +
                    name +
                    ") cannot crop back over the tokens it just wrote (its state keeps no "
                    "per-token history to roll rejected drafts back); only full, sliding and "
                    "chunked attention layers can: drop --spec for this model");
  }
  for (WindowLayer* w : windows) w->reserve_rollback(rollback);
  for (QuantizedLayer* q : quantized) q->reserve_rollback(rollback);
  if (paged_window) session.paged_store()->set_rollback_tokens(rollback);
}

GenerateStats generate_speculative(Session& target, Session* draft, std::span<const int32_t> prompt,
                                   const GenerateParams& params, const SpecParams& spec,
                                   const std::function<void(int32_t)>& on_token,
                                   std::vector<int32_t>* generated, SpecStats* spec_stats) {
  if (prompt.empty())
    throw Error(ErrorKind::kInvalidArgument, "generate: the prompt has no tokens (BOS at least)");
  if (params.max_new_tokens < 0)
    throw Error(ErrorKind::kInvalidArgument, "generate: -n must be >= 0");
  if (params.verify)
    throw Error(ErrorKind::kInvalidArgument,
                "--verify audits one decoded token per step; speculative decoding verifies "
                "several per forward: drop --verify or --spec");
  if (spec.k < 1)
    throw Error(ErrorKind::kInvalidArgument,
                "--spec-k must be >= 1, got " + std::to_string(spec.k));
  if (spec.mode == SpecMode::kNgram && spec.ngram < 1)
    throw Error(ErrorKind::kInvalidArgument,
                "--spec-ngram must be >= 1, got " + std::to_string(spec.ngram));
  if (spec.k + 1 > target.config().prefill_chunk)
    throw Error(ErrorKind::kInvalidArgument,
                "--spec-k " + std::to_string(spec.k) + " verifies " + std::to_string(spec.k + 1) +
                    " tokens per forward, more than the prefill chunk (" +
                    std::to_string(target.config().prefill_chunk) +
                    " tokens, --chunk) the forward is sized for; lower --spec-k or raise --chunk");
  if ((spec.mode == SpecMode::kDraft) != (draft != nullptr))
    throw Error(ErrorKind::kInvalidArgument,
                "speculative decoding: a draft session goes with --spec draft, and only with it");
  const int64_t vocab = target.model().config().vocab_size;
  if (draft != nullptr && draft->model().config().vocab_size != vocab)
    throw Error(ErrorKind::kInvalidArgument,
                "--draft-model: its vocabulary has " +
                    std::to_string(draft->model().config().vocab_size) + " tokens, the target's " +
                    std::to_string(vocab) + "; a draft model must share the target's vocabulary");
  // The target rolls back at most the k drafts of one verification, the draft at most k - 1.
  prepare_speculative_cache(target, "target", spec.k);
  if (draft != nullptr) prepare_speculative_cache(*draft, "draft", spec.k);

  GenerateStats st;
  SpecStats ss;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  const bool greedy = params.sampler.temperature <= 0.0f;
  Sampler sampler(params.sampler, vocab);
  // The draft's own generator, so that the target's coins do not depend on what it drew.
  SamplerParams dparams = params.sampler;
  dparams.seed = params.sampler.seed ^ 0x9e3779b97f4a7c15ull;
  Sampler dsampler(dparams, vocab);
  // The coins of the rejection rule and the draft's draws: streams of their own.
  Pcg32 rng(params.sampler.seed, 0x2545f4914f6cdd1dull), drng(dparams.seed, 0x2545f4914f6cdd1dull);

  std::vector<int32_t> seq;  // everything the target holds
  seq.reserve(params.history.size() + prompt.size() + static_cast<size_t>(params.max_new_tokens) +
              static_cast<size_t>(spec.k) + 1);
  seq.assign(params.history.begin(), params.history.end());
  seq.insert(seq.end(), prompt.begin(), prompt.end());
  std::vector<int32_t> dseq;  // everything the draft holds: always a prefix of seq + [last]
  if (draft != nullptr) {
    if (draft->position() != target.position())
      throw Error(ErrorKind::kInvalidArgument, "speculative decoding: the draft session holds " +
                                                   std::to_string(draft->position()) +
                                                   " tokens, the target " +
                                                   std::to_string(target.position()));
    dseq = params.history;
  }
  const int64_t draft_ctx = draft != nullptr ? draft->model().config().max_seq_len : 0;
  // The whole generation and one verification's drafts, reserved up front (Session::reserve).
  const int64_t total = static_cast<int64_t>(prompt.size()) + params.max_new_tokens + spec.k;
  target.reserve(target.position() + total);
  if (draft != nullptr) draft->reserve(draft->position() + total);

  const auto t0 = Clock::now();
  std::span<const float> logits = target.prefill(prompt);
  st.prefill_seconds = seconds_since(t0);
  if (draft != nullptr) {
    // The draft reads the prompt too: a one-time cost like the target's prefill, counted in
    // neither the prefill nor the decode time.
    if (static_cast<int64_t>(seq.size()) > draft_ctx)
      throw Error(ErrorKind::kInvalidArgument,
                  "--draft-model: the prompt has " + std::to_string(seq.size()) +
                      " tokens, more than the draft model's context (" + std::to_string(draft_ctx) +
                      ")");
    draft->prefill(prompt);
    dseq.insert(dseq.end(), prompt.begin(), prompt.end());
  }

  const auto t1 = Clock::now();
  bool done = false;
  // emit(): the stop and streaming rules of generate(); false once generation ends.
  auto emit = [&](int32_t id) {
    ++st.new_tokens;
    if (generated != nullptr) generated->push_back(id);
    if (!params.ignore_eos &&
        std::find(params.stop_ids.begin(), params.stop_ids.end(), id) != params.stop_ids.end()) {
      st.stopped = true;
      return false;
    }
    if (on_token) on_token(id);
    return st.new_tokens < params.max_new_tokens;
  };
  int32_t last = -1;
  if (params.max_new_tokens > 0) {
    last = sampler.sample(logits, seq);
    done = !emit(last);
  } else {
    done = true;
  }

  std::vector<int32_t> drafts;
  std::vector<std::vector<float>> q;  // draft mode, sampling: the draft's distribution per draft
  std::vector<float> p, scratch;
  std::vector<int32_t> batch, hist;
  while (!done) {
    // At most the tokens still wanted minus the one the target adds itself.
    const int64_t room = params.max_new_tokens - st.new_tokens - 1;
    int64_t m = std::min(spec.k, room);
    drafts.clear();
    if (spec.mode == SpecMode::kNgram) {
      seq.push_back(last);
      drafts = ngram_propose(seq, spec.ngram, m);
      seq.pop_back();
    } else {
      // The draft feeds what it lacks of seq + [last], then its own drafts but the last.
      const int64_t need = static_cast<int64_t>(seq.size()) + 1;
      m = std::min(m, draft_ctx - need + 1);
      if (m > 0) {
        std::vector<int32_t> feed(seq.begin() + static_cast<std::ptrdiff_t>(dseq.size()),
                                  seq.end());
        feed.push_back(last);
        std::span<const float> dl = draft->prefill(feed);
        ++ss.draft_forwards;
        dseq.insert(dseq.end(), feed.begin(), feed.end());
        if (q.size() < static_cast<size_t>(m)) q.resize(static_cast<size_t>(m));
        for (int64_t i = 0; i < m; ++i) {
          int32_t d;
          if (greedy) {
            d = dsampler.sample(dl, dseq);
          } else {
            dsampler.probabilities(dl, dseq, q[static_cast<size_t>(i)]);
            d = draw_from(q[static_cast<size_t>(i)], drng);
          }
          drafts.push_back(d);
          if (i + 1 < m) {
            dl = draft->decode(d);
            ++ss.draft_forwards;
            dseq.push_back(d);
          }
        }
      }
    }
    const auto nd = static_cast<int64_t>(drafts.size());

    // One target forward over [last, drafts...]: row i predicts the token after batch[i].
    batch.assign(1, last);
    batch.insert(batch.end(), drafts.begin(), drafts.end());
    const std::span<const float> rows = target.forward_all(batch, /*batch_invariant=*/true);
    ++ss.target_forwards;
    ss.drafted += nd;
    hist = seq;
    hist.push_back(last);
    int64_t accepted = 0;
    int32_t next = -1;
    for (int64_t i = 0; i <= nd; ++i) {
      const auto row = rows.subspan(static_cast<size_t>(i * vocab), static_cast<size_t>(vocab));
      if (i == nd) {  // every draft accepted: the target's own next token
        next = sampler.sample(row, hist);
        break;
      }
      const int32_t d = drafts[static_cast<size_t>(i)];
      if (greedy) {
        next = sampler.sample(row, hist);  // the argmax plain decoding would take
        if (next != d) break;
      } else {
        sampler.probabilities(row, hist, p);
        const std::span<const float> qi = spec.mode == SpecMode::kDraft
                                              ? std::span<const float>(q[static_cast<size_t>(i)])
                                              : std::span<const float>();
        const SpecDecision dec = speculative_accept(p, qi, d, rng, scratch);
        if (!dec.accepted) {
          next = dec.token;
          break;
        }
      }
      ++accepted;
      hist.push_back(d);
    }
    ss.accepted += accepted;
    // The target holds seq + [last] + drafts; keep seq + [last] + the accepted drafts.
    target.rollback(nd - accepted);
    seq.push_back(last);
    seq.insert(seq.end(), drafts.begin(), drafts.begin() + accepted);
    if (draft != nullptr && nd > 0) {
      // The draft holds seq_before + [last] + drafts[0, nd - 1): keep what the target kept.
      const int64_t keep = std::min(accepted, nd - 1);
      draft->rollback(nd - 1 - keep);
      dseq.resize(dseq.size() - static_cast<size_t>(nd - 1 - keep));
    }
    for (int64_t i = 0; i < accepted && !done; ++i) done = !emit(drafts[static_cast<size_t>(i)]);
    if (!done) done = !emit(next);
    last = next;
  }
  st.decode_seconds = seconds_since(t1);
  // A stop token among the accepted drafts ends the output before what the target holds: keep
  // what plain decoding would (the prompt and every generated token but the last), so that a
  // session saved now holds the same tokens.
  const int64_t held = static_cast<int64_t>(params.history.size() + prompt.size()) +
                       std::max<int64_t>(0, st.new_tokens - 1);
  if (target.position() > held) target.rollback(target.position() - held);
  st.kv_bytes = target.kv_bytes();
  if (spec_stats != nullptr) *spec_stats = ss;
  return st;
}

}  // namespace kvcache
