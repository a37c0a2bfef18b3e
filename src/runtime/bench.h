// Speed measurement modelled on llama.cpp's llama-bench: prompt processing (ppN: N tokens in
// one prefill, chunked) and token generation (tgN: N single-token decodes), each optionally
// after a depth of d tokens already in the cache (untimed), repeated r times after a warm-up.
// Tokens are seeded random ids, so any model (dummy ones included) can be measured.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/session.h"

namespace kvcache {

struct BenchParams {
  std::vector<int64_t> n_prompt = {512};  // one pp test per value (0 entries: none)
  std::vector<int64_t> n_gen = {128};     // one tg test per value
  std::vector<int64_t> depths = {0};
  int repetitions = 3;
  uint64_t seed = 1;
  // Non-empty: also the disk tier (cache/disk_tier.h) under this directory: after the cached
  // request, every cached block is evicted (written to disk) and a third prompt with the same
  // prefix is served from disk. disk_cold: the files are synced and dropped from the page cache
  // (posix_fadvise DONTNEED) before that request, so its reads hit the device.
  std::string disk_dir;
  bool disk_cold = false;
};

struct BenchResult {
  std::string cache;
  std::string kernel;
  std::string kv_dtype;
  int64_t n_prompt = 0, n_gen = 0, n_depth = 0;
  int n_threads = 0;
  std::vector<double> samples_ns, samples_ts;
  double avg_ns = 0, stddev_ns = 0, avg_ts = 0, stddev_ts = 0;
  size_t kv_bytes = 0;  // resident KV bytes at the end of the test
  // Offloaded caches (cache/offloaded_layer.h): bytes in the layer files at the end of the test,
  // and the pool's TierCopier over the timed runs, per token: bytes read back from the files,
  // the copier thread's time reading and writing, and the time compute waited for a read (the
  // part of the copies compute did not hide).
  size_t offloaded_bytes = 0;
  double read_bytes_per_token = 0, read_us_per_token = 0, write_us_per_token = 0,
         wait_us_per_token = 0;
  // Thread time lost per token over the timed runs (core/thread_pool.h, ThreadPoolTimes): the
  // workers idle while the caller works alone between parallel loops, and all threads waiting
  // at the loops' ends; idle_fraction is their sum over threads x wall time. loops_per_token:
  // parallel loops (hand-offs) per token.
  double idle_serial_us_per_token = 0, idle_join_us_per_token = 0, idle_fraction = 0,
         loops_per_token = 0;
  std::string name() const;  // "pp512", "tg128", "pp512 @ d4096"
};

// Time to first token with a shared prefix (`kvcache bench --prefix-reuse N:F`, paged caches):
// cold, a fresh N-token prompt prefilled from nothing; cached, an N-token prompt whose first
// F*N tokens a finished request left in the prefix index (its blocks released, keys kept), so
// only the suffix past the last shared full block is prefilled. Both include the prefix lookup
// and the last position's logits. Each repetition draws new random prompts.
struct PrefixReuseParams {
  int64_t n_prompt = 2000;
  double shared_fraction = 0.9;
  int repetitions = 3;
  uint64_t seed = 1;
  // Non-empty: also the disk tier (cache/disk_tier.h) under this directory: after the cached
  // request, every cached block is evicted (written to disk) and a third prompt with the same
  // prefix is served from disk. disk_cold: the files are synced and dropped from the page cache
  // (posix_fadvise DONTNEED) before that request, so its reads hit the device.
  std::string disk_dir;
  bool disk_cold = false;
};

struct PrefixReuseResult {
  std::string cache, kernel, kv_dtype;
  int64_t n_prompt = 0;
  int64_t n_shared = 0;  // tokens the two prompts have in common
  int64_t n_cached = 0;  // tokens actually reused (last token excluded)
  int64_t block_tokens = 0;
  int n_threads = 0;
  std::vector<double> cold_ms, cached_ms;
  double ttft_cold_ms = 0, ttft_cached_ms = 0;  // averages
  double speedup = 0;                           // ttft_cold_ms / ttft_cached_ms
  // Medians: robust on a shared, loaded machine where one sample can be several times slower.
  double ttft_cold_median_ms = 0, ttft_cached_median_ms = 0, speedup_median = 0;
  // Median over the repetitions of cold / cached, each pair measured back to back (the cached
  // request starts as the cold one ends): the host's drift between repetitions cancels.
  double speedup_paired = 0;
  // Process CPU time (all threads) of the same intervals, averaged: the work done, which a
  // loaded machine stretches far less than the wall clock.
  std::vector<double> cold_cpu_ms, cached_cpu_ms;
  double ttft_cold_cpu_ms = 0, ttft_cached_cpu_ms = 0, speedup_cpu = 0;
  // With PrefixReuseParams::disk_dir: the request served from the disk tier (n_cached_disk
  // tokens loaded from disk), its median, and the median of cold / disk pairs; its logits
  // against a cold prefill of the same prompt (last repetition).
  std::vector<double> disk_ms;
  int64_t n_cached_disk = 0;
  double ttft_disk_median_ms = 0, speedup_disk_paired = 0, disk_max_abs_logit_diff = 0;
  // Last repetition: the cached run's logits against a cold prefill of the same prompt.
  double max_abs_logit_diff = 0;
  size_t kv_bytes = 0;
};

// Throws Error unless config.cache.implementation is "paged" and the prompt fits the model's
// context.
PrefixReuseResult run_prefix_reuse_bench(const Model& model, const SessionConfig& config,
                                         const PrefixReuseParams& params);

// Runs every (test, depth) pair with `config` (static caches are sized to depth + test).
// Throws Error when a test does not fit the model's context.
std::vector<BenchResult> run_bench(const Model& model, const SessionConfig& config,
                                   const BenchParams& params);

}  // namespace kvcache
