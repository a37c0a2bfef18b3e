// Runs the built `kvcache` CLI (path from the KVCACHE_CLI compile definition) through the shell
// and captures its stdout, stderr and exit code, for tests of the command-line contract. The one
// runner of the CLI tests, so that each states only its arguments and what it expects.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "shared_data.h"

namespace kvcache::testing_util {

struct CliResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// What the CLI runs with besides its arguments. Every member has an initializer, so a caller
// names only what it sets ({.env = ...}) without -Wmissing-field-initializers.
struct CliRun {
  std::string stdin_text = {};
  // Set for the CLI's process only, e.g. KVCACHE_CACHE_DIR, so that dummy presets are built in
  // a test's scratch folder rather than the user's cache.
  std::vector<std::pair<std::string, std::string>> env = {};
};

// `s` as one shell word, whatever it holds.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// `args` go to the shell as written: quote paths that may hold spaces with shell_quote.
inline CliResult run_cli(const std::string& args, const CliRun& run = {}) {
  static int counter = 0;
  // pid in the name: ctest runs test cases of one binary as parallel processes.
  const std::string base = ::testing::TempDir() + "kvcache_cli_" + std::to_string(getpid()) + "_" +
                           std::to_string(++counter);
  const std::string in_path = base + ".in", out_path = base + ".out", err_path = base + ".err";
  write_file(in_path, run.stdin_text);
  std::string cmd;
  for (const auto& [name, value] : run.env) cmd += name + "=" + shell_quote(value) + " ";
  cmd += shell_quote(KVCACHE_CLI) + " " + args + " <" + shell_quote(in_path) + " >" +
         shell_quote(out_path) + " 2>" + shell_quote(err_path);
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  std::remove(in_path.c_str());
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return r;
}

}  // namespace kvcache::testing_util
