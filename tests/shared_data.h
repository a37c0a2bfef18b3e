// Where the tests find ../shared's data (stories260K, llama2.c's golden outputs, llama.cpp's
// vocabularies) and how they read and write whole files, so each layer's tests need no copy of
// their own.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

namespace kvcache::testing_util {

inline std::string shared_dir() {
  return KVCACHE_SHARED_DIR;
}
inline std::string stories_dir() {
  return shared_dir() + "/models/stories260K";
}
inline std::string stories_model() {
  return stories_dir() + "/stories260K.bin";
}
inline std::string golden_dir() {
  return shared_dir() + "/golden/stories260K";
}
inline bool have_stories() {
  return std::filesystem::exists(stories_model()) &&
         std::filesystem::exists(stories_dir() + "/tok512.bin") &&
         std::filesystem::exists(golden_dir() + "/once_upon_a_time.ids") &&
         std::filesystem::exists(golden_dir() + "/once_upon_a_time.txt");
}
#define KVCACHE_REQUIRE_STORIES()                                                         \
  if (!::kvcache::testing_util::have_stories())                                           \
  GTEST_SKIP() << "stories260K or its golden outputs not found under " KVCACHE_SHARED_DIR \
                  " (the ../shared data folder); skipping"

// The whole file; empty when it cannot be read (the caller's assertions say what was expected).
inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace kvcache::testing_util
