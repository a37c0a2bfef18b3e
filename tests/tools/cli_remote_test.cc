// The remote tier's options on serve and batch: a bad URL, deadline or budget exits 2 naming
// the option; the tuning options without --kv-remote are refused; a batch run whose Redis does
// not answer still answers, with the same output as a run without the tier.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cli_util.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

TEST(CliRemote, BadValuesExitWith2NamingTheOption) {
  const struct {
    const char* args;
    const char* names;
  } cases[] = {
      {"--kv-remote http://127.0.0.1:6379", "--kv-remote"},
      {"--kv-remote redis://127.0.0.1:99999", "--kv-remote"},
      {"--kv-remote redis://127.0.0.1:6379 --kv-remote-deadline-ms 0", "--kv-remote-deadline-ms"},
      {"--kv-remote redis://127.0.0.1:6379 --kv-remote-deadline-ms 20000",
       "--kv-remote-deadline-ms"},
      {"--kv-remote redis://127.0.0.1:6379 --kv-remote-write-budget 0", "--kv-remote-write-budget"},
      {"--kv-remote redis://127.0.0.1:6379 --kv-remote-write-budget lots",
       "--kv-remote-write-budget"},
  };
  for (const auto& c : cases) {
    const auto r =
        testing_util::run_cli(std::string("serve --port 0 --model dummy:tiny ") + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.names), std::string::npos) << c.args << "\n" << r.err;
  }
}

TEST(CliRemote, TuningOptionsWithoutKvRemoteAreRefused) {
  for (const char* cmd : {"serve --port 0", "batch --input /dev/null"})
    for (const char* opt : {"--kv-remote-deadline-ms 20", "--kv-remote-write-budget 1MiB"}) {
      const auto r = testing_util::run_cli(std::string(cmd) + " --model dummy:tiny " + opt);
      EXPECT_EQ(r.exit_code, 2) << cmd << " " << opt;
      EXPECT_NE(r.err.find("without --kv-remote"), std::string::npos) << r.err;
    }
}

TEST(CliRemote, ABatchWhoseRedisDoesNotAnswerGivesTheSameOutput) {
  const testing_util::ScratchDir scratch("cli_remote");
  const std::string in = scratch.file("in.jsonl");
  std::ofstream(in) << R"({"id": "a", "prompt": [1, 450, 4996, 17, 18, 19, 20, 21, 22, 23, 24, )"
                    << R"(25, 26, 27, 28, 29, 30, 31, 32, 33], "max_tokens": 4, "temperature": 0})"
                    << "\n";
  const auto plain = testing_util::run_cli("batch --model dummy:tiny --input " + in);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  // Port 1 on loopback: nothing listens, connections are refused at once.
  const auto remote = testing_util::run_cli("batch --model dummy:tiny --input " + in +
                                            " --kv-remote redis://127.0.0.1:1 "
                                            "--kv-remote-deadline-ms 20");
  ASSERT_EQ(remote.exit_code, 0) << remote.err;
  const auto text = [](const std::string& out) {  // the answer, without timings
    const size_t a = out.find("\"choices\"");
    const size_t b = out.find("\"stats\"");
    return out.substr(a, b - a);
  };
  EXPECT_EQ(text(remote.out), text(plain.out));
}

}  // namespace
}  // namespace kvcache
