// Generation with an encoder-decoder model (T5, model/t5.h): the encoder runs once over the
// input ids, filling the EncoderDecoderCache's cross-attention K/V; the decoder starts from
// decoder_start_token_id and feeds each sampled token back through the self-attention cache
// (any container the registry builds). --verify compares every step's logits with a no-cache
// recompute: the encoder again and the whole decoder prefix in one call through a fresh
// "recompute" cache.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "model/t5.h"
#include "runtime/sampler.h"

namespace kvcache {

struct T5GenerateParams {
  std::vector<int32_t> encoder_ids;  // one row
  int64_t max_new_tokens = 32;
  SamplerParams sampler;
  bool ignore_eos = false;
  bool verify = false;
  double verify_tolerance = 0.0;  // 0: verify_tolerance_for(kv dtype)
  CacheOptions cache;             // the self-attention cache (max_cache_len 0: max_new_tokens)
};

struct T5GenerateStats {
  std::vector<int32_t> tokens;  // generated, decoder_start_token_id not included
  bool stopped = false;         // sampled eos_token_id (not included in tokens)
  double encode_ms = 0.0, decode_ms = 0.0;
  size_t self_bytes = 0, cross_bytes = 0;  // the EncoderDecoderCache at the end
  double verify_max_rel_diff = 0.0;
  double verify_tolerance = 0.0;
  int64_t verify_failures = 0;
};

// Error(kInvalidArgument) for an empty encoder input, ids outside the vocabulary, or a
// non-positive max_new_tokens; whatever the cache throws.
T5GenerateStats generate_t5(const T5Model& model, const T5GenerateParams& params,
                            const std::function<void(int32_t)>& on_token = {});

}  // namespace kvcache
