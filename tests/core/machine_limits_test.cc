// The machine probe: plausible, positive limits (never timed assertions), the loops' sums, and
// the errors for options that cannot work.
#include "core/machine_limits.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"

namespace kvcache {
namespace {

TEST(MachineLimits, ReadSumAddsEveryElement) {
  std::vector<float> v(96 + 1);  // one past: an unaligned start is allowed
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 5);
  float expect = 0;
  for (size_t i = 1; i < v.size(); ++i) expect += v[i];
  EXPECT_FLOAT_EQ(read_sum(v.data() + 1, 96), expect);
}

TEST(MachineLimits, FmaChainsStayFinite) {
  const float s = fma_chains(100'000);
  EXPECT_TRUE(std::isfinite(s));
  EXPECT_GT(s, 0.0f);
}

TEST(MachineLimits, ProbeReturnsPositiveFiniteLimits) {
  ThreadPool pool(2);
  MachineProbeOptions o;
  o.read_bytes = int64_t{8} << 20;  // small: the test checks the plumbing, not the host
  o.read_repetitions = 2;
  o.fma_iterations = 10'000;
  o.fma_repetitions = 2;
  const MachineLimits m = probe_machine_limits(pool, o);
  EXPECT_TRUE(std::isfinite(m.read_bytes_per_s));
  EXPECT_GT(m.read_bytes_per_s, 0.0);
  EXPECT_TRUE(std::isfinite(m.fma_flops_per_s));
  EXPECT_GT(m.fma_flops_per_s, 0.0);
  EXPECT_EQ(m.n_threads, 2);
  EXPECT_EQ(m.read_buffer_bytes, int64_t{8} << 20);
  EXPECT_EQ(m.fma_lanes, kFmaLanes);
  EXPECT_FALSE(m.cpu_model.empty());
  EXPECT_GE(m.llc_bytes, 0);
}

TEST(MachineLimits, DefaultBufferIsFarLargerThanTheLastLevelCache) {
  EXPECT_EQ(default_read_buffer_bytes(0), int64_t{256} << 20);  // unknown: a floor
  EXPECT_EQ(default_read_buffer_bytes(int64_t{32} << 20), int64_t{256} << 20);
  EXPECT_EQ(default_read_buffer_bytes(int64_t{96} << 20), int64_t{768} << 20);
  EXPECT_EQ(default_read_buffer_bytes(int64_t{480} << 20), int64_t{2} << 30);  // capped
  EXPECT_EQ(default_read_buffer_bytes((int64_t{40} << 20) + 3) % 128, 0);
  EXPECT_GE(last_level_cache_bytes(), 0);
}

TEST(MachineLimits, RejectsOptionsThatCannotWork) {
  ThreadPool pool(1);
  MachineProbeOptions o;
  o.read_repetitions = 0;
  EXPECT_THROW(probe_machine_limits(pool, o), Error);
  o = MachineProbeOptions{};
  o.read_bytes = 64;
  EXPECT_THROW(probe_machine_limits(pool, o), Error);
  o = MachineProbeOptions{};
  o.fma_iterations = 0;
  EXPECT_THROW(probe_machine_limits(pool, o), Error);
}

}  // namespace
}  // namespace kvcache
