// KvClient: a byte-value key-value store client with deadlines, the transport of the shared KV
// tier (cache/remote_tier.h). The one implementation is Redis, standalone or Cluster, over
// hiredis (make_redis_client, core/redis_client.cc); tests may substitute an in-memory one.
//
// Contract (every implementation):
// - Faults are results, never exceptions: a refused connection, a timeout, a server error
//   (-ERR, -CLUSTERDOWN, -LOADING, -OOM ...) or a protocol error makes the affected keys kError
//   and the call returns normally. Only programming errors (sizes that disagree) throw.
// - Every call returns by its deadline (plus the time to notice it: one poll interval). A
//   connection that timed out mid-reply is closed, since its next reply would belong to the
//   old request; the next call reconnects (at most once per call and node).
// - Cluster: keys are routed by their hash slot (CRC16 of the key, or of its {hash tag}, mod
//   16384) through the slot map read by CLUSTER SLOTS; requests to one node are pipelined, and
//   nodes are served concurrently (non-blocking sockets). A -MOVED reply updates the map (and
//   re-reads it) and retries on the named node; -ASK retries once there after ASKING. At most
//   max_redirects redirections per key, then kError. Standalone Redis (cluster support
//   disabled) is detected at the first connection and needs no map.
// - Not thread-safe: one client per thread (the tier's lookup thread and its writer each own
//   one).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache {

using SteadyTime = std::chrono::steady_clock::time_point;

enum class KvStatus { kHit, kMiss, kError };

struct KvClientStats {
  int64_t commands = 0;        // GET / SET commands sent (retries included)
  int64_t errors = 0;          // keys that ended kError
  int64_t timeouts = 0;        // calls that reached their deadline with keys unanswered
  int64_t moved = 0;           // -MOVED redirections followed
  int64_t asked = 0;           // -ASK redirections followed
  int64_t connects = 0;        // connections opened (the first ones included)
  int64_t slot_map_reads = 0;  // CLUSTER SLOTS reads
  uint64_t bytes_in = 0;       // value bytes received (hits)
  uint64_t bytes_out = 0;      // value bytes sent (sets)
};

class KvClient {
 public:
  virtual ~KvClient() = default;
  // GETs `keys` (pipelined per node) and calls on_value(i, status, value) exactly once per key
  // i, in any order, on the calling thread; `value` (kHit only) is valid during the call. Keys
  // unanswered at `deadline` end kError.
  using ValueFn = std::function<void(size_t i, KvStatus status, std::span<const std::byte> value)>;
  virtual void get(std::span<const std::string> keys, SteadyTime deadline,
                   const ValueFn& on_value) = 0;
  // SET keys[i] values[i] (PX ttl_ms when ttl_ms > 0), pipelined; the values are sent from the
  // caller's memory (no copy). Returns how many were acknowledged +OK by the deadline.
  virtual size_t set(std::span<const std::string> keys,
                     std::span<const std::span<const std::byte>> values, SteadyTime deadline,
                     int64_t ttl_ms = 0) = 0;
  virtual KvClientStats stats() const = 0;
  // "redis standalone 127.0.0.1:6379" / "redis cluster, 3 masters (127.0.0.1:7000, ...)", or
  // "redis (not connected yet: 127.0.0.1:7000)".
  virtual std::string describe() const = 0;
};

struct RedisOptions {
  struct Endpoint {
    std::string host;
    int port = 6379;
  };
  std::vector<Endpoint> seeds;  // tried in order until one answers (>= 1)
  std::string password;         // AUTH when not empty
  int max_redirects = 5;
  // A node that refused a connection or timed out is not retried before this long (a dead
  // master is not dialled at every call while the cluster fails over).
  double node_retry_seconds = 0.5;
};

// Parses `redis://host:port[,host:port...]` (also `redis://:password@host:port,...`; the port
// defaults to 6379). Error(kInvalidArgument) naming the bad part: another scheme, an empty
// host, a port outside 1..65535, a path or query (not supported).
RedisOptions parse_redis_url(const std::string& url);

// A client for `options` (no connection yet: the first call connects, within its deadline).
std::unique_ptr<KvClient> make_redis_client(const RedisOptions& options);

// The Redis Cluster hash slot of `key` (CRC16-CCITT/XMODEM mod 16384, {hash tag} rule), as
// Redis' cluster specification defines it.
uint16_t redis_key_slot(std::string_view key);

}  // namespace kvcache
