// The paged cache's memory planner: from a byte budget and the model config, how many blocks
// the pool gets and how many tokens one forward step may carry — predicted before anything is
// allocated, so that serving never runs out of memory by surprise (transformers'
// PagedAttentionMemoryHandler: activation_peak, then infer_max_batch_tokens_and_num_blocks,
// per the KV cache notes' paged section). The prediction is exact: a store built from
// plan.store has pool_bytes() == plan.pool_bytes, and a Forward reserved for
// plan.max_tokens_per_step rows has workspace_bytes() == plan.activation_bytes (tested).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/paged_store.h"
#include "core/dtype.h"
#include "model/model_file.h"

namespace kvcache {

struct PagedPlanOptions {
  uint64_t budget_bytes = 0;  // 0: no budget, size for max_cached_tokens
  int64_t block_tokens = 16;
  DType kv_dtype = DType::kF16;
  // Upper bound on tokens per forward (batch x chunk); with a budget it is halved until the
  // activations take at most half of it.
  int64_t max_tokens_per_step = 512;
  int64_t max_cached_tokens = 0;  // without a budget: tokens the pool must hold (> 0)
  // Empty: the model's layer types and window.
  std::vector<std::string> layer_types;
  int64_t sliding_window = 0;
  int n_threads = 0;  // attention scratch per thread; 0: the default pool's
  // Bill the eager paged kernel's per-thread f32 copy of a sequence's K/V (attention_scratch_
  // bytes). False when the kernel reads the pages in place: "fused", and quantized pages (the
  // quantized kernel widens codes in registers), whose workspaces do not grow with the cache.
  bool eager_scratch = true;
  // Hybrid models (linear_attention layers): the state shape (CacheConfig::linear), the
  // sequences holding state at once (one slot each: the engine's max_running, a session's 1)
  // and the snapshot policy (PagedOptions). Billed: slots (+ workspaces) and the snapshots.
  LinearStateShape linear = {};
  int32_t linear_slots = 1;
  int32_t snapshot_every_blocks = 4;
  int32_t max_snapshots = 0;
  // DeepSeek-V4 / V3.2 (CacheConfig::compressed, kv_content == kSharedKV): compressed groups
  // (entry blocks per rate), indexer pages, K-only pages; the compressors' state is billed per
  // slot with the linear state (linear_slots sequences).
  CompressedShape compressed = {};
  bool shared_kv = false;  // K==V layers (CacheConfig::KVContent::kSharedKV): K pages only
  // Quantized pages (PagedOptions::quant): blocks billed at their packed bytes, plus each
  // running sequence's residual in kv_dtype.
  std::optional<PagedQuantFormat> quant;
  // Sequences may stream (PagedStoreConfig::streaming): each full group's block 0 is its null
  // block, so it holds one block fewer.
  bool streaming = false;
};

struct PagedMemoryPlan {
  PagedStoreConfig store;  // what to build (group_blocks, shapes, dtype)
  int64_t max_tokens_per_step = 0;
  size_t activation_bytes = 0;  // Forward workspaces for max_tokens_per_step rows
  // The eager paged kernel widens one sequence's keys and values to f32 per thread: at most
  // n_threads x cached tokens x (D_k + D_v + 1) floats.
  size_t attention_scratch_bytes = 0;
  size_t pool_bytes = 0;  // pages + pool metadata of the store
  // Tokens the full-attention group can hold (compressed models without one: the tokens the
  // compressed groups' entries cover, running sequences' partial blocks set aside).
  int64_t max_cached_tokens = 0;
  // Hybrid models: one sequence's state (every linear layer), constant per running sequence;
  // the slots of every running sequence plus the store's workspaces; the snapshot arena.
  size_t linear_bytes_per_sequence = 0;
  size_t linear_state_bytes = 0;
  size_t snapshot_bytes = 0;
  // Quantized pages: every running sequence's residual slot and the step workspaces of every
  // layer (the store's quant_state_bytes(), exactly).
  size_t quant_state_bytes = 0;
  size_t total_bytes() const {
    return activation_bytes + attention_scratch_bytes + pool_bytes + linear_state_bytes +
           snapshot_bytes + quant_state_bytes;
  }
};

// Throws Error(kInvalidArgument) when the budget cannot hold one step and two blocks, or the
// options are inconsistent.
PagedMemoryPlan plan_paged_memory(const ModelConfig& model, const PagedPlanOptions& options);

}  // namespace kvcache
