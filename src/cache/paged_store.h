// PagedKVStore: the paged KV cache of one model — K/V pages of every layer, one BlockPool per
// layer group, the sequences and their block tables, the prefix index. Every PagedLayer of a
// Cache writes into the same store (shared_ptr); the store hands each layer a kPaged KVSpan
// (pages + CSR page table, core/kv_span.h) that the attention kernel reads in place.
//
// Layer groups: layers of one attention kind share block tables (one table per sequence and
// group, and block id b names page b in every layer of the group): "full_attention" keeps all
// blocks; "sliding_attention" (window W) releases blocks that no later query can see and puts
// the reserved null block (page 0 of its pool, zeros) in their place, so the table still maps
// position p to slot p (kv_offset stays 0 and the kernel's window mask skips those keys), as
// vLLM does for sliding-window groups.
//
// A step (one forward of the active batch): plan_step() allocates the blocks the new tokens
// need for every active sequence and group, or returns kOutOfBlocks having changed nothing
// the sequences can see (plan, then apply). When the caller did not plan, the first layer's
// update() plans (throwing Error when out of blocks, the protocol's capacity error). Each
// layer's update() then copies its new K/V into the slots; after the last layer wrote, the
// blocks that became full and whose token ids are known are keyed into the prefix index.
//
// K and V rows may have different widths (head_dim, head_dim_v): MLA (DeepSeek-V2/V3) stores
// its compressed latent c_kv in the K pages ([blocks, 1, bt, d_c]) and its rotated key k_rot in
// the V pages ([blocks, 1, bt, d_r]) — two one-head tensors, L·(d_c + d_r)·b bytes per token,
// no factor 2. Why the K/V slots rather than a third "latent" page kind: block tables, prefix
// keys, fork/crop copies and the null block then serve MLA unchanged, and the model already
// hands MLA's pair to Cache::update as (K, V) for the dense containers.
// KV-shared layers (num_kv_shared_layers, Gemma-3n) belong to their type's group for the
// tables but own no pages: they read their source layer's span.
//
// Ownership: the store owns pages, pools and tables; spans point into them and are valid until
// the next step or lifecycle call. Not thread-safe (one runtime thread drives it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "core/dtype.h"
#include "core/kv_span.h"
#include "core/tensor.h"

namespace kvcache {

using SeqId = int32_t;

enum class GroupKind { kFull, kSliding };

struct PagedGroup {
  GroupKind kind = GroupKind::kFull;
  int64_t window = 0;       // kSliding: W (a query sees W keys, itself included)
  std::vector<int> layers;  // model layer indices in this group
};

// Groups of a model's layer types: one per distinct kind, in order of first appearance.
// Throws Error(kUnsupported) for layer types the paged cache does not serve.
std::vector<PagedGroup> paged_groups(const std::vector<std::string>& layer_types,
                                     int64_t sliding_window);

struct PagedStoreConfig {
  int32_t block_tokens = 16;
  std::vector<std::string> layer_types;  // one per model layer
  int64_t sliding_window = 0;            // W of "sliding_attention" layers
  DType dtype = DType::kF32;             // storage dtype of the pages (f32/f16/bf16)
  int64_t kv_heads = 0, head_dim = 0;    // 0: taken from the first update (pages lazy)
  int64_t head_dim_v = 0;                // V row width; 0: head_dim (MLA: d_r, head_dim = d_c)
  int num_kv_shared_layers = 0;          // the last N layers own no pages (never write)
  // Blocks per group (the null block included for sliding groups). Empty: each group sized
  // for `max_tokens` tokens (full) or one window plus a step (sliding).
  std::vector<int32_t> group_blocks;
  int64_t max_tokens = 0;
};

// Blocks each group gets when config.group_blocks is empty (kept here so the planner, the
// tests and the store agree).
std::vector<int32_t> default_group_blocks(const PagedStoreConfig& config);
// Bytes of the pages of one block of `group` (all its page-owning layers, K and V):
// layers · kv_heads · block_tokens · (head_dim + head_dim_v) · b.
size_t paged_block_bytes(const PagedStoreConfig& config, const PagedGroup& group);
// Whether `layer` owns pages (false for the last num_kv_shared_layers layers).
bool paged_layer_owns_pages(const PagedStoreConfig& config, int layer);
// Exact pool_bytes() of a store built from `config` (kv_heads/head_dim must be set).
size_t predict_pool_bytes(const PagedStoreConfig& config);

enum class StepStatus { kOk, kOutOfBlocks };

// A paged span's keys (values: its values) as a dense [B, H_kv, S, D] tensor in the pages'
// dtype, S the longest sequence, shorter rows zero-padded; positions behind a sliding group's
// null block read as zeros. An explicit copy for tools and tests comparing paged with dense.
Tensor gather_paged(const PagedKV& kv, bool values);

struct PagedGroupStats {
  BlockPoolStats pool;
  size_t block_bytes = 0;       // pages of one block, all layers of the group
  size_t used_bytes = 0;        // used blocks * block_bytes (the null block included)
  int64_t allocated_slots = 0;  // slots in blocks held by live tables (null excluded)
  int64_t live_tokens = 0;      // tokens those tables map to real (non-null) blocks
};

class PagedKVStore {
 public:
  explicit PagedKVStore(const PagedStoreConfig& config);
  PagedKVStore(const PagedKVStore&) = delete;
  PagedKVStore& operator=(const PagedKVStore&) = delete;

  const PagedStoreConfig& config() const { return config_; }
  int num_groups() const { return static_cast<int>(groups_.size()); }
  const PagedGroup& group(int g) const { return groups_[static_cast<size_t>(g)]; }
  int group_of_layer(int layer) const { return layer_group_[static_cast<size_t>(layer)]; }
  int32_t block_tokens() const { return config_.block_tokens; }
  bool allocated() const {
    return !k_pages_.empty() && k_pages_[0].defined() && k_pages_[0].size_bytes() > 0;
  }

  // --- sequences and the batch -----------------------------------------------------------
  // A new empty sequence. `salt` (e.g. a tenant id) is folded into its block keys: prefixes
  // are shared only between sequences with the same salt.
  SeqId add_sequence(std::span<const uint8_t> salt = {});
  // Releases the sequence's blocks tail first (keyed blocks stay cached) and drops it from
  // the batch.
  void free_sequence(SeqId seq);
  // The sequences the next forward's batch rows are, in row order (each at most once).
  void set_batch(std::span<const SeqId> seqs);
  std::span<const SeqId> batch() const { return batch_; }
  int64_t length(SeqId seq) const;
  bool is_live(SeqId seq) const;

  // --- prefix sharing and fork ------------------------------------------------------------
  // Leading tokens of `tokens` already cached by every group, capped at tokens.size() - 1 so
  // that at least the last token is computed (its logits are needed). Full blocks are shared
  // (kFullBlocks stops there); kCopyTail goes on into the cached block that continues the
  // last matched one with the most of the next tokens (SGLang's token-granular reuse, without
  // a token-granular index): attach_prefix copies those rows into a fresh block of the
  // sequence, so a prompt whose shared part ends inside a block recomputes none of it. The
  // tail counts only when every group holds such a block and has a block to copy it into.
  enum class PrefixMatch { kFullBlocks, kCopyTail };
  int64_t match_prefix(std::span<const int32_t> tokens, std::span<const uint8_t> salt = {},
                       PrefixMatch mode = PrefixMatch::kCopyTail);
  // Gives the empty sequence `seq` the blocks of match_prefix(tokens, mode) (references taken,
  // the tail copied) and that length; returns it. The caller then feeds tokens[returned ..].
  int64_t attach_prefix(SeqId seq, std::span<const int32_t> tokens,
                        PrefixMatch mode = PrefixMatch::kCopyTail);
  // n new sequences continuing `seq`: every full block shared (ref count), the partial last
  // block copied (one block per child per group). false, nothing changed: not enough blocks.
  bool fork(SeqId seq, int n, std::vector<SeqId>& children);

  // --- steps ------------------------------------------------------------------------------
  // Allocates the blocks for n_tokens more tokens of every batch sequence. tokens: the ids,
  // [batch, n_tokens] row-major, or empty (then the blocks of this step are never keyed).
  StepStatus plan_step(int64_t n_tokens, std::span<const int32_t> tokens = {});
  // PagedLayer::update: writes layer `layer`'s new K/V (k [B, H_kv, S, D_k], v [B, H_kv, S, D_v],
  // B = batch size) and
  // returns the layer's span. Throws Error on shape mismatch or when unplanned and out of
  // blocks (before anything is written).
  KVSpan write(int layer, const TensorView& k, const TensorView& v);
  // The span write() would return for `layer` over the current batch, without writing
  // (inspection, tests). Pages must exist.
  KVSpan peek_span(int layer) const;
  // Undoes the open step (a forward that failed between plan_step and its last layer's write):
  // every batch sequence goes back to its length before the step and the blocks the step
  // allocated are released. They were never keyed (keys are written when the step closes), and
  // rows some layers already wrote lie past the restored lengths, where nothing reads them.
  // No-op when no step is open.
  void abort_step();
  bool step_open() const { return step_open_; }

  // --- the CacheLayer lifecycle, over the batch (see PagedLayer) ---------------------------
  // n < 0: drop the last |n| tokens of every batch sequence; n >= 0: keep the first n.
  void crop(int64_t n);
  void reset();  // frees every sequence (content cached), empties the batch
  // Batch row i becomes a continuation of old row rows[i] (reorder, select,
  // repeat_interleave): a row used again is forked, rows not listed are freed.
  void remap(std::span<const int64_t> rows);

  // --- accounting -------------------------------------------------------------------------
  PagedGroupStats stats(int g) const;
  size_t used_bytes() const;  // sum over groups
  // Pages and pool metadata: fixed once the pages exist (the planner predicts it).
  size_t pool_bytes() const;
  // pool_bytes() plus the tables and per-sequence metadata.
  size_t bytes() const;
  size_t layer_page_bytes(int layer) const;
  // Empty when consistent: each pool's invariants, and every block's ref count equals the
  // number of live table entries holding it (plus the store's hold on null blocks).
  std::string check_invariants() const;
  BlockPool& pool(int g) { return *pools_[static_cast<size_t>(g)]; }

  // PagedLayer bookkeeping: a layer that will write (shared layers never attach); the step
  // closes when every attached layer wrote.
  void attach_layer(int layer);
  int leader_layer() const;  // the lowest attached layer (-1: none)
  // Tokens `layer` has written for batch row 0 (the protocol's seq_length()).
  int64_t layer_length(int layer) const;

 private:
  struct Seq {
    bool live = false;
    int64_t len = 0;
    bool tokens_known = true;     // every token id so far recorded
    std::vector<int32_t> tokens;  // [len] while tokens_known
    std::vector<uint8_t> salt;
    std::vector<std::vector<int32_t>> tables;  // [group][blocks]
    std::vector<std::vector<BlockKey>> keys;   // [group][committed blocks]
  };

  // What match_prefix found: `full` tokens in shared blocks (per group, their keys and ids; -1
  // where the window lets the null block stand in), then `tail` tokens to copy from tail_src[g].
  struct PrefixHit {
    int64_t full = 0, tail = 0;
    std::vector<std::vector<BlockKey>> keys;   // [group][full / block_tokens]
    std::vector<std::vector<int32_t>> blocks;  // [group][full / block_tokens]
    std::vector<int32_t> tail_src;             // [group] (when tail > 0)
  };
  PrefixHit find_prefix(std::span<const int32_t> tokens, std::span<const uint8_t> salt,
                        PrefixMatch mode);

  Seq& seq_ref(SeqId seq);
  const Seq& seq_ref(SeqId seq) const;
  void allocate_pages(int64_t kv_heads, int64_t head_dim, int64_t head_dim_v);
  bool is_null(int g, int32_t id) const {
    return groups_[static_cast<size_t>(g)].kind == GroupKind::kSliding && id == 0;
  }
  // First position a query at `pos` (or later) can see in group g.
  int64_t first_visible(int g, int64_t pos) const;
  void drop_out_of_window(int g, Seq& s, int64_t next_pos);
  void commit_full_blocks(Seq& s);
  void copy_block(int g, int32_t src, int32_t dst, int64_t slots);
  void build_tables();
  void release_seq_blocks(Seq& s);

  PagedStoreConfig config_;
  std::vector<PagedGroup> groups_;
  std::vector<int> layer_group_;                   // [n_layers]
  std::vector<std::unique_ptr<BlockPool>> pools_;  // [groups]
  std::vector<Tensor> k_pages_, v_pages_;          // [n_layers] [blocks_g, H_kv, bt, D_k | D_v]
  std::vector<Seq> seqs_;
  std::vector<SeqId> batch_;
  // The open step: tokens per row, each batch row's length before it, which layers wrote.
  int64_t step_tokens_ = 0;
  bool step_open_ = false;
  std::vector<int64_t> step_base_;   // [batch]
  std::vector<uint8_t> step_wrote_;  // [n_layers]
  int step_writes_ = 0;
  std::vector<uint8_t> attached_;  // [n_layers]
  int n_attached_ = 0;
  // CSR page tables of the batch per group, rebuilt when a step opens.
  std::vector<std::vector<int32_t>> indptr_, indices_, last_len_;
};

}  // namespace kvcache
