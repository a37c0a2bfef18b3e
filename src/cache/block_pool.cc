#include "cache/block_pool.h"

#include <blake2.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/error.h"

namespace kvcache {

BlockKey block_key(const BlockKey& parent, int32_t group, std::span<const uint8_t> extra,
                   std::span<const int32_t> tokens) {
  // Fixed-width little-endian fields, so that the key is the same on every process and build.
  blake2b_state st;
  KV_CHECK(blake2b_init(&st, 16) == 0, "blake2b_init failed");
  uint8_t head[16 + 4 + 8];
  for (int i = 0; i < 8; ++i) {
    head[i] = static_cast<uint8_t>(parent.hi >> (8 * i));
    head[8 + i] = static_cast<uint8_t>(parent.lo >> (8 * i));
  }
  const auto g = static_cast<uint32_t>(group);
  for (int i = 0; i < 4; ++i) head[16 + i] = static_cast<uint8_t>(g >> (8 * i));
  // Lengths make the encoding prefix-free: (extra, tokens) pairs cannot collide by shifting.
  const uint64_t n_extra = extra.size();
  for (int i = 0; i < 8; ++i) head[20 + i] = static_cast<uint8_t>(n_extra >> (8 * i));
  blake2b_update(&st, head, sizeof(head));
  if (!extra.empty()) blake2b_update(&st, extra.data(), extra.size());
  uint8_t buf[256];
  size_t fill = 0;
  for (const int32_t t : tokens) {
    const auto u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) buf[fill++] = static_cast<uint8_t>(u >> (8 * i));
    if (fill == sizeof(buf)) {
      blake2b_update(&st, buf, fill);
      fill = 0;
    }
  }
  if (fill > 0) blake2b_update(&st, buf, fill);
  uint8_t out[16];
  KV_CHECK(blake2b_final(&st, out, sizeof(out)) == 0, "blake2b_final failed");
  BlockKey k;
  for (int i = 0; i < 8; ++i) {
    k.hi |= static_cast<uint64_t>(out[i]) << (8 * i);
    k.lo |= static_cast<uint64_t>(out[8 + i]) << (8 * i);
  }
  return k;
}

size_t BlockPool::index_capacity(int32_t num_blocks) {
  // At most num_blocks keys live at once: a load factor <= 1/2 keeps linear probes short.
  return std::bit_ceil(static_cast<size_t>(std::max(num_blocks, 1)) * 2);
}

BlockPool::BlockPool(const BlockPoolConfig& config)
    : block_tokens_(config.block_tokens), group_(config.group) {
  if (config.num_blocks < 1 || config.block_tokens < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                "block pool: num_blocks (" + std::to_string(config.num_blocks) +
                    ") and block_tokens (" + std::to_string(config.block_tokens) +
                    ") must both be >= 1");
  }
  blocks_.resize(static_cast<size_t>(config.num_blocks));
  tokens_.assign(static_cast<size_t>(config.num_blocks) * static_cast<size_t>(block_tokens_), 0);
  index_.assign(index_capacity(config.num_blocks), -1);
  families_.assign(index_capacity(config.num_blocks), -1);
  for (int32_t id = 0; id < config.num_blocks; ++id) list_push_back(id);
  n_free_ = config.num_blocks;
}

size_t BlockPool::check_id(int32_t id) const {
  KV_CHECK(id >= 0 && id < num_blocks(), "block id " + std::to_string(id) + " out of range");
  return static_cast<size_t>(id);
}

void BlockPool::list_push_front(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  b.prev = -1;
  b.next = head_;
  if (head_ >= 0) blocks_[static_cast<size_t>(head_)].prev = id;
  head_ = id;
  if (tail_ < 0) tail_ = id;
  b.on_free_list = true;
}

void BlockPool::list_push_back(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  b.next = -1;
  b.prev = tail_;
  if (tail_ >= 0) blocks_[static_cast<size_t>(tail_)].next = id;
  tail_ = id;
  if (head_ < 0) head_ = id;
  b.on_free_list = true;
}

void BlockPool::list_remove(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  KV_CHECK(b.on_free_list, "removing a block that is not on the free list");
  if (b.prev >= 0)
    blocks_[static_cast<size_t>(b.prev)].next = b.next;
  else
    head_ = b.next;
  if (b.next >= 0)
    blocks_[static_cast<size_t>(b.next)].prev = b.prev;
  else
    tail_ = b.prev;
  b.prev = b.next = -1;
  b.on_free_list = false;
}

size_t BlockPool::slot_of(const BlockKey& key) const {
  // The key is a cryptographic digest: its low bits are already uniform.
  return static_cast<size_t>(key.lo) & (index_.size() - 1);
}

template <typename Home>
void BlockPool::erase_slot(std::vector<int32_t>& table, size_t i, Home home) {
  // Pull later entries of the probe run into the hole when their home slot is not between the
  // hole and them.
  const size_t mask = table.size() - 1;
  size_t hole = i;
  for (size_t j = (i + 1) & mask; table[j] >= 0; j = (j + 1) & mask) {
    const size_t h = home(table[j]);
    const bool movable = hole <= j ? (h <= hole || h > j) : (h <= hole && h > j);
    if (movable) {
      table[hole] = table[j];
      hole = j;
    }
  }
  table[hole] = -1;
}

size_t BlockPool::family_slot(const BlockKey& parent, int32_t first) const {
  // The parent is a digest (uniform bits); the first token spreads the root's children.
  const uint64_t h =
      parent.lo ^ (static_cast<uint64_t>(static_cast<uint32_t>(first)) * 0x9E3779B97F4A7C15ull);
  return static_cast<size_t>(h ^ (h >> 29)) & (families_.size() - 1);
}

size_t BlockPool::family_slot_of(int32_t id) const {
  return family_slot(blocks_[static_cast<size_t>(id)].parent, tokens(id)[0]);
}

size_t BlockPool::find_family(const BlockKey& parent, int32_t first) const {
  const size_t mask = families_.size() - 1;
  size_t i = family_slot(parent, first);
  for (; families_[i] >= 0; i = (i + 1) & mask) {
    const int32_t h = families_[i];
    if (blocks_[static_cast<size_t>(h)].parent == parent && tokens(h)[0] == first) break;
  }
  return i;
}

void BlockPool::link_family(int32_t id) {
  const size_t i = find_family(blocks_[static_cast<size_t>(id)].parent, tokens(id)[0]);
  const int32_t head = families_[i];  // -1: a new family
  blocks_[static_cast<size_t>(id)].sib_next = head;
  if (head >= 0) blocks_[static_cast<size_t>(head)].sib_prev = id;
  families_[i] = id;
}

void BlockPool::unlink_family(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  if (b.sib_next >= 0) blocks_[static_cast<size_t>(b.sib_next)].sib_prev = b.sib_prev;
  if (b.sib_prev >= 0) {
    blocks_[static_cast<size_t>(b.sib_prev)].sib_next = b.sib_next;
  } else {  // the head: the index entry moves to the next member, or goes
    const size_t mask = families_.size() - 1;
    size_t i = family_slot_of(id);
    while (families_[i] != id) {
      KV_CHECK(families_[i] >= 0, "keyed block missing from the family index");
      i = (i + 1) & mask;
    }
    if (b.sib_next >= 0)
      families_[i] = b.sib_next;
    else
      erase_slot(families_, i, [this](int32_t h) { return family_slot_of(h); });
  }
  b.sib_prev = b.sib_next = -1;
}

void BlockPool::drop_content(int32_t id) {
  Block& b = blocks_[static_cast<size_t>(id)];
  KV_CHECK(kept(b), "dropping the content of a block that keeps none");
  unlink_family(id);
  if (b.keyed) {  // a tail is in the family index only
    const size_t mask = index_.size() - 1;
    size_t i = slot_of(b.key);
    while (index_[i] != id) {
      KV_CHECK(index_[i] >= 0, "keyed block missing from the index");
      i = (i + 1) & mask;
    }
    erase_slot(index_, i,
               [this](int32_t e) { return slot_of(blocks_[static_cast<size_t>(e)].key); });
  }
  const bool was_keyed = b.keyed;
  const BlockKey key = b.key;
  b.keyed = false;
  b.tail = 0;
  b.key = {};
  b.parent = {};
  if (was_keyed && key_dropped_) key_dropped_(key);
}

void BlockPool::evict_content(int32_t id) {
  const Block& b = blocks_[static_cast<size_t>(id)];
  if (b.keyed && evicted_) evicted_(id, b.key, b.parent, tokens(id));
  drop_content(id);
}

void BlockPool::keep_tail(int32_t id, const BlockKey& parent, std::span<const uint8_t> extra,
                          std::span<const int32_t> tokens) {
  Block& b = blocks_[check_id(id)];
  KV_CHECK(b.ref > 0 && !kept(b), "keep_tail needs a used block that keeps nothing yet");
  KV_CHECK(!tokens.empty() && static_cast<int32_t>(tokens.size()) < block_tokens_,
           "keep_tail needs a partial block");
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(id) * block_tokens_));
  b.tail = static_cast<int32_t>(tokens.size());
  b.parent = parent;
  b.key = block_key(parent, group_, extra, tokens);  // of the partial content: verified on a hit
  link_family(id);
}

bool BlockPool::allocate(int32_t n, std::vector<int32_t>& out) {
  if (n < 0 || n > num_available()) return false;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = head_;
    Block& b = blocks_[static_cast<size_t>(id)];
    list_remove(id);
    if (kept(b)) {
      evict_content(id);
      --n_cached_;
      ++counters_.evictions;
    } else {
      --n_free_;
    }
    b.ref = 1;
    out.push_back(id);
  }
  counters_.allocations += n;
  return true;
}

void BlockPool::retain(int32_t id) {
  Block& b = blocks_[check_id(id)];
  KV_CHECK(b.ref > 0, "retain on a block nobody holds (use acquire for index hits)");
  ++b.ref;
}

void BlockPool::acquire(int32_t id) {
  Block& b = blocks_[check_id(id)];
  KV_CHECK(kept(b), "acquire on a block that is neither in the index nor a kept tail");
  if (b.ref == 0) {
    list_remove(id);
    --n_cached_;
  }
  ++b.ref;
  ++counters_.hits;
}

void BlockPool::release(int32_t id) {
  Block& b = blocks_[check_id(id)];
  KV_CHECK(b.ref > 0, "release of block " + std::to_string(id) + " with no reference");
  if (--b.ref > 0) return;
  if (kept(b)) {
    list_push_back(id);  // most recently released: evicted last
    ++n_cached_;
  } else {
    list_push_front(id);  // nothing worth keeping: handed out first
    ++n_free_;
  }
}

void BlockPool::release_table(std::span<const int32_t> ids) {
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) release(*it);
}

bool BlockPool::commit(int32_t id, const BlockKey& key, const BlockKey& parent,
                       std::span<const int32_t> tokens) {
  Block& b = blocks_[check_id(id)];
  KV_CHECK(b.ref > 0 && !b.keyed, "commit needs a used, unkeyed block");
  KV_CHECK(static_cast<int32_t>(tokens.size()) == block_tokens_, "commit needs a full block");
  const size_t mask = index_.size() - 1;
  bool took_over = false;
  size_t i = slot_of(key);
  for (; index_[i] >= 0; i = (i + 1) & mask) {
    const int32_t o = index_[i];
    Block& ob = blocks_[static_cast<size_t>(o)];
    if (ob.key != key) continue;
    // The same content computed twice (a prompt prefilled again without a prefix lookup, two
    // requests computing one prefix at once). While the indexed copy is held too, it keeps
    // serving. When it is only cached, the live copy takes the key over and the old copy is
    // freed: otherwise the cached copy, released long ago, sits first in line for eviction
    // while the live one, unkeyed, is dropped when its sequence ends, and the prefix is lost.
    if (ob.ref > 0) return false;
    took_over = true;
    list_remove(o);
    --n_cached_;
    unlink_family(o);
    ob.keyed = false;
    ob.key = {};
    ob.parent = {};
    list_push_front(o);  // nothing worth keeping: handed out first
    ++n_free_;
    break;  // slot i: the same key, so the same probe position for the new holder
  }
  index_[i] = id;
  b.keyed = true;
  b.key = key;
  b.parent = parent;
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(id) * block_tokens_));
  link_family(id);
  if (!took_over && committed_) committed_(id, key, parent, this->tokens(id));
  return true;
}

int32_t BlockPool::lookup(const BlockKey& key, std::span<const int32_t> tokens) {
  ++counters_.lookups;
  const size_t mask = index_.size() - 1;
  for (size_t i = slot_of(key); index_[i] >= 0; i = (i + 1) & mask) {
    const int32_t id = index_[i];
    if (blocks_[static_cast<size_t>(id)].key != key) continue;
    const std::span<const int32_t> stored = this->tokens(id);
    // Equal keys with different tokens would be a BLAKE2b collision: refuse the hit.
    if (tokens.size() != stored.size() || !std::equal(tokens.begin(), tokens.end(), stored.begin()))
      return -1;
    return id;
  }
  return -1;
}

std::vector<int32_t> BlockPool::match_prefix(std::span<const int32_t> tokens,
                                             std::span<const uint8_t> extra) {
  std::vector<int32_t> ids;
  BlockKey parent;
  const size_t bt = static_cast<size_t>(block_tokens_);
  for (size_t off = 0; off + bt <= tokens.size(); off += bt) {
    const std::span<const int32_t> blk = tokens.subspan(off, bt);
    parent = block_key(parent, group_, extra, blk);
    const int32_t id = lookup(parent, blk);
    if (id < 0) break;
    ids.push_back(id);
  }
  return ids;
}

int32_t BlockPool::longest_child(const BlockKey& parent, std::span<const uint8_t> extra,
                                 std::span<const int32_t> head, int32_t& matched) const {
  KV_CHECK(static_cast<int32_t>(head.size()) < block_tokens_,
           "longest_child: head must be shorter than a block");
  int32_t best = -1;
  matched = 0;
  if (head.empty()) return -1;
  for (int32_t id = families_[find_family(parent, head[0])]; id >= 0;
       id = blocks_[static_cast<size_t>(id)].sib_next) {
    const int32_t kept_tail = blocks_[static_cast<size_t>(id)].tail;  // 0: a keyed full block
    const std::span<const int32_t> stored =
        kept_tail > 0 ? tokens(id).first(static_cast<size_t>(kept_tail)) : tokens(id);
    const std::span<const int32_t> h = head.first(std::min(head.size(), stored.size()));
    const auto common =
        static_cast<int32_t>(std::mismatch(h.begin(), h.end(), stored.begin()).first - h.begin());
    // The root has one parent key for every salt: the key tells tenants (and groups) apart.
    if (common > matched &&
        block_key(parent, group_, extra, stored) == blocks_[static_cast<size_t>(id)].key) {
      best = id;
      matched = common;
    }
  }
  return best;
}

std::span<const int32_t> BlockPool::tokens(int32_t id) const {
  return {tokens_.data() + check_id(id) * static_cast<size_t>(block_tokens_),
          static_cast<size_t>(block_tokens_)};
}

int32_t BlockPool::evict(int32_t n) {
  int32_t done = 0;
  // Kept free blocks sit after the others, oldest first: walk from the head.
  for (int32_t id = head_; id >= 0 && done < n;) {
    const int32_t next = blocks_[static_cast<size_t>(id)].next;
    if (kept(blocks_[static_cast<size_t>(id)])) {
      evict_content(id);
      list_remove(id);
      list_push_front(id);
      --n_cached_;
      ++n_free_;
      ++counters_.evictions;
      ++done;
    }
    id = next;
  }
  return done;
}

void BlockPool::forget(int32_t id) {
  const Block& b = blocks_[check_id(id)];
  KV_CHECK(b.ref > 0, "forget on a block nobody holds");
  if (kept(b)) drop_content(id);
}

void BlockPool::clear_index() {
  for (int32_t id = 0; id < num_blocks(); ++id) {
    Block& b = blocks_[static_cast<size_t>(id)];
    if (!kept(b)) continue;
    drop_content(id);
    if (b.ref == 0) {
      list_remove(id);
      list_push_front(id);
      --n_cached_;
      ++n_free_;
    }
  }
}

BlockPoolStats BlockPool::stats() const {
  BlockPoolStats s = counters_;
  s.total = num_blocks();
  s.free = n_free_;
  s.cached = n_cached_;
  s.used = num_blocks() - n_free_ - n_cached_;
  return s;
}

std::string BlockPool::check_invariants() const {
  int32_t used = 0, free = 0, cached = 0, keyed = 0, tails = 0;
  for (int32_t id = 0; id < num_blocks(); ++id) {
    const Block& b = blocks_[static_cast<size_t>(id)];
    if (b.ref < 0) return "block " + std::to_string(id) + " has a negative ref count";
    if ((b.ref == 0) != b.on_free_list)
      return "block " + std::to_string(id) + ": ref " + std::to_string(b.ref) +
             (b.on_free_list ? " but on" : " but not on") + " the free list";
    if (b.ref > 0)
      ++used;
    else if (kept(b))
      ++cached;
    else
      ++free;
    if (b.keyed && b.tail > 0) return "block " + std::to_string(id) + " is both keyed and a tail";
    tails += b.tail > 0;
    if (b.keyed) {
      ++keyed;
      const size_t mask = index_.size() - 1;
      size_t i = slot_of(b.key);
      while (index_[i] >= 0 && index_[i] != id) i = (i + 1) & mask;
      if (index_[i] != id)
        return "keyed block " + std::to_string(id) + " is not reachable in the index";
    }
  }
  if (used + free + cached != num_blocks()) return "free + used + cached != total";
  if (free != n_free_ || cached != n_cached_)
    return "counters: free " + std::to_string(n_free_) + " vs " + std::to_string(free) +
           ", cached " + std::to_string(n_cached_) + " vs " + std::to_string(cached);
  // Family index: every keyed block and tail in the list of its (parent, first token), lists
  // well linked, one entry per family.
  int32_t in_families = 0;
  for (size_t i = 0; i < families_.size(); ++i) {
    const int32_t head = families_[i];
    if (head < 0) continue;
    if (head >= num_blocks() || blocks_[static_cast<size_t>(head)].sib_prev != -1)
      return "family index entry " + std::to_string(head) + " is not a list head";
    const size_t home = family_slot_of(head);
    for (size_t j = home; j != i; j = (j + 1) & (families_.size() - 1))
      if (families_[j] < 0)
        return "family of block " + std::to_string(head) + " unreachable from its slot";
    int32_t prev = -1;
    for (int32_t id = head; id >= 0; id = blocks_[static_cast<size_t>(id)].sib_next) {
      const Block& b = blocks_[static_cast<size_t>(id)];
      if (++in_families > num_blocks()) return "family list has a cycle";
      if (!kept(b) || b.sib_prev != prev || b.parent != blocks_[static_cast<size_t>(head)].parent ||
          tokens(id)[0] != tokens(head)[0])
        return "family list of block " + std::to_string(head) + " is broken at block " +
               std::to_string(id);
      prev = id;
    }
  }
  if (in_families != keyed + tails)
    return "family lists hold " + std::to_string(in_families) + " blocks for " +
           std::to_string(keyed + tails) + " keyed blocks and tails";
  int32_t entries = 0;
  for (const int32_t id : index_) {
    if (id < 0) continue;
    ++entries;
    if (id >= num_blocks() || !blocks_[static_cast<size_t>(id)].keyed)
      return "index entry " + std::to_string(id) + " is not a keyed block";
  }
  if (entries != keyed)
    return "index holds " + std::to_string(entries) + " entries for " + std::to_string(keyed) +
           " keyed blocks";
  // Walk the free list: well linked, exactly the ref-0 blocks, unkeyed ones before keyed ones.
  int32_t n = 0, prev = -1;
  bool seen_kept = false;
  for (int32_t id = head_; id >= 0; id = blocks_[static_cast<size_t>(id)].next) {
    if (++n > num_blocks()) return "free list has a cycle";
    const Block& b = blocks_[static_cast<size_t>(id)];
    if (b.prev != prev) return "free list: bad prev link at block " + std::to_string(id);
    if (!b.on_free_list || b.ref != 0) return "free list holds a used block " + std::to_string(id);
    if (kept(b))
      seen_kept = true;
    else if (seen_kept)
      return "free list: free block " + std::to_string(id) + " after a kept one";
    prev = id;
  }
  if (prev != tail_) return "free list: tail mismatch";
  if (n != free + cached) return "free list length " + std::to_string(n) + " != free + cached";
  return {};
}

size_t BlockPool::predict_bytes(const BlockPoolConfig& c) {
  return static_cast<size_t>(c.num_blocks) * sizeof(Block) +
         static_cast<size_t>(c.num_blocks) * static_cast<size_t>(c.block_tokens) * sizeof(int32_t) +
         2 * index_capacity(c.num_blocks) * sizeof(int32_t);  // the key and family indexes
}

size_t BlockPool::bytes() const {
  return blocks_.capacity() * sizeof(Block) + tokens_.capacity() * sizeof(int32_t) +
         (index_.capacity() + families_.capacity()) * sizeof(int32_t);
}

}  // namespace kvcache
