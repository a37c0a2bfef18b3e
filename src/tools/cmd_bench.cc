// `kvcache bench`: llama-bench's measurements (pp/tg tokens per second at given depths) on any
// model and cache container, as a markdown table or llama-bench-style JSON (-o json). Beside
// each speed, the machine's limit measured in the same run (core/machine_limits.h): for tg, the
// bytes a decode token reads and the fraction of the read bandwidth that speed represents; for
// pp, the fraction of the FMA peak (runtime/token_cost.h has the formulas).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/machine_limits.h"
#include "core/thread_pool.h"
#include "runtime/bench.h"
#include "runtime/model_loader.h"
#include "runtime/token_cost.h"
#include "tools/commands.h"
#include "tools/model_options.h"
#include "tools/option_rules.h"

namespace kvcache::tools {
namespace {

struct BenchOptions {
  ModelOptions model;
  std::vector<std::string> caches = {"dynamic"};
  BenchParams params;
  std::string output = "table";
  std::string prefix_reuse;  // "N:F": the prefix-reuse TTFT test instead of pp/tg
  std::string kv_disk;       // with --prefix-reuse: also a hit served from the disk tier
  bool kv_disk_cold = false;
};

PrefixReuseParams parse_prefix_reuse(const std::string& text, int repetitions) {
  PrefixReuseParams p;
  p.repetitions = repetitions;
  const size_t colon = text.find(':');
  try {
    size_t used = 0;
    p.n_prompt = std::stoll(text.substr(0, colon), &used);
    if (used != (colon == std::string::npos ? text.size() : colon))
      throw std::invalid_argument("n");
    if (colon != std::string::npos) {
      const std::string f = text.substr(colon + 1);
      p.shared_fraction = std::stod(f, &used);
      if (used != f.size()) throw std::invalid_argument("f");
    }
  } catch (const std::exception&) {
    throw Error(ErrorKind::kInvalidArgument,
                "--prefix-reuse '" + text + "': expected TOKENS:FRACTION, e.g. 2000:0.9");
  }
  return p;
}

void run_prefix_reuse_cmd(BenchOptions& o, const Model& model) {
  if (o.caches.size() != 1)
    throw Error(ErrorKind::kInvalidArgument,
                "--prefix-reuse measures one cache: pass --cache paged");
  ModelOptions mo = o.model;
  mo.cache = o.caches[0];
  const SessionConfig sc = session_config(mo, model);
  PrefixReuseParams params = parse_prefix_reuse(o.prefix_reuse, o.params.repetitions);
  params.disk_dir = o.kv_disk;
  params.disk_cold = o.kv_disk_cold;
  const PrefixReuseResult r = run_prefix_reuse_bench(model, sc, params);
  if (o.output == "json") {
    nlohmann::json j = {{"test", "prefix_reuse"},
                        {"model_filename", o.model.model},
                        {"model_type", model.config().summary()},
                        {"cache", r.cache},
                        {"attention_kernel", r.kernel},
                        {"type_kv", r.kv_dtype},
                        {"block_tokens", r.block_tokens},
                        {"n_threads", r.n_threads},
                        {"n_prompt", r.n_prompt},
                        {"n_shared", r.n_shared},
                        {"n_cached", r.n_cached},
                        {"ttft_cold_ms", r.ttft_cold_ms},
                        {"ttft_cached_ms", r.ttft_cached_ms},
                        {"speedup", r.speedup},
                        {"ttft_cold_median_ms", r.ttft_cold_median_ms},
                        {"ttft_cached_median_ms", r.ttft_cached_median_ms},
                        {"speedup_median", r.speedup_median},
                        {"speedup_paired", r.speedup_paired},
                        {"ttft_cold_cpu_ms", r.ttft_cold_cpu_ms},
                        {"ttft_cached_cpu_ms", r.ttft_cached_cpu_ms},
                        {"speedup_cpu", r.speedup_cpu},
                        {"samples_cold_ms", r.cold_ms},
                        {"samples_cached_ms", r.cached_ms},
                        {"max_abs_logit_diff", r.max_abs_logit_diff},
                        {"kv_bytes", r.kv_bytes}};
    if (!o.kv_disk.empty()) {
      j["disk_page_cache"] = o.kv_disk_cold ? "dropped" : "warm";
      j["n_cached_disk"] = r.n_cached_disk;
      j["ttft_disk_median_ms"] = r.ttft_disk_median_ms;
      j["speedup_disk_paired"] = r.speedup_disk_paired;
      j["samples_disk_ms"] = r.disk_ms;
      j["disk_max_abs_logit_diff"] = r.disk_max_abs_logit_diff;
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf(
        "| model | cache | kernel | kv | block | prompt | cached | ttft cold ms | ttft cached ms | "
        "speedup | speedup paired | max logit diff |\n");
    std::printf(
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    std::printf("| %s | %s | %s | %s | %lld | %lld | %lld | %.2f | %.2f | %.2fx | %.2fx | %.3g |\n",
                o.model.model.c_str(), r.cache.c_str(), r.kernel.c_str(), r.kv_dtype.c_str(),
                static_cast<long long>(r.block_tokens), static_cast<long long>(r.n_prompt),
                static_cast<long long>(r.n_cached), r.ttft_cold_ms, r.ttft_cached_ms, r.speedup,
                r.speedup_paired, r.max_abs_logit_diff);
    if (!o.kv_disk.empty())
      std::printf(
          "\ndisk tier (%s page cache): %lld tokens from disk, ttft median %.2f ms (cold "
          "%.2f ms, RAM %.2f ms), cold/disk paired %.2fx, max logit diff %.3g\n",
          o.kv_disk_cold ? "dropped" : "warm", static_cast<long long>(r.n_cached_disk),
          r.ttft_disk_median_ms, r.ttft_cold_median_ms, r.ttft_cached_median_ms,
          r.speedup_disk_paired, r.disk_max_abs_logit_diff);
  }
}

std::string mib(size_t n) {
  return fmt::format("{:.2f} MiB", static_cast<double>(n) / (1 << 20));
}

// One test against the machine's limits. tg: bytes one token reads, and bytes x tokens/s over
// the read bandwidth; pp: the prompt's FLOPs over its time, over the FMA peak. The other
// test's fields stay 0 (not applicable).
struct Roofline {
  double bytes_per_token = 0, weight_bytes = 0, kv_bytes_per_token = 0, read_fraction = 0;
  double flops = 0, fma_fraction = 0;
};

Roofline roofline(const Model& model, const CacheOptions& cache, const BenchResult& b,
                  const MachineLimits& lim) {
  Roofline r;
  if (b.n_gen > 0) {
    r.weight_bytes = decode_weight_bytes(model);
    r.bytes_per_token = decode_bytes_per_token(model, cache, b.n_depth, b.n_gen);
    r.kv_bytes_per_token = r.bytes_per_token - r.weight_bytes;
    r.read_fraction = r.bytes_per_token * b.avg_ts / lim.read_bytes_per_s;
  } else {
    r.flops = prefill_flops(model, b.n_depth, b.n_prompt);
    r.fma_fraction = r.flops / (b.avg_ns * 1e-9) / lim.fma_flops_per_s;
  }
  return r;
}

void run_bench_cmd(BenchOptions& o) {
  if (o.output != "table" && o.output != "json") {
    throw Error(ErrorKind::kInvalidArgument,
                "-o must be 'table' or 'json', got '" + o.output + "'");
  }
  RunShape shape;  // random token ids, no text
  shape.caches = o.caches;
  shape.kv_budget = !o.model.kv_budget.empty();
  shape.prefix_reuse = !o.prefix_reuse.empty();
  shape.kv_disk = !o.kv_disk.empty();
  const auto positive = [](const std::vector<int64_t>& v) {
    return std::any_of(v.begin(), v.end(), [](int64_t n) { return n > 0; });
  };
  shape.prefill = shape.prefix_reuse || positive(o.params.n_prompt) || positive(o.params.depths);
  check_options(*o.model.cmd, shape);
  LoadedModel lm = load_model(o.model.model, load_options(o.model, o.output == "json"));
  const Model& model = *lm.model;
  if (!o.prefix_reuse.empty()) {
    run_prefix_reuse_cmd(o, model);
    return;
  }
  size_t n_params = 0;
  for (const auto& [name, t] : model.file().tensors()) n_params += static_cast<size_t>(t.numel());
  const std::string wdtype = dtype_name(model.weight_dtype());
  // The limits on the threads the tests use, probed before and again after each cache's tests
  // (a second or so each): a shared host's bandwidth drifts by tens of percent within a minute,
  // so a test is held against the higher of the two probes around it (its fraction is never
  // flattered by a dip), and both are printed.
  MachineLimits lim = probe_machine_limits(default_pool());
  if (o.output == "table")
    std::printf(
        "machine: %s, %d threads: read bandwidth %.1f GB/s (best of 5 passes over %lld MiB), "
        "FMA peak %.1f GFLOP/s (%d-lane FMAs)\n\n",
        lim.cpu_model.c_str(), lim.n_threads, lim.read_bytes_per_s / 1e9,
        static_cast<long long>(lim.read_buffer_bytes >> 20), lim.fma_flops_per_s / 1e9,
        lim.fma_lanes);
  std::vector<MachineLimits> limits;  // per test: the limits it is held against
  std::vector<std::string> probe_notes;
  std::vector<BenchResult> all;
  std::vector<Roofline> roofs;
  for (const std::string& cache : o.caches) {
    ModelOptions mo = o.model;
    mo.cache = cache;
    const SessionConfig sc = session_config(mo, model);
    if (!all.empty()) lim = probe_machine_limits(default_pool());
    std::vector<BenchResult> r = run_bench(model, sc, o.params);
    const MachineLimits after = probe_machine_limits(default_pool());
    probe_notes.push_back(fmt::format("{}: read {:.1f} / {:.1f} GB/s, FMA {:.1f} / {:.1f} GFLOP/s",
                                      cache, lim.read_bytes_per_s / 1e9,
                                      after.read_bytes_per_s / 1e9, lim.fma_flops_per_s / 1e9,
                                      after.fma_flops_per_s / 1e9));
    MachineLimits held = lim;
    held.read_bytes_per_s = std::max(lim.read_bytes_per_s, after.read_bytes_per_s);
    held.fma_flops_per_s = std::max(lim.fma_flops_per_s, after.fma_flops_per_s);
    for (const BenchResult& b : r) {
      roofs.push_back(roofline(model, sc.cache, b, held));
      limits.push_back(held);
    }
    if (o.output == "table") {
      if (all.empty()) {
        std::printf(
            "| model | size | params | weights | cache | kv | threads | test | t/s | KV bytes | "
            "bytes/token | of read BW | of FMA peak | idle |\n");
        std::printf(
            "| --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | "
            "---: | ---: |\n");
      }
      for (size_t i = 0; i < r.size(); ++i) {
        const BenchResult& b = r[i];
        const Roofline& f = roofs[all.size() + i];
        const std::string bytes = b.n_gen > 0 ? mib(static_cast<size_t>(f.bytes_per_token)) : "-";
        const std::string read = b.n_gen > 0 ? fmt::format("{:.2f}", f.read_fraction) : "-";
        const std::string fma = b.n_gen > 0 ? "-" : fmt::format("{:.2f}", f.fma_fraction);
        // Thread time lost (runtime/bench.h): the fraction, and per token the serial part +
        // the waits at the loops' ends.
        const std::string idle =
            b.n_threads > 1
                ? fmt::format("{:.0f}% ({:.0f} + {:.0f} us/token)", 100 * b.idle_fraction,
                              b.idle_serial_us_per_token, b.idle_join_us_per_token)
                : "-";
        std::printf(
            "| %s | %s | %.2f M | %s | %s | %s | %d | %s | %.2f ± %.2f | %zu | %s | %s | %s | %s "
            "|\n",
            o.model.model.c_str(), mib(model.weight_bytes()).c_str(),
            static_cast<double>(n_params) / 1e6, wdtype.c_str(), b.cache.c_str(),
            b.kv_dtype.c_str(), b.n_threads, b.name().c_str(), b.avg_ts, b.stddev_ts, b.kv_bytes,
            bytes.c_str(), read.c_str(), fma.c_str(), idle.c_str());
        std::fflush(stdout);
        if (b.cache.rfind("offloaded", 0) == 0) {  // the table keeps its columns: stderr
          std::fprintf(stderr,
                       "%s %s: offloaded %zu bytes; per token: read %.0f bytes in %.1f us, "
                       "wrote in %.1f us, compute waited %.1f us\n",
                       b.cache.c_str(), b.name().c_str(), b.offloaded_bytes, b.read_bytes_per_token,
                       b.read_us_per_token, b.write_us_per_token, b.wait_us_per_token);
        }
      }
    }
    all.insert(all.end(), r.begin(), r.end());
  }
  if (o.output == "table") {
    std::string notes;
    for (const std::string& n : probe_notes) notes += (notes.empty() ? "" : "; ") + n;
    std::printf(
        "\nlimits probed before / after each cache's tests (%s); fractions against the "
        "higher\n",
        notes.c_str());
  }
  if (o.output == "json") {
    nlohmann::json arr = nlohmann::json::array();
    for (size_t i = 0; i < all.size(); ++i) {
      const BenchResult& b = all[i];
      const Roofline& f = roofs[i];
      const MachineLimits& lim = limits[i];
      arr.push_back({{"model_filename", o.model.model},
                     {"model_type", model.config().summary()},
                     {"model_size", model.weight_bytes()},
                     {"model_n_params", n_params},
                     {"type_weights", wdtype},
                     {"type_kv", b.kv_dtype},
                     {"attention_kernel", b.kernel},
                     {"n_threads", b.n_threads},
                     {"n_prompt", b.n_prompt},
                     {"n_gen", b.n_gen},
                     {"n_depth", b.n_depth},
                     {"avg_ns", b.avg_ns},
                     {"stddev_ns", b.stddev_ns},
                     {"avg_ts", b.avg_ts},
                     {"stddev_ts", b.stddev_ts},
                     {"samples_ns", b.samples_ns},
                     {"samples_ts", b.samples_ts},
                     {"cache", b.cache},
                     {"kv_bytes", b.kv_bytes},
                     {"offloaded_bytes", b.offloaded_bytes},
                     {"offload_read_bytes_per_token", b.read_bytes_per_token},
                     {"offload_read_us_per_token", b.read_us_per_token},
                     {"offload_write_us_per_token", b.write_us_per_token},
                     {"offload_wait_us_per_token", b.wait_us_per_token},
                     // The machine's limits (the higher of the probes before and after this
                     // cache's tests), and this test against them (tg: read_*, pp: prefill_flops /
                     // fma_peak_fraction; the other test's fields are 0).
                     {"cpu_model", lim.cpu_model},
                     {"limit_threads", lim.n_threads},
                     {"read_bandwidth_gbs", lim.read_bytes_per_s / 1e9},
                     {"read_buffer_bytes", lim.read_buffer_bytes},
                     {"fma_peak_gflops", lim.fma_flops_per_s / 1e9},
                     {"fma_lanes", lim.fma_lanes},
                     {"decode_bytes_per_token", f.bytes_per_token},
                     {"decode_weight_bytes", f.weight_bytes},
                     {"decode_kv_bytes_per_token", f.kv_bytes_per_token},
                     {"read_bandwidth_fraction", f.read_fraction},
                     {"prefill_flops", f.flops},
                     {"fma_peak_fraction", f.fma_fraction},
                     {"idle_fraction", b.idle_fraction},
                     {"idle_serial_us_per_token", b.idle_serial_us_per_token},
                     {"idle_join_us_per_token", b.idle_join_us_per_token},
                     {"loops_per_token", b.loops_per_token}});
    }
    std::printf("%s\n", arr.dump(2).c_str());
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd =
      app.add_subcommand("bench", "Prompt processing / token generation speed (llama-bench style)");
  add_model_options(cmd, o->model);
  cmd->remove_option(cmd->get_option("--cache"));
  cmd->add_option("--cache", o->caches, "Cache implementations to compare, comma-separated")
      ->delimiter(',');
  cmd->add_option("-p,--n-prompt", o->params.n_prompt, "Prompt lengths (pp tests), comma-separated")
      ->delimiter(',');
  cmd->add_option("-n,--n-gen", o->params.n_gen, "Generation lengths (tg tests), comma-separated")
      ->delimiter(',');
  cmd->add_option("-d,--n-depth", o->params.depths, "Tokens already in the cache, comma-separated")
      ->delimiter(',');
  cmd->add_option("-r,--repetitions", o->params.repetitions, "Repetitions per test");
  cmd->add_option("-o,--output", o->output, "table or json");
  cmd->add_option(
      "--prefix-reuse", o->prefix_reuse,
      "TOKENS:FRACTION, e.g. 2000:0.9: time to first token cold vs with FRACTION of the prompt "
      "cached (--cache paged); replaces the pp/tg tests");
  cmd->add_option("--kv-disk", o->kv_disk,
                  "With --prefix-reuse: also time a hit served from a disk tier in this directory "
                  "(every cached block evicted to it first)");
  cmd->add_flag("--kv-disk-cold", o->kv_disk_cold,
                "With --kv-disk: drop the tier's files from the page cache before the disk hit");
  cmd->add_flag("--offload-cold", o->model.offload_cold,
                "--cache offloaded: before every read of a layer file, sync it and drop its pages "
                "from the page cache (posix_fadvise DONTNEED): decode from a cold page cache");
  cmd->callback([o] { run_bench_cmd(*o); });
}

}  // namespace kvcache::tools
