// BlockEventSink: what the paged store tells the outside about its prefix index — a full block
// stored under its key, a key removed, everything cleared. Consumers: the KV events publisher
// (server/kv_events.h, vLLM's BlockStored / BlockRemoved / AllBlocksCleared for KV-aware
// routers) and the shared remote tier's write-behind (cache/remote_tier.h), which reads the
// stored block's pages during the call.
//
// Calls come on the store's (the runtime's) thread, inside the store's operations: a sink must
// be quick and must not call back into the store. Pages named by `pages` are valid during the
// call only (the block may be evicted and reused right after).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "cache/block_pool.h"

namespace kvcache {

// Where a newly stored block's content came from.
enum class BlockSource : uint8_t {
  kComputed,  // a forward wrote it
  kDisk,      // loaded from the disk tier (cache/disk_tier.h)
  kRemote,    // loaded from the shared remote tier (cache/remote_tier.h)
  kSession,   // restored from a session / slot file
};
const char* block_source_name(BlockSource s);  // "computed", "disk", "remote", "session"

struct StoredBlock {
  int32_t group = 0;  // layer group (PagedKVStore::group)
  int32_t id = 0;     // block id in that group's pool
  BlockKey key, parent;
  std::span<const int32_t> tokens;  // [block_tokens]
  BlockSource source = BlockSource::kComputed;
  // The block's pages, in the disk tier's payload order (every page-owning layer of the group,
  // K then V; K only for K==V layers).
  std::span<const std::span<std::byte>> pages;
};

class BlockEventSink {
 public:
  virtual ~BlockEventSink() = default;
  // A full block was indexed under a key the pool did not hold.
  virtual void on_stored(const StoredBlock& block) = 0;
  // The pool dropped `key` (LRU eviction, a crop over it, a tier load that failed). Not called
  // for the keys that clear_prefix_cache() drops: on_cleared() stands for all of them.
  virtual void on_removed(int32_t group, const BlockKey& key) = 0;
  // Every key of every group was dropped (PagedKVStore::clear_prefix_cache).
  virtual void on_cleared() = 0;
};

}  // namespace kvcache
