// `--cache paged` through the CLI: generate reproduces llama2.c's text, bench --prefix-reuse
// reports the time to first token cold and cached as a JSON object, bad values exit with 2.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"

namespace {

const std::string kModel = kvcache::testing_util::stories_model();
const std::string kGolden = kvcache::testing_util::golden_dir();

using kvcache::testing_util::read_file;
using kvcache::testing_util::run_cli;

TEST(CliPaged, GenerateEqualsLlama2cWithOddBlockSizes) {
  KVCACHE_REQUIRE_STORIES();
  for (const char* block : {"16", "7"}) {
    const auto r = run_cli("generate --model '" + kModel +
                           "' --prompt 'Once upon a time' -n 252 --temp 0 --cache paged --kernel "
                           "eager --block-tokens " +
                           block);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, read_file(kGolden + "/once_upon_a_time.txt")) << "block size " << block;
  }
}

TEST(CliPaged, BenchPrefixReuseReportsColdAndCachedTimeToFirstToken) {
  KVCACHE_REQUIRE_STORIES();
  const auto r = run_cli("bench --model '" + kModel +
                         "' --cache paged --kernel eager --prefix-reuse 300:0.9 -r 1 -o json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j["test"], "prefix_reuse");
  EXPECT_EQ(j["n_prompt"], 300);
  EXPECT_EQ(j["n_shared"], 270);
  EXPECT_EQ(j["n_cached"], 270);  // 16 full blocks of 16 and 14 tokens copied from the 17th
  EXPECT_GT(j["ttft_cold_ms"].get<double>(), 0.0);
  EXPECT_GT(j["ttft_cached_ms"].get<double>(), 0.0);
  EXPECT_GT(j["speedup_paired"].get<double>(), 0.0);  // one pair: cold / cached of that pair
  EXPECT_DOUBLE_EQ(j["speedup_paired"].get<double>(),
                   j["samples_cold_ms"][0].get<double>() / j["samples_cached_ms"][0].get<double>());
  EXPECT_LT(j["max_abs_logit_diff"].get<double>(), 1e-3);
  const auto t = run_cli("bench --model '" + kModel +
                         "' --cache paged --kernel eager --prefix-reuse 300:0.9 -r 1");
  EXPECT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("ttft cold ms"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("speedup paired"), std::string::npos) << t.out;
}

TEST(CliPaged, BadValuesExitWith2AndSayWhy) {
  KVCACHE_REQUIRE_STORIES();
  auto r = run_cli("bench --model '" + kModel + "' --cache dynamic --prefix-reuse 300:0.9 -r 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--cache paged"), std::string::npos) << r.err;
  r = run_cli("bench --model '" + kModel +
              "' --cache paged --kernel eager --prefix-reuse 300x -r 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("TOKENS:FRACTION"), std::string::npos) << r.err;
  r = run_cli("generate --model '" + kModel +
              "' -n 4 --cache paged --kernel eager --block-tokens 0");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--block-tokens"), std::string::npos) << r.err;
  // A block larger than the model's context can never fill, with or without a budget.
  for (const char* budget : {"", " --kv-budget 64MiB"}) {
    r = run_cli("generate --model '" + kModel +
                "' -n 4 --cache paged --kernel eager --block-tokens 100000" + budget);
    EXPECT_EQ(r.exit_code, 2) << budget;
    EXPECT_NE(r.err.find("--block-tokens 100000 is larger than the model's context"),
              std::string::npos)
        << r.err;
  }
  // Budgets that cannot be honoured: none at all, more than the machine has, more than a number
  // holds.
  for (const char* budget : {"0", "100000TiB", "1e30"}) {
    r = run_cli("generate --model '" + kModel + "' -n 4 --cache paged --kernel eager --kv-budget " +
                budget);
    EXPECT_EQ(r.exit_code, 2) << budget;
    EXPECT_NE(r.err.find(budget == std::string("100000TiB") ? "more than this machine's" : budget),
              std::string::npos)
        << r.err;
  }
  r = run_cli("generate --model '" + kModel + "' -n 4 --cache static --max-cache-len -3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--max-cache-len must be >= 0"), std::string::npos) << r.err;
  r = run_cli("generate --model '" + kModel +
              "' -n 4 --cache paged --kernel eager --kv-budget 1000");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--kv-budget"), std::string::npos) << r.err;
}

}  // namespace
