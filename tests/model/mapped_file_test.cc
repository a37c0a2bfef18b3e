#include "model/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace kvcache {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvcache_mf_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST(MappedFile, MapsContentAndChecksBounds) {
  const std::string p = temp_path("a.bin");
  {
    std::ofstream f(p, std::ios::binary);
    f << "hello world";
  }
  MappedFile m(p);
  EXPECT_EQ(m.size(), 11u);
  EXPECT_EQ(m.bytes(), "hello world");
  EXPECT_EQ(reinterpret_cast<const char*>(m.at(6, 5, "word"))[0], 'w');
  try {
    m.at(8, 4, "the tail");
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("the tail"), std::string::npos);
  }
  EXPECT_THROW(m.at(~0ull, 2, "overflow"), Error);
  MappedFile moved = std::move(m);
  EXPECT_EQ(moved.bytes(), "hello world");
  EXPECT_EQ(m.data(), nullptr);
  std::filesystem::remove(p);
}

TEST(MappedFile, MissingFileNamesPath) {
  const std::string p = temp_path("does_not_exist.gguf");
  try {
    MappedFile m(p);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos);
  }
}

TEST(MappedFile, EmptyFileHasNoData) {
  const std::string p = temp_path("empty.bin");
  { std::ofstream f(p, std::ios::binary); }
  MappedFile m(p);
  EXPECT_EQ(m.size(), 0u);
  EXPECT_THROW(m.at(0, 4, "magic"), Error);
  std::filesystem::remove(p);
}

TEST(MappedFile, DirectoryIsRefused) {
  EXPECT_THROW(MappedFile m(std::filesystem::temp_directory_path().string()), Error);
}

}  // namespace
}  // namespace kvcache
