#include "model/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
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

// MapMode::kRead (--no-mmap): the same bytes as the map, in memory that starts on a 2 MiB
// boundary (so every whole 2 MiB of it can be a transparent huge page), released by the
// destructor and carried by moves; a file of 5 MiB + 3 bytes covers whole and partial huge
// pages and a tail that is not a whole 4 KiB page. Errors as in map mode.
TEST(MappedFile, ReadModeHoldsTheSameBytesOnAHugePageBoundary) {
  const std::string p = temp_path("read.bin");
  std::string content((5u << 20) + 3, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 131 + (i >> 12));
  {
    std::ofstream f(p, std::ios::binary);
    f.write(content.data(), static_cast<std::streamsize>(content.size()));
  }
  MappedFile mapped(p);
  MappedFile read(p, MapMode::kRead);
  ASSERT_EQ(read.size(), content.size());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(read.data()) % (2u << 20), 0u);
  EXPECT_TRUE(read.bytes() == mapped.bytes());
  EXPECT_TRUE(read.bytes() == content);
  EXPECT_THROW(read.at(content.size() - 2, 3, "past the end"), Error);
  MappedFile moved = std::move(read);
  EXPECT_TRUE(moved.bytes() == content);
  EXPECT_EQ(read.data(), nullptr);
  std::filesystem::remove(p);
  // The bytes were read at open: the file's removal does not touch them.
  EXPECT_EQ(moved.bytes()[content.size() - 1], content.back());

  { std::ofstream f(p, std::ios::binary); }
  MappedFile empty(p, MapMode::kRead);
  EXPECT_EQ(empty.size(), 0u);
  EXPECT_EQ(empty.data(), nullptr);
  std::filesystem::remove(p);
  try {
    MappedFile m(p, MapMode::kRead);
    FAIL() << "expected an Error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos);
  }
}

}  // namespace
}  // namespace kvcache
