// batch --spec ngram (speculative decoding in the engine): the same greedy tokens as without it,
// usage.speculative per request, the acceptance rate on the summary line, a request turning it
// off, and the refusals (exit 2).
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <utility>

#include "cli_util.h"
#include "scratch_dir.h"
#include "shared_data.h"

namespace {

using kvcache::testing_util::CliResult;
using kvcache::testing_util::run_cli;

// Each output line's "tokens" arrays, in line order.
std::string tokens_of(const std::string& out) {
  std::string all;
  for (size_t at = out.find("\"tokens\":"); at != std::string::npos;
       at = out.find("\"tokens\":", at + 1))
    all += out.substr(at, out.find(']', at) - at) + ";";
  return all;
}

// The golden story's first 60 greedy ids (../shared/golden/stories260K/once_upon_a_time.ids,
// generated_ids) after its prompt "Once upon a time" (1 403 407 261 378).
constexpr const char* kStoryPrompt = "1, 403, 407, 261, 378";
constexpr const char* kStory =
    "432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, "
    "419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, "
    "266, 268, 388, 426, 338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, "
    "333, 415, 426, 13, 438, 310";

TEST(CliSpecEngine, BatchSpecGivesTheSameTokensAndReportsAcceptance) {
  KVCACHE_REQUIRE_STORIES();
  const kvcache::testing_util::ScratchDir scratch("cli_spec_engine");
  const std::string in = scratch.file("in.jsonl");
  // The story told three times, then its prompt again: stories260K retells it for a while
  // (prompt lookup's drafts accepted), then departs from it (drafts rejected, cropped). A short
  // prompt, and one turning speculation off.
  std::string story;
  for (int i = 0; i < 3; ++i) story += std::string(kStoryPrompt) + ", " + kStory + ", ";
  std::ofstream(in) << R"({"prompt": [)" << story << kStoryPrompt
                    << R"(], "temperature": 0, "max_tokens": 60})"
                    << "\n"
                    << R"({"prompt": [1, 403, 407], "temperature": 0, "max_tokens": 30})"
                    << "\n"
                    << R"({"prompt": [1, 403], "temperature": 0, "max_tokens": 20, )"
                    << R"("speculative": {"k": 0}})"
                    << "\n";
  const std::string model =
      "--model " + kvcache::testing_util::shell_quote(kvcache::testing_util::stories_model());
  const std::string base = "batch " + model + " --input '" + in + "'";
  const CliResult plain = run_cli(base);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.err.find("acceptance rate"), std::string::npos);
  const CliResult spec = run_cli(base + " --spec ngram --spec-k 3");
  ASSERT_EQ(spec.exit_code, 0) << spec.err;
  ASSERT_NE(tokens_of(plain.out), "");
  EXPECT_EQ(tokens_of(spec.out), tokens_of(plain.out));
  EXPECT_NE(spec.err.find("speculative (ngram, k 3): acceptance rate "), std::string::npos)
      << spec.err;
  // usage.speculative on the first two lines, not on the third (k 0).
  const size_t second = spec.out.find('\n'), third = spec.out.find('\n', second + 1);
  ASSERT_NE(third, std::string::npos);
  EXPECT_NE(spec.out.substr(0, second).find("\"speculative\":{\"accepted\":"), std::string::npos)
      << spec.out;
  EXPECT_EQ(spec.out.substr(0, second).find("\"speculative\":{\"accepted\":0"), std::string::npos)
      << spec.out;
  EXPECT_NE(spec.out.substr(second, third - second).find("\"speculative\":"), std::string::npos);
  EXPECT_EQ(spec.out.substr(third).find("\"speculative\":"), std::string::npos);

  // A request asking for more drafts than --spec-k gets an error line, not a crash.
  const std::string big = scratch.file("big.jsonl");
  std::ofstream(big) << R"({"prompt": [1, 450], "max_tokens": 4, "speculative": {"k": 9}})"
                     << "\n";
  const CliResult refused = run_cli("batch " + model + " --spec ngram --input '" + big + "'");
  ASSERT_EQ(refused.exit_code, 0) << refused.err;
  EXPECT_NE(refused.out.find("speculative k must be in [0, 4]"), std::string::npos) << refused.out;

  for (const std::string bad :
       {"--spec-k 2", "--spec-ngram 2", "--spec draft", "--spec ngram --spec-k 0",
        "--spec ngram --kv-policy streaming:sink=4,window=64"}) {
    const CliResult r = run_cli(base + " " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.err;
    EXPECT_NE(r.err.find("spec"), std::string::npos) << bad << "\n" << r.err;
  }
}

// generate's speculative options: each combination that would be ignored or cannot work is
// refused with a message naming the option, before anything is generated.
TEST(CliSpecGenerate, OptionsWithoutEffectAreRefused) {
  KVCACHE_REQUIRE_STORIES();
  kvcache::testing_util::ScratchDir scratch("cli_spec_gen");
  const std::string base =
      "generate --model " +
      kvcache::testing_util::shell_quote(kvcache::testing_util::stories_model()) +
      " --prompt-ids '1 403 407' -n 4 --temp 0 --output ids";
  const CliResult ok = run_cli(base + " --spec ngram --spec-k 2");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("acceptance rate"), std::string::npos) << ok.err;
  const std::string session = scratch.file("s.kvs");
  for (const auto& [bad, says] : std::vector<std::pair<std::string, std::string>>{
           {"--spec-k 2", "--spec-k"},
           {"--spec ngram --draft-model x", "--draft-model"},
           {"--spec draft --spec-ngram 2", "--spec-ngram"},
           {"--spec draft", "--draft-model"},
           {"--spec bogus", "--spec must be"},
           {"--spec ngram --save-session '" + session + "'", "--save-session with --spec"}}) {
    const CliResult r = run_cli(base + " " + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_NE(r.err.find(says), std::string::npos) << bad << "\n" << r.err;
  }
}

}  // namespace
