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
};

// Adds the model options (the paged cache is implied: --cache takes only "paged") and
// --max-running, --max-waiting, --fast-prefill. --chunk is the step's token budget.
void add_engine_options(CLI::App* cmd, EngineOptions& o);
// Refuses the options given that have no effect on the engine (option_rules.h): before the
// model loads (loaded == nullptr), then once more with what the loaded model has.
void check_engine_options(const EngineOptions& o, const LoadedModel* loaded = nullptr);
// Applies -t and builds the engine config for `model`.
EngineConfig engine_config(const EngineOptions& o, const Model& model);

}  // namespace kvcache::tools
