// BlockPool: the bookkeeping of a paged KV cache's blocks — descriptors, reference counts, a
// free list with lazy LRU eviction, and the prefix index (block key -> block). It owns no K/V
// storage: block id b names page b in every layer tensor of its layer group (the store owns
// those, see cache/paged_store.h). Everything is allocated once at construction; no operation
// allocates afterwards.
//
// Block states (free + used + cached = total):
//   free    ref 0, no key, on the free list (taken first);
//   cached  ref 0, keyed (or a kept tail, below), on the free list in release order (least
//           recently released first): its content stays valid until the block is handed out
//           again (lazy eviction), so a later request with the same prefix can take it back;
//   used    ref > 0, off the free list; keyed once it is full and its tokens are known.
// A tail is a finished sequence's partial last block kept with its tokens (keep_tail): not in
// the key index and never shared, but found by longest_child() so that a prompt continuing it
// copies its rows (SGLang's radix cache reuses every cached token; blocks alone lose up to
// block_tokens - 1 per request).
// The free list is intrusive and doubly linked (O(1) removal from the middle when a prefix hit
// revives a cached block), as vLLM's FreeKVCacheBlockQueue and TensorRT-LLM's eviction policy.
//
// Block key = BLAKE2b-128(parent key, layer group, extra keys, token ids of the full block):
// stable across processes (unlike std::hash, cf. transformers' cache_manager.py:282-288 moving
// to blake2b for TP) and collisions cannot be forced. A hit also compares the stored tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvcache {

// 128-bit BLAKE2b digest. All-zero is the root (the parent of a sequence's first block).
struct BlockKey {
  uint64_t hi = 0, lo = 0;
  friend bool operator==(const BlockKey&, const BlockKey&) = default;
};

// Key of a full block: hashes (parent, group, extra, tokens). `extra` carries what else makes
// equal tokens produce different K/V (a tenant salt, adapter ids); empty for none.
BlockKey block_key(const BlockKey& parent, int32_t group, std::span<const uint8_t> extra,
                   std::span<const int32_t> tokens);

struct BlockPoolConfig {
  int32_t num_blocks = 0;    // total blocks (>= 1)
  int32_t block_tokens = 0;  // tokens per block (>= 1)
  int32_t group = 0;         // layer group id, folded into every key
};

struct BlockPoolStats {
  int32_t total = 0, free = 0, used = 0, cached = 0;
  int64_t allocations = 0;  // blocks handed out by allocate()
  int64_t evictions = 0;    // cached blocks whose key was dropped to reuse them
  int64_t hits = 0;         // blocks taken back from the index by acquire()
  int64_t lookups = 0;      // lookup() calls (block granularity)
};

class BlockPool {
 public:
  explicit BlockPool(const BlockPoolConfig& config);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t block_tokens() const { return block_tokens_; }
  int32_t group() const { return group_; }
  int32_t num_available() const { return n_free_ + n_cached_; }  // allocatable now

  // Appends n fresh blocks (ref 1, no key) to `out`, taking free blocks first, then cached
  // ones least recently released first (their keys are dropped: an eviction). Returns false
  // and changes nothing when fewer than n blocks are available (the caller may wait, preempt,
  // or evict elsewhere).
  bool allocate(int32_t n, std::vector<int32_t>& out);

  // One more reference to a used block (fork, a second table holding it).
  void retain(int32_t id);
  // Takes a reference on a block found by lookup(): a cached block leaves the free list.
  void acquire(int32_t id);
  // Drops one reference; at zero the block goes to the free list — keyed blocks at its LRU
  // end (content kept), unkeyed ones where allocate() takes first.
  void release(int32_t id);
  // A finished table: released tail first, so its last (least shareable) blocks are evicted
  // before its prefix.
  void release_table(std::span<const int32_t> ids);

  // Registers a full, used block under `key` (= block_key(parent, group, extra, tokens)) with
  // its tokens ([block_tokens]); `parent` is kept for longest_child(). When another
  // block already holds the key (the same content computed twice): if that block is in use
  // too, it keeps the key and this returns false (block left unkeyed); if it is only cached,
  // this block takes the key over and the cached copy becomes free (returns true).
  bool commit(int32_t id, const BlockKey& key, const BlockKey& parent,
              std::span<const int32_t> tokens);
  // The block holding `key` whose stored tokens equal `tokens`, or -1. No reference taken.
  int32_t lookup(const BlockKey& key, std::span<const int32_t> tokens);
  // Block ids holding tokens[0 .. k * block_tokens) for the largest such k (full blocks only),
  // walking the key chain from the root. No reference taken.
  std::vector<int32_t> match_prefix(std::span<const int32_t> tokens,
                                    std::span<const uint8_t> extra = {});

  // The keyed block or tail continuing `parent` (under `extra`) whose tokens share the longest
  // common prefix with `head` (fewer than block_tokens ids), and that length in `matched`; -1
  // and 0 when none shares a first token. Walks the family (parent, head[0]) — a second
  // index — and re-derives a candidate's key from parent, extra and its stored
  // tokens before it counts, so a hit is as certain as lookup()'s. No reference taken.
  int32_t longest_child(const BlockKey& parent, std::span<const uint8_t> extra,
                        std::span<const int32_t> head, int32_t& matched) const;

  // Drops the keys of up to n cached blocks, least recently released first (they become
  // free). Returns how many were evicted.
  int32_t evict(int32_t n);
  // Keeps the partial content of a used, unkeyed block (tokens: its first 0 < n < block_tokens
  // ids, continuing `parent` under `extra`) after its holder lets go: released, it is cached
  // like a keyed block (LRU, evicted by allocate()) but found by longest_child() only — never
  // shared, its rows only copied (a finished chat turn's last partial block serves the next
  // turn's prompt).
  void keep_tail(int32_t id, const BlockKey& parent, std::span<const uint8_t> extra,
                 std::span<const int32_t> tokens);
  bool is_tail(int32_t id) const { return blocks_[check_id(id)].tail > 0; }

  // Drops the key of a used block about to be overwritten (e.g. after a crop made it partial).
  void forget(int32_t id);
  // Drops every key and tail (the indexes forget everything; used blocks keep their content).
  void clear_index();
  // Called with a block's key whenever the pool drops it (eviction by allocate() or evict(),
  // forget(), clear_index()); not when commit() hands a key from a cached copy to a live one.
  // The store drops what it attached to that key (hybrid models' state snapshots).
  void set_key_drop_hook(std::function<void(const BlockKey&)> hook) {
    key_dropped_ = std::move(hook);
  }
  // Called with a keyed block that allocate() or evict() is about to reuse (an LRU eviction,
  // not forget() or clear_index()), before its key is dropped: its pages still hold the
  // block's content, so the store can write it behind to the disk tier (cache/disk_tier.h).
  using EvictHook = std::function<void(int32_t id, const BlockKey& key, const BlockKey& parent,
                                       std::span<const int32_t> tokens)>;
  void set_evict_hook(EvictHook hook) { evicted_ = std::move(hook); }

  // Called when commit() indexes a key the pool did not hold (a block newly stored in the
  // prefix index; not when a live copy takes a key over from a cached one).
  using CommitHook = std::function<void(int32_t id, const BlockKey& key, const BlockKey& parent,
                                        std::span<const int32_t> tokens)>;
  void set_commit_hook(CommitHook hook) { committed_ = std::move(hook); }

  int32_t ref_count(int32_t id) const { return blocks_[check_id(id)].ref; }
  bool is_keyed(int32_t id) const { return blocks_[check_id(id)].keyed; }
  const BlockKey& key(int32_t id) const { return blocks_[check_id(id)].key; }
  const BlockKey& parent(int32_t id) const { return blocks_[check_id(id)].parent; }
  std::span<const int32_t> tokens(int32_t id) const;  // valid while keyed (a tail: its first ids)

  BlockPoolStats stats() const;
  // Empty when every invariant holds, else the first violation: counts add up, the free list
  // is well linked and holds exactly the ref-0 blocks, every keyed block is indexed under its
  // key and every index entry points at a keyed block with that key.
  std::string check_invariants() const;
  // Exact bytes of the descriptors, the token store and the index (all fixed at construction).
  size_t bytes() const;
  // The same for a pool of `config` without building it (the planner's prediction).
  static size_t predict_bytes(const BlockPoolConfig& config);

 private:
  struct Block {
    int32_t ref = 0;
    int32_t prev = -1, next = -1;  // free list links (-1: none)
    bool on_free_list = false;
    bool keyed = false;
    BlockKey key;
    BlockKey parent;   // the key it continues (the root: all zero); valid while keyed or a tail
    int32_t tail = 0;  // > 0: a kept partial block of `tail` tokens (keep_tail), not keyed
    // Doubly linked list of the keyed blocks and tails of one family (same parent, same first
    // token), whose head the family index holds.
    int32_t sib_prev = -1, sib_next = -1;
  };

  size_t check_id(int32_t id) const;
  static bool kept(const Block& b) { return b.keyed || b.tail > 0; }  // content worth caching
  void drop_content(int32_t id);   // drops a key (both indexes) or a tail (the family index)
  void evict_content(int32_t id);  // the same for an LRU eviction (the evict hook first)
  void list_push_front(int32_t id);
  void list_push_back(int32_t id);
  void list_remove(int32_t id);
  size_t slot_of(const BlockKey& key) const;
  size_t family_slot(const BlockKey& parent, int32_t first) const;
  size_t family_slot_of(int32_t id) const;                          // of a keyed block or tail
  size_t find_family(const BlockKey& parent, int32_t first) const;  // its slot, or the free one
  void link_family(int32_t id);
  void unlink_family(int32_t id);
  // Backward-shift deletion of slot i of a linear-probing table whose entries' home slots
  // `home(entry)` gives (no tombstones).
  template <typename Home>
  static void erase_slot(std::vector<int32_t>& table, size_t i, Home home);
  static size_t index_capacity(int32_t num_blocks);

  int32_t block_tokens_ = 0;
  int32_t group_ = 0;
  std::vector<Block> blocks_;      // [num_blocks]
  std::vector<int32_t> tokens_;    // [num_blocks, block_tokens] token ids of keyed blocks
  std::vector<int32_t> index_;     // open addressing, linear probing: block id or -1
  std::vector<int32_t> families_;  // the same over (parent, first token): a family's head
  int32_t head_ = -1, tail_ = -1;  // free list: allocate() takes from head_
  int32_t n_free_ = 0, n_cached_ = 0;
  BlockPoolStats counters_;
  std::function<void(const BlockKey&)> key_dropped_;
  EvictHook evicted_;
  CommitHook committed_;
};

}  // namespace kvcache
