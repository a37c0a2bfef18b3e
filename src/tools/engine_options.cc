#include "tools/engine_options.h"

#include "core/error.h"

namespace kvcache::tools {

void add_engine_options(CLI::App* cmd, EngineOptions& o) {
  o.model.kernel = "fused";  // reads pages in place; batch-invariant (per-sequence split-KV)
  o.model.chunk = 256;
  add_model_options(cmd, o.model);
  cmd->add_option("--max-running", o.max_running, "Sequences resident at once (default 64)");
  cmd->add_option("--max-waiting", o.max_waiting, "Queued requests before refusing with 429 (default 256)");
  cmd->add_flag("--fast-prefill", o.fast_prefill,
                "Prefill through BLAS: faster, but batched results may differ from a request run alone in the last bits");
}

EngineConfig engine_config(const EngineOptions& o, const LlamaModel& model) {
  ModelOptions mo = o.model;
  mo.cache = "paged";
  const SessionConfig sc = session_config(mo, model);  // -t, dtype, block size, budget checks
  EngineConfig c;
  c.kernel = sc.kernel;
  c.block_tokens = sc.block_size;
  c.kv_dtype = sc.kv_dtype.value_or(DType::kF16);
  c.kv_budget_bytes = sc.kv_budget_bytes;
  c.max_cached_tokens = o.model.max_cache_len > 0 ? o.model.max_cache_len : 16384;
  if (o.model.chunk < 1) throw Error(ErrorKind::kInvalidArgument, "--chunk must be >= 1");
  c.max_tokens_per_step = o.model.chunk;
  if (o.max_running < 1) throw Error(ErrorKind::kInvalidArgument, "--max-running must be >= 1");
  c.max_running = o.max_running;
  if (o.max_waiting < 1) throw Error(ErrorKind::kInvalidArgument, "--max-waiting must be >= 1");
  c.max_waiting = o.max_waiting;
  c.batch_invariant = !o.fast_prefill;
  return c;
}

}  // namespace kvcache::tools
