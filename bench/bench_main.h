// The entry of the benchmark tools that are not Google Benchmark binaries (bench_decode,
// bench_serve): their options through CLI11, then their run, with one exit-code contract.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

namespace kvcache::bench {

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
