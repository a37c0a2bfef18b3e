#include "model/paged_plan.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/forward.h"

namespace kvcache {

PagedMemoryPlan plan_paged_memory(const ModelConfig& model, const PagedPlanOptions& o) {
  if (o.block_tokens < 1) throw Error(ErrorKind::kInvalidArgument, "--block-tokens must be >= 1");
  if (o.max_tokens_per_step < 1)
    throw Error(ErrorKind::kInvalidArgument, "paged plan: max tokens per step must be >= 1");
  PagedMemoryPlan plan;
  PagedStoreConfig& sc = plan.store;
  sc.block_tokens = static_cast<int32_t>(o.block_tokens);
  sc.layer_types = o.layer_types.empty() ? model.layer_types : o.layer_types;
  sc.sliding_window = o.layer_types.empty() ? model.sliding_window : o.sliding_window;
  sc.dtype = o.kv_dtype;
  if (model.mla.enabled()) {
    // MLA: K pages hold the latent c_kv (one head of d_c), V pages the rotated key k_rot (one
    // head of d_r); see paged_store.h.
    sc.kv_heads = 1;
    sc.head_dim = model.mla.kv_lora_rank;
    sc.head_dim_v = model.mla.qk_rope_head_dim;
  } else {
    sc.kv_heads = model.n_kv_heads;
    sc.head_dim = model.head_dim;
    sc.head_dim_v = model.head_dim;
  }
  sc.num_kv_shared_layers = static_cast<int>(model.num_kv_shared_layers);
  sc.linear = o.linear;
  sc.linear_slots = o.linear_slots;
  sc.snapshot_every_blocks = o.snapshot_every_blocks;
  sc.max_snapshots = o.max_snapshots;
  sc.compressed = o.compressed;
  sc.shared_kv = o.shared_kv;
  sc.quant = o.quant;
  sc.streaming = o.streaming;
  if (o.quant && model.mla.enabled())
    throw Error(ErrorKind::kUnsupported,
                "paged plan: quantized pages hold per-head K/V, but this model uses MLA (a latent "
                "c_kv and a rotated key k_rot), for which the paged store defines no quantized "
                "format; use f16/f32 pages");
  check_paged_quant(sc);
  // Constant per running sequence and per snapshot: billed before any block.
  plan.linear_bytes_per_sequence = paged_linear_bytes_per_sequence(sc);
  plan.linear_state_bytes = predict_linear_state_bytes(sc);
  plan.snapshot_bytes = predict_snapshot_bytes(sc);
  const size_t state_bytes = plan.linear_state_bytes + plan.snapshot_bytes;
  const std::vector<PagedGroup> groups =
      paged_groups(sc.layer_types, sc.sliding_window, sc.compressed.rates);
  // Token groups get n blocks; a compressed group of rate r holds block_tokens entries
  // (r * block_tokens tokens) per block: n / r of them, plus one partial block per sequence.
  const auto assign_blocks = [&](int64_t n) {
    sc.group_blocks.clear();
    for (const PagedGroup& g : groups)
      sc.group_blocks.push_back(static_cast<int32_t>(
          std::min<int64_t>(g.kind == GroupKind::kCompressed
                                ? (n + g.rate - 1) / g.rate + std::max<int32_t>(1, sc.linear_slots)
                                : n,
                            INT32_MAX)));
  };
  const int n_threads = o.n_threads > 0 ? o.n_threads : default_pool().n_threads();
  // The eager paged kernel's per-thread f32 copy of one sequence's K and V (plus a score) per
  // token. MLA does not run it (it expands the latent into the forward's own buffers), so this
  // is an upper bound there.
  const size_t scratch_per_token =
      !o.eager_scratch ? 0
                       : static_cast<size_t>(n_threads) *
                             static_cast<size_t>(sc.head_dim + sc.head_dim_v + 1) * sizeof(float);

  plan.max_tokens_per_step = o.max_tokens_per_step;
  // A block no sequence can fill is memory nobody can use: with the default capacity, a
  // 100,000-token block for a 2,048-token context allocated 49x the cache it serves. (A
  // capacity that is not a whole number of blocks rounds up to one: a block's worth at most.)
  if (model.max_seq_len > 0 && o.block_tokens > model.max_seq_len)
    throw Error(ErrorKind::kInvalidArgument,
                "--block-tokens " + std::to_string(o.block_tokens) +
                    " is larger than the model's context of " + std::to_string(model.max_seq_len) +
                    " tokens: no sequence could fill a block; use at most " +
                    std::to_string(model.max_seq_len) + " (default 16)");
  if (o.budget_bytes == 0) {
    if (o.max_cached_tokens <= 0)
      throw Error(ErrorKind::kInvalidArgument,
                  "paged plan: give a byte budget or a token capacity");
    sc.max_tokens = o.max_cached_tokens;
    sc.group_blocks = default_group_blocks(sc);
  } else {
    const auto act = [&](int64_t rows) { return Forward::workspace_bytes_for(model, rows); };
    while (plan.max_tokens_per_step > 1 && act(plan.max_tokens_per_step) > o.budget_bytes / 2)
      plan.max_tokens_per_step /= 2;
    const size_t activations = act(plan.max_tokens_per_step);
    size_t per_block = scratch_per_token * static_cast<size_t>(o.block_tokens);
    for (const PagedGroup& g : groups)
      per_block += paged_block_bytes(sc, g) /
                   static_cast<size_t>(g.kind == GroupKind::kCompressed ? g.rate : 1);
    // Quantized pages: each running sequence's residual slot and the step workspaces, sized
    // for the step this plan allows (a decode step of every running sequence included).
    if (sc.quant) {
      sc.max_step_tokens = std::max<int64_t>(plan.max_tokens_per_step, sc.linear_slots);
      plan.quant_state_bytes = predict_quant_state_bytes(sc);
    }
    const size_t fixed = activations + state_bytes + plan.quant_state_bytes;
    const size_t left = o.budget_bytes > fixed ? o.budget_bytes - fixed : 0;
    // Every group gets the same block count (a sliding group's block 0 is its null block).
    auto blocks = static_cast<int64_t>(left / per_block);
    const auto fits = [&](int64_t n) {
      assign_blocks(n);
      return predict_pool_bytes(sc) + scratch_per_token * static_cast<size_t>(n * o.block_tokens) <=
             left;
    };
    while (blocks >= 2 && !fits(blocks)) --blocks;  // pool metadata: a few bytes per block
    if (blocks < 2)
      throw Error(ErrorKind::kInvalidArgument,
                  "paged plan: a budget of " + std::to_string(o.budget_bytes) +
                      " bytes cannot hold one forward step (" + std::to_string(activations) +
                      " bytes of activations), the linear-attention state (" +
                      std::to_string(plan.linear_state_bytes) + " bytes) and snapshots (" +
                      std::to_string(plan.snapshot_bytes) +
                      " bytes), the quantized pages' residuals and step workspaces (" +
                      std::to_string(plan.quant_state_bytes) + " bytes) and two blocks of " +
                      std::to_string(per_block) + " bytes; raise --kv-budget");
    assign_blocks(std::min<int64_t>(blocks, INT32_MAX));
  }
  if (sc.quant) {
    sc.max_step_tokens = std::max<int64_t>(plan.max_tokens_per_step, sc.linear_slots);
    plan.quant_state_bytes = predict_quant_state_bytes(sc);
  }
  plan.activation_bytes = Forward::workspace_bytes_for(model, plan.max_tokens_per_step);
  plan.pool_bytes = predict_pool_bytes(sc);
  for (size_t g = 0; g < groups.size(); ++g)
    if (groups[g].kind == GroupKind::kFull)  // a streaming store's block 0 is its null block
      plan.max_cached_tokens =
          static_cast<int64_t>(sc.group_blocks[g] - (o.streaming ? 1 : 0)) * o.block_tokens;
  for (size_t g = 0; g < groups.size() && plan.max_cached_tokens == 0; ++g) {
    if (groups[g].kind != GroupKind::kCompressed) continue;
    int64_t cap = INT64_MAX;  // the tightest compressed group
    for (size_t h = 0; h < groups.size(); ++h)
      if (groups[h].kind == GroupKind::kCompressed)
        cap = std::min<int64_t>(cap, (sc.group_blocks[h] - std::max<int32_t>(1, sc.linear_slots)) *
                                         groups[h].rate * o.block_tokens);
    // At most what the token groups' blocks hold (the scratch was billed for that).
    for (size_t h = 0; h < groups.size(); ++h)
      if (groups[h].kind != GroupKind::kCompressed)
        cap = std::min<int64_t>(cap, static_cast<int64_t>(sc.group_blocks[h]) * o.block_tokens);
    plan.max_cached_tokens = std::max<int64_t>(o.block_tokens, cap);
  }
  if (plan.max_cached_tokens == 0)  // only sliding layers: bounded by the window anyway
    plan.max_cached_tokens = static_cast<int64_t>(sc.group_blocks[0] - 1) * o.block_tokens;
  plan.attention_scratch_bytes = scratch_per_token * static_cast<size_t>(plan.max_cached_tokens);
  return plan;
}

}  // namespace kvcache
