// serve/batch --scheduler and --safety-margin: accepted values change the order of the work, not
// the tokens (greedy, batch-invariant); bad values exit 2 naming the accepted ones.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cli_util.h"
#include "scratch_dir.h"

namespace {

using kvcache::testing_util::CliResult;
using kvcache::testing_util::run_cli;

TEST(CliScheduler, PoliciesGiveTheSameTokensAndBadValuesNameTheAcceptedOnes) {
  const kvcache::testing_util::ScratchDir scratch("cli_scheduler");
  const std::string in = scratch.file("in.jsonl");
  std::ofstream(in) << R"({"prompt": [1, 450, 23, 99, 7], "max_tokens": 6})"
                    << "\n"
                    << R"({"prompt": [1, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40], "max_tokens": 4})"
                    << "\n"
                    << R"({"prompt": [1, 450, 23], "max_tokens": 5})"
                    << "\n";
  const std::string base = "batch --model dummy:tiny --chunk 8 --input '" + in + "'";
  const CliResult fifo = run_cli(base);
  ASSERT_EQ(fifo.exit_code, 0) << fifo.err;
  const auto tokens = [](const std::string& out) {  // each line's tokens, in line order
    std::string all;
    for (size_t at = out.find("\"tokens\":"); at != std::string::npos;
         at = out.find("\"tokens\":", at + 1))
      all += out.substr(at, out.find(']', at) - at) + ";";
    return all;
  };
  ASSERT_NE(tokens(fifo.out), "");
  for (const std::string opt : {"--scheduler fifo", "--scheduler prefill-first",
                                "--scheduler fifo --safety-margin 0.2", "--safety-margin 0.9"}) {
    const CliResult r = run_cli(base + " " + opt);
    ASSERT_EQ(r.exit_code, 0) << opt << "\n" << r.err;
    EXPECT_EQ(tokens(r.out), tokens(fifo.out)) << opt;
  }
  struct Bad {
    const char* opt;
    const char* says;
  };
  for (const Bad& b :
       {Bad{"--scheduler lifo", "use fifo or prefill-first"}, Bad{"--safety-margin 1", "in [0, 1)"},
        Bad{"--safety-margin -0.5", "in [0, 1)"},
        Bad{"--scheduler prefill-first --safety-margin 0.2", "--scheduler fifo"}}) {
    const CliResult r = run_cli(base + " " + b.opt);
    EXPECT_EQ(r.exit_code, 2) << b.opt << "\n" << r.err;
    EXPECT_NE(r.err.find(b.says), std::string::npos) << b.opt << "\n" << r.err;
  }
}

}  // namespace
