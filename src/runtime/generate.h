// The generation loop: prefill the prompt in chunks, then sample and decode one token at a
// time until N new tokens or an end token. Optional audit (--verify): after every step the
// logits are compared with a no-cache full recompute of the sequence so far.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"

namespace kvcache {

struct GenerateParams {
  int64_t max_new_tokens = 256;  // llama.cpp's -n: new tokens, the prompt not counted
  SamplerParams sampler;
  std::vector<int32_t> stop_ids;  // end tokens: sampled -> stop (not fed back)
  bool ignore_eos = false;        // generate all max_new_tokens regardless of stop_ids
  bool verify = false;
  double verify_tolerance = 0.0;  // 0: verify_tolerance_for(kv dtype)
  // Tokens the session already holds before `prompt` (a restored session file, an earlier
  // turn): the sampler's repetition window and --verify's recompute see them too.
  std::vector<int32_t> history;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t new_tokens = 0;  // sampled, the stop token included
  bool stopped = false;    // ended on a stop token
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;       // decode forwards + sampling after the first token
  size_t kv_bytes = 0;               // the cache's resident bytes at the end
  double verify_max_rel_diff = 0.0;  // largest normwise relative logit difference (--verify)
  int64_t verify_failures = 0;       // steps past the tolerance
  double verify_tolerance = 0.0;

  double prefill_tps() const { return prefill_seconds > 0 ? prompt_tokens / prefill_seconds : 0.0; }
  double decode_tps() const;
};

// Normwise relative difference max_i |a_i - b_i| / max_i |b_i| (the --verify metric).
double max_rel_diff(std::span<const float> a, std::span<const float> b);

// Tolerance of --verify for a KV storage dtype: f32 1e-4 (only summation order differs: BLAS
// prefill vs GEMV decode, measured ~1e-6 on stories260K), f16 1e-2, bf16 5e-2 (the stored K/V
// are rounded to 11 and 8 significant bits).
double verify_tolerance_for(DType kv_dtype);

// Runs the loop. on_token(id) is called for every sampled token that is not a stop token, as
// soon as it is known (streaming). `generated`, if given, receives every sampled id, a final
// stop token included. The session must be empty (position 0) or continue a conversation.
GenerateStats generate(Session& session, std::span<const int32_t> prompt,
                       const GenerateParams& params, const std::function<void(int32_t)>& on_token,
                       std::vector<int32_t>* generated = nullptr);

}  // namespace kvcache
