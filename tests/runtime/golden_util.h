// Shared helpers of the runtime tests: ../shared's data (stories260K and llama2.c's golden
// outputs) and comparisons of logits.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace kvcache::testing_util {

// Bit-for-bit equality of two logit rows (the normwise relative difference is
// kvcache::max_rel_diff, runtime/generate.h).
inline bool bits_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline std::string shared_dir() { return KVCACHE_SHARED_DIR; }
inline std::string stories_dir() { return shared_dir() + "/models/stories260K"; }
inline std::string golden_dir() { return shared_dir() + "/golden/stories260K"; }
inline bool have_stories() {
  return std::filesystem::exists(stories_dir() + "/stories260K.bin") &&
         std::filesystem::exists(stories_dir() + "/tok512.bin") &&
         std::filesystem::exists(golden_dir() + "/once_upon_a_time.ids");
}
#define KVCACHE_REQUIRE_STORIES()                                                         \
  if (!::kvcache::testing_util::have_stories())                                           \
  GTEST_SKIP() << "stories260K or its golden outputs not found under " KVCACHE_SHARED_DIR \
                  " (the ../shared data folder); skipping"

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct GoldenIds {
  std::vector<int32_t> prompt, generated;
};

// Parses "<name>.ids": lines "prompt_ids: ..." and "generated_ids: ..." (comments start with #).
inline GoldenIds read_golden_ids(const std::string& name) {
  GoldenIds g;
  std::istringstream in(read_file(golden_dir() + "/" + name + ".ids"));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    std::vector<int32_t>* dst = key == "prompt_ids:" ? &g.prompt : key == "generated_ids:" ? &g.generated : nullptr;
    if (dst == nullptr) continue;
    int32_t id;
    while (ls >> id) dst->push_back(id);
  }
  return g;
}

}  // namespace kvcache::testing_util
