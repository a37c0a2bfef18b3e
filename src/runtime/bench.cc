#include "runtime/bench.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>

#include "cache/offloaded_layer.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "core/tier.h"
#include "kernels/kv_quant.h"
#include "runtime/engine.h"

namespace kvcache {

namespace {

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t& state) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& id : t) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;  // LCG: enough for ids
    id = static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab));
  }
  return t;
}

void summarise(BenchResult& r) {
  const double n = static_cast<double>(r.samples_ns.size());
  double s = 0, st = 0;
  for (size_t i = 0; i < r.samples_ns.size(); ++i) s += r.samples_ns[i], st += r.samples_ts[i];
  r.avg_ns = s / n;
  r.avg_ts = st / n;
  double v = 0, vt = 0;
  for (size_t i = 0; i < r.samples_ns.size(); ++i) {
    v += (r.samples_ns[i] - r.avg_ns) * (r.samples_ns[i] - r.avg_ns);
    vt += (r.samples_ts[i] - r.avg_ts) * (r.samples_ts[i] - r.avg_ts);
  }
  // Sample standard deviation, as llama-bench (0 for a single sample).
  r.stddev_ns = n > 1 ? std::sqrt(v / (n - 1)) : 0.0;
  r.stddev_ts = n > 1 ? std::sqrt(vt / (n - 1)) : 0.0;
}

}  // namespace

std::string BenchResult::name() const {
  std::string s = n_prompt > 0 ? "pp" + std::to_string(n_prompt) : "tg" + std::to_string(n_gen);
  if (n_depth > 0) s += " @ d" + std::to_string(n_depth);
  return s;
}

std::vector<BenchResult> run_bench(const Model& model, const SessionConfig& config,
                                   const BenchParams& params) {
  if (params.repetitions <= 0)
    throw Error(ErrorKind::kInvalidArgument, "bench: -r must be positive");
  const int64_t vocab = model.config().vocab_size, ctx = model.config().max_seq_len;
  struct Test {
    int64_t pp, tg;
  };
  const auto check = [](const std::vector<int64_t>& v, const char* flag, const char* zero) {
    for (const int64_t x : v)
      if (x < 0)
        throw Error(ErrorKind::kInvalidArgument,
                    std::string("bench: ") + flag + " " + std::to_string(x) +
                        ": token counts must be >= 0 (0: " + zero + ")");
  };
  check(params.n_prompt, "-p", "no prompt test");
  check(params.n_gen, "-n", "no generation test");
  check(params.depths, "-d", "an empty cache");
  std::vector<Test> tests;  // 0 skips a test, as in llama-bench (-n 0: prompt processing only)
  for (int64_t p : params.n_prompt)
    if (p > 0) tests.push_back({p, 0});
  for (int64_t g : params.n_gen)
    if (g > 0) tests.push_back({0, g});
  if (tests.empty() || params.depths.empty())
    throw Error(ErrorKind::kInvalidArgument,
                "bench: nothing to measure: give a positive -p or -n, and a -d");
  std::vector<BenchResult> out;
  uint64_t rng = params.seed;
  for (int64_t depth : params.depths) {
    for (const Test& t : tests) {
      const int64_t need = depth + t.pp + t.tg;
      if (need > ctx) {
        throw Error(ErrorKind::kInvalidArgument, "bench: depth " + std::to_string(depth) +
                                                     " + test " + std::to_string(t.pp + t.tg) +
                                                     " tokens exceed the model's context " +
                                                     std::to_string(ctx));
      }
      SessionConfig sc = config;
      if (sc.cache.max_cache_len < need) sc.cache.max_cache_len = need;
      Session s(model, sc);
      // Room for the whole test up front, as llama-bench's n_ctx-sized cache has: otherwise a
      // growing container (dynamic, quantized) doubles inside the first timed run at a depth,
      // and that run's copy makes it an outlier.
      s.cache().reserve(need);
      BenchResult r;
      // "quantized-q4" (KIVI) / "quantized-q8_0" (per-token): the format is what distinguishes
      // quantized runs in a table.
      const CacheOptions& co = sc.cache;
      r.cache = co.implementation != "quantized" ? co.implementation
                : co.quantized.scheme == KVQuantScheme::kKivi
                    ? "quantized-q" + std::to_string(co.quantized.bits)
                    : std::string("quantized-") + kv_quant_scheme_name(co.quantized.scheme);
      r.kernel = sc.kernel;
      r.kv_dtype = dtype_name(co.kv_dtype.value_or(DType::kF32));
      r.n_prompt = t.pp;
      r.n_gen = t.tg;
      r.n_depth = depth;
      r.n_threads = default_pool().n_threads();
      const std::vector<int32_t> ctx_tokens =
          random_tokens(std::max<int64_t>(depth, 1), vocab, rng);
      const std::vector<int32_t> test_tokens = random_tokens(std::max(t.pp, t.tg), vocab, rng);
      for (int rep = -1; rep < params.repetitions; ++rep) {  // rep -1: warm-up, not recorded
        s.reset();
        // The warm-up runs its few tokens on an empty cache: it is there to touch the code
        // and the weights, and refilling a 16K depth only for it doubled the cost of a run.
        if (depth > 0 && rep >= 0) s.prefill({ctx_tokens.data(), static_cast<size_t>(depth)});
        const int64_t n =
            rep < 0 ? std::min<int64_t>(std::max(t.pp, t.tg), 4) : std::max(t.pp, t.tg);
        const OffloadPool* pool = find_offload_pool(s.cache());
        const TierCopierStats io0 = pool != nullptr ? pool->copier().stats() : TierCopierStats{};
        ThreadPool& threads = default_pool();
        threads.set_timing(true);
        const auto t0 = std::chrono::steady_clock::now();
        if (t.pp > 0) {
          s.prefill({test_tokens.data(), static_cast<size_t>(n)});
        } else {
          for (int64_t i = 0; i < n; ++i) s.decode(test_tokens[static_cast<size_t>(i)]);
        }
        const double ns =
            std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        threads.set_timing(false);
        if (rep < 0) continue;
        {
          const ThreadPoolTimes pt = threads.times();
          const double nt = threads.n_threads(), tokens = static_cast<double>(n);
          const auto in_loops = static_cast<double>(pt.in_loops_ns);
          const double serial = (nt - 1) * std::max(0.0, ns - in_loops);
          const double join = std::max(0.0, nt * in_loops - static_cast<double>(pt.task_ns));
          const double per = 1.0 / (tokens * params.repetitions);
          r.idle_serial_us_per_token += serial * 1e-3 * per;
          r.idle_join_us_per_token += join * 1e-3 * per;
          r.idle_fraction += (serial + join) / (nt * ns) / params.repetitions;
          r.loops_per_token += static_cast<double>(pt.loops) * per;
        }
        if (pool != nullptr) {
          const TierCopierStats io = pool->copier().stats();
          const double per = 1.0 / static_cast<double>(n * params.repetitions);
          r.read_bytes_per_token +=
              static_cast<double>(io.from_disk.bytes - io0.from_disk.bytes) * per;
          r.read_us_per_token +=
              static_cast<double>(io.from_disk.ns - io0.from_disk.ns) * 1e-3 * per;
          r.write_us_per_token += static_cast<double>(io.to_disk.ns - io0.to_disk.ns) * 1e-3 * per;
          r.wait_us_per_token += static_cast<double>(io.wait_ns - io0.wait_ns) * 1e-3 * per;
        }
        r.samples_ns.push_back(ns);
        r.samples_ts.push_back(static_cast<double>(n) * 1e9 / ns);
      }
      r.kv_bytes = s.kv_bytes();
      r.offloaded_bytes = s.cache().offloaded_bytes();
      summarise(r);
      out.push_back(std::move(r));
    }
  }
  return out;
}

namespace {

// Writes back and drops from the page cache every file under `dir` (bench: a disk hit read
// from the device, not from RAM).
void drop_from_page_cache(const std::string& dir) {
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir)) {
    if (!f.is_regular_file()) continue;
    const int fd = ::open(f.path().c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

}  // namespace

PrefixReuseResult run_prefix_reuse_bench(const Model& model, const SessionConfig& config,
                                         const PrefixReuseParams& params) {
  if (config.cache.implementation != "paged")
    throw Error(ErrorKind::kInvalidArgument, "bench --prefix-reuse needs --cache paged (got '" +
                                                 config.cache.implementation + "')");
  if (params.repetitions <= 0)
    throw Error(ErrorKind::kInvalidArgument, "bench: -r must be positive");
  if (params.n_prompt < 2 || params.n_prompt > model.config().max_seq_len)
    throw Error(ErrorKind::kInvalidArgument,
                "bench --prefix-reuse: prompt length " + std::to_string(params.n_prompt) +
                    " must be in [2, " + std::to_string(model.config().max_seq_len) + "]");
  if (!(params.shared_fraction >= 0 && params.shared_fraction <= 1))
    throw Error(ErrorKind::kInvalidArgument,
                "bench --prefix-reuse: the shared fraction must be in [0, 1]");
  const int64_t n = params.n_prompt, vocab = model.config().vocab_size;
  const auto shared = static_cast<int64_t>(static_cast<double>(n) * params.shared_fraction);
  SessionConfig sc = config;
  // Room for the primed prompt (cached), a whole cold prompt and the cached request's suffix,
  // so no request evicts the prefix the cached one is measured on.
  if (sc.cache.max_cache_len < 3 * n) sc.cache.max_cache_len = 3 * n;
  Session s(model, sc);
  PrefixReuseResult r;
  r.cache = sc.cache.implementation;
  r.kernel = sc.kernel;
  r.kv_dtype = dtype_name(sc.cache.kv_dtype.value_or(DType::kF32));
  r.n_prompt = n;
  r.n_shared = shared;
  r.block_tokens = sc.cache.paged.block_tokens;
  r.n_threads = default_pool().n_threads();
  uint64_t rng = params.seed;
  using Clock = std::chrono::steady_clock;
  const auto ms_since = [](Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  const auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  };
  std::vector<float> cached_logits, disk_logits;
  std::vector<int32_t> prompt_b, prompt_c;
  PagedKVStore* store = s.paged_store();
  if (!params.disk_dir.empty())
    store->set_disk_tier(open_disk_tier(model, *store, params.disk_dir, uint64_t{64} << 30));
  for (int rep = -1; rep < params.repetitions; ++rep) {  // rep -1: warm-up, not recorded
    // Prime: a finished request leaves the shared prefix in the index.
    const std::vector<int32_t> prefix = random_tokens(shared, vocab, rng);
    std::vector<int32_t> prompt_a = prefix;
    const std::vector<int32_t> tail_a = random_tokens(n - shared, vocab, rng);
    prompt_a.insert(prompt_a.end(), tail_a.begin(), tail_a.end());
    s.reset();
    s.prefill(prompt_a);
    s.reset();  // blocks released tail first, keys kept
    // Cold: a prompt nobody has seen (the lookup runs and finds nothing). Then, back to back,
    // the cached request, so that both see the same minute of a shared machine.
    const std::vector<int32_t> cold = random_tokens(n, vocab, rng);
    double c0 = cpu_ms();
    auto t0 = Clock::now();
    const int64_t hit = s.reuse_prefix(cold);
    s.prefill(std::span<const int32_t>(cold).subspan(static_cast<size_t>(hit)));
    const double cold_ms = ms_since(t0), cold_cpu = cpu_ms() - c0;
    s.reset();
    // Cached: the primed prefix, another suffix.
    prompt_b = prefix;
    const std::vector<int32_t> tail_b = random_tokens(n - shared, vocab, rng);
    prompt_b.insert(prompt_b.end(), tail_b.begin(), tail_b.end());
    c0 = cpu_ms();
    t0 = Clock::now();
    const int64_t m = s.reuse_prefix(prompt_b);
    const std::span<const float> logits =
        s.prefill(std::span<const int32_t>(prompt_b).subspan(static_cast<size_t>(m)));
    const double cached_ms = ms_since(t0), cached_cpu = cpu_ms() - c0;
    r.n_cached = m;
    if (rep == params.repetitions - 1) {  // before the disk request reuses the logits buffer
      r.kv_bytes = s.kv_bytes();
      cached_logits.assign(logits.begin(), logits.end());
    }
    double disk_ms = 0;
    if (!params.disk_dir.empty()) {
      // Every cached block leaves RAM for the disk tier; then a third suffix on the prefix.
      s.reset();
      for (int g = 0; g < store->num_groups(); ++g)
        store->pool(g).evict(store->pool(g).num_blocks());
      store->disk_tier()->flush();
      if (params.disk_cold) drop_from_page_cache(params.disk_dir);
      prompt_c = prefix;
      const std::vector<int32_t> tail_c = random_tokens(n - shared, vocab, rng);
      prompt_c.insert(prompt_c.end(), tail_c.begin(), tail_c.end());
      t0 = Clock::now();
      const int64_t md = s.reuse_prefix(prompt_c);
      const std::span<const float> dl =
          s.prefill(std::span<const int32_t>(prompt_c).subspan(static_cast<size_t>(md)));
      disk_ms = ms_since(t0);
      r.n_cached_disk = store->last_prefix_disk_tokens();
      if (rep == params.repetitions - 1) disk_logits.assign(dl.begin(), dl.end());
    }
    if (rep < 0) continue;
    if (!params.disk_dir.empty()) r.disk_ms.push_back(disk_ms);
    r.cold_ms.push_back(cold_ms);
    r.cached_ms.push_back(cached_ms);
    r.cold_cpu_ms.push_back(cold_cpu);
    r.cached_cpu_ms.push_back(cached_cpu);
  }
  // Exactness check outside the timings: the same prompts prefilled cold.
  store->set_disk_tier(nullptr);
  const auto cold_diff = [&](const std::vector<int32_t>& prompt, const std::vector<float>& got) {
    s.reset();
    for (int g = 0; g < store->num_groups(); ++g) store->pool(g).clear_index();
    const std::span<const float> ref = s.prefill(prompt);
    double d = 0;
    for (size_t i = 0; i < ref.size(); ++i)
      d = std::max(d, static_cast<double>(std::fabs(ref[i] - got[i])));
    return d;
  };
  r.max_abs_logit_diff = cold_diff(prompt_b, cached_logits);
  if (!params.disk_dir.empty()) r.disk_max_abs_logit_diff = cold_diff(prompt_c, disk_logits);
  for (size_t i = 0; i < r.cold_ms.size(); ++i)
    r.ttft_cold_ms += r.cold_ms[i], r.ttft_cached_ms += r.cached_ms[i];
  r.ttft_cold_ms /= static_cast<double>(r.cold_ms.size());
  r.ttft_cached_ms /= static_cast<double>(r.cached_ms.size());
  r.speedup = r.ttft_cold_ms / r.ttft_cached_ms;
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
  };
  r.ttft_cold_median_ms = median(r.cold_ms);
  r.ttft_cached_median_ms = median(r.cached_ms);
  r.speedup_median = r.ttft_cold_median_ms / r.ttft_cached_median_ms;
  std::vector<double> pairs;
  for (size_t i = 0; i < r.cold_ms.size(); ++i) pairs.push_back(r.cold_ms[i] / r.cached_ms[i]);
  r.speedup_paired = median(pairs);
  if (!r.disk_ms.empty()) {
    r.ttft_disk_median_ms = median(r.disk_ms);
    pairs.clear();
    for (size_t i = 0; i < r.cold_ms.size(); ++i) pairs.push_back(r.cold_ms[i] / r.disk_ms[i]);
    r.speedup_disk_paired = median(pairs);
  }
  for (size_t i = 0; i < r.cold_cpu_ms.size(); ++i)
    r.ttft_cold_cpu_ms += r.cold_cpu_ms[i], r.ttft_cached_cpu_ms += r.cached_cpu_ms[i];
  r.ttft_cold_cpu_ms /= static_cast<double>(r.cold_cpu_ms.size());
  r.ttft_cached_cpu_ms /= static_cast<double>(r.cached_cpu_ms.size());
  r.speedup_cpu = r.ttft_cold_cpu_ms / r.ttft_cached_cpu_ms;
  return r;
}

}  // namespace kvcache
