// The entry of the benchmark tools that are not Google Benchmark binaries (bench_decode,
// bench_serve, bench_chaos): their options through CLI11 (the load options the first two share
// declared once), then their run, with one exit-code contract.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

namespace kvcache::bench {

// The load options of bench_decode and bench_serve: each tool sets its own defaults.
struct LoadArgs {
  int max_tokens = 0;     // tokens generated per request
  int prompt_tokens = 0;  // prompt tokens per request
  int threads = 0;        // 0: all cores
  int repeat = 1;
  bool fast = false;  // EngineConfig::batch_invariant off (BLAS for every multi-row linear)
};

// Adds --max-tokens, --prompt-tokens, -t/--threads, --repeat and --fast; `request` names one
// request of the tool in the help ("sequence", "stream").
inline void add_load_options(CLI::App& app, LoadArgs& a, const std::string& request) {
  app.add_option("--max-tokens", a.max_tokens, "tokens generated per " + request)
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--prompt-tokens", a.prompt_tokens, "prompt tokens per " + request)
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("-t,--threads", a.threads, "threads (0: all cores)")->check(CLI::Range(0, 1024));
  app.add_option("--repeat", a.repeat, "repetitions")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_flag("--fast", a.fast, "batch_invariant off (BLAS for multi-row linears)");
}

// Parses argv into `app`'s options, then returns run(). --help exits 0; a bad option or value
// prints CLI11's message and exits 2; an error while loading or running (kvcache::Error or any
// std::exception) prints "<tool>: <what>" and exits 2 instead of ending in std::terminate.
template <typename Run>
int parse_and_run(CLI::App& app, int argc, char** argv, const char* tool, Run&& run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", tool, e.what());
    return 2;
  }
}

}  // namespace kvcache::bench
