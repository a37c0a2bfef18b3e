// The machine's two ceilings, measured in a second or two: read bandwidth (a STREAM-like sum
// over a buffer far larger than the last-level cache) and the FMA peak (independent FMA chains
// in registers, the widest vectors the build has). Decode reads every weight and K/V byte once
// per token, so bytes / bandwidth bounds it; prefill is FMA-bound. `kvcache bench` prints its
// numbers as fractions of these, and bench/bench_attention's BM_ReadBandwidth and BM_FmaPeak
// run the same loops, so the two tools' limits agree.
#pragma once

#include <cstdint>
#include <string>

#include "core/thread_pool.h"

namespace kvcache {

// Lanes of one FMA instruction in fma_chains(): 16 when the build has AVX-512F, 8 with AVX2 and
// FMA, 1 for the scalar fallback.
#if defined(__AVX512F__)
inline constexpr int kFmaLanes = 16;
#elif defined(__AVX2__) && defined(__FMA__)
inline constexpr int kFmaLanes = 8;
#else
inline constexpr int kFmaLanes = 1;
#endif
// Independent chains per fma_chains() call: more than FMA latency (4) x FMA ports (2) needs, so
// the loop is bound by throughput, not by latency.
inline constexpr int kFmaChains = 10;

// The sum of p[0, n): n a multiple of 32 (any alignment). Loads 128 bytes per step into four
// accumulators, no prefetch: the plain reader, as STREAM's.
float read_sum(const float* p, int64_t n);
// n iterations of kFmaChains independent kFmaLanes-lane FMAs (n * kFmaChains * kFmaLanes
// multiply-adds); the result only defeats dead-code elimination.
float fma_chains(int64_t n);

struct MachineProbeOptions {
  // Buffer of the read test; 0: max(256 MiB, 8 x the last-level cache), at most 2 GiB.
  int64_t read_bytes = 0;
  int read_repetitions = 5;            // best pass wins (after one untimed pass that touches it)
  int64_t fma_iterations = 2'000'000;  // per thread and repetition (x kFmaChains FMAs)
  int fma_repetitions = 5;             // best wins (after one untimed warm-up)
};

struct MachineLimits {
  double read_bytes_per_s = 0;  // best pass over the buffer, all threads
  double fma_flops_per_s = 0;   // 2 FLOPs per lane-FMA, all threads, best repetition
  int fma_lanes = kFmaLanes;
  int n_threads = 0;  // the pool's threads, the caller included
  int64_t read_buffer_bytes = 0;
  int64_t llc_bytes = 0;  // the last-level cache sysfs reports (0: unknown)
  std::string cpu_model;  // /proc/cpuinfo's "model name" ("unknown" when absent)
};

// Runs both probes on `pool`'s threads. Throws Error(kInvalidArgument) for non-positive
// repetitions or a read buffer under 32 bytes.
MachineLimits probe_machine_limits(ThreadPool& pool, const MachineProbeOptions& options = {});

// The read buffer probe_machine_limits() uses by default for a last-level cache of `llc_bytes`
// (0: unknown): max(256 MiB, 8 x llc_bytes), at most 2 GiB, rounded down to 128 bytes.
int64_t default_read_buffer_bytes(int64_t llc_bytes);

// /proc/cpuinfo's first "model name" ("unknown" where there is none, e.g. non-x86 kernels).
std::string cpu_model_name();
// The largest cache sysfs lists for cpu0 (/sys/devices/system/cpu/cpu0/cache/index*/size);
// 0 when none is listed (some VMs).
int64_t last_level_cache_bytes();

}  // namespace kvcache
