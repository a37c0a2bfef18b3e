// Memory tiers and the copier that moves bytes between them.
//
// A CPU server's tiers are host RAM and local disk (an NVMe, or its page cache); a GPU's are
// device memory and host RAM (Tier::kDevice is named for that future backend and not used yet).
// TierCopier runs copies asynchronously on its own thread, in submission order, and counts each
// direction's bytes and time, so that the containers above it (cache/offloaded_layer.h, the
// prefix cache's disk tier cache/disk_tier.h) can overlap I/O with compute and report what it
// cost. Disk I/O is plain pread/pwrite on that thread (the choice and its measurement:
// docs/architecture.md, "Memory tiers").
//
// Usage:
//   TierCopier io("offload");
//   auto t = io.read(fd, offset, slot, n);   // returns at once
//   ... compute ...
//   io.wait(t);                              // the bytes are in `slot`, or Error(kIo)
//
// Ownership: the caller keeps every buffer alive and untouched until its job is done (wait(),
// done(), or the job's callback). Thread-safe: any thread may submit and wait.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace kvcache {

enum class Tier { kDevice, kHost, kDisk };
const char* tier_name(Tier t);  // "device", "host", "disk"

// One direction's totals: bytes moved, jobs run, nanoseconds the copier thread spent on them.
struct TierTransfer {
  uint64_t bytes = 0;
  uint64_t jobs = 0;
  uint64_t ns = 0;
};

struct TierCopierStats {
  TierTransfer to_disk;    // host -> disk (pwrite)
  TierTransfer from_disk;  // disk -> host (pread)
  TierTransfer in_host;    // host -> host (memcpy, or a job given as a function)
  uint64_t failed = 0;     // jobs that failed (their error went to wait() or the callback)
  uint64_t waits = 0;      // wait() calls that had to block (the copy was not done yet)
  uint64_t wait_ns = 0;    // time callers spent blocked in wait(): the copies compute did not hide
};

class TierCopier {
 public:
  using Ticket = uint64_t;
  // Called on the copier thread when a job ends: error is empty on success.
  using DoneFn = std::function<void(const std::string& error)>;

  explicit TierCopier(std::string name = "tier");
  ~TierCopier();  // runs every submitted job, then joins
  TierCopier(const TierCopier&) = delete;
  TierCopier& operator=(const TierCopier&) = delete;

  // Reads n bytes at `offset` of fd into dst. Short reads are retried; end of file before n
  // bytes is an error naming `what` (a path, for messages) and the offset.
  Ticket read(int fd, uint64_t offset, void* dst, size_t n, std::string_view what = "",
              DoneFn done = nullptr);
  // Writes n bytes of src at `offset` of fd (retried until complete).
  Ticket write(int fd, uint64_t offset, const void* src, size_t n, std::string_view what = "",
               DoneFn done = nullptr);
  // memcpy on the copier thread.
  Ticket copy(void* dst, const void* src, size_t n, DoneFn done = nullptr);
  // Any job: `run` throws kvcache::Error (or std::exception) to fail. Counted as from -> to with
  // `bytes` bytes.
  Ticket submit(Tier from, Tier to, size_t bytes, std::function<void()> run, DoneFn done = nullptr);

  // Blocks until job t is done. A job submitted without a callback that failed rethrows here as
  // Error(kIo) with its message (once). Waiting on a finished ticket returns at once.
  void wait(Ticket t);
  bool done(Ticket t) const;
  void drain();  // waits for every job submitted so far (errors stay for wait())
  TierCopierStats stats() const;
  const std::string& name() const { return name_; }

 private:
  struct Job {
    Ticket ticket = 0;
    Tier from = Tier::kHost, to = Tier::kHost;
    size_t bytes = 0;
    std::function<void()> run;
    DoneFn done;
  };
  Ticket enqueue(Job job);
  void loop();

  std::string name_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job> queue_;
  Ticket next_ = 1;                       // the next ticket handed out
  Ticket completed_ = 0;                  // every ticket <= completed_ is done (FIFO)
  std::map<Ticket, std::string> errors_;  // failed jobs without a callback, until waited
  TierCopierStats stats_;
  bool stop_ = false;
  std::thread thread_;
};

// pread/pwrite loops for callers that do I/O on their own thread (same error messages).
void read_exact(int fd, uint64_t offset, void* dst, size_t n, std::string_view what);
void write_exact(int fd, uint64_t offset, const void* src, size_t n, std::string_view what);

}  // namespace kvcache
