// KVPolicy: which keys a full-attention cache keeps — all of them (exact) or a lossy eviction
// policy's choice — parsed from a spec string and named by a canonical key(). A plain value type
// the cache options carry (cache/cache.h CacheOptions::policy); the containers that honour a
// lossy policy live in cache/evicting_layer.h. key() is what a block key or a metrics label folds
// in, so that state computed under a lossy policy can never pass for exact state.
//
// Specs ("kind" alone takes the defaults below):
//   exact
//   streaming:sink=S,window=W          StreamingLLM (Xiao et al. 2023, "Efficient Streaming
//                                      Language Models with Attention Sinks"): the first S
//                                      tokens (attention sinks) plus the W most recent.
//   h2o:heavy=H,recent=R               H2O (Zhang et al. 2023, "H2O: Heavy-Hitter Oracle"): the R
//                                      most recent tokens plus the H others with the largest
//                                      attention accumulated over every query so far.
//   snapkv:budget=B,window=w,kernel=k  SnapKV (Li et al. 2024, "SnapKV: LLM Knows What You are
//                                      Looking for Before Generation"): at the end of prefill,
//                                      the prompt's last w tokens plus the B - w others with the
//                                      most attention from those w queries (pooled over k
//                                      neighbouring keys); decode then appends without evicting.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvcache {

enum class KVPolicyKind { kExact, kStreaming, kH2O, kSnapKV };

struct KVPolicy {
  KVPolicyKind kind = KVPolicyKind::kExact;
  // streaming: attention sinks and recent window, in tokens.
  int64_t sink = 4;
  int64_t window = 256;
  // h2o: heavy hitters and recent window kept between steps, per KV head.
  int64_t heavy = 128;
  int64_t recent = 128;
  // snapkv: prompt tokens kept per KV head (the observation window included), the observation
  // window (last prompt queries), and the width of the average pooling over keys (odd).
  int64_t budget = 256;
  int64_t obs_window = 32;
  int64_t kernel = 7;

  // Parses a spec (see above). Error(kInvalidArgument) saying what is wrong, where in the spec
  // and what would be accepted; the result is validated.
  static KVPolicy parse(std::string_view spec);

  bool exact() const { return kind == KVPolicyKind::kExact; }
  // H2O and SnapKV score keys by attention: the model must hand the layer each step's queries
  // (CacheLayer::observe_queries). StreamingLLM chooses by position alone.
  bool needs_queries() const { return kind == KVPolicyKind::kH2O || kind == KVPolicyKind::kSnapKV; }
  // "exact", "streaming", "h2o", "snapkv".
  std::string_view kind_name() const;
  // Canonical id: the kind and every parameter, in a fixed order ("streaming:sink=4,window=256";
  // "exact" for exact). Two policies behave alike exactly when their keys are equal.
  std::string key() const;
  // Error(kInvalidArgument) naming the parameter, its value and the accepted range.
  void validate() const;

  bool operator==(const KVPolicy& o) const { return key() == o.key(); }
};

}  // namespace kvcache
