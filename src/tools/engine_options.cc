#include "tools/engine_options.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/kv_client.h"
#include "model/kv_plan.h"
#include "tools/option_rules.h"

namespace kvcache::tools {

void add_engine_options(CLI::App* cmd, EngineOptions& o) {
  o.model.kernel = "fused";  // reads pages in place; batch-invariant (per-sequence split-KV)
  o.model.chunk = 256;
  add_model_options(cmd, o.model);
  // Help as the engine reads these options; what it refuses, see option_rules.cc.
  cmd->get_option("--cache")->description(
      "Always the paged cache: only 'paged' is accepted (it changes nothing)");
  cmd->get_option("--kernel")
      ->description("Paged attention kernel: eager or fused (default fused)");
  cmd->get_option("--max-cache-len")
      ->description("Tokens the paged pool holds, without --kv-budget (default 16384)");
  cmd->get_option("--chunk")->description(
      "Token budget of one step: decodes plus prefill chunks (default 256)");
  for (const char* quantized : {"--kv-bits", "--kv-quant", "--kv-group", "--kv-residual"})
    cmd->get_option(quantized)->description(
        "Refused: the paged cache is not quantized (--cache quantized: generate, logits, bench)");
  cmd->get_option("--offload-dir")
      ->description(
          "Refused: the paged cache is not offloaded (--cache offloaded: generate, logits, bench)");
  cmd->add_option("--max-running", o.max_running, "Sequences resident at once (default 64)");
  cmd->add_option("--max-waiting", o.max_waiting,
                  "Queued requests before refusing with 429 (default 256)");
  cmd->add_option("--snapshot-every-blocks", o.snapshot_every_blocks,
                  "Hybrid models (linear_attention layers): snapshot the linear state for the "
                  "prefix cache every N blocks; prefill chunks end there (default 4)");
  cmd->add_option("--max-snapshots", o.max_snapshots,
                  "Hybrid models: linear-state snapshots kept for the prefix cache, each one "
                  "sequence's state, billed in the memory plan; 0: no prefix hits (default 16)");
  cmd->add_option("--kv-disk", o.kv_disk,
                  "Directory of the disk tier under the prefix cache: blocks evicted from RAM are "
                  "written there and still serve later hits, across restarts (not for models "
                  "with linear, compressed or indexed layers)");
  cmd->add_option("--kv-disk-budget", o.kv_disk_budget,
                  "Most bytes the disk tier's files take, e.g. 20GiB (default 10GiB)");
  cmd->add_option("--kv-remote", o.kv_remote,
                  "Redis of the shared remote KV tier, redis://HOST:PORT[,HOST:PORT...] (a "
                  "Cluster's seed nodes, or one standalone server): prefix blocks are written "
                  "behind and looked up before prefill, so servers sharing it reuse each other's "
                  "prefixes (not for models with linear, compressed or indexed layers)");
  cmd->add_option("--kv-remote-deadline-ms", o.kv_remote_deadline_ms,
                  "Deadline of a remote tier lookup in milliseconds, 1..10000 (default 50); past "
                  "it the request computes locally");
  cmd->add_option("--kv-remote-write-budget", o.kv_remote_write_budget,
                  "Most bytes of blocks queued for writing to the remote tier before writes are "
                  "dropped, e.g. 64MiB (default 64MiB)");
  cmd->add_flag("--fast-prefill", o.fast_prefill,
                "Prefill through BLAS: faster, but batched results may differ from a request run "
                "alone in the last bits");
}

void check_engine_options(const EngineOptions& o, const LoadedModel* loaded) {
  RunShape shape;
  shape.caches = {"paged"};
  shape.kv_budget = !o.model.kv_budget.empty();
  shape.kv_disk = !o.kv_disk.empty();
  shape.kv_remote = !o.kv_remote.empty();
  shape.prefill = true;  // --chunk: each step's token budget
  shape.text = true;     // text prompts and chat messages
  if (loaded != nullptr) {
    shape.has_tokenizer = loaded->tokenizer != nullptr;
    const std::vector<std::string>& types = loaded->model->config().layer_types;
    shape.hybrid = std::find(types.begin(), types.end(), "linear_attention") != types.end();
  }
  check_options(*o.model.cmd, shape);
}

EngineConfig engine_config(const EngineOptions& o, const Model& model) {
  ModelOptions mo = o.model;
  mo.cache = "paged";
  const SessionConfig sc = session_config(mo, model);  // -t, dtype, block tokens, budget checks
  EngineConfig c;
  c.kernel = sc.kernel;
  c.cache = sc.cache;  // "paged"; max_cache_len 0: the engine's default pool
  c.kv_budget_bytes = sc.kv_budget_bytes;
  if (o.model.chunk < 1) throw Error(ErrorKind::kInvalidArgument, "--chunk must be >= 1");
  c.max_tokens_per_step = o.model.chunk;
  if (o.max_running < 1) throw Error(ErrorKind::kInvalidArgument, "--max-running must be >= 1");
  c.max_running = o.max_running;
  if (o.max_waiting < 1) throw Error(ErrorKind::kInvalidArgument, "--max-waiting must be >= 1");
  c.max_waiting = o.max_waiting;
  c.batch_invariant = !o.fast_prefill;
  if (o.snapshot_every_blocks < 1)
    throw Error(ErrorKind::kInvalidArgument, "--snapshot-every-blocks must be >= 1, got " +
                                                 std::to_string(o.snapshot_every_blocks));
  if (o.max_snapshots < 0)
    throw Error(ErrorKind::kInvalidArgument,
                "--max-snapshots must be >= 0 (0: no prefix hits for hybrid models), got " +
                    std::to_string(o.max_snapshots));
  c.cache.paged.snapshot_every_blocks = o.snapshot_every_blocks;
  c.cache.paged.max_snapshots = o.max_snapshots;
  c.kv_disk_dir = o.kv_disk;
  if (!o.kv_disk_budget.empty()) {
    try {
      c.kv_disk_budget_bytes = parse_byte_size(o.kv_disk_budget);
    } catch (const Error& e) {
      throw Error(e.kind(), std::string("--kv-disk-budget: ") + e.what());
    }
    if (c.kv_disk_budget_bytes == 0)
      throw Error(ErrorKind::kInvalidArgument,
                  "--kv-disk-budget " + o.kv_disk_budget + " is zero; give a size such as 20GiB");
  }
  if (!o.kv_remote.empty()) {
    RedisOptions ro;
    try {
      ro = parse_redis_url(o.kv_remote);
    } catch (const Error& e) {
      throw Error(e.kind(), std::string("--kv-remote: ") + e.what() +
                                " (expected redis://HOST:PORT[,HOST:PORT...])");
    }
    c.kv_remote_url = o.kv_remote;
    c.kv_remote_client = [ro] { return make_redis_client(ro); };
  }
  if (o.kv_remote_deadline_ms < 1 || o.kv_remote_deadline_ms > 10000)
    throw Error(ErrorKind::kInvalidArgument,
                "--kv-remote-deadline-ms " + std::to_string(o.kv_remote_deadline_ms) +
                    " is outside 1..10000; a lookup's deadline is tens of milliseconds (default "
                    "50)");
  c.kv_remote_deadline_ms = o.kv_remote_deadline_ms;
  if (!o.kv_remote_write_budget.empty()) {
    try {
      c.kv_remote_write_budget_bytes = parse_byte_size(o.kv_remote_write_budget);
    } catch (const Error& e) {
      throw Error(e.kind(), std::string("--kv-remote-write-budget: ") + e.what());
    }
    if (c.kv_remote_write_budget_bytes == 0)
      throw Error(ErrorKind::kInvalidArgument, "--kv-remote-write-budget " +
                                                   o.kv_remote_write_budget +
                                                   " is zero; give a size such as 64MiB");
  }
  return c;
}

}  // namespace kvcache::tools
