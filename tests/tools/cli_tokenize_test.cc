// `kvcache tokenize` end to end: stdin text -> ids on stdout, for GGUF vocabularies (llama.cpp's
// test vectors), a llama2.c checkpoint and its tokenizer.bin; bad files end with exit code 2.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "scratch_dir.h"

namespace {

namespace fs = std::filesystem;

using kvcache::testing_util::CliResult;
using kvcache::testing_util::read_file;

const std::string kShared = kvcache::testing_util::shared_dir();

class CliTokenize : public ::testing::Test {
 public:
  CliResult tokenize(const std::string& model, const std::string& text) const {
    return kvcache::testing_util::run_cli(
        "tokenize --model " + kvcache::testing_util::shell_quote(model), {.stdin_text = text});
  }
  // Made with the fixture, so named after the running test; removed with it.
  const kvcache::testing_util::ScratchDir scratch_{"tok"};
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

void check_vocab(const CliTokenize& t, const std::string& vocab, size_t stride,
                 CliResult (CliTokenize::*run)(const std::string&, const std::string&) const) {
  const std::string path = kShared + "/vocab/" + vocab;
  const std::string inp = read_file(path + ".inp"), outp = read_file(path + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t begin = 0;
  for (size_t hit; (hit = inp.find(sep, begin)) != std::string::npos; begin = hit + sep.size()) {
    texts.push_back(inp.substr(begin, hit - begin));
  }
  std::istringstream lines(outp);
  std::string line;
  for (size_t i = 0; std::getline(lines, line); ++i) {
    if (i % stride != 0) continue;
    ASSERT_LT(i, texts.size());
    const CliResult r = (t.*run)(path, texts[i]);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, trim(line) + "\n") << vocab << " case " << i;
  }
}

TEST_F(CliTokenize, GgufVocabulariesReproduceLlamaCppVectors) {
  if (!fs::exists(kShared + "/vocab/ggml-vocab-llama-spm.gguf"))
    GTEST_SKIP() << "../shared/vocab is absent";
  check_vocab(*this, "ggml-vocab-llama-spm.gguf", 1, &CliTokenize::tokenize);
  check_vocab(*this, "ggml-vocab-gpt-2.gguf", 3, &CliTokenize::tokenize);
}

TEST_F(CliTokenize, Llama2cCheckpointAndTokenizerFile) {
  const std::string model = kvcache::testing_util::stories_model();
  if (!fs::exists(model)) GTEST_SKIP() << "stories260K is absent";
  const CliResult a = tokenize(model, "Once upon a time");
  const CliResult b =
      tokenize(kvcache::testing_util::stories_dir() + "/tok512.bin", "Once upon a time");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  EXPECT_EQ(a.out, b.out);
  // run.c's encode: " " prefix piece merged into "Once"; ids end with a newline.
  EXPECT_FALSE(a.out.empty());
  EXPECT_EQ(a.out.back(), '\n');
  EXPECT_EQ(a.out.find(" 1 "), std::string::npos);  // no BOS
}

TEST_F(CliTokenize, BadFilesExitWithCode2AndNameTheFile) {
  const std::string bad = scratch_.file("bad.gguf");
  std::ofstream(bad, std::ios::binary)
      << std::string("GGUF\x07\x00\x00\x00", 8) << std::string(16, '\0');
  const CliResult r = tokenize(bad, "x");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(bad), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("version 7"), std::string::npos) << r.err;
  const CliResult m = tokenize(scratch_.file("missing"), "x");
  EXPECT_EQ(m.exit_code, 2);
  EXPECT_NE(m.err.find("missing"), std::string::npos) << m.err;
  const CliResult d = tokenize("dummy:tiny", "x");  // a built-in model, not a file
  EXPECT_EQ(d.exit_code, 2);
  EXPECT_NE(d.err.find("dummy models have no tokenizer"), std::string::npos) << d.err;
}

}  // namespace
