// Replays every checked-in fuzz input — the seed corpora (corpus/<target>/) and the minimised
// crashes found so far (regressions/<target>/) — through the fuzz targets' functions in the
// normal build, so the targets keep compiling and every fixed crash stays fixed. An exception
// escaping a target fails the test naming the file; a crash fails the process.
// pending/ holds reproducers of bugs not fixed yet; it is not replayed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <string>
#include <vector>

#include "fuzz_targets.h"

namespace kvcache::fuzz {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> inputs_of(const std::string& target) {
  std::vector<fs::path> files;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(KVCACHE_FUZZ_DIR) / kind / target;
    if (!fs::is_directory(dir)) continue;
    for (const fs::directory_entry& e : fs::directory_iterator(dir))
      if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

class FuzzReplay : public ::testing::TestWithParam<Target> {};

}  // namespace

// gtest prints a failing parameter with this (else as raw bytes).
void PrintTo(const Target& t, std::ostream* os) {
  *os << t.name;
}

namespace {

TEST_P(FuzzReplay, EveryCheckedInInputRunsClean) {
  const Target& t = GetParam();
  const std::vector<fs::path> files = inputs_of(std::string(t.name));
  ASSERT_FALSE(files.empty()) << "no seed corpus in " << KVCACHE_FUZZ_DIR << "/corpus/" << t.name;
  for (const fs::path& file : files) {
    const std::string bytes = read_file(file);
    try {
      EXPECT_EQ(t.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), 0) << file;
    } catch (const std::exception& e) {
      ADD_FAILURE() << file << ": an exception escaped the " << t.name << " target: " << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, FuzzReplay,
                         ::testing::ValuesIn(all_targets().begin(), all_targets().end()),
                         [](const ::testing::TestParamInfo<Target>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace kvcache::fuzz
