// RemoteTier: the prefix cache's shared tier on a key-value store (Redis, standalone or Cluster:
// `serve --kv-remote redis://...`), so that several servers reuse each other's prefixes, as
// LMCache's Redis backend and SGLang's HiCache L3 do. Blocks go in behind the request path and
// come back before prefill, verified; a fault of the store is a miss, never a wrong answer.
//
// Objects: one per block and layer group, the block record (cache/block_record.h, the disk
// tier's file bytes) under
//     "<prefix><layout fingerprint hex>:<block key hex>:g<group>"   (prefix default "kvc:")
// The layout fingerprint (RemoteTierOptions::fingerprint; runtime/engine.h open_remote_tier)
// folds the model's and the tokenizer's fingerprints, the KV dtype, block_tokens and the
// store's page layout; the block key is the pool's hash chain, which folds the tenant's salt.
// Eviction is the store's own (Redis: maxmemory-policy allkeys-lru); an optional TTL bounds age.
//
// Write-behind: the tier is a BlockEventSink (cache/block_events.h). on_stored of a block
// computed, restored from a session or loaded from disk (never one loaded from this tier)
// copies it into a record now (the pages are valid during the call only) and queues it; a
// writer thread seals the records (checksum) and SETs them in batches with its own client.
// Beyond max_pending_write_bytes queued, or while the breaker is open, records are dropped and
// counted: the store's thread never waits. A small LRU of keys known to be in the store
// (written or read) avoids sending a block twice.
//
// Lookup: lookup() queues a request (the key chain of blocks [first, last) of every group, and
// their tokens) and returns at once; a lookup thread GETs every key in one pipelined call with
// the deadline, verifies each record (fingerprint, key, group, tokens, size, checksum: a
// failure is a miss, counted corrupt) and keeps the longest run of blocks that every group
// has, from `first`. The result (the records, their payloads verified) is queued for
// take_results(), and the on_result callback (the engine's wake-up) runs.
//
// Circuit breaker (both threads): after `breaker_failures` consecutive failed calls (a key
// ended kError, or a SET not acknowledged) it opens: lookups answer a miss at once and writes
// are dropped for `breaker_open_seconds`; then it is half-open: the next call is a probe, and
// its outcome closes or reopens it.
//
// Thread-safety: on_stored / on_removed / on_cleared come on the store's thread; lookup,
// take_results, stats and flush may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/block_events.h"
#include "cache/block_pool.h"
#include "core/digest.h"
#include "core/kv_client.h"

namespace kvcache {

struct RemoteTierOptions {
  // Makes the clients (one per thread: the lookup thread and the writer each call it once, when
  // they start; a throw counts as a failed call). Required.
  std::function<std::unique_ptr<KvClient>()> make_client;
  Digest128 fingerprint;     // the layout fingerprint (see above)
  int32_t block_tokens = 0;  // tokens per block (>= 1)
  // A lookup fetches its blocks in chunks of at most lookup_chunk_bytes (at least one block per
  // group), one pipelined GET call each, and each call has deadline_seconds: a store that stops
  // answering is noticed within one deadline, while a long prefix from a healthy store arrives
  // whole (a 2,000-token prefix of a 125M model is ~24-48 MB, which no 50 ms bound fits, yet is
  // worth far more than its transfer: its prefill takes seconds). The first chunk that is not
  // all hits ends the lookup.
  double deadline_seconds = 0.050;                 // per GET call (one chunk)
  uint64_t lookup_chunk_bytes = 4ull << 20;        // payload bytes per GET call
  double write_deadline_seconds = 0.200;           // per batch of SETs
  int32_t breaker_failures = 3;                    // consecutive failed calls that open it
  double breaker_open_seconds = 2.0;               // open this long, then half-open
  uint64_t max_pending_write_bytes = 64ull << 20;  // records queued for writing
  int64_t ttl_ms = 0;                              // > 0: the objects expire (PX)
  std::string key_prefix = "kvc:";
  size_t known_keys = 65536;  // the LRU of keys known to be stored
  size_t write_batch = 16;    // records per SET call
  // How many GET calls a lookup of `blocks` blocks of `block_bytes` payload bytes each (every
  // group together) takes: the engine's bound on a lookup's time is that many deadlines.
  int64_t lookup_calls(int64_t blocks, uint64_t block_bytes) const;
};

enum class BreakerState : int { kClosed = 0, kOpen = 1, kHalfOpen = 2 };
const char* breaker_state_name(BreakerState s);  // "closed", "open", "half-open"

struct RemoteTierStats {
  int64_t lookups = 0;                   // lookup requests answered
  int64_t hit_blocks = 0;                // blocks found and verified in every group (the run kept)
  int64_t miss_blocks = 0;               // blocks asked for and not kept
  int64_t corrupt = 0;                   // records that failed verification (misses too)
  int64_t errors = 0;                    // calls that failed (a key kError, a SET not acknowledged)
  int64_t timeouts = 0;                  // of which reached their deadline
  int64_t writes_stored = 0;             // records acknowledged by the store
  int64_t writes_dropped = 0;            // records dropped (budget, breaker open, a failed SET)
  int64_t writes_skipped = 0;            // records not sent: their key was known to be stored
  uint64_t bytes_in = 0, bytes_out = 0;  // record bytes received (hits) and sent
  uint64_t pending_write_bytes = 0;      // queued now
  double lookup_seconds = 0;             // time spent in lookups (on the lookup thread)
  BreakerState breaker = BreakerState::kClosed;
  int64_t breaker_opens = 0;
  int64_t lookups_refused = 0;  // answered a miss at once (breaker open)
};

// A request for blocks [first_block, first_block + n) of a prompt.
struct RemoteLookup {
  uint64_t id = 0;  // the caller's (the engine's request id), echoed in the result
  int64_t first_block = 0;
  // [group][n]: the block keys (the pool's chain, salt folded in). A group with no keys (a
  // group the caller does not fetch) is skipped.
  std::vector<std::vector<BlockKey>> keys;
  std::vector<size_t> payload_bytes;  // [group]: the size of a block's payload
  std::vector<int32_t> tokens;        // [n * block_tokens]: the blocks' tokens
};

struct RemoteResult {
  uint64_t id = 0;
  int64_t first_block = 0;
  int64_t blocks = 0;  // blocks [first_block, first_block + blocks) verified in every group
  // [group][blocks]: verified records (empty groups stay empty); payload(g, i) views one.
  std::vector<std::vector<std::vector<std::byte>>> records;
  size_t head_bytes = 0;              // the records' payload offset
  std::vector<size_t> payload_bytes;  // [group]
  std::span<const std::byte> payload(size_t g, size_t i) const {
    return {records[g][i].data() + head_bytes, payload_bytes[g]};
  }
};

class RemoteTier : public BlockEventSink {
 public:
  // Starts the lookup and writer threads (no connection yet: each client connects on its first
  // call). Error(kInvalidArgument) for a missing factory, block_tokens < 1, a deadline <= 0.
  explicit RemoteTier(RemoteTierOptions options);
  ~RemoteTier() override;  // stops the threads (queued writes are dropped)
  RemoteTier(const RemoteTier&) = delete;
  RemoteTier& operator=(const RemoteTier&) = delete;

  // Queues a lookup; its result comes through take_results() (always: a miss, blocks 0, when
  // the breaker is open or the store fails). Never blocks on the network.
  void lookup(RemoteLookup request);
  // The results ready now (the caller matches them by id).
  std::vector<RemoteResult> take_results();
  // Called on the lookup thread after each result is queued (the engine wakes its loop).
  void set_on_result(std::function<void()> fn);

  // BlockEventSink.
  void on_stored(const StoredBlock& block) override;
  void on_removed(int32_t group, const BlockKey& key) override;
  void on_cleared() override;

  // Waits until every queued write was sent (or dropped), and every queued lookup answered.
  void flush();
  RemoteTierStats stats() const;
  const RemoteTierOptions& options() const { return options_; }
  // The object key of a block (see above).
  std::string object_key(const BlockKey& key, int32_t group) const;

 private:
  struct Impl;
  RemoteTierOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache
