// Options of the subcommands that run the continuous-batching engine (serve, batch): the model
// options (model_options.h) plus the scheduler's, turned into an EngineConfig.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "tools/model_options.h"

namespace kvcache::tools {

struct EngineOptions {
  ModelOptions model;
  int32_t max_running = 64;
  int64_t max_waiting = 256;
  bool fast_prefill = false;
  // EngineConfig::scheduler / safety_margin.
  std::string scheduler = "fifo";
  double safety_margin = 0;
  // Hybrid models: PagedOptions::snapshot_every_blocks / max_snapshots.
  int32_t snapshot_every_blocks = 4;
  int32_t max_snapshots = 16;
  // The disk tier under the prefix cache (EngineConfig::kv_disk_dir / kv_disk_budget_bytes).
  std::string kv_disk;
  std::string kv_disk_budget;
  // The shared remote tier (EngineConfig::kv_remote_*): a Redis URL, the lookup deadline and
  // the write-behind budget.
  std::string kv_remote;
  int32_t kv_remote_deadline_ms = 50;
  std::string kv_remote_write_budget;
  // Speculative decoding (EngineConfig::spec_k / spec_ngram): --spec ngram (prompt lookup; a
  // draft model is generate's only), --spec-k drafts per step, --spec-ngram the longest match.
  std::string spec;
  int64_t spec_k = 4;
  int64_t spec_ngram = 3;
};

// Adds the model options (the paged cache is implied: --cache takes only "paged") and
// --max-running, --max-waiting, --fast-prefill. --chunk is the step's token budget.
void add_engine_options(CLI::App* cmd, EngineOptions& o);
// Refuses the options given that have no effect on the engine (option_rules.h): before the
// model loads (loaded == nullptr), then once more with what the loaded model has.
void check_engine_options(const EngineOptions& o, const LoadedModel* loaded = nullptr);
// Applies -t and builds the engine config for `model`.
EngineConfig engine_config(const EngineOptions& o, const Model& model);

// serve's default model id (--served-model-name overrides): the --model path's last component
// (a trailing '/' ignored); a name without '/' (dummy:tiny) as given.
std::string served_model_id(const std::string& model);

// serve's pool when neither --kv-budget nor --max-cache-len sizes it: from the memory the
// machine has free, not a fixed token count (a fixed count is too small for a big machine and
// too big for a small one or a large model).
struct PoolSizeInputs {
  uint64_t mem_available_bytes = 0;  // /proc/meminfo MemAvailable
  uint64_t weight_bytes = 0;         // the model's weights (resident once loaded)
  uint64_t fixed_bytes = 0;          // the plan's bytes that do not grow with the pool
  double bytes_per_token = 0;        // the pool's bytes per cached token (every layer)
  int64_t max_context = 0;           // the model's trained context
  int32_t max_sequences = 8;         // the pool never exceeds max_context x this
  int64_t block_tokens = 16;
};
struct PoolSize {
  int64_t tokens = 0;   // a multiple of block_tokens
  uint64_t bytes = 0;   // tokens x bytes_per_token + fixed_bytes
  uint64_t margin = 0;  // left free for the process, the OS and other programs
  std::string why;      // which bound decided
};
// The kept margin is kPoolMarginFraction of MemAvailable, at least kPoolMarginMinBytes. The
// pool is what is left after the weights, the fixed bytes and the margin, capped at
// max_context x max_sequences, and raised to one max-length request (into the margin) when
// the memory without the margin holds it. Throws Error(kInvalidArgument) when not even two
// blocks fit, naming --max-cache-len and --kv-budget.
inline constexpr double kPoolMarginFraction = 0.10;
inline constexpr uint64_t kPoolMarginMinBytes = uint64_t{1} << 30;
PoolSize size_pool_from_memory(const PoolSizeInputs& in);
// MemAvailable of /proc/meminfo in bytes; throws Error(kIo) when it cannot be read.
uint64_t mem_available_bytes();
// The inputs for `model` and the engine config `c` (its block size, KV dtype, step size), the
// machine's memory, and max_sequences = min(max_running, 8).
PoolSizeInputs pool_size_inputs(const Model& model, const EngineConfig& c);

}  // namespace kvcache::tools
