#include "tools/model_options.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/kv_quant.h"
#include "model/kv_plan.h"
#include "tools/option_rules.h"

namespace kvcache::tools {

namespace {
constexpr int kMaxThreads = 1024;  // far past any machine here; beyond it -t is a typo
}  // namespace

void add_model_options(CLI::App* cmd, ModelOptions& o) {
  o.cmd = cmd;
  cmd->add_option("--model,-m", o.model,
                  "Model: llama2.c .bin, GGUF file, Hugging Face folder, stories260K (built in), "
                  "or dummy:PRESET[:WEIGHT_TYPE] (tiny, llama-125m, qwen3-tiny, phi3-tiny, "
                  "gemma2-tiny, gemma3-tiny, gptoss-tiny, mla-tiny, qwen3next-tiny, ...; weight "
                  "types f16, f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, q2_K..q6_K)")
      ->required();
  cmd->add_option(
      "--tokenizer", o.tokenizer,
      "Tokenizer file (default: tokenizer.bin / tok512.bin beside a llama2.c checkpoint)");
  cmd->add_option("--cache", o.cache,
                  "Cache implementation (transformers' names): dynamic, static, paged, quantized, "
                  "offloaded, offloaded_static, ...");
  cmd->add_option("--max-cache-len", o.max_cache_len,
                  "Capacity in tokens of --cache static and offloaded_static, and of the paged "
                  "pool without --kv-budget "
                  "(default: context "
                  "length)");
  cmd->add_option("--kernel", o.kernel,
                  "Attention kernel: eager or fused, or flex (dynamic and static caches only)");
  cmd->add_option("--kv-dtype", o.kv_dtype,
                  "KV storage dtype: f32, f16, bf16 (default: f32 for f32 weights, else f16)");
  cmd->add_option("-t,--threads", o.threads, "Threads (default: all cores)");
  cmd->add_option("--chunk", o.chunk, "Prefill chunk in tokens");
  cmd->add_option("--progress", o.progress,
                  "Model load progress on stderr for weights over 100 MB: auto (when stderr is a "
                  "terminal), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}));
  cmd->add_flag("--no-mmap", o.no_mmap,
                "Read the model file into private memory backed by transparent huge pages "
                "instead of mapping it: a decode step streams every weight, and 4 KiB file "
                "pages cost a TLB walk per 4 KiB (1.03-1.2x faster decode on the 125M f16 "
                "model); costs the file's size in private memory and a full read at load");
  cmd->add_option("--block-tokens", o.block_tokens, "Paged cache: tokens per block (default 16)");
  cmd->add_option("--kv-budget", o.kv_budget,
                  "Paged cache: bytes for the block pool plus activations, e.g. 512MiB (default: "
                  "blocks for --max-cache-len)");
  cmd->add_option(
         "--kv-policy", o.kv_policy,
         "Which keys full-attention layers keep: exact (default), or a lossy eviction "
         "policy (generate and logits, --cache dynamic or static): streaming:sink=4,window=256 "
         "(StreamingLLM), h2o:heavy=128,recent=128 (H2O), "
         "snapkv:budget=256,window=32,kernel=7 (SnapKV). serve and batch: exact or streaming "
         "(whole blocks; the requests' default, each may send its own kv_policy)")
      ->capture_default_str();
  cmd->add_option("--kv-bits", o.kv_bits,
                  "--cache quantized: bits per code, 2, 4 or 8 (KIVI; default 4)");
  cmd->add_option(
         "--kv-quant", o.kv_quant,
         "--cache quantized: packed format, kivi (per-channel keys, per-token values; default) or "
         "llama.cpp's per-token q8_0 / q4_0 (for comparison)")
      ->capture_default_str();
  cmd->add_option("--kv-group", o.kv_group,
                  "--cache quantized: tokens per key group (values: channels per group)")
      ->capture_default_str();
  cmd->add_option("--kv-residual", o.kv_residual,
                  "--cache quantized: most recent tokens kept in full precision")
      ->capture_default_str();
  cmd->add_option("--offload-dir", o.offload_dir,
                  "--cache offloaded / offloaded_static: directory of the layer files (unlinked at "
                  "creation; default $TMPDIR or /tmp)");
  add_renamed_options(cmd);
}

LoadOptions load_options(const ModelOptions& o, bool machine_output) {
  LoadOptions lo;
  lo.tokenizer_path = o.tokenizer;
  lo.map_mode = o.no_mmap ? MapMode::kRead : MapMode::kMap;
  const bool tty = ::isatty(STDERR_FILENO) == 1;
  if (o.progress == "on" || (o.progress == "auto" && tty && !machine_output)) {
    // A terminal gets one line rewritten in place; a file or pipe gets a line per quarter.
    lo.on_progress = [name = o.model, tty, last_quarter = -1](uint64_t done,
                                                              uint64_t total) mutable {
      const double mib = 1.0 / (1 << 20);
      const int pct = total > 0 ? static_cast<int>(100 * done / total) : 100;
      if (tty) {
        std::fprintf(stderr, "\rloading %s: %3d%% (%.0f / %.0f MiB)%s", name.c_str(), pct,
                     done * mib, total * mib, done == total ? "\n" : "");
      } else if (pct / 25 != last_quarter) {
        last_quarter = pct / 25;
        std::fprintf(stderr, "loading %s: %d%% (%.0f / %.0f MiB)\n", name.c_str(), pct, done * mib,
                     total * mib);
      }
      std::fflush(stderr);
    };
  }
  const std::string spm = std::string(KVCACHE_SHARED_DIR) + "/vocab/ggml-vocab-llama-spm.gguf";
  std::error_code ec;
  if (std::filesystem::exists(spm, ec)) lo.dummy_vocab = spm;
  return lo;
}

SessionConfig session_config(const ModelOptions& o, const Model& model) {
  if (o.threads < 0) throw Error(ErrorKind::kInvalidArgument, "-t must be >= 0");
  if (o.threads > kMaxThreads)
    throw Error(ErrorKind::kInvalidArgument, "-t " + std::to_string(o.threads) + ": at most " +
                                                 std::to_string(kMaxThreads) + " threads");
  if (o.threads > 0) set_default_threads(o.threads);
  (void)default_pool();  // start the workers now: a thread limit is reported before any output
  SessionConfig sc;
  CacheOptions& co = sc.cache;
  co.implementation = o.cache;
  co.max_cache_len = o.max_cache_len;
  co.policy = KVPolicy::parse(o.kv_policy);
  sc.kernel = o.kernel;
  sc.prefill_chunk = o.chunk;
  if (o.block_tokens < 1) throw Error(ErrorKind::kInvalidArgument, "--block-tokens must be >= 1");
  co.paged.block_tokens = o.block_tokens;
  if (o.max_cache_len < 0)
    throw Error(ErrorKind::kInvalidArgument,
                "--max-cache-len must be >= 0 (0 or absent: the model's context), got " +
                    std::to_string(o.max_cache_len));
  if (!o.kv_budget.empty()) {
    try {
      sc.kv_budget_bytes = parse_byte_size(o.kv_budget);
    } catch (const Error& e) {
      throw Error(e.kind(), std::string("--kv-budget: ") + e.what());
    }
    if (sc.kv_budget_bytes == 0)
      throw Error(
          ErrorKind::kInvalidArgument,
          "--kv-budget " + o.kv_budget +
              " leaves no memory for the cache; omit it to size the pool from --max-cache-len");
    // The pool is allocated up front: a budget past the machine's memory cannot be honoured
    // (`plan --budget` still sizes hypothetical machines).
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    const uint64_t ram =
        pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
    if (ram > 0 && sc.kv_budget_bytes > ram)
      throw Error(ErrorKind::kInvalidArgument,
                  "--kv-budget " + o.kv_budget + " is more than this machine's " +
                      format_bytes(static_cast<double>(ram)) + " of memory; give at most that");
  }
  const std::optional<KVQuantScheme> scheme = parse_kv_quant_scheme(o.kv_quant);
  if (!scheme)
    throw Error(ErrorKind::kInvalidArgument,
                "--kv-quant must be kivi, q8_0 or q4_0, got '" + o.kv_quant + "'");
  co.quantized.scheme = *scheme;
  if (*scheme == KVQuantScheme::kKivi) {
    co.quantized.bits = o.kv_bits != 0 ? o.kv_bits : 4;
  } else {
    const int fixed = *scheme == KVQuantScheme::kQ8_0 ? 8 : 4;
    if (o.kv_bits != 0 && o.kv_bits != fixed)
      throw Error(ErrorKind::kInvalidArgument,
                  "--kv-quant " + o.kv_quant + " stores " + std::to_string(fixed) +
                      "-bit codes; --kv-bits " + std::to_string(o.kv_bits) +
                      " contradicts it (drop --kv-bits)");
    co.quantized.bits = fixed;
  }
  co.offload.dir = o.offload_dir;
  co.offload.drop_page_cache = o.offload_cold;
  co.quantized.group = o.kv_group;
  co.quantized.residual = o.kv_residual;
  if (!o.kv_dtype.empty()) {
    co.kv_dtype = parse_dtype(o.kv_dtype);
    if (!dtype_is_float(*co.kv_dtype)) {
      throw Error(ErrorKind::kUnsupported,
                  "--kv-dtype " + o.kv_dtype + ": dense caches store f32, f16 or bf16");
    }
  } else {
    co.kv_dtype = model.embeddings().dtype() == DType::kF32 ? DType::kF32 : DType::kF16;
  }
  return sc;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  const char* p = text.c_str();
  while (*p != '\0') {
    if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
      ++p;
      continue;
    }
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(p, &end, 10);
    if (end == p || errno != 0 || v < 0 || v > INT32_MAX ||
        (*end != '\0' && *end != ' ' && *end != ',' && *end != '\t' && *end != '\n')) {
      throw Error(ErrorKind::kInvalidArgument,
                  "--prompt-ids: '" + text + "' is not a list of non-negative token ids (at: '" +
                      std::string(p) + "')");
    }
    ids.push_back(static_cast<int32_t>(v));
    p = end;
  }
  return ids;
}

}  // namespace kvcache::tools
