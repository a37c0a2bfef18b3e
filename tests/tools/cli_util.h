// Runs the built `kvcache` CLI (path from the KVCACHE_CLI compile definition) and captures its
// stdout, stderr and exit code, for tests of the command-line contract.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

namespace kvcache::testing_util {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline CliResult run_cli(const std::string& args, const std::string& stdin_text = "") {
  static int counter = 0;
  // pid in the name: ctest runs test cases of one binary as parallel processes.
  const std::string base = ::testing::TempDir() + "kvcache_cli_" + std::to_string(getpid()) +
                           "_" + std::to_string(++counter);
  const std::string in_path = base + ".in", out_path = base + ".out", err_path = base + ".err";
  std::ofstream(in_path, std::ios::binary) << stdin_text;
  const std::string cmd = std::string("'") + KVCACHE_CLI + "' " + args + " <'" + in_path +
                          "' >'" + out_path + "' 2>'" + err_path + "'";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  std::remove(in_path.c_str());
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return r;
}

}  // namespace kvcache::testing_util
