// `kvcache generate` on the encoder-decoder model (T5): --verify passes on dummy:t5-tiny with the
// dynamic, static and paged self-attention caches; the misuses are refused with their reason.
#include <gtest/gtest.h>

#include <string>

#include "cli_util.h"
#include "scratch_dir.h"

namespace {

using kvcache::testing_util::CliResult;

struct Scratch : kvcache::testing_util::ScratchDir {
  Scratch() : ScratchDir("clit5") {}
  CliResult run(const std::string& args) const {
    return kvcache::testing_util::run_cli(args, {.env = {{"KVCACHE_CACHE_DIR", file("cache")}}});
  }
};

class CliT5 : public ::testing::TestWithParam<std::string> {};

TEST_P(CliT5, GenerateVerifyPasses) {
  Scratch s;
  for (const char* preset : {"t5-tiny", "t5-tiny-gated"}) {
    const CliResult r =
        s.run(std::string("generate --model dummy:") + preset +
              " --encoder-ids \"5 9 13 2 40 7\" --output ids -n 12 --ignore-eos --verify --cache " +
              GetParam());
    ASSERT_EQ(r.exit_code, 0) << preset << "\n" << r.err;
    EXPECT_NE(r.err.find("verify: max relative logit difference"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(" ok"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("cross "), std::string::npos) << r.err;
    // 12 ids on stdout.
    int words = 0;
    bool in = false;
    for (char c : r.out) {
      const bool digit = c >= '0' && c <= '9';
      if (digit && !in) ++words;
      in = digit;
    }
    EXPECT_EQ(words, 12) << r.out;
  }
}

INSTANTIATE_TEST_SUITE_P(Caches, CliT5, ::testing::Values("dynamic", "static", "paged"),
                         [](const auto& info) { return info.param; });

TEST(CliT5Refusals, SayWhy) {
  Scratch s;
  CliResult r = s.run("generate --model dummy:t5-tiny --output ids -n 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--encoder-ids"), std::string::npos) << r.err;
  r = s.run("generate --model dummy:tiny --prompt-ids \"1 2\" --encoder-ids 3 --output ids -n 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("decoder-only"), std::string::npos) << r.err;
  r = s.run("generate --model dummy:t5-tiny --encoder-ids 3 -n 2");  // text output
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--output ids"), std::string::npos) << r.err;
  r = s.run("generate --model dummy:t5-tiny --encoder-ids 3 --output ids --kernel eager -n 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--kernel"), std::string::npos) << r.err;
  r = s.run("batch --model dummy:t5-tiny --input /dev/null --output " + s.file("out.jsonl"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("encoder-decoder"), std::string::npos) << r.err;
  r = s.run("logits --model dummy:t5-tiny --prompt-ids \"1 2\" --output " + s.file("l.bin"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("encoder-decoder"), std::string::npos) << r.err;
  r = s.run("serve --model dummy:t5-tiny --port 0");  // refused before listening
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("encoder-decoder"), std::string::npos) << r.err;
}

}  // namespace
