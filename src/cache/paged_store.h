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
// Hybrid models (issue 38): "linear_attention" layers belong to no group and own no pages. Their
// state is per sequence, outside the block pool: a fixed arena of `linear_slots` slots
// (cache/paged_linear_state.h), one per live sequence, taken by add_sequence (zeroed) and given
// back when the sequence is freed; fork / remap copy slots; crop goes to 0 (zeroes) or nowhere
// (the recurrent state cannot go back). PagedLinearLayer (cache/paged_linear_layer.h) reads and
// writes the batch's slots. Prefix caching: when a step ends with a sequence exactly at a
// multiple of snapshot_every_blocks blocks and its blocks are keyed, every linear layer's state
// is copied into the snapshot store under the key of the block ending there; a prefix hit is
// then cut to the latest block boundary that has a snapshot (no snapshot: no hit) and
// attach_prefix restores it, so the linear layers continue exactly where the cached blocks end
// (no tail copy: a tail has no state). A snapshot is erased when its block's key is dropped.
//
// DeepSeek-V4 / V3.2 (issue 39; cache/compressed_cache_layer.h, cache/paged_compressed_layer.h):
// - K==V (shared_kv, CacheConfig::KVContent::kSharedKV): layers keep K pages only; a span's v
//   pages alias its k pages. CSA/HCA layers are always K==V (their sliding branch).
// - "compressed_sparse_attention" (CSA) and "heavily_compressed_attention" (HCA) layers are
//   members of two groups: the sliding group (their raw K==V window, window W, null blocks as
//   any sliding layer) and a kCompressed group, one per distinct compress rate r, whose blocks
//   hold block_tokens ENTRIES (= block_tokens * r tokens): a sequence of len tokens has
//   floor(len / r) entries there, so ceil(floor(len / r) / block_tokens) blocks, allocated by
//   plan_step from the lengths the step reaches (deterministic). A CSA layer also owns the
//   indexer's key pages (index_head_dim wide) in the same blocks. compressed(s) is a kPaged span
//   over those pages (one slot per entry), read in place by the sparse kernel.
// - The compressors' carried state (per layer and stream: the len % r buffered rows of kv and
//   gate, and CSA's overlap Ca half [r, width / 2] of kv and gate, f32) lives in the
//   per-sequence slots of the linear state (after the linear layers' part; one slot per live
//   sequence, zeroed at add_sequence, copied by fork/remap), so crop goes only to 0 or nowhere
//   and abort_step marks the state lost, as for linear layers.
// - "deepseek_sparse_attention" (DSA) layers are full-attention members with one indexer-key
//   page per layer in the same blocks (one slot per token): prefix sharing as usual.
// - A compressed layer's part of a step closes when its window was written and every batch
//   row's streams were fed (store_compression_weights, then update_compressor_states when it
//   held windows); a DSA layer's when its K/V and its indexer keys were written.
// - Prefix hits are refused for models with compressed layers (the compressor state at a block
//   boundary is not snapshotted yet): attach_prefix returns 0 and counts the refusal
//   (prefix_refused_compressed(), /metrics kvcache_prefix_refused_total{reason=
//   "compressed_state"}), so a hit never continues from a state that is not the prefix's.
//
// Disk tier (issue 40, cache/disk_tier.h; set_disk_tier): a keyed block that a pool evicts by
// LRU is copied out (its pages of every page-owning layer of the group, K then V, K only for
// K==V layers) and written behind to the disk tier under its key before the block is reused.
// attach_prefix continues past the last RAM-cached block: every next full block whose key the
// disk tier holds is loaded into a fresh block (verified: a failed check ends the hit there)
// and committed, so it is a RAM-cached block again, and the RAM match then runs as usual.
// Sliding groups load only the blocks the hit's window sees. Refused (set_disk_tier throws
// kUnsupported) for models with linear, compressed or indexed layers: their state or indexer
// keys at a block boundary are not in the stored pages.
//
// Remote tier (issue 41, cache/remote_tier.h; set_remote_tier): the tier is an event sink (the
// blocks stored go to it behind); its lookups run off this thread, and the runtime hands a
// result's verified records to stage_remote() before attach_prefix, which loads the staged
// blocks past the RAM and disk hit like disk blocks (fresh blocks, committed with source
// kRemote; no block free ends the hit). Refused for the same models as the disk tier.
//
// Quantized pages (issue 43; PagedStoreConfig::quant, format F = make_kv_block_format(scheme,
// bits, G = block_tokens, D_k, D_v) of kernels/kv_quant.h): a page-owning layer keeps, per
// block, K bytes [H_kv][kv_k_block_bytes(F)] and V bytes [H_kv][kv_v_block_bytes(F)] — the
// dense QuantizedLayer's per-(row, head) block, so a full block is one quantization group and
// its bytes never change after it fills. Each sequence's tokens past its last full block (its
// residual, < G tokens between steps) are kept in `dtype` in its residual slot ([slots][H_kv]
// [G][D] per layer; one slot per live sequence, linear_slots of them, add_sequence refuses
// beyond). The partial last block is allocated as usual (tables, keys and accounting are those
// of an f16 store) but its page is written only when it fills. A step's rows whose residual
// would pass G tokens are gathered [tail | new tokens] in a per-layer step workspace (sized
// for max_step_tokens tokens), so a row's residual view is one contiguous [1, H_kv, n, D].
// Semantics: the dense QuantizedLayer with group = residual = G, bit for bit — a step's
// attention reads the blocks that were full before it (packed) and everything after them in
// full precision; when the step closes, every block that became full is quantized from its
// rows converted to f32 exactly as QuantizedLayer::flush does, written into its pool block, and
// keyed (the dense layer flushes the same groups at its next update). write() / peek_span()
// return kPagedQuantized spans (core/kv_span.h). Prefix keys fold the format into the salt
// (an f16 block never serves a 4-bit request), prefix hits are whole blocks only (a tail copy
// would need dequantized rows in the residual, which no longer equal what the dense container
// holds), fork copies the residual slot, crop into a full block dequantizes its kept tokens
// back into the residual (as the dense crop does). Refused: MLA latents, K==V (shared_kv),
// linear, compressed and indexed layers.
//
// StreamingLLM (issue 43; add_sequence(salt, policy) with a "streaming:sink=S,window=W"
// KVPolicy, cache/kv_policy.h; the store built with PagedStoreConfig::streaming): a sequence
// under the policy keeps, in every full-attention group, its first ceil(S / block_tokens)
// blocks (the attention sinks) and the blocks holding its last W - 1 tokens; when a step
// closes, the blocks in between are released and the full group's null block (block 0,
// reserved only in a streaming store) stands in their table entries, as for a sliding group.
// Whole blocks: a block is kept while any of its tokens is a sink or in the window, so a decode
// query sees at least S sinks and exactly its window of W keys plus up to block_tokens - 1 more
// on each side (masking inside a page would need a second key range in every paged kernel).
// The batch's CSR tables skip the null entries of a streaming sequence (its full-group rows are
// compacted: sinks, then the window), so the kernels read it unchanged — full attention's
// causal mask is relative to the row's end, and the keys carry their RoPE from their original
// positions. A step's queries see the kept blocks plus every token of the step (the dense
// EvictingLayer's "eviction between steps"); the first step after a prefix hit sees every
// attached block, as the step that computed them did, so a repeated prompt continues as its
// first run did. Beyond that, what a token sees depends on where steps ended (prefill chunks,
// preemption), as in the dense EvictingLayer: a lossy policy's output may depend on the
// schedule. Keys: the policy's key() is folded into the sequence's block keys, and only blocks
// completed before the sequence evicted anything are keyed at all (their contents are what
// exact attention computed; later blocks depend on where steps ended), so a lossy block never
// serves an exact request, nor one of another policy. Sliding groups keep their own window.
// Refused: quantized pages (the residual slots and released packed blocks are not combined
// yet), linear, compressed and indexed layers; crop back into released blocks (kOutOfRange, as
// for sliding groups).
//
// Ownership: the store owns pages, pools and tables; spans point into them and are valid until
// the next step or lifecycle call. Not thread-safe (one runtime thread drives it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/block_events.h"
#include "cache/block_pool.h"
#include "cache/compressed_cache_layer.h"
#include "cache/disk_tier.h"
#include "cache/kv_policy.h"
#include "cache/linear_state_layer.h"
#include "cache/paged_linear_state.h"
#include "cache/remote_tier.h"
#include "core/dtype.h"
#include "core/kv_span.h"
#include "core/tensor.h"
#include "kernels/kv_quant.h"

namespace kvcache {

using SeqId = int32_t;

enum class GroupKind { kFull, kSliding, kCompressed };

struct PagedGroup {
  GroupKind kind = GroupKind::kFull;
  int64_t window = 0;       // kSliding: W (a query sees W keys, itself included)
  int64_t rate = 0;         // kCompressed: tokens per entry (a block holds block_tokens entries)
  std::vector<int> layers;  // model layer indices in this group
};

// Groups of a model's layer types: one per distinct kind (kCompressed: per distinct rate), in
// order of first appearance; CSA/HCA layers are listed in the sliding group and in their rate's
// compressed group. Throws Error(kUnsupported) for layer types the paged cache does not serve.
std::vector<PagedGroup> paged_groups(const std::vector<std::string>& layer_types,
                                     int64_t sliding_window,
                                     const std::map<std::string, int64_t>& compress_rates = {});

// The three layer types of issue 39 (cache/compressed_cache_layer.h).
bool is_compressed_layer_type(const std::string& type);  // CSA or HCA
inline bool is_indexed_layer_type(const std::string& type) {
  return type == "deepseek_sparse_attention";
}

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
  // Hybrid models: the linear layers' state shape (CacheConfig::linear), required when a layer
  // is "linear_attention", and the sequences that may hold state at once (one slot each; the
  // engine's max_running; add_sequence refuses beyond, 0 = 1 slot).
  LinearStateShape linear = {};
  int32_t linear_slots = 0;
  // Snapshot the state each time a sequence reaches a multiple of this many blocks (the
  // runtime ends prefill chunks there), keeping at most max_snapshots (least recently used
  // replaced). max_snapshots 0: none, and a hybrid model never hits the prefix cache.
  int32_t snapshot_every_blocks = 4;
  int32_t max_snapshots = 0;
  // DeepSeek-V4 / V3.2 (see above): K==V pages for every layer (KVContent::kSharedKV); the
  // compress rates of the CSA/HCA layer types and the indexer key width (CSA, DSA). The
  // compressor state needs head_dim up front (its widths follow it). linear_slots also counts
  // the sequences that may hold compressor state at once.
  bool shared_kv = false;
  CompressedShape compressed = {};
  // Quantized pages (PagedOptions::quant; unset: pages of `dtype` rows). The residual (each
  // sequence's partial last block) is kept in `dtype`.
  std::optional<PagedQuantFormat> quant;
  // Quantized pages: tokens one step may carry over all its rows (sizes the step workspaces;
  // plan_step refuses more). 0: the first group's capacity (group_blocks[0] * block_tokens).
  int64_t max_step_tokens = 0;
  // Sequences may run under a StreamingLLM policy (see above): every full-attention group
  // reserves its block 0 as the null block (group_blocks count it; default_group_blocks adds it).
  bool streaming = false;
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
// Whether `layer` keeps K pages only (K==V: shared_kv, or a CSA/HCA layer).
bool paged_layer_k_only(const PagedStoreConfig& config, int layer);
// Floats of one sequence's compressor state for every CSA/HCA layer (0 without).
int64_t paged_compressor_state_elems(const PagedStoreConfig& config);
// Model layer indices of the "linear_attention" layers, in order.
std::vector<int> paged_linear_layers(const PagedStoreConfig& config);
// Exact linear_state_bytes() and snapshot_bytes() of a store built from `config` (0 without
// linear or compressed layers): slots (linear and compressor state) + the linear batch
// workspaces, and the snapshot arena (linear layers only).
size_t predict_linear_state_bytes(const PagedStoreConfig& config);
size_t predict_snapshot_bytes(const PagedStoreConfig& config);
// Bytes of one sequence's state (every linear layer, every compressor), what the planner bills
// per sequence.
size_t paged_linear_bytes_per_sequence(const PagedStoreConfig& config);
// Quantized pages: throws Error(kUnsupported) saying why for a configuration the quantized store
// refuses (shared_kv, linear / compressed / indexed layers); no-op without config.quant.
void check_paged_quant(const PagedStoreConfig& config);
// Quantized pages: the block format of `config` (kv_heads / head_dim must be set).
KVBlockFormat paged_quant_format(const PagedStoreConfig& config);
// Quantized pages: sequences that may be live at once (one residual slot each), and tokens one
// step may carry (max_step_tokens or the first group's capacity).
int32_t paged_sequence_slots(const PagedStoreConfig& config);
int64_t paged_quant_step_tokens(const PagedStoreConfig& config);
// Exact quant_state_bytes() of a store built from `config` (0 without quant): every page-owning
// layer's residual slots and step workspace, and the f32 scratch of one block.
size_t predict_quant_state_bytes(const PagedStoreConfig& config);

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
  bool allocated() const {  // the first attention layer's pages (linear layers own none)
    const auto l = static_cast<size_t>(groups_.empty() ? 0 : groups_[0].layers[0]);
    if (l < kq_.size() && kq_[l].size() > 0) return true;  // quantized pages
    return l < k_pages_.size() && k_pages_[l].defined() && k_pages_[l].size_bytes() > 0;
  }

  // --- sequences and the batch -----------------------------------------------------------
  // A new empty sequence. `salt` (e.g. a tenant id) is folded into its block keys: prefixes
  // are shared only between sequences with the same salt.
  // `policy`: exact, or streaming (needs config().streaming); its key() is folded into the
  // block keys. Others: Error(kUnsupported) saying why.
  SeqId add_sequence(std::span<const uint8_t> salt = {}, const KVPolicy& policy = {});
  // Whether group g reserves block 0 as its null block (sliding groups; full groups of a
  // streaming store).
  bool has_null_block(int g) const;
  // The policy sequence `seq` runs under, and its blocks released by that policy so far.
  const KVPolicy& policy(SeqId seq) const { return seq_ref(seq).policy; }
  int64_t evicted_blocks(SeqId seq) const { return seq_ref(seq).evicted; }
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
  // `policy`: the one the request would run under (its key is part of the block keys).
  int64_t match_prefix(std::span<const int32_t> tokens, std::span<const uint8_t> salt = {},
                       PrefixMatch mode = PrefixMatch::kCopyTail, const KVPolicy& policy = {});
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
  // Speculative decoding's rollback bound: from now on a sliding group keeps, besides what
  // its next query sees, the blocks a query `tokens` positions back would see, so that crops
  // removing at most `tokens` tokens in all since a step closed find their keys (the store
  // otherwise releases blocks as soon as the window leaves them). Costs at most
  // ceil(tokens / block_tokens) + 1 blocks per sequence and sliding group. Streaming (lossy)
  // sequences are not affected. 0: release as soon as possible (the default).
  void set_rollback_tokens(int64_t tokens);
  int64_t rollback_tokens() const { return rollback_tokens_; }
  void reset();  // frees every sequence (content cached), empties the batch
  // Batch row i becomes a continuation of old row rows[i] (reorder, select,
  // repeat_interleave): a row used again is forked, rows not listed are freed.
  void remap(std::span<const int64_t> rows);
  // reorder (one index per batch row, checked) and repeat_interleave (r >= 1) as remaps.
  void reorder(std::span<const int64_t> beam_idx);
  void repeat_interleave(int64_t r);

  // --- linear-attention state (hybrid models; PagedLinearLayer) ---------------------------
  bool has_linear() const { return linear_; }
  int linear_index(int layer) const;  // among the linear layers; -1 for other layers
  int32_t slot_of(SeqId seq) const { return seq_ref(seq).slot; }
  int32_t free_linear_slots() const { return slots_ ? slots_->num_free() : 0; }
  // update_conv_state of `layer` for the batch: x [B, T, C]; T must be the open step's tokens
  // (no open step and no batch: protocol use, the rows become new sequences and the step is
  // planned, as write() does). previous: the windows before x, in a workspace; state: the
  // stored windows (a view of the slots when the batch's slots are consecutive, else a copy).
  ConvStateUpdate linear_conv_update(int layer, const TensorView& x);
  // The batch's recurrent states [B, H_v, d_k, d_v]: a writable view of the slots when
  // consecutive, else a gathered copy in a workspace (valid until the next linear call).
  TensorView linear_recurrent_state(int layer);
  TensorView linear_conv_state(int layer);
  // Stores s [B, H_v, d_k, d_v] into the batch's slots (nothing to copy when s is the view
  // linear_recurrent_state returned over the slots) and ends this layer's part of the step.
  TensorView linear_recurrent_update(int layer, const TensorView& s);
  // Whether any batch sequence had tokens (or a restored snapshot) before the open step.
  bool linear_has_previous() const;
  const LinearSnapshotStore* snapshots() const { return snaps_.get(); }
  size_t linear_state_bytes() const;  // slots + workspaces (constant)
  size_t snapshot_bytes() const;      // the snapshot arena (constant)
  // A linear layer's share of the slots and snapshot arenas (its state in every slot and
  // snapshot); 0 for other layers.
  size_t layer_state_bytes(int layer) const;
  // bytes() minus every layer's pages and state shares: what the leader layer reports on top
  // of its own, so the layers' bytes() add up to bytes().
  size_t leader_extra_bytes() const;

  // --- compressed (CSA/HCA) and indexed (DSA) layers (cache/paged_compressed_layer.h) ------
  // The CompressedCacheLayer calls for the batch rows (see compressed_cache_layer.h); row is a
  // batch row. A step must be open or the batch set (the layer's update() opens it).
  bool has_compressed() const { return !compressed_layers_.empty(); }
  int compressed_group_of_layer(int layer) const {  // -1: not a CSA/HCA layer
    return layer_cgroup_[static_cast<size_t>(layer)];
  }
  int64_t compress_rate(int layer) const;
  bool has_indexer_stream(int layer) const;  // CSA
  // Row width of stream s's kv/gate (CSA: 2 * head_dim, HCA: head_dim, indexer: 2 * c) and of
  // its entries (head_dim, or index_head_dim).
  int64_t compressor_width(int layer, CompressedStream s) const;
  int64_t entry_width(int layer, CompressedStream s) const;
  CompressionChunk compressor_feed(int layer, CompressedStream s, int64_t row, const TensorView& kv,
                                   const TensorView& gate);
  OverlapPrior compressor_overlap(int layer, CompressedStream s, int64_t row,
                                  const CompressionChunk& chunk);
  void compressor_entries(int layer, CompressedStream s, int64_t row, const TensorView& entries);
  // Every batch row's entries written so far, kPaged (k == v), kv_offset 0.
  KVSpan compressed_span(int layer, CompressedStream s);
  int64_t compressed_entries(int layer, CompressedStream s, int64_t row) const;
  // DSA: writes the step's indexer keys [B, 1, n, c] and returns every token's, kPaged.
  KVSpan write_indexer(int layer, const TensorView& index_keys);
  // attach_prefix calls that found cached blocks but attached none because the model has
  // compressed layers (the reason counted in /metrics).
  int64_t prefix_refused_compressed() const { return prefix_refused_compressed_; }

  // --- the disk tier under the prefix cache (see above) --------------------------------------
  // Attaches `disk` (its block_tokens must be the store's): evicted blocks are written behind
  // to it and attach_prefix loads hits from it. nullptr detaches. Throws Error(kUnsupported)
  // for models with linear, compressed or indexed layers.
  void set_disk_tier(std::shared_ptr<DiskTier> disk);
  DiskTier* disk_tier() const { return disk_.get(); }
  // Digest of the page layout (layer types, groups, page-owning and K-only layers, kv heads,
  // head dims, dtype, block_tokens): the runtime folds it with the model's fingerprint into
  // DiskTierOptions::fingerprint. Pages must exist (kv_heads and head_dim known).
  Digest128 layout_digest() const;
  // Full-block prefix of `tokens` (last token excluded) that RAM and the disk tier together
  // can serve, without any I/O (the disk's index only).
  int64_t match_prefix_with_disk(std::span<const int32_t> tokens,
                                 std::span<const uint8_t> salt = {}, const KVPolicy& policy = {});
  // Writes every keyed block in RAM that the disk tier does not hold yet, and waits for the
  // writes (a server shutting down keeps its whole prefix cache for the next start). Returns
  // the blocks written.
  int64_t spill_to_disk();
  // Of the tokens the last attach_prefix attached, those whose blocks it loaded from disk.
  int64_t last_prefix_disk_tokens() const { return last_disk_tokens_; }
  // Blocks loaded from disk by attach_prefix, and loads refused (a file that failed its checks
  // or no block to load into), over the store's life.
  int64_t disk_blocks_loaded() const { return disk_loaded_; }
  int64_t disk_loads_failed() const { return disk_load_failed_; }

  // --- the shared remote tier (see above) -------------------------------------------------
  // Attaches `remote` (its block_tokens must be the store's) as an event sink; nullptr
  // detaches. Throws Error(kUnsupported) for models with linear, compressed or indexed layers.
  void set_remote_tier(std::shared_ptr<RemoteTier> remote);
  RemoteTier* remote_tier() const { return remote_.get(); }
  // The key chain of every full block of `tokens` (last token excluded), per group
  // ([group][block]; compressed groups empty): what a remote lookup asks for.
  std::vector<std::vector<BlockKey>> prefix_block_keys(std::span<const int32_t> tokens,
                                                       std::span<const uint8_t> salt = {},
                                                       const KVPolicy& policy = {});
  // The payload bytes of one block of group g (its pages, the tiers' payload order).
  size_t block_payload_bytes(int g) const;
  // Hands a remote lookup's verified blocks to the next attach_prefix (which loads those past
  // the local hit, then drops them all); clear_remote_stage() drops them without a load.
  void stage_remote(RemoteResult result);
  void clear_remote_stage() { staged_ = RemoteResult{}; }
  // Of the tokens the last attach_prefix attached, those whose blocks it loaded from the
  // remote tier's staged blocks.
  int64_t last_prefix_remote_tokens() const { return last_remote_tokens_; }
  int64_t remote_blocks_loaded() const { return remote_loaded_; }
  int64_t remote_loads_failed() const { return remote_load_failed_; }

  // --- events (cache/block_events.h) ---------------------------------------------------------
  // Adds a sink told of every block stored in / removed from the prefix index, and of clears.
  // Sinks are called in the order added, on the store's thread.
  void add_event_sink(std::shared_ptr<BlockEventSink> sink);
  // Drops every key and tail of every group (vLLM's reset_prefix_cache): used blocks keep their
  // content, cached blocks become free; sinks get one on_cleared().
  void clear_prefix_cache();
  // The pages of block `id` of group g, in the disk tier's payload order (valid until the
  // block is reused).
  std::vector<std::span<std::byte>> block_pages(int g, int32_t id);
  // The next commits into group pools come from `source` (a tier's loads set it around their
  // commits; kComputed otherwise).
  void set_commit_source(BlockSource source) { commit_source_ = source; }

  // --- quantized pages (see above) ----------------------------------------------------------
  bool quantized() const { return config_.quant.has_value(); }
  // The block format (valid once the pages exist).
  const KVBlockFormat& quant_format() const { return qfmt_; }
  // Residual slots, step workspaces and scratch (constant once the pages exist).
  size_t quant_state_bytes() const;
  int32_t free_sequence_slots() const { return static_cast<int32_t>(qfree_.size()); }

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
    int32_t slot = -1;                         // linear state slot (hybrid models)
    int32_t qslot = -1;                        // residual slot (quantized pages)
    bool state_lost = false;                   // abort_step left its linear state half-updated
    KVPolicy policy;                           // exact or streaming
    int64_t evicted = 0;                       // blocks the streaming policy released
  };

  // What match_prefix found: `full` tokens in shared blocks (per group, their keys and ids; -1
  // where the window lets the null block stand in), then `tail` tokens to copy from tail_src[g].
  struct PrefixHit {
    int64_t full = 0, tail = 0;
    std::vector<std::vector<BlockKey>> keys;   // [group][full / block_tokens]
    std::vector<std::vector<int32_t>> blocks;  // [group][full / block_tokens]
    std::vector<int32_t> tail_src;             // [group] (when tail > 0)
    BlockKey snapshot;                         // hybrid: the snapshot at `full`
  };
  // with_disk: blocks the disk tier holds count as present (their id kOnDisk) and the match
  // stops at full blocks (no tail); for planning the loads only.
  PrefixHit find_prefix(std::span<const int32_t> tokens, std::span<const uint8_t> salt,
                        PrefixMatch mode, bool with_disk = false);
  static constexpr int32_t kOnDisk = -2;
  static constexpr int32_t kOnRemote = -3;  // staged by stage_remote (with_disk only)
  // Whether block i of group g under `key` is staged (stage_remote).
  bool staged(int g, int64_t i, const BlockKey& key) const;
  // Loads the disk-only (and staged remote) blocks a hit on `tokens` needs into RAM (cached,
  // keyed, at the LRU's most recent end); loaded[i] = 1 when some group's block i came from
  // disk, 2 when from the remote tier.
  void load_from_disk(std::span<const int32_t> tokens, std::span<const uint8_t> salt,
                      std::vector<uint8_t>& loaded);
  bool write_behind(int g, int32_t id, const BlockKey& key, const BlockKey& parent,
                    std::span<const int32_t> tokens);

  Seq& seq_ref(SeqId seq);
  const Seq& seq_ref(SeqId seq) const;
  void allocate_pages(int64_t kv_heads, int64_t head_dim, int64_t head_dim_v);
  bool is_null(int g, int32_t id) const { return id == 0 && has_null_block(g); }
  // First position a query at `pos` (or later) can see in group g (streaming sequences: past
  // their sinks).
  int64_t first_visible(int g, int64_t pos) const;
  int64_t first_visible(int g, const Seq& s, int64_t pos) const;
  bool streams(int g, const Seq& s) const;  // s runs under streaming in group g
  void drop_out_of_window(int g, Seq& s, int64_t next_pos);
  void commit_full_blocks(Seq& s);
  void copy_block(int g, int32_t src, int32_t dst, int64_t slots);
  void build_tables();
  void release_seq_blocks(Seq& s);
  void drop_seq(Seq& s);  // blocks and slot released, the entry emptied
  // Protocol use: the first update of a step plans it (rows become sequences when none).
  void open_step_if_needed(const std::string& where, int64_t rows, int64_t tokens);
  // A layer finished its part of the open step; the last one closes it.
  void layer_done(int layer);
  void take_snapshot(const Seq& s);
  // Slots (entries for compressed groups) and blocks a sequence of `len` tokens uses in group g.
  int64_t group_slots(int g, int64_t len) const;
  int64_t group_blocks_for(int g, int64_t len) const;
  // One part of a layer's step done (its K/V write, a compressed row's stream, DSA's indexer
  // keys); the layer is done when all its parts are.
  void part_done(int layer);
  int64_t parts_needed(int layer) const;
  struct CompressorSlot {  // one stream's state in a sequence's slot
    float *buf_kv, *buf_gate, *ov_kv, *ov_gate;
  };
  CompressorSlot compressor_slot(int layer, CompressedStream s, int32_t slot);
  void check_compressed_call(int layer, CompressedStream s, int64_t row, const char* what);
  void open_step_for_feed(const std::string& where, int64_t tokens);
  // Slots of the batch; whether they are consecutive (one strided view).
  bool batch_slots_consecutive() const;
  TensorView slot_view(int li, bool recurrent, int64_t rows) const;
  void check_linear_call(int layer, const char* what) const;

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
  int64_t rollback_tokens_ = 0;      // set_rollback_tokens
  std::vector<int64_t> step_base_;   // [batch]
  std::vector<uint8_t> step_wrote_;  // [n_layers]: the layer's part of the step is done
  std::vector<uint8_t> kv_written_;  // [n_layers]: its K/V written this step
  std::vector<int64_t> step_parts_;  // [n_layers]: parts done this step
  int step_writes_ = 0;
  std::vector<uint8_t> attached_;  // [n_layers]
  int n_attached_ = 0;
  // CSR page tables of the batch per group, rebuilt when a step opens.
  std::vector<std::vector<int32_t>> indptr_, indices_, last_len_;
  std::vector<std::vector<int64_t>> row_off_;  // [group][batch] PagedKV::row_offset
  // Hybrid models.
  std::vector<int> linear_index_;  // [n_layers]: index among the linear layers, -1
  std::unique_ptr<LinearStateSlots> slots_;
  std::unique_ptr<LinearSnapshotStore> snaps_;
  Tensor conv_prev_ws_, conv_ws_, rec_ws_;  // [linear_slots, ...] batch workspaces
  bool linear_ = false;                     // linear_attention layers present
  // Issue 39.
  std::vector<int> layer_cgroup_;          // [n_layers]: compressed group, -1
  std::vector<int> compressed_layers_;     // CSA/HCA layers, in order
  std::vector<int64_t> cstate_offset_;     // [n_layers]: compressor state's offset in a slot
  std::vector<Tensor> c_pages_, x_pages_;  // [n_layers] entries; indexer keys (CSA, DSA)
  std::vector<uint8_t> x_written_;         // [n_layers]: DSA indexer keys written this step
  // Per layer and stream (index layer * 2 + stream) for the open step: each batch row's feed
  // (0 not fed, 1 fed with windows to store, 2 done) and its windows; the chunk and prior
  // workspaces; the span's CSR (rebuilt by compressed_span).
  struct StreamStep {
    std::vector<uint8_t> fed;
    std::vector<int64_t> windows;
    Tensor chunk_kv, chunk_gate, prior_kv, prior_gate;
    std::vector<int32_t> indptr, indices, last;
  };
  std::vector<StreamStep> streams_;  // [n_layers * 2]
  int64_t prefix_refused_compressed_ = 0;
  // Disk tier.
  std::shared_ptr<DiskTier> disk_;
  // One block's payload: written behind (the tier copies it at once), and loaded (a load's
  // allocation may write another block behind, so not the same buffer).
  std::vector<std::byte> load_buf_;
  int64_t last_disk_tokens_ = 0, disk_loaded_ = 0, disk_load_failed_ = 0;
  // Quantized pages (see the header comment).
  KVBlockFormat qfmt_;
  int64_t kbb_ = 0, vbb_ = 0;        // bytes of one (block, head) of K / V
  std::vector<ByteBuffer> kq_, vq_;  // [n_layers] [blocks][H_kv][kbb_ | vbb_]
  std::vector<Tensor> rk_, rv_;      // [n_layers] residual slots [slots, H_kv, G, D]
  std::vector<Tensor> wk_, wv_;      // [n_layers] step workspaces, flat [tokens * H_kv * D]
  std::vector<int32_t> qfree_;       // free residual slots (a stack)
  std::vector<float> qscratch_;      // [G, max(D_k, D_v)] f32 rows
  std::vector<int64_t> ws_off_;      // [batch] the open step's workspace token offset, -1: slot
  int64_t ws_tokens_ = 0;            // workspace capacity in tokens
  mutable std::vector<std::vector<QuantKV>> qrows_;  // [n_layers][batch] span rows
  mutable std::vector<std::vector<int64_t>> qoff_;   // [n_layers][batch] span kv_offset
  std::vector<uint8_t> keyed_salt(std::span<const uint8_t> salt, const KVPolicy& policy = {}) const;
  SeqId new_sequence(std::vector<uint8_t> keyed);
  void allocate_quant(int64_t kv_heads, int64_t head_dim, int64_t head_dim_v);
  KVSpan quant_span(int layer) const;
  void write_quant(int layer, const TensorView& k, const TensorView& v);
  void quantize_closed_step();  // the step closes: blocks that became full get their bytes
  // Dequantizes the first `part` tokens of block `id` of every page-owning layer of group g
  // into `slot`'s residual (crop).
  void dequantize_into_slot(int g, int32_t id, int64_t part, int32_t slot);
  void copy_slot(int32_t src, int32_t dst, int64_t rows);
  // Remote tier.
  std::shared_ptr<RemoteTier> remote_;
  RemoteResult staged_;  // blocks [first_block, first_block + blocks) per group
  int64_t last_remote_tokens_ = 0, remote_loaded_ = 0, remote_load_failed_ = 0;
  // What of this model's state a block's pages do not carry (empty: nothing), so that a block
  // loaded from a tier could not continue exactly: the tiers refuse such models.
  std::string state_outside_pages() const;
  // Events.
  void install_pool_hooks();
  std::vector<std::shared_ptr<BlockEventSink>> sinks_;
  BlockSource commit_source_ = BlockSource::kComputed;
  bool clearing_ = false;  // clear_prefix_cache: per-key removals are not reported
};

}  // namespace kvcache
