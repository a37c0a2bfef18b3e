#include "runtime/t5_generate.h"

#include <chrono>

#include "core/error.h"
#include "runtime/generate.h"

namespace kvcache {

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

T5GenerateStats generate_t5(const T5Model& model, const T5GenerateParams& p,
                            const std::function<void(int32_t)>& on_token) {
  const T5Config& c = model.config();
  if (p.encoder_ids.empty())
    throw Error(ErrorKind::kInvalidArgument,
                "an encoder-decoder model needs encoder input ids (generate --encoder-ids)");
  if (p.max_new_tokens <= 0)
    throw Error(ErrorKind::kInvalidArgument, "-n must be at least 1 for an encoder-decoder model");
  validate_sampler_params(p.sampler);
  CacheOptions co = p.cache;
  // Decoder tokens fed: the start token and every generated token but the last.
  if (co.max_cache_len == 0) co.max_cache_len = p.max_new_tokens;
  if (co.max_batch_size == 0) co.max_batch_size = 1;
  T5GenerateStats st;
  st.verify_tolerance = p.verify_tolerance > 0
                            ? p.verify_tolerance
                            : verify_tolerance_for(co.kv_dtype.value_or(DType::kF32));
  EncoderDecoderCache cache(t5_cache_config(c, co));
  T5Runner run(model), ref(model);
  const int64_t S_enc = static_cast<int64_t>(p.encoder_ids.size());
  auto t0 = std::chrono::steady_clock::now();
  run.encode(p.encoder_ids.data(), 1, S_enc, cache);
  st.encode_ms = ms_since(t0);
  Sampler sampler(p.sampler, c.vocab_size);
  std::vector<int32_t> fed = {c.decoder_start_token_id};
  double decode_ms = 0;
  for (int64_t step = 0; step < p.max_new_tokens; ++step) {
    t0 = std::chrono::steady_clock::now();
    const std::span<const float> logits = run.decode(&fed.back(), 1, 1, step, cache, false);
    decode_ms += ms_since(t0);
    if (p.verify) {
      const std::vector<float> got(logits.begin(), logits.end());
      EncoderDecoderCache fresh(t5_cache_config(c, CacheOptions{.implementation = "recompute"}));
      ref.encode(p.encoder_ids.data(), 1, S_enc, fresh);
      const std::span<const float> want =
          ref.decode(fed.data(), 1, static_cast<int64_t>(fed.size()), 0, fresh, false);
      const double d = max_rel_diff(got, want);
      st.verify_max_rel_diff = std::max(st.verify_max_rel_diff, d);
      if (d > st.verify_tolerance) ++st.verify_failures;
    }
    const int32_t id = sampler.sample(logits, st.tokens);
    if (id == c.eos_token_id && !p.ignore_eos) {
      st.stopped = true;
      break;
    }
    st.tokens.push_back(id);
    if (on_token) on_token(id);
    if (step + 1 < p.max_new_tokens) fed.push_back(id);
  }
  st.decode_ms = decode_ms;
  st.self_bytes = cache.self_bytes();
  st.cross_bytes = cache.cross_bytes();
  return st;
}

}  // namespace kvcache
