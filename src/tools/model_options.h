// Options shared by the subcommands that run a model (generate, logits, bench): parsing of
// --prompt-ids and of the cache/kernel/dtype choices into a SessionConfig.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/model_loader.h"
#include "runtime/session.h"

namespace kvcache::tools {

struct ModelOptions {
  std::string model;
  std::string tokenizer;
  std::string cache = "dynamic";
  int64_t max_cache_len = 0;
  std::string kernel = "fused";
  std::string kv_dtype;  // empty: f32 for f32 checkpoints, f16 otherwise
  int threads = 0;
  int64_t chunk = 512;
  bool no_mmap = false;  // read the model into huge-page memory (MapMode::kRead) instead of mapping
  std::string progress = "auto";  // model load progress on stderr: auto (when a terminal), on, off
  int64_t block_tokens = 16;      // --cache paged: tokens per block
  std::string kv_budget;  // --cache paged: bytes for pool + activations ("512MiB"); empty: none
  std::string kv_policy = "exact";  // cache/kv_policy.h spec; lossy: generate and logits only
  int kv_bits = 0;                  // --cache quantized, KIVI; 0: unset (4)
  std::string kv_quant = "kivi";    // --cache quantized: kivi, q8_0, q4_0
  int64_t kv_group = 64;
  int64_t kv_residual = 128;
  std::string offload_dir;    // --cache offloaded[_static]: where the layer files go
  bool offload_cold = false;  // bench: drop the files' pages before every read (cold page cache)
  // The subcommand that registered these options: which of them the user gave (option_rules.h).
  const CLI::App* cmd = nullptr;
};

// Adds --model, --tokenizer, --cache, --max-cache-len, --kernel, --kv-dtype, -t, --chunk,
// --progress, --no-mmap, --block-tokens, --kv-budget, --kv-policy, --kv-bits, --kv-quant,
// --kv-group,
// --kv-residual,
// --offload-dir,
// and the old spellings of renamed ones. Which of them take effect in which run (the old
// spellings: none): option_rules.h.
void add_model_options(CLI::App* cmd, ModelOptions& o);
// --tokenizer, plus for dummy:NAME models the SentencePiece vocabulary of ../shared/vocab
// when it exists (so text prompts work on dummy models), plus the load progress printer
// (stderr; "auto" shows it only when stderr is a terminal and the command's output is not
// JSON — machine_output — so scripts never see it unless they ask with --progress on).
LoadOptions load_options(const ModelOptions& o, bool machine_output = false);
// Applies -t (thread pool and BLAS) and builds the session config for `model`.
SessionConfig session_config(const ModelOptions& o, const Model& model);
// "1 403 407" (spaces or commas) -> ids; throws Error naming the bad entry.
std::vector<int32_t> parse_ids(const std::string& text);

}  // namespace kvcache::tools
