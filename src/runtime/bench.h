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
  std::string name() const;  // "pp512", "tg128", "pp512 @ d4096"
};

// Runs every (test, depth) pair with `config` (static caches are sized to depth + test).
// Throws Error when a test does not fit the model's context.
std::vector<BenchResult> run_bench(const LlamaModel& model, const SessionConfig& config, const BenchParams& params);

}  // namespace kvcache
