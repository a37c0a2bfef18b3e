#include "tools/engine_options.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/kv_client.h"
#include "model/forward.h"
#include "model/kv_plan.h"
#include "model/paged_plan.h"
#include "tools/option_rules.h"

namespace kvcache::tools {

void add_engine_options(CLI::App* cmd, EngineOptions& o) {
  o.model.kernel = "fused";  // reads pages in place; batch-invariant (per-sequence split-KV)
  o.model.chunk = 256;
  add_model_options(cmd, o.model);
  // Help as the engine reads these options; what it refuses, see option_rules.cc.
  cmd->get_option("--cache")->description(
      "The paged pool's pages: paged (rows in --kv-dtype, the default) or quantized (packed "
      "pages, as --kv-bits / --kv-quant select)");
  cmd->get_option("--kernel")
      ->description("Paged attention kernel: eager or fused (default fused)");
  cmd->get_option("--max-cache-len")
      ->description(
          "Tokens the paged pool holds, without --kv-budget (default: serve sizes it from free "
          "memory, batch takes 16384)");
  cmd->get_option("--chunk")->description(
      "Token budget of one step: decodes plus prefill chunks (default 256)");
  cmd->get_option("--kv-bits")
      ->description(
          "Quantized pages: KIVI code bits, 2, 4 or 8 (default 4); each full block is one "
          "quantization group, each sequence's partial last block stays in --kv-dtype");
  cmd->get_option("--kv-quant")
      ->description(
          "Quantized pages: kivi (per-channel keys over the block, per-token values) or "
          "llama.cpp's per-token q8_0 / q4_0");
  cmd->get_option("--kv-group")
      ->description(
          "Quantized pages: the key group is the block; accepted only equal to --block-tokens");
  cmd->get_option("--kv-residual")
      ->description(
          "Quantized pages: the residual is each sequence's partial last block; accepted only "
          "equal to --block-tokens");
  cmd->get_option("--offload-dir")
      ->description(
          "Refused: the paged cache is not offloaded (--cache offloaded: generate, logits, bench)");
  cmd->add_option("--max-running", o.max_running, "Sequences resident at once (default 64)");
  cmd->add_option("--scheduler", o.scheduler,
                  "Order a step fills its token budget in: fifo (decodes, then running prefills, "
                  "then new requests) or prefill-first (running prefills and new requests before "
                  "decodes: sooner first tokens, paused streams) (default fifo)");
  cmd->add_option("--safety-margin", o.safety_margin,
                  "fifo: while some layer group has fewer free blocks than this fraction of its "
                  "blocks, a step that ran something admits no new request (transformers v5 "
                  "uses 0.2); in [0, 1) (default 0: admit while blocks last, preempt when full)");
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
  cmd->add_option("--spec", o.spec,
                  "Speculative decoding: ngram (prompt lookup: drafts are the tokens that followed "
                  "the latest earlier occurrence of a sequence's last tokens), verified in one "
                  "forward and rolled back with crop; greedy output is unchanged");
  cmd->add_option("--spec-k", o.spec_k, "With --spec: drafts per sequence and step (default 4)");
  cmd->add_option("--spec-ngram", o.spec_ngram,
                  "With --spec ngram: the longest n-gram matched (default 3)");
  cmd->add_flag("--fast-prefill", o.fast_prefill,
                "Prefill through BLAS: faster, but batched results may differ from a request run "
                "alone in the last bits");
}

bool quantized_pool(const EngineOptions& o) {
  return o.model.cache == "quantized" ||
         (o.model.cmd != nullptr &&
          (o.model.cmd->count("--kv-bits") > 0 || o.model.cmd->count("--kv-quant") > 0));
}

void check_engine_options(const EngineOptions& o, const LoadedModel* loaded) {
  RunShape shape;
  shape.caches = {"paged"};
  if (quantized_pool(o)) shape.caches.push_back("quantized");
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
  if (quantized_pool(o)) {
    // One full block is one quantization group (its bytes never change once full, so it can be
    // shared), and the residual is the partial last block: both sizes are the block's.
    const int64_t bt = c.cache.paged.block_tokens;
    const auto given = [&](const char* name) {
      return o.model.cmd != nullptr && o.model.cmd->count(name) > 0;
    };
    if (given("--kv-group") && o.model.kv_group != bt)
      throw Error(ErrorKind::kInvalidArgument,
                  "--kv-group " + std::to_string(o.model.kv_group) +
                      ": in serve and batch a full block is one quantization group, so the group "
                      "is --block-tokens (" +
                      std::to_string(bt) + "); drop --kv-group or set --block-tokens " +
                      std::to_string(o.model.kv_group));
    if (given("--kv-residual") && o.model.kv_residual != bt)
      throw Error(ErrorKind::kInvalidArgument,
                  "--kv-residual " + std::to_string(o.model.kv_residual) +
                      ": in serve and batch the residual kept in --kv-dtype is each sequence's "
                      "partial last block, --block-tokens (" +
                      std::to_string(bt) + ") tokens at most; drop --kv-residual");
    if (given("--kernel"))
      throw Error(ErrorKind::kInvalidArgument,
                  "--kernel " + o.model.kernel +
                      ": quantized pages are read by the quantized kernel (codes widened in "
                      "registers), whatever the name; drop --kernel");
    const QuantizedOptions& q = sc.cache.quantized;
    if (q.scheme == KVQuantScheme::kKivi && q.bits != 2 && q.bits != 4 && q.bits != 8)
      throw Error(ErrorKind::kInvalidArgument,
                  "--kv-bits " + std::to_string(q.bits) +
                      ": KIVI pages store 2, 4 or 8-bit codes (--kv-quant q8_0 / q4_0 fix their "
                      "own)");
    c.cache.paged.quant = PagedQuantFormat{q.scheme, q.bits};
  }
  // c.cache.policy is the requests' default (exact or streaming: option_rules refuses the
  // others); the engine folds each request's policy into its block keys.
  if (!c.cache.policy.exact() && c.cache.paged.quant)
    throw Error(ErrorKind::kInvalidArgument,
                "--kv-policy " + c.cache.policy.key() +
                    " with quantized pages: pick one way to save memory per server (a streaming "
                    "sequence's released blocks and the packed blocks' residual slots are not "
                    "combined yet); drop --kv-bits/--kv-quant or use --kv-policy exact");
  c.kv_budget_bytes = sc.kv_budget_bytes;
  if (o.model.chunk < 1) throw Error(ErrorKind::kInvalidArgument, "--chunk must be >= 1");
  c.max_tokens_per_step = o.model.chunk;
  if (o.max_running < 1) throw Error(ErrorKind::kInvalidArgument, "--max-running must be >= 1");
  c.max_running = o.max_running;
  if (o.scheduler != "fifo" && o.scheduler != "prefill-first")
    throw Error(ErrorKind::kInvalidArgument,
                "--scheduler " + o.scheduler + " is not known; use fifo or prefill-first");
  c.scheduler = parse_scheduler_policy(o.scheduler);
  if (!(o.safety_margin >= 0 && o.safety_margin < 1))  // NaN fails too
    throw Error(ErrorKind::kInvalidArgument,
                "--safety-margin is a fraction of the blocks in [0, 1), got " +
                    std::to_string(o.safety_margin));
  if (c.scheduler == SchedulerPolicy::kPrefillFirst && o.safety_margin > 0)
    throw Error(ErrorKind::kInvalidArgument,
                "--safety-margin is the fifo scheduler's admission rule; --scheduler "
                "prefill-first admits while blocks last (drop --safety-margin or use --scheduler "
                "fifo)");
  c.safety_margin = o.safety_margin;
  const auto given_opt = [&](const char* name) {
    return o.model.cmd != nullptr && o.model.cmd->count(name) > 0;
  };
  if (o.spec.empty()) {
    for (const char* name : {"--spec-k", "--spec-ngram"})
      if (given_opt(name))
        throw Error(ErrorKind::kInvalidArgument,
                    std::string(name) +
                        " has no effect without --spec ngram; add --spec ngram "
                        "or drop it");
  } else if (o.spec != "ngram") {
    throw Error(ErrorKind::kInvalidArgument,
                "--spec " + o.spec +
                    ": serve and batch draft by prompt lookup only (--spec ngram); a draft model "
                    "runs in generate (--spec draft --draft-model M)");
  } else {
    if (o.spec_k < 1 || o.spec_ngram < 1)
      throw Error(ErrorKind::kInvalidArgument, "--spec-k and --spec-ngram must be >= 1, got " +
                                                   std::to_string(o.spec_k) + " and " +
                                                   std::to_string(o.spec_ngram));
    c.spec_k = o.spec_k;
    c.spec_ngram = o.spec_ngram;
  }
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

std::string served_model_id(const std::string& model) {
  // "dummy:tiny" and other built-in names stay whole; a path gives its last component, so
  // clients send "Qwen3-0.6B-Q8_0.gguf" rather than where it lies on this machine.
  if (model.find('/') == std::string::npos) return model;
  std::string path = model;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

PoolSize size_pool_from_memory(const PoolSizeInputs& in) {
  if (in.max_context < 1)
    throw Error(ErrorKind::kInvalidArgument,
                "the model states no context length to size the KV pool by; size it with "
                "--max-cache-len TOKENS or --kv-budget BYTES");
  if (!(in.bytes_per_token > 0) || in.block_tokens < 1)
    throw Error(ErrorKind::kInvalidArgument,
                "pool sizing: bytes per token and block tokens must be positive");
  PoolSize out;
  out.margin = std::max(
      kPoolMarginMinBytes,
      static_cast<uint64_t>(static_cast<double>(in.mem_available_bytes) * kPoolMarginFraction));
  const auto left = [&](uint64_t reserve) -> uint64_t {
    const uint64_t used = in.weight_bytes + in.fixed_bytes + reserve;
    return in.mem_available_bytes > used ? in.mem_available_bytes - used : 0;
  };
  const auto tokens_in = [&](uint64_t bytes) {
    return static_cast<int64_t>(static_cast<double>(bytes) / in.bytes_per_token);
  };
  const int64_t by_memory = tokens_in(left(out.margin));
  const int64_t cap = in.max_context * std::max<int32_t>(1, in.max_sequences);
  const std::string mem = format_bytes(static_cast<double>(in.mem_available_bytes)) +
                          " available - " + format_bytes(static_cast<double>(in.weight_bytes)) +
                          " weights - " + format_bytes(static_cast<double>(in.fixed_bytes)) +
                          " activations - " + format_bytes(static_cast<double>(out.margin)) +
                          " margin";
  if (by_memory >= cap) {
    out.tokens = cap;
    out.why = "capped at the context " + std::to_string(in.max_context) + " x " +
              std::to_string(in.max_sequences) + " sequences (" + mem + " would hold more)";
  } else if (by_memory >= in.max_context) {
    out.tokens = by_memory;
    out.why = "the memory left: " + mem;
  } else if (tokens_in(left(0)) >= in.max_context) {
    out.tokens = in.max_context;
    out.why = "one request of the full context " + std::to_string(in.max_context) +
              ", into the margin (" + mem + " holds less)";
  } else {
    out.tokens = by_memory;
    out.why = "the memory left: " + mem + " (less than one full-context request)";
  }
  out.tokens -= out.tokens % in.block_tokens;
  if (out.tokens < 2 * in.block_tokens)
    throw Error(ErrorKind::kInvalidArgument,
                "not enough free memory for a KV pool: " + mem + " leaves room for " +
                    std::to_string(out.tokens) +
                    " tokens; free memory, or size the pool with --max-cache-len TOKENS or "
                    "--kv-budget BYTES");
  out.bytes =
      static_cast<uint64_t>(static_cast<double>(out.tokens) * in.bytes_per_token) + in.fixed_bytes;
  return out;
}

uint64_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream in(line.substr(13));
    uint64_t kib = 0;
    if (in >> kib) return kib * 1024;
  }
  throw Error(ErrorKind::kIo,
              "cannot read MemAvailable from /proc/meminfo to size the KV pool; size it with "
              "--max-cache-len TOKENS or --kv-budget BYTES");
}

PoolSizeInputs pool_size_inputs(const Model& model, const EngineConfig& c) {
  const ModelConfig& mc = model.config();
  // The engine's planner options (runtime/engine.cc), at two pool sizes: the difference is the
  // bytes per token, the rest the fixed part (activations, scratch, per-sequence state).
  PagedPlanOptions po = engine_plan_options(model, c);
  po.budget_bytes = 0;
  const int64_t t1 = 64 * po.block_tokens, t2 = 2 * t1;
  po.max_cached_tokens = t1;
  const PagedMemoryPlan p1 = plan_paged_memory(mc, po);
  po.max_cached_tokens = t2;
  const PagedMemoryPlan p2 = plan_paged_memory(mc, po);
  PoolSizeInputs in;
  in.mem_available_bytes = mem_available_bytes();
  in.weight_bytes = model.weight_bytes();
  if (p2.max_cached_tokens <= p1.max_cached_tokens || p2.total_bytes() <= p1.total_bytes())
    throw Error(ErrorKind::kInvalidArgument,
                "cannot tell this model's KV bytes per token from its plan; size the pool with "
                "--max-cache-len TOKENS or --kv-budget BYTES");
  in.bytes_per_token = static_cast<double>(p2.total_bytes() - p1.total_bytes()) /
                       static_cast<double>(p2.max_cached_tokens - p1.max_cached_tokens);
  const double fixed = static_cast<double>(p1.total_bytes()) -
                       in.bytes_per_token * static_cast<double>(p1.max_cached_tokens);
  in.fixed_bytes = fixed > 0 ? static_cast<uint64_t>(fixed) : 0;
  in.max_context = mc.max_seq_len;
  in.max_sequences = std::min<int32_t>(c.max_running, 8);
  in.block_tokens = po.block_tokens;
  return in;
}

}  // namespace kvcache::tools
