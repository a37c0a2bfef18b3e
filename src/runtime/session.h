// Session: one sequence running through a Model with a KV cache built from the model's
// layer types (`--cache` picks the container family, transformers' cache_implementation
// names). Owns the Cache and the forward workspaces; tracks the position. Prefill feeds many
// tokens per forward (chunked), decode one; both return next-token logits.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "cache/cache.h"
#include "cache/paged_store.h"
#include "core/dtype.h"
#include "model/forward.h"

namespace kvcache {

struct SessionConfig {
  // The cache over the model's layers (cache.implementation: "dynamic", "static", "paged",
  // ...). A session holds one sequence and resolves what the options leave open from the model:
  // max_cache_len 0 is the model's context, an unset kv_dtype is f32 (the activations' dtype),
  // max_batch_size is 1 (0 or 1 accepted). "paged": the session builds the store from the
  // memory plan (paged.store must stay unset).
  CacheOptions cache;
  std::string kernel = "fused";  // attention kernel name
  int64_t prefill_chunk = 512;   // tokens per forward during prefill
  // > 0: force every layer to "sliding_attention" with this window (tests/demos showing that
  // a window covering the whole sequence changes nothing).
  int64_t sliding_window_override = 0;
  // "paged": the byte budget the memory planner splits between the block pool and the
  // forward's activations (0: blocks for cache.max_cache_len tokens).
  uint64_t kv_budget_bytes = 0;
};

class Session {
 public:
  Session(const Model& model, const SessionConfig& config);

  // Feeds ids at the current position; returns the next-token logits after the last one
  // ([vocab], valid until the next call). ids must be non-empty.
  std::span<const float> prefill(std::span<const int32_t> ids);
  std::span<const float> decode(int32_t id) { return prefill({&id, 1}); }
  // Feeds ids in one forward and returns the logits of every position: [ids.size(), vocab].
  // batch_invariant: each row's logits are the bits a one-token decode of it would give (the
  // linears never take the BLAS GEMM path; ForwardParams::batch_invariant), as speculative
  // verification needs.
  std::span<const float> forward_all(std::span<const int32_t> ids, bool batch_invariant = false);
  // Removes the last n tokens (Cache::crop(-n)) and moves the position back by n: speculative
  // decoding's rollback of rejected drafts. Throws Error(kInvalidArgument) unless
  // 0 <= n <= position().
  void rollback(int64_t n);

  int64_t position() const { return pos_; }
  // Room for `tokens` tokens in all (at most the cache's max_cache_len) without reallocating
  // (Cache::reserve; growing containers only): generate reserves its prompt and -n up front, so
  // that a dynamic cache does not double, copying every layer's K/V, inside a decode step.
  void reserve(int64_t tokens);
  // Forget the sequence, keep the memory. A paged cache releases its blocks tail first; full
  // blocks stay in the prefix index until their memory is needed again.
  void reset();
  // Paged caches at position 0: takes the longest cached prefix of `prompt` (full blocks, at
  // least the last token left to compute) and moves the position past it; returns its length.
  // The caller then prefills prompt[returned ..]. Other caches: 0.
  int64_t reuse_prefix(std::span<const int32_t> prompt);
  // The paged store (nullptr for dense caches).
  PagedKVStore* paged_store() const { return paged_.get(); }
  Cache& cache() { return *cache_; }
  const Cache& cache() const { return *cache_; }
  // Session files (runtime/session_file.h): after Cache::load restored `position` tokens into
  // this session's cache, the session continues from there. Dense caches only (Error for a
  // paged one); `position` must equal the cache's seq_length().
  void restored(int64_t position);
  size_t kv_bytes() const { return cache_->bytes(); }
  const Model& model() const { return model_; }
  const SessionConfig& config() const { return config_; }

 private:
  const Model& model_;
  SessionConfig config_;
  void ensure_sequence();

  std::shared_ptr<PagedKVStore> paged_;  // "paged": shared with every layer of cache_
  SeqId seq_ = -1;                       // "paged": this session's sequence
  std::unique_ptr<Cache> cache_;
  Forward forward_;
  int64_t pos_ = 0;
};

// The cache config a session builds for `model` (exposed for tools and tests).
CacheConfig make_cache_config(const ModelConfig& model, const SessionConfig& config);

// Logits of the last position after running `ids` from position 0 through the forward's
// recompute container (no tokens kept from earlier calls): the oracle of --verify and of the
// tests. `fwd` provides the workspaces.
std::span<const float> recompute_last_logits(Forward& fwd, std::span<const int32_t> ids);

}  // namespace kvcache
