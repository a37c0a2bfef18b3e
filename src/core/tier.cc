#include "core/tier.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <utility>

#include "core/error.h"

namespace kvcache {

const char* tier_name(Tier t) {
  switch (t) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kDisk:
      return "disk";
  }
  return "?";
}

namespace {
std::string where(std::string_view what, int fd, uint64_t offset) {
  return (what.empty() ? "fd " + std::to_string(fd) : std::string(what)) + " at offset " +
         std::to_string(offset);
}
uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}
}  // namespace

void read_exact(int fd, uint64_t offset, void* dst, size_t n, std::string_view what) {
  auto* p = static_cast<char*>(dst);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, p + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::kIo, "read of " + std::to_string(n) + " bytes from " +
                                      where(what, fd, offset) + " failed: " + std::strerror(errno));
    }
    if (r == 0) {
      throw Error(ErrorKind::kIo, "read of " + std::to_string(n) + " bytes from " +
                                      where(what, fd, offset) + " ended after " +
                                      std::to_string(got) + " bytes (file truncated)");
    }
    got += static_cast<size_t>(r);
  }
}

void write_exact(int fd, uint64_t offset, const void* src, size_t n, std::string_view what) {
  const auto* p = static_cast<const char*>(src);
  size_t put = 0;
  while (put < n) {
    const ssize_t r = ::pwrite(fd, p + put, n - put, static_cast<off_t>(offset + put));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorKind::kIo, "write of " + std::to_string(n) + " bytes to " +
                                      where(what, fd, offset) + " failed: " + std::strerror(errno));
    }
    put += static_cast<size_t>(r);
  }
}

TierCopier::TierCopier(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { loop(); });
}

TierCopier::~TierCopier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

TierCopier::Ticket TierCopier::enqueue(Job job) {
  Ticket t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    KV_CHECK(!stop_, "TierCopier " + name_ + ": submit after shutdown");
    t = next_++;
    job.ticket = t;
    queue_.push_back(std::move(job));
  }
  work_cv_.notify_one();
  return t;
}

TierCopier::Ticket TierCopier::read(int fd, uint64_t offset, void* dst, size_t n,
                                    std::string_view what, DoneFn done) {
  std::string label(what);
  return enqueue(Job{0, Tier::kDisk, Tier::kHost, n, [=] { read_exact(fd, offset, dst, n, label); },
                     std::move(done)});
}

TierCopier::Ticket TierCopier::write(int fd, uint64_t offset, const void* src, size_t n,
                                     std::string_view what, DoneFn done) {
  std::string label(what);
  return enqueue(Job{0, Tier::kHost, Tier::kDisk, n,
                     [=] { write_exact(fd, offset, src, n, label); }, std::move(done)});
}

TierCopier::Ticket TierCopier::copy(void* dst, const void* src, size_t n, DoneFn done) {
  return enqueue(
      Job{0, Tier::kHost, Tier::kHost, n, [=] { std::memcpy(dst, src, n); }, std::move(done)});
}

TierCopier::Ticket TierCopier::submit(Tier from, Tier to, size_t bytes, std::function<void()> run,
                                      DoneFn done) {
  return enqueue(Job{0, from, to, bytes, std::move(run), std::move(done)});
}

void TierCopier::loop() {
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    std::string error;
    const uint64_t t0 = now_ns();
    try {
      job.run();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "copy failed";
    }
    const uint64_t dt = now_ns() - t0;
    if (job.done) {
      try {
        job.done(error);
      } catch (const std::exception& e) {
        // A callback must not throw: the copier cannot tell anyone. A bug.
        KV_CHECK(false, "TierCopier " + name_ + ": a done callback threw: " + e.what());
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      TierTransfer& tr = job.to == Tier::kDisk     ? stats_.to_disk
                         : job.from == Tier::kDisk ? stats_.from_disk
                                                   : stats_.in_host;
      tr.jobs += 1;
      tr.ns += dt;
      if (error.empty()) {
        tr.bytes += job.bytes;
      } else {
        stats_.failed += 1;
        if (!job.done) errors_[job.ticket] = error;
      }
      completed_ = job.ticket;
    }
    done_cv_.notify_all();
  }
}

bool TierCopier::done(Ticket t) const {
  std::lock_guard<std::mutex> lock(mu_);
  return t <= completed_;
}

void TierCopier::wait(Ticket t) {
  std::unique_lock<std::mutex> lock(mu_);
  KV_CHECK(t < next_, "TierCopier " + name_ + ": wait on a ticket never handed out");
  if (t > completed_) {
    const uint64_t t0 = now_ns();
    done_cv_.wait(lock, [&] { return t <= completed_; });
    stats_.waits += 1;
    stats_.wait_ns += now_ns() - t0;
  }
  const auto it = errors_.find(t);
  if (it != errors_.end()) {
    const std::string message = it->second;
    errors_.erase(it);
    throw Error(ErrorKind::kIo, message);
  }
}

void TierCopier::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  const Ticket last = next_ - 1;
  done_cv_.wait(lock, [&] { return last <= completed_; });
}

TierCopierStats TierCopier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace kvcache
