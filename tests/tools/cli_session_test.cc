// `generate --save-session` then `generate --load-session` continues with exactly the tokens
// an uninterrupted greedy run gives (stories260K; a dummy model with sliding layers), and a
// session file from another model is refused.
#include <gtest/gtest.h>

#include <string>

#include "cli_util.h"
#include "scratch_dir.h"
#include "shared_data.h"

namespace {

using kvcache::testing_util::CliResult;
using kvcache::testing_util::shell_quote;

class CliSession : public ::testing::Test {
 protected:
  CliResult run(const std::string& args) {
    return kvcache::testing_util::run_cli(args,
                                          {.env = {{"KVCACHE_CACHE_DIR", dir_.str() + "/cache"}}});
  }
  // Greedy ids: a run of n1 + n2 tokens vs a run of n1 saved and a restored run of n2 whose
  // prompt is the first run's prompt and output (the last generated token was not fed).
  void expect_round_trip(const std::string& model, const std::string& prompt, int n1, int n2,
                         const std::string& extra = "") {
    SCOPED_TRACE(model + extra);
    const std::string base =
        "generate --model " + model + " --temp 0 --ignore-eos --output ids " + extra + " ";
    const std::string file = shell_quote(dir_.str() + "/s.kvs");
    const CliResult full =
        run(base + "--prompt-ids '" + prompt + "' -n " + std::to_string(n1 + n2));
    ASSERT_EQ(full.exit_code, 0) << full.err;
    const CliResult first = run(base + "--prompt-ids '" + prompt + "' -n " + std::to_string(n1) +
                                " --save-session " + file);
    ASSERT_EQ(first.exit_code, 0) << first.err;
    EXPECT_NE(first.err.find("session: saved"), std::string::npos) << first.err;
    std::string ids = first.out;
    ids.pop_back();  // the final newline
    const CliResult second = run(base + "--prompt-ids '" + prompt + " " + ids + "' -n " +
                                 std::to_string(n2) + " --load-session " + file);
    ASSERT_EQ(second.exit_code, 0) << second.err;
    EXPECT_NE(second.err.find("prompt tokens: 1 |"), std::string::npos)
        << "only the token after the saved ones is computed: " << second.err;
    EXPECT_EQ(ids + " " + second.out, full.out);
  }
  kvcache::testing_util::ScratchDir dir_{"cli_session"};
};

TEST_F(CliSession, SaveThenLoadContinuesExactlyStories) {
  KVCACHE_REQUIRE_STORIES();
  const std::string m = shell_quote(kvcache::testing_util::stories_model());
  expect_round_trip(m, "1 403 407 261", 25, 30);
  expect_round_trip(m, "1 403 407 261", 12, 20, "--cache static --max-cache-len 128");
}

TEST_F(CliSession, SaveThenLoadContinuesExactlySlidingLayers) {
  expect_round_trip("dummy:gemma2-tiny", "2 40 41 42 43", 14, 12);  // window 8: evicted
}

TEST_F(CliSession, FileFromAnotherModelRefused) {
  KVCACHE_REQUIRE_STORIES();
  const std::string file = shell_quote(dir_.str() + "/s.kvs");
  ASSERT_EQ(run("generate --model " + shell_quote(kvcache::testing_util::stories_model()) +
                " --temp 0 --prompt-ids '1 403' -n 3 --output ids --save-session " + file)
                .exit_code,
            0);
  const CliResult r =
      run("generate --model dummy:tiny --temp 0 --prompt-ids '1 403 9' -n 3 "
          "--output ids --load-session " +
          file);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("was saved from another model (fingerprint"), std::string::npos) << r.err;
}

}  // namespace
