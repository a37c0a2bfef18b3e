// TierCopier: jobs run in submission order on the copier thread, wait() returns once the bytes
// are there, failures reach wait() (once) or the job's callback, and each direction is counted.
#include "core/tier.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"

namespace kvcache {
namespace {

// An unlinked temp file (nothing left behind).
int temp_fd() {
  char name[] = "/tmp/kvcache_tier_test_XXXXXX";
  const int fd = ::mkstemp(name);
  EXPECT_GE(fd, 0);
  ::unlink(name);
  return fd;
}

TEST(TierCopier, WritesThenReadsBackAndCountsBothDirections) {
  const int fd = temp_fd();
  std::vector<unsigned char> src(3 * 4096 + 17), dst(src.size(), 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
  TierCopier io("test");
  const auto w = io.write(fd, 100, src.data(), src.size(), "tmp");
  const auto r = io.read(fd, 100, dst.data(), dst.size(), "tmp");  // FIFO: after the write
  EXPECT_LT(w, r);
  io.wait(r);
  EXPECT_TRUE(io.done(w));
  EXPECT_EQ(src, dst);
  const TierCopierStats s = io.stats();
  EXPECT_EQ(s.to_disk.bytes, src.size());
  EXPECT_EQ(s.to_disk.jobs, 1u);
  EXPECT_EQ(s.from_disk.bytes, src.size());
  EXPECT_EQ(s.in_host.jobs, 0u);
  EXPECT_EQ(s.failed, 0u);
  ::close(fd);
}

TEST(TierCopier, ReadPastTheEndIsAnErrorReportedOnceByWait) {
  const int fd = temp_fd();
  const char data[10] = "123456789";
  ASSERT_EQ(::pwrite(fd, data, sizeof(data), 0), static_cast<ssize_t>(sizeof(data)));
  std::vector<char> out(64);
  TierCopier io;
  const auto t = io.read(fd, 0, out.data(), out.size(), "short.bin");
  try {
    io.wait(t);
    FAIL() << "a short read must throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("short.bin"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(io.wait(t));  // reported once
  EXPECT_EQ(io.stats().failed, 1u);
  EXPECT_EQ(io.stats().from_disk.bytes, 0u);  // failed bytes are not counted as moved
  ::close(fd);
}

TEST(TierCopier, CallbackGetsTheErrorInsteadOfWait) {
  TierCopier io;
  std::atomic<int> calls{0};
  std::string seen;
  std::vector<char> out(8);
  const auto t = io.read(-1, 0, out.data(), out.size(), "bad fd", [&](const std::string& error) {
    seen = error;
    calls.fetch_add(1);
  });
  EXPECT_NO_THROW(io.wait(t));
  EXPECT_EQ(calls.load(), 1);
  EXPECT_NE(seen.find("bad fd"), std::string::npos) << seen;
}

TEST(TierCopier, JobsRunInOrderAndDrainWaitsForAll) {
  TierCopier io;
  std::vector<int> order;
  for (int i = 0; i < 50; ++i)
    io.submit(Tier::kHost, Tier::kHost, 1, [&order, i] { order.push_back(i); });
  io.drain();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  std::vector<char> a(1000, 'x'), b(1000, 0);
  io.wait(io.copy(b.data(), a.data(), a.size()));
  EXPECT_EQ(a, b);
  EXPECT_EQ(io.stats().in_host.jobs, 51u);
  EXPECT_EQ(io.stats().in_host.bytes, 1050u);
}

TEST(TierCopier, DestructorRunsQueuedJobs) {
  std::atomic<int> ran{0};
  {
    TierCopier io;
    for (int i = 0; i < 20; ++i)
      io.submit(Tier::kHost, Tier::kHost, 0, [&ran] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 20);
}

}  // namespace
}  // namespace kvcache
