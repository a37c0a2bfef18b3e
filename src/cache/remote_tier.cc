#include "cache/remote_tier.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "cache/block_record.h"
#include "core/error.h"

namespace kvcache {

namespace {

using Clock = std::chrono::steady_clock;

using block_record::BlockId;
using block_record::BlockIdHash;

// A bounded LRU set of block ids.
class KnownKeys {
 public:
  explicit KnownKeys(size_t capacity) : capacity_(capacity) {}
  bool contains(const BlockId& id) {
    const auto it = map_.find(id);
    if (it == map_.end()) return false;
    lru_.splice(lru_.begin(), lru_, it->second);
    return true;
  }
  void add(const BlockId& id) {
    if (capacity_ == 0 || contains(id)) return;
    lru_.push_front(id);
    map_.emplace(id, lru_.begin());
    if (map_.size() > capacity_) {
      map_.erase(lru_.back());
      lru_.pop_back();
    }
  }
  void erase(const BlockId& id) {
    const auto it = map_.find(id);
    if (it == map_.end()) return;
    lru_.erase(it->second);
    map_.erase(it);
  }
  void clear() {
    map_.clear();
    lru_.clear();
  }

 private:
  size_t capacity_;
  std::list<BlockId> lru_;
  std::unordered_map<BlockId, std::list<BlockId>::iterator, BlockIdHash> map_;
};

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

const char* breaker_state_name(BreakerState s) {
  switch (s) {
    case BreakerState::kClosed:
      return "closed";
    case BreakerState::kOpen:
      return "open";
    case BreakerState::kHalfOpen:
      return "half-open";
  }
  return "?";
}

struct RemoteTier::Impl {
  struct Write {
    BlockId id;
    std::vector<std::byte> record;  // unsealed until the writer seals it
  };

  RemoteTierOptions opt;
  mutable std::mutex mu;
  std::condition_variable cv;       // work for the threads
  std::condition_variable idle_cv;  // flush()
  bool stop = false;
  std::deque<RemoteLookup> lookups;
  std::deque<Write> writes;
  int busy = 0;  // jobs taken off the queues and not finished
  std::vector<RemoteResult> results;
  std::mutex cb_mu;                 // held while on_result runs (set_on_result waits for it)
  std::function<void()> on_result;  // under cb_mu
  KnownKeys known;
  RemoteTierStats stats;
  // Breaker.
  int32_t failures = 0;
  Clock::time_point open_until;
  bool probe_in_flight = false;
  std::thread lookup_thread, writer_thread;

  explicit Impl(RemoteTierOptions o) : opt(std::move(o)), known(opt.known_keys) {}

  std::string object_key(const BlockKey& key, int32_t group) const {
    return opt.key_prefix + opt.fingerprint.hex() + ":" + Digest128{key.hi, key.lo}.hex() + ":g" +
           std::to_string(group);
  }

  // Whether a call may go out now (under mu). Open past its time: half-open, this call probes.
  bool allow() {
    switch (stats.breaker) {
      case BreakerState::kClosed:
        return true;
      case BreakerState::kOpen:
        if (Clock::now() < open_until) return false;
        stats.breaker = BreakerState::kHalfOpen;
        probe_in_flight = true;
        return true;
      case BreakerState::kHalfOpen:
        if (probe_in_flight) return false;
        probe_in_flight = true;
        return true;
    }
    return false;
  }
  void record(bool ok) {  // under mu: a call's outcome
    probe_in_flight = false;
    if (ok) {
      failures = 0;
      stats.breaker = BreakerState::kClosed;
      return;
    }
    ++failures;
    if (stats.breaker == BreakerState::kHalfOpen || failures >= opt.breaker_failures) {
      if (stats.breaker != BreakerState::kOpen) ++stats.breaker_opens;
      stats.breaker = BreakerState::kOpen;
      open_until = Clock::now() + seconds(opt.breaker_open_seconds);
    }
  }

  void done_job() {  // under mu
    --busy;
    if (busy == 0 && lookups.empty() && writes.empty()) idle_cv.notify_all();
  }

  // A client for this thread, made on first use; nullptr when the factory failed (retried at
  // the next call).
  std::unique_ptr<KvClient> client_or_null() {
    try {
      return opt.make_client();
    } catch (const std::exception&) {
      return nullptr;
    }
  }

  void deliver(RemoteResult r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      results.push_back(std::move(r));
    }
    std::lock_guard<std::mutex> lock(cb_mu);
    if (on_result) on_result();
  }

  void lookup_loop() {
    std::unique_ptr<KvClient> client;
    for (;;) {
      RemoteLookup req;
      bool allowed = false;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !lookups.empty(); });
        if (stop) return;
        req = std::move(lookups.front());
        lookups.pop_front();
        ++busy;
        allowed = allow();
        if (!allowed) ++stats.lookups_refused;
      }
      RemoteResult res = allowed ? run_lookup(client, req) : miss(req);
      if (!allowed) {
        std::lock_guard<std::mutex> lock(mu);
        ++stats.lookups;
        stats.miss_blocks += blocks_of(req);
      }
      deliver(std::move(res));
      std::lock_guard<std::mutex> lock(mu);
      done_job();
    }
  }

  int64_t blocks_of(const RemoteLookup& req) const {
    for (const auto& k : req.keys)
      if (!k.empty()) return static_cast<int64_t>(k.size());
    return 0;
  }

  RemoteResult miss(const RemoteLookup& req) const {
    RemoteResult r;
    r.id = req.id;
    r.first_block = req.first_block;
    r.records.resize(req.keys.size());
    r.head_bytes = block_record::head_bytes(opt.block_tokens);
    r.payload_bytes = req.payload_bytes;
    return r;
  }

  RemoteResult run_lookup(std::unique_ptr<KvClient>& client, const RemoteLookup& req) {
    const auto t0 = Clock::now();
    RemoteResult res = miss(req);
    const int64_t n = blocks_of(req);
    const size_t G = req.keys.size();
    const auto bt = static_cast<size_t>(opt.block_tokens);
    uint64_t block_bytes = 0;  // one block of every group that has keys
    for (size_t g = 0; g < G; ++g)
      if (!req.keys[g].empty()) block_bytes += req.payload_bytes[g];
    const int64_t per_call = std::max<int64_t>(
        1, static_cast<int64_t>(opt.lookup_chunk_bytes / std::max<uint64_t>(1, block_bytes)));
    if (!client) client = client_or_null();
    bool call_ok = client != nullptr, timed_out = false;
    int64_t run = 0, corrupt = 0;
    uint64_t bytes_in = 0;
    std::vector<std::string> keys;
    std::vector<std::pair<size_t, size_t>> where;  // key -> (group, block)
    std::vector<std::vector<std::byte>> values;
    std::vector<KvStatus> status;
    // Chunk by chunk, block-major: blocks [lo, hi) of every group in one call; a chunk that is
    // not all verified hits ends the run there.
    for (int64_t lo = 0; client && call_ok && run == lo && lo < n; lo += per_call) {
      const int64_t hi = std::min(n, lo + per_call);
      keys.clear();
      where.clear();
      for (size_t g = 0; g < G; ++g) {
        if (req.keys[g].empty()) continue;
        for (auto i = static_cast<size_t>(lo); i < static_cast<size_t>(hi); ++i) {
          keys.push_back(object_key(req.keys[g][i], static_cast<int32_t>(g)));
          where.emplace_back(g, i);
        }
      }
      values.assign(keys.size(), {});
      status.assign(keys.size(), KvStatus::kError);
      const Clock::time_point deadline = Clock::now() + seconds(opt.deadline_seconds);
      try {
        client->get(keys, deadline, [&](size_t i, KvStatus st, std::span<const std::byte> v) {
          status[i] = st;
          if (st == KvStatus::kHit) values[i].assign(v.begin(), v.end());
        });
      } catch (const std::exception&) {
        // The contract says faults are results; a throw is a client bug, still not our reply's.
        std::fill(status.begin(), status.end(), KvStatus::kError);
      }
      call_ok = std::none_of(status.begin(), status.end(),
                             [](KvStatus s) { return s == KvStatus::kError; });
      timed_out = !call_ok && Clock::now() >= deadline;
      // good[b - lo]: block b verified in every group that has keys.
      std::vector<uint8_t> good(static_cast<size_t>(hi - lo), 1);
      for (size_t k = 0; k < keys.size(); ++k) {
        const auto [g, i] = where[k];
        uint8_t& ok = good[i - static_cast<size_t>(lo)];
        if (status[k] != KvStatus::kHit) {
          ok = 0;
          continue;
        }
        bytes_in += values[k].size();
        const block_record::Expect e{opt.fingerprint, req.keys[g][i], static_cast<int32_t>(g),
                                     std::span<const int32_t>(req.tokens).subspan(i * bt, bt),
                                     req.payload_bytes[g]};
        if (block_record::verify(e, values[k]) != block_record::Verdict::kOk) {
          ++corrupt;
          ok = 0;
        }
      }
      int64_t kept = 0;
      while (kept < hi - lo && good[static_cast<size_t>(kept)]) ++kept;
      for (size_t k = 0; k < keys.size(); ++k) {
        const auto [g, i] = where[k];
        if (static_cast<int64_t>(i) < lo + kept) res.records[g].push_back(std::move(values[k]));
      }
      run = lo + kept;
    }
    res.blocks = run;
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::lock_guard<std::mutex> lock(mu);
    record(call_ok);
    ++stats.lookups;
    stats.hit_blocks += run;
    stats.miss_blocks += n - run;
    stats.corrupt += corrupt;
    stats.errors += call_ok ? 0 : 1;
    stats.timeouts += timed_out ? 1 : 0;
    stats.bytes_in += bytes_in;
    stats.lookup_seconds += secs;
    for (size_t g = 0; g < G; ++g)
      for (int64_t i = 0; i < run && !req.keys[g].empty(); ++i)
        known.add(BlockId{req.keys[g][static_cast<size_t>(i)], static_cast<int32_t>(g)});
    return res;
  }

  void writer_loop() {
    std::unique_ptr<KvClient> client;
    std::vector<Write> batch;
    std::vector<std::string> keys;
    std::vector<std::span<const std::byte>> values;
    for (;;) {
      batch.clear();
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stop || !writes.empty(); });
        if (stop) return;
        while (!writes.empty() && batch.size() < std::max<size_t>(1, opt.write_batch)) {
          batch.push_back(std::move(writes.front()));
          writes.pop_front();
        }
        ++busy;
      }
      uint64_t bytes = 0;
      for (const Write& w : batch) bytes += w.record.size();
      bool allowed;
      {
        std::lock_guard<std::mutex> lock(mu);
        allowed = allow();
      }
      size_t acked = 0;
      bool ok = false;
      if (allowed) {
        keys.clear();
        values.clear();
        for (Write& w : batch) {
          block_record::seal(w.record);
          keys.push_back(object_key(w.id.key, w.id.group));
          values.emplace_back(w.record);
        }
        if (!client) client = client_or_null();
        if (client) {
          try {
            acked = client->set(keys, values, Clock::now() + seconds(opt.write_deadline_seconds),
                                opt.ttl_ms);
          } catch (const std::exception&) {
            acked = 0;
          }
        }
        ok = acked == batch.size();
      }
      std::lock_guard<std::mutex> lock(mu);
      if (allowed) {
        record(ok);
        if (!ok) ++stats.errors;
      }
      stats.pending_write_bytes -= bytes;
      stats.writes_stored += static_cast<int64_t>(acked);
      stats.writes_dropped += static_cast<int64_t>(batch.size() - acked);
      if (ok) {
        stats.bytes_out += bytes;
        for (const Write& w : batch) known.add(w.id);
      }
      done_job();
    }
  }
};

RemoteTier::RemoteTier(RemoteTierOptions options) : options_(std::move(options)) {
  if (!options_.make_client)
    throw Error(ErrorKind::kInvalidArgument, "remote tier: no client factory given");
  if (options_.block_tokens < 1)
    throw Error(ErrorKind::kInvalidArgument, "remote tier: block_tokens is " +
                                                 std::to_string(options_.block_tokens) +
                                                 "; it must be at least 1");
  if (!(options_.deadline_seconds > 0) || !(options_.write_deadline_seconds > 0))
    throw Error(ErrorKind::kInvalidArgument, "remote tier: the deadlines must be > 0 seconds");
  if (options_.breaker_failures < 1) options_.breaker_failures = 1;
  impl_ = std::make_unique<Impl>(options_);
  impl_->lookup_thread = std::thread([this] { impl_->lookup_loop(); });
  impl_->writer_thread = std::thread([this] { impl_->writer_loop(); });
}

RemoteTier::~RemoteTier() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->lookup_thread.join();
  impl_->writer_thread.join();
}

int64_t RemoteTierOptions::lookup_calls(int64_t blocks, uint64_t block_bytes) const {
  const auto per_call = std::max<int64_t>(
      1, static_cast<int64_t>(lookup_chunk_bytes / std::max<uint64_t>(1, block_bytes)));
  return std::max<int64_t>(1, (blocks + per_call - 1) / per_call);
}

std::string RemoteTier::object_key(const BlockKey& key, int32_t group) const {
  return impl_->object_key(key, group);
}

void RemoteTier::lookup(RemoteLookup request) {
  KV_CHECK(request.payload_bytes.size() == request.keys.size(),
           "RemoteTier::lookup: payload_bytes and keys disagree on the groups");
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->lookups.push_back(std::move(request));
  }
  impl_->cv.notify_all();
}

std::vector<RemoteResult> RemoteTier::take_results() {
  std::vector<RemoteResult> out;
  std::lock_guard<std::mutex> lock(impl_->mu);
  out.swap(impl_->results);
  return out;
}

void RemoteTier::set_on_result(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(impl_->cb_mu);
  impl_->on_result = std::move(fn);
}

void RemoteTier::on_stored(const StoredBlock& block) {
  if (block.source == BlockSource::kRemote) return;  // it came from here
  Impl& m = *impl_;
  size_t payload_bytes = 0;
  for (const auto& p : block.pages) payload_bytes += p.size();
  const size_t bytes =
      block_record::record_bytes(static_cast<int32_t>(block.tokens.size()), payload_bytes);
  const BlockId id{block.key, block.group};
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.known.contains(id)) {
      ++m.stats.writes_skipped;
      return;
    }
    // Open: dropped without a look (the half-open probe is the writer's or a lookup's).
    if (m.stats.breaker == BreakerState::kOpen && Clock::now() < m.open_until) {
      ++m.stats.writes_dropped;
      return;
    }
    if (m.stats.pending_write_bytes + bytes > options_.max_pending_write_bytes) {
      ++m.stats.writes_dropped;
      return;
    }
    m.stats.pending_write_bytes += bytes;
  }
  Impl::Write w;
  w.id = id;
  w.record.resize(bytes);
  const std::vector<std::span<const std::byte>> parts(block.pages.begin(), block.pages.end());
  block_record::write_unsealed(
      {options_.fingerprint, block.key, block.parent, block.group, block.tokens}, parts, w.record);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.writes.push_back(std::move(w));
  }
  m.cv.notify_all();
}

void RemoteTier::on_removed(int32_t, const BlockKey&) {
  // The shared store keeps its copy (its own LRU evicts): a block another server computed is
  // worth keeping after this one dropped it.
}

void RemoteTier::on_cleared() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->known.clear();
}

void RemoteTier::flush() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->idle_cv.wait(
      lock, [&] { return impl_->busy == 0 && impl_->lookups.empty() && impl_->writes.empty(); });
}

RemoteTierStats RemoteTier::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  RemoteTierStats s = impl_->stats;
  // An open breaker past its time is half-open (the next call probes).
  if (s.breaker == BreakerState::kOpen && Clock::now() >= impl_->open_until)
    s.breaker = BreakerState::kHalfOpen;
  return s;
}

}  // namespace kvcache
