// Scratch directories for tests. Each is a fresh folder under the system temp dir, removed with
// everything in it when its owner goes away, so a test run leaves nothing behind: before this,
// every run of the suite left over 100 MB of generated dummy models, configs and outputs in /tmp
// (27 paged-family test processes alone wrote 4 MB each; 8.3 GB had piled up on a development
// machine). The name carries the process id
// because ctest runs each test case as its own process, several at a time.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace kvcache::testing_util {

class ScratchDir {
 public:
  enum class Scope { kTest, kProcess };
  // <temp>/kvcache_<tag>_<pid>, and for Scope::kTest _<suite>_<test> of the running test ('/'
  // of parameterized names made '_', so the folder is one level deep and removed whole).
  explicit ScratchDir(const std::string& tag, Scope scope = Scope::kTest) {
    std::string name = "kvcache_" + tag + "_" + std::to_string(::getpid());
    const ::testing::TestInfo* t = ::testing::UnitTest::GetInstance()->current_test_info();
    if (scope == Scope::kTest && t != nullptr)
      name += std::string("_") + t->test_suite_name() + "_" + t->name();
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::remove_all(path_);  // a previous process with the same pid was killed
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;  // never throw from a destructor; a leftover folder is not a failure
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// The process's own scratch directory, created on first use and removed at exit: for what the
// tests of one process build once and share (generated dummy models).
inline const ScratchDir& process_scratch() {
  static const ScratchDir dir("test", ScratchDir::Scope::kProcess);
  return dir;
}

}  // namespace kvcache::testing_util
