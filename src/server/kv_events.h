// KV events: the paged store's prefix index, published over ZeroMQ in vLLM's KVEventBatch wire
// format, so that KV-aware routers written for vLLM (llm-d's kv-cache manager, vLLM's
// examples/online_serving/kv_events_subscriber.py) can follow which prefixes this server holds.
//
// Wire format, as read in vllm-project/vllm vllm/distributed/kv_events.py (commits b4e69e0 and
// 0181ea3; the line numbers below are 0181ea3's):
// - Sockets (ZmqEventPublisher, ~L255-L445): a PUB socket sends each batch as a three-frame
//   message (topic, sequence number as 8 bytes big-endian starting at 0, msgpack payload); the
//   optional ROUTER replay socket takes [identity, "", start_seq (8 bytes big-endian)] and
//   answers, for every buffered batch with seq >= start_seq, [identity, "", seq, payload], then
//   the end marker [identity, "", -1 as 8 signed big-endian bytes, ""] (_service_replay).
// - Payload: msgspec structs with array_like=True, omit_defaults=True, tag=True (b4e69e0 L22-L37;
//   vLLM's PR #42892 later dropped array_like from the events, which newer vLLM sends as maps
//   under a "type" key: we send the positional arrays every vLLM consumer we know of reads,
//   llm-d's kv-cache manager included, which reads both). A batch is
//     [ts (float64 seconds), [event, ...], data_parallel_rank (0)]
//   (EventBatch ~L25-L32; ZmqEventPublisher.publish() sets data_parallel_rank to the rank, 0
//   here, so vLLM always sends it). Events, the tag first, trailing default fields omitted:
//     ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
//      lora_name, extra_keys, group_idx, kv_cache_spec_kind(, kv_cache_spec_sliding_window)]
//     ["BlockRemoved", block_hashes, medium, group_idx]
//     ["AllBlocksCleared"]
//   (BlockStored ~L47-L72, BlockRemoved ~L91-L94, AllBlocksCleared ~L106). We send lora_id,
//   lora_name and extra_keys nil, medium "CPU" (our blocks live in host RAM; vLLM sends "GPU"
//   for its device pool and "CPU" for offloaded blocks), parent_block_hash nil for a
//   sequence's first block.
// - Block hashes: vLLM's ExternalBlockHash is bytes | int. Our BlockKey is a 128-bit digest,
//   sent as msgpack bin of 16 bytes: hi then lo, each big-endian. Consumers that fold bytes
//   hashes to 64 bits by their last 8 bytes (llm-d) get `lo`.
// - Groups: group_idx is the store's layer group (PagedKVStore::group), kv_cache_spec_kind
//   vLLM's KVCacheSpecKind value: "full_attention", "sliding_window" (with
//   kv_cache_spec_sliding_window = W), "unknown" for compressed groups (vLLM has no kind for
//   them). A router that only tracks full-attention prefixes filters on the kind (group 0 is
//   the first layer's kind: sliding for Gemma 2);
//   consumers of the older 6-field layout ignore the trailing fields (msgspec's array_like
//   decoding drops extra trailing items unless forbid_unknown_fields).
// - Where a stored block came from (BlockSource) has no vLLM field and is not sent.
//
// Threads: the store calls on_stored / on_removed / on_cleared on its thread; they append to a
// bounded queue under a mutex and make no syscall (a full queue drops the event and counts it).
// The publisher thread wakes every flush_interval_ms, services replay requests, groups the
// queue into batches of at most max_batch_events block events, and sends them without
// blocking: a subscriber past its high-water mark loses the batch (counted as dropped; it
// keeps its sequence number and stays in the replay buffer, so the gap is visible and can be
// replayed).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cache/block_events.h"
#include "cache/paged_store.h"

namespace kvcache {

struct KvEventsOptions {
  std::string endpoint;         // PUB address to bind: tcp://host:port (port * = any), ipc://path
  std::string topic;            // first frame of every message (vLLM's default: "")
  std::string replay_endpoint;  // ROUTER address to bind for replay; empty: none
  double flush_interval_ms = 2;
  size_t max_batch_events = 256;  // block events per batch
  size_t max_pending = 100000;    // block events queued between flushes; more are dropped
  size_t replay_batches = 10000;  // batches kept for replay (vLLM's buffer_steps default)
  int send_hwm = 100000;          // PUB high-water mark, in messages (vLLM's default)
};

// Throws Error(kInvalidArgument) naming `flag` when `endpoint` is not tcp://HOST:PORT or
// ipc://PATH.
void check_kv_events_endpoint(const std::string& endpoint, const char* flag);

// One block-level change, as queued and as encoded (consecutive stored blocks of one chain and
// consecutive removals of one group share an event on the wire).
struct KvEvent {
  enum class Kind : uint8_t { kStored, kRemoved, kCleared };
  Kind kind = Kind::kStored;
  int32_t group = 0;
  std::vector<BlockKey> keys;   // stored / removed blocks, in order
  BlockKey parent;              // kStored: the first block's parent (all zero: none)
  std::vector<int32_t> tokens;  // kStored: every block's tokens, concatenated
  int32_t block_size = 0;       // kStored: tokens per block
};

// What the encoder needs of each group: vLLM's kind string and the window.
struct KvEventGroup {
  std::string kind = "full_attention";
  int64_t sliding_window = 0;  // > 0: sent as kv_cache_spec_sliding_window
};
std::vector<KvEventGroup> kv_event_groups(const PagedKVStore& store);

// The msgpack payload of one batch (see the format above).
std::string encode_kv_event_batch(double ts, const std::vector<KvEvent>& events,
                                  const std::vector<KvEventGroup>& groups);
// BlockKey as the 16 bytes sent on the wire.
std::string block_key_bytes(const BlockKey& key);

class KvEventPublisher : public BlockEventSink {
 public:
  // Binds the sockets (Error(kIo) naming the endpoint when that fails) and starts the
  // publisher thread.
  KvEventPublisher(const KvEventsOptions& options, std::vector<KvEventGroup> groups);
  ~KvEventPublisher() override;
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  void on_stored(const StoredBlock& block) override;
  void on_removed(int32_t group, const BlockKey& key) override;
  void on_cleared() override;

  // Flushes what is queued, stops the thread and closes the sockets; later events are
  // counted as dropped. Idempotent.
  void close();

  // The bound addresses (a tcp port given as * resolved).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  // Block events sent to the PUB socket (a stored or removed block counts one, a clear one).
  int64_t published() const { return published_.load(); }
  // Block events lost: the queue was full, a subscriber was past its high-water mark, or the
  // publisher was closed.
  int64_t dropped() const { return dropped_.load(); }
  int64_t batches() const { return batches_.load(); }

 private:
  struct Sockets;
  void push(KvEvent&& e, size_t blocks);
  void run();
  void flush();
  void service_replay();

  KvEventsOptions options_;
  std::vector<KvEventGroup> groups_;
  std::string endpoint_, replay_endpoint_;
  std::unique_ptr<Sockets> sockets_;
  std::mutex mu_;
  std::vector<KvEvent> pending_;  // guarded by mu_
  size_t pending_blocks_ = 0;     // guarded by mu_
  bool closed_ = false;           // guarded by mu_
  std::atomic<bool> stop_{false};
  std::thread thread_;
  uint64_t seq_ = 0;                                     // publisher thread only
  std::deque<std::pair<uint64_t, std::string>> replay_;  // publisher thread only
  std::atomic<int64_t> published_{0}, dropped_{0}, batches_{0};
};

// --- decoding (the `kvcache events` subscriber and the tests) ---------------------------------

// One event of a batch, whichever layout it came in (positional arrays, or vLLM's newer maps
// keyed by field name with the tag under "type"). Hashes as lowercase hex (bytes hashes) or
// the integer's 16 hex digits (int hashes).
struct KvEventView {
  std::string type;  // "BlockStored", "BlockRemoved", "AllBlocksCleared" (or what came)
  std::vector<std::string> block_hashes;
  std::optional<std::string> parent_block_hash;
  std::vector<int64_t> token_ids;
  int64_t block_size = 0;
  std::optional<std::string> medium;
  std::optional<int64_t> group_idx;
  std::optional<std::string> kv_cache_spec_kind;
  std::optional<int64_t> sliding_window;
};
struct KvEventBatchView {
  double ts = 0;
  std::vector<KvEventView> events;
  std::optional<int64_t> data_parallel_rank;
};
// Throws Error(kFormat) saying what is wrong when `payload` is not a KVEventBatch.
KvEventBatchView decode_kv_event_batch(std::string_view payload);
// One JSON object (one line) for an event of batch `seq`.
std::string kv_event_json(const KvEventView& e, uint64_t seq, double ts);
// One human-readable line.
std::string kv_event_line(const KvEventView& e, uint64_t seq);

}  // namespace kvcache
