#include "runtime/generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"

namespace kvcache {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}
}  // namespace

double GenerateStats::decode_tps() const {
  // The first new token comes from the prefill's logits; every later one costs a decode.
  const int64_t decodes = std::max<int64_t>(0, new_tokens - 1);
  return decode_seconds > 0 ? decodes / decode_seconds : 0.0;
}

double max_rel_diff(std::span<const float> a, std::span<const float> b) {
  KV_CHECK(a.size() == b.size(), "max_rel_diff: sizes differ");
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return den > 0 ? num / den : num;
}

double verify_tolerance_for(DType kv_dtype) {
  switch (kv_dtype) {
    case DType::kF32:
      return 1e-4;
    case DType::kF16:
      return 1e-2;
    case DType::kBF16:
      return 5e-2;
    default:
      return 1e-1;
  }
}

GenerateStats generate(Session& session, std::span<const int32_t> prompt,
                       const GenerateParams& params, const std::function<void(int32_t)>& on_token,
                       std::vector<int32_t>* generated) {
  if (prompt.empty()) {
    throw Error(ErrorKind::kInvalidArgument, "generate: the prompt has no tokens (BOS at least)");
  }
  if (params.max_new_tokens < 0)
    throw Error(ErrorKind::kInvalidArgument, "generate: -n must be >= 0");
  GenerateStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  const int64_t vocab = session.model().config().vocab_size;
  Sampler sampler(params.sampler, vocab);

  std::vector<int32_t> seq;  // everything fed so far
  seq.reserve(params.history.size() + prompt.size() + static_cast<size_t>(params.max_new_tokens));
  session.reserve(session.position() + static_cast<int64_t>(prompt.size()) + params.max_new_tokens);
  seq.assign(params.history.begin(), params.history.end());
  seq.insert(seq.end(), prompt.begin(), prompt.end());
  std::unique_ptr<Forward> oracle;
  if (params.verify) {
    oracle = std::make_unique<Forward>(session.model(), session.config().kernel,
                                       static_cast<int64_t>(seq.capacity()));
    const DType kv_dtype = session.config().cache.kv_dtype.value_or(DType::kF32);
    st.verify_tolerance =
        params.verify_tolerance > 0 ? params.verify_tolerance : verify_tolerance_for(kv_dtype);
  }
  double verify_seconds = 0.0;  // kept out of the decode speed
  auto check = [&](std::span<const float> logits) {
    if (!oracle) return;
    const auto tv = Clock::now();
    std::span<const float> want = recompute_last_logits(*oracle, seq);
    const double d = max_rel_diff(logits, want);
    st.verify_max_rel_diff = std::max(st.verify_max_rel_diff, d);
    if (d > st.verify_tolerance) ++st.verify_failures;
    verify_seconds += seconds_since(tv);
  };

  const auto t0 = Clock::now();
  std::span<const float> logits = session.prefill(prompt);
  st.prefill_seconds = seconds_since(t0);
  check(logits);
  verify_seconds = 0.0;

  const auto t1 = Clock::now();
  for (int64_t i = 0; i < params.max_new_tokens; ++i) {
    const int32_t next = sampler.sample(logits, seq);
    ++st.new_tokens;
    if (generated != nullptr) generated->push_back(next);
    if (!params.ignore_eos &&
        std::find(params.stop_ids.begin(), params.stop_ids.end(), next) != params.stop_ids.end()) {
      st.stopped = true;
      break;
    }
    if (on_token) on_token(next);
    if (i + 1 == params.max_new_tokens) break;  // the last sampled token is never fed
    seq.push_back(next);
    logits = session.decode(next);
    check(logits);
  }
  st.decode_seconds = seconds_since(t1) - verify_seconds;
  st.kv_bytes = session.kv_bytes();
  return st;
}

}  // namespace kvcache
