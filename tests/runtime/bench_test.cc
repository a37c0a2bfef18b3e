#include "runtime/bench.h"

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "golden_util.h"
#include "model/llama2c.h"

namespace kvcache {
namespace {

TEST(Bench, RunsEveryTestAtEveryDepthWithLlamaBenchFields) {
  KVCACHE_REQUIRE_STORIES();
  const Model model(load_llama2c(testing_util::stories_dir() + "/stories260K.bin"));
  BenchParams p;
  p.n_prompt = {16};
  p.n_gen = {4};
  p.depths = {0, 32};
  p.repetitions = 2;
  for (const char* cache : {"dynamic", "static"}) {
    SessionConfig sc;
    sc.cache.implementation = cache;
    const std::vector<BenchResult> r = run_bench(model, sc, p);
    ASSERT_EQ(r.size(), 4u);
    EXPECT_EQ(r[0].name(), "pp16");
    EXPECT_EQ(r[1].name(), "tg4");
    EXPECT_EQ(r[2].name(), "pp16 @ d32");
    EXPECT_EQ(r[3].name(), "tg4 @ d32");
    const size_t per_token = 2 * 5 * 32 * 4;  // K+V x layers x kv_dim x f32
    for (const BenchResult& b : r) {
      EXPECT_EQ(b.cache, cache);
      EXPECT_EQ(b.samples_ts.size(), 2u);
      EXPECT_GT(b.avg_ts, 0.0);
      EXPECT_GE(b.stddev_ts, 0.0);
      const int64_t tokens = b.n_depth + b.n_prompt + b.n_gen;
      // static holds exactly its capacity (sized to depth + test); dynamic at least what was
      // written (it grows geometrically and reports its resident capacity).
      if (std::string(cache) == "static") {
        EXPECT_EQ(b.kv_bytes, per_token * static_cast<size_t>(tokens)) << b.name();
      } else {
        EXPECT_GE(b.kv_bytes, per_token * static_cast<size_t>(tokens)) << b.name();
      }
    }
  }
  p.depths = {600};
  EXPECT_THROW(run_bench(model, SessionConfig{}, p), Error);  // past the 512-token context
  // Negative counts, and nothing left to measure, are errors naming the flag (not skipped tests).
  const auto rejects = [&](const BenchParams& bad, const std::string& needle) {
    try {
      run_bench(model, SessionConfig{}, bad);
      ADD_FAILURE() << needle << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  BenchParams q;
  q.n_prompt = {-1};
  rejects(q, "-p -1");
  q = BenchParams{};
  q.n_gen = {8, -5};
  rejects(q, "-n -5");
  q = BenchParams{};
  q.depths = {-4};
  rejects(q, "-d -4");
  q = BenchParams{};
  q.n_prompt = {0};
  q.n_gen = {0};
  rejects(q, "nothing to measure");
}

}  // namespace
}  // namespace kvcache
