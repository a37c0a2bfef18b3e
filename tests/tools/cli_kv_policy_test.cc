// `--kv-policy` on the CLI (issue 43, lossy policies labelled): generate names the policy on its
// report line, logits --compare-exact measures it against exact attention, and every place a
// lossy policy cannot act refuses it saying where it can.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"
#include "scratch_dir.h"

namespace {

using kvcache::testing_util::CliResult;
using kvcache::testing_util::run_cli;
using kvcache::testing_util::shell_quote;

const std::string kModel = kvcache::testing_util::stories_model();

TEST(CliKVPolicy, GenerateLabelsThePolicy) {
  KVCACHE_REQUIRE_STORIES();
  CliResult r = run_cli("generate --model " + shell_quote(kModel) +
                        " --prompt 'Once upon a time' -n 80 --temp 0 --kv-policy "
                        "streaming:window=32,sink=4");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("policy streaming:sink=4,window=32)"), std::string::npos) << r.err;
  CliResult e = run_cli("generate --model " + shell_quote(kModel) + " -n 8 --temp 0");
  EXPECT_EQ(e.exit_code, 0) << e.err;
  EXPECT_NE(e.err.find("policy exact)"), std::string::npos) << e.err;
}

TEST(CliKVPolicy, LogitsComparesWithExact) {
  KVCACHE_REQUIRE_STORIES();
  kvcache::testing_util::ScratchDir dir("cli_kv_policy");
  std::string ids = "1";
  for (int i = 0; i < 120; ++i) ids.append(" ").append(std::to_string(3 + (i * 29) % 500));
  auto compare = [&](const std::string& spec) {
    CliResult r = run_cli("logits --model " + shell_quote(kModel) + " --prompt-ids '" + ids +
                          "' --n-prompt 20 --compare-exact --kv-policy " + spec + " -o " +
                          shell_quote(dir.file("l.bin")));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json wide = compare("streaming:sink=4,window=200");
  EXPECT_EQ(wide["policy"], "streaming:sink=4,window=200");
  EXPECT_EQ(wide["positions"], 102);  // the prompt's last position and the 101 fed after it
  EXPECT_LT(wide["max_abs_logit_diff"].get<double>(), 1e-3);  // decode vs prefill rounding only
  EXPECT_EQ(wide["top1_agreement"].get<double>(), 1.0);
  const nlohmann::json narrow = compare("streaming:sink=4,window=8");
  EXPECT_GT(narrow["max_abs_logit_diff"].get<double>(), 0.1);
}

TEST(CliKVPolicy, RefusedWhereItCannotAct) {
  KVCACHE_REQUIRE_STORIES();
  const std::string m = " --model " + shell_quote(kModel);
  struct Case {
    std::string args, message;
  };
  for (const Case& c : {
           Case{"serve" + m + " --kv-policy h2o",
                "runs only streaming:sink=S,window=W (a choice by position); h2o chooses tokens "
                "per KV head by attention, which generate and logits honour (--cache dynamic, "
                "static)"},
           Case{"batch" + m + " --kv-policy snapkv --input /dev/null",
                "use --kv-policy exact or streaming here"},
           Case{"serve" + m + " --kv-policy streaming --kv-bits 4",
                "pick one way to save memory per server"},
           Case{"bench" + m + " --kv-policy streaming", "bench measures the exact containers"},
           Case{"generate" + m + " -n 4 --kv-policy snapkv --cache quantized",
                "cannot act on --cache quantized; the caches that honour a lossy policy: dynamic, "
                "static"},
           Case{"generate" + m + " -n 4 --kv-policy streaming --verify",
                "--verify compares every step with exact attention"},
           Case{"generate" + m + " -n 4 --kv-policy streaming:window=0", "window must be >= 1"},
           Case{"logits" + m + " --prompt-ids '1 2 3' -o /dev/null --kv-policy h2o",
                "give --n-prompt N"},
       }) {
    CliResult r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << c.args << "\n" << r.err;
  }
}

}  // namespace
