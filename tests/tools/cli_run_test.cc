// `kvcache run` (what `make run` shows a newcomer): the built-in stories260K tells llama2.c's
// greedy story, with nothing downloaded, before the container tables.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_util.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(CliRun, TheBuiltInModelTellsLlama2csGreedyStory) {
  const testing_util::ScratchDir scratch("cli_run");
  const std::string cache = scratch.str() + "/cache";
  const testing_util::CliResult r =
      testing_util::run_cli("run --prefill 8 --decode 4", {.env = {{"KVCACHE_CACHE_DIR", cache}}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // llama2.c's greedy output (../shared/golden), up to the end of its first paragraph: the
  // story ends up in the output unchanged but for the indentation `run` adds.
  const std::string golden =
      read_text(KVCACHE_SHARED_DIR "/golden/stories260K/once_upon_a_time.txt");
  const std::string first = golden.substr(0, golden.find('\n'));
  ASSERT_GT(first.size(), 100u);
  EXPECT_NE(r.out.find(first), std::string::npos) << r.out;
  // The model was written to the cache folder and is the checkpoint shipped in models/.
  EXPECT_EQ(std::filesystem::file_size(cache + "/stories260K/stories260K.bin"), 1056540u);
  EXPECT_EQ(std::filesystem::file_size(cache + "/stories260K/tok512.bin"), 6227u);
  // The per-container table then runs on the same model.
  EXPECT_NE(r.out.find("kvcache run --model stories260K:"), std::string::npos) << r.out;
  // A second run reuses the written files.
  EXPECT_EQ(testing_util::run_cli("generate --model stories260K -p 'Once upon a time' -n 8",
                                  {.env = {{"KVCACHE_CACHE_DIR", cache}}})
                .exit_code,
            0);
}

}  // namespace
}  // namespace kvcache
