// EvictingLayer: a dense full-attention container under a lossy KVPolicy (cache/kv_policy.h:
// StreamingLLM, H2O, SnapKV). It is the "dynamic" or "static" container plus eviction:
// registered in PolicyLayerRegistry under both names, the Cache builds it for full_attention
// layers when the options carry a lossy policy. Never exact: its name says which policy it runs
// ("dynamic/full_attention+streaming:sink=4,window=256").
//   dynamic: the storage grows x2 from max(16, first n) slots up to what the policy keeps plus
//            the largest step, then stays (flat memory under StreamingLLM and H2O).
//   static:  max_cache_len slots allocated at the first update and never reallocated (a stable
//            address); a step whose kept + new tokens exceed them is refused before anything
//            changes (kOutOfRange), as StaticLayer refuses a full cache.
//
// Eviction happens between steps, at the start of the next update(), before the new tokens are
// appended: the span the previous update() returned stays valid until then (the CacheLayer
// contract), and the kernels need no new mask. The kept keys stay where they are, with the RoPE
// of their original positions already applied; the span is [B, H_kv, kept + n, D] with the n new
// tokens last and kv_offset = seq_length() - (kept + n), so the kernel's causal mask over the
// implied positions still lets every new query see every kept key and the new keys up to itself
// (AttentionKernel::attend's check_positions holds: the span ends at the queries' end).
//
// Each (batch row, KV head) plane keeps its own tokens (H2O and SnapKV choose per head), but
// every plane keeps the same number, so the span stays one dense tensor. Evicting fills the
// holes with the kept tokens from the end of the plane: O(evicted) bytes moved per step rather
// than O(kept) for an order-preserving compaction. Attention is a sum over keys, so the order of
// the old keys changes only the rounding of the result; while nothing is evicted nothing moves
// and the layer is bit-identical to the dynamic container.
//
// What each policy keeps of the old tokens at an update of n new ones:
//   streaming  the first `sink` positions and the most recent max(window - n, 0) others, so a
//              decode query sees sink + window keys, itself included (StreamingLLM's reference
//              evicts "for space" before appending the incoming tokens:
//              mit-han-lab/streaming-llm, streaming_llm/kv_cache.py, evict_for_space).
//   h2o        the `recent` most recent and, of the others, the `heavy` with the largest
//              accumulated attention; a decode query then sees heavy + recent + 1 keys (H2O
//              reduces the cache to heavy + recent after each step's attention:
//              FMInference/H2O, h2o_hf/utils_real_drop/modify_llama.py, H2OKVCache_LayerWise).
//              A key's score is the sum of the probabilities it received from every query since
//              it entered, over the query heads of its KV group (GQA).
//   snapkv     once, at the first single-token update after a prefill (a multi-token update):
//              the last `window` prompt tokens plus the budget - window others with the highest
//              pooled score, the sum of the probabilities from the window's queries over the
//              query heads of the group, averaged over `kernel` neighbouring keys with zero
//              padding (FasterDecoding/SnapKV, snapkv/monkeypatch/snapkv_utils.py,
//              SnapKVCluster.update_kv: avg_pool1d, padding kernel // 2). Decode then appends.
// Ties go to the earlier position. RoPE deviates from StreamingLLM's paper, which re-rotates
// the kept keys to positions within the cache: keys here keep their original positions (the
// brief of issue 43: pre-rotated keys, no second rotation).
//
// H2O and SnapKV need the probabilities: observe_queries() recomputes them with the "eager"
// kernel (the only one filling AttentionOptions::weights_out) over the span of the step, in
// chunks of queries to bound the scratch. That doubles the attention work of a step for H2O
// (SnapKV: once, for its window); the model's own kernel stays whatever was chosen. A step
// whose queries were not observed makes the next update() fail for these two policies: they
// cannot choose without scores, and choosing by zeros would pass for a policy it is not.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cache/dense_layer.h"
#include "cache/kv_policy.h"
#include "kernels/attention.h"

namespace kvcache {

class EvictingLayer final : public DenseLayer {
 public:
  static constexpr int64_t kMinCapacity = 16;  // first allocation at least this

  // Error(kInvalidArgument / kUnsupported) for an exact or invalid policy, or K/V that are not
  // per-head (MLA latents, shared K == V): the scores need per-head queries and keys.
  // static (params.fixed_storage): max_cache_len > 0 slots; dynamic: max_cache_len unused.
  EvictingLayer(DenseLayerParams params, const KVPolicy& policy, CacheConfig::KVContent content,
                int64_t max_cache_len = 0);

  // Evicts (see above), appends k, v and returns [B, H_kv, kept + n, D] views of the storage.
  KVSpan update(const TensorView& k, const TensorView& v) override;
  MaskSizes mask_sizes(int64_t query_len) const override;
  int64_t seq_length() const override { return seq_length_; }
  int64_t max_length() const override { return params_.fixed_storage ? max_cache_len_ : -1; }
  // Allowed only while nothing was evicted nor scored (a lossy cache cannot bring back what it
  // dropped): Error(kUnsupported) otherwise.
  void crop(int64_t n) override;
  void reset() override;
  void reorder(std::span<const int64_t> beam_idx) override;
  void repeat_interleave(int64_t r) override;
  void select(std::span<const int64_t> indices) override;
  // Error(kUnsupported): past recording keeps every token, which an evicting layer does not.
  void activate_past_recording() override;
  bool wants_queries() const override { return policy_.needs_queries(); }
  void observe_queries(const TensorView& q, const AttentionOptions& options) override;
  // Storage, workspace, and the per-token positions and scores (their vectors' capacity).
  size_t bytes() const override;
  // Error(kUnsupported): the positions and scores are not part of the session format.
  void save(StateWriter& out) const override;
  void load(StateReader& in) override;

  const KVPolicy& policy() const { return policy_; }
  // Original positions of the tokens plane (b, h) holds, ascending.
  std::vector<int64_t> kept_positions(int64_t b, int64_t h) const;
  // Accumulated score of the token at `position` in plane (b, h) (H2O), or -1 if not held.
  float score_of(int64_t b, int64_t h, int64_t position) const;
  // Tokens evicted so far per plane.
  int64_t evicted_tokens() const { return evicted_; }

 private:
  // Per (batch row, KV head): the original position and the accumulated score of each slot.
  struct Plane {
    std::vector<int64_t> pos;
    std::vector<float> score;
  };
  int64_t restore_capacity(const SavedPosition& p) const override;
  // How many old tokens each plane keeps before an update of n tokens.
  int64_t kept_before(int64_t n) const;
  // Chooses what each plane keeps for an update of n tokens and compacts the planes.
  void evict(int64_t n);
  // Keeps, in plane p, the slots flagged in keep (exactly `count` of them) at slots [0, count).
  void compact_plane(size_t p, const std::vector<char>& keep, int64_t count);
  // Probabilities of the queries q [B, H_q, m, D] at positions [q_pos0, q_pos0 + m) over the
  // stored keys, summed over the queries and the query heads of each KV group, added to
  // out[(b * H_kv + h) * stored + slot] (zero-initialised by the caller).
  void attention_mass(const TensorView& q, int64_t q_pos0, std::vector<float>& out) const;
  void snapkv_compress();
  void gather_meta(std::span<const int64_t> rows);

  KVPolicy policy_;
  int64_t max_cache_len_ = 0;  // static: the fixed capacity in tokens
  int64_t seq_length_ = 0;
  int64_t evicted_ = 0;
  bool observed_ = true;       // the last update's queries were observed (H2O, SnapKV)
  bool scored_ = false;        // scores hold some attention (crop would leave them inconsistent)
  bool prefilled_ = false;     // SnapKV: a multi-token update happened
  bool compressed_ = false;    // SnapKV: the prompt was compressed (or the chance has passed)
  std::vector<Plane> planes_;  // [B * H_kv]
  // SnapKV's observation window: the latest queries [B, H_q, obs_len_, D_k] f32, oldest first,
  // and the options they were attended with.
  std::vector<float> obs_q_;
  int64_t obs_len_ = 0, obs_heads_ = 0, obs_dim_ = 0;
  AttentionOptions obs_options_;
};

}  // namespace kvcache
