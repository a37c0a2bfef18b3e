#include "runtime/bench.h"

#include <chrono>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"

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

std::vector<BenchResult> run_bench(const LlamaModel& model, const SessionConfig& config, const BenchParams& params) {
  if (params.repetitions <= 0) throw Error(ErrorKind::kInvalidArgument, "bench: -r must be positive");
  const int64_t vocab = model.config().vocab_size, ctx = model.config().max_seq_len;
  struct Test {
    int64_t pp, tg;
  };
  std::vector<Test> tests;
  for (int64_t p : params.n_prompt)
    if (p > 0) tests.push_back({p, 0});
  for (int64_t g : params.n_gen)
    if (g > 0) tests.push_back({0, g});
  std::vector<BenchResult> out;
  uint64_t rng = params.seed;
  for (int64_t depth : params.depths) {
    for (const Test& t : tests) {
      const int64_t need = depth + t.pp + t.tg;
      if (depth < 0 || need > ctx) {
        throw Error(ErrorKind::kInvalidArgument, "bench: depth " + std::to_string(depth) + " + test " +
                                                     std::to_string(t.pp + t.tg) + " tokens exceed the model's context " +
                                                     std::to_string(ctx));
      }
      SessionConfig sc = config;
      if (sc.max_cache_len <= 0 || sc.max_cache_len < need) sc.max_cache_len = need;
      Session s(model, sc);
      BenchResult r;
      r.cache = sc.cache;
      r.kernel = sc.kernel;
      r.kv_dtype = dtype_name(sc.kv_dtype.value_or(DType::kF32));
      r.n_prompt = t.pp;
      r.n_gen = t.tg;
      r.n_depth = depth;
      r.n_threads = default_pool().n_threads();
      const std::vector<int32_t> ctx_tokens = random_tokens(std::max<int64_t>(depth, 1), vocab, rng);
      const std::vector<int32_t> test_tokens = random_tokens(std::max(t.pp, t.tg), vocab, rng);
      for (int rep = -1; rep < params.repetitions; ++rep) {  // rep -1: warm-up, not recorded
        s.reset();
        if (depth > 0) s.prefill({ctx_tokens.data(), static_cast<size_t>(depth)});
        const int64_t n = rep < 0 ? std::min<int64_t>(std::max(t.pp, t.tg), 4) : std::max(t.pp, t.tg);
        const auto t0 = std::chrono::steady_clock::now();
        if (t.pp > 0) {
          s.prefill({test_tokens.data(), static_cast<size_t>(n)});
        } else {
          for (int64_t i = 0; i < n; ++i) s.decode(test_tokens[static_cast<size_t>(i)]);
        }
        const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        if (rep < 0) continue;
        r.samples_ns.push_back(ns);
        r.samples_ts.push_back(static_cast<double>(n) * 1e9 / ns);
      }
      r.kv_bytes = s.kv_bytes();
      summarise(r);
      out.push_back(std::move(r));
    }
  }
  return out;
}

}  // namespace kvcache
