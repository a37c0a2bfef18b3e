// The kvcache command-line tool: subcommands over the library (see commands.h for the
// pattern). Errors from bad input reach here as kvcache::Error and end the process with exit
// code 2 and a one-line message on stderr.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>

#include "core/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kvcache: a KV cache engine for LLM inference, and the runtime that proves it"};
  app.set_version_flag("--version", std::string("kvcache ") + KVCACHE_VERSION);
  app.require_subcommand(1);

  kvcache::tools::register_commands(app);

  try {
    app.parse(argc, argv);  // runs the chosen subcommand's callback
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const kvcache::Error& e) {
    std::fprintf(stderr, "kvcache: %s: %s\n", kvcache::error_kind_name(e.kind()), e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "kvcache: out of memory: an allocation failed; lower --max-cache-len, "
                 "--kv-budget, the batch or "
                 "the prompt length\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvcache: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
