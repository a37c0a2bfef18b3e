// The kvcache CLI's subcommands. Each src/tools/cmd_<name>.cc defines one
// `void register_<name>(CLI::App&)` that adds its subcommand, its options and a callback doing
// the work; main.cc only calls register_commands. Callbacks throw kvcache::Error for bad
// input; main turns that into a message on stderr and exit code 2.
#pragma once

#include <CLI/CLI.hpp>

namespace kvcache::tools {

void register_run(CLI::App& app);       // cmd_run.cc: demo of the cache containers
void register_generate(CLI::App& app);  // cmd_generate.cc: text generation on a model
void register_logits(CLI::App& app);    // cmd_logits.cc: dump every position's logits
void register_convert(CLI::App& app);   // cmd_convert.cc: llama2.c -> GGUF
void register_plan(CLI::App& app);      // cmd_plan.cc: the KV memory bill of a model
void register_bench(CLI::App& app);     // cmd_bench.cc: llama-bench style speed tests
void register_tokenize(CLI::App& app);  // cmd_tokenize.cc: text on stdin -> token ids
void register_serve(CLI::App& app);     // cmd_serve.cc: OpenAI-compatible HTTP server
void register_batch(CLI::App& app);     // cmd_batch.cc: offline batch over JSON lines
void register_events(CLI::App& app);    // cmd_events.cc: KV events subscriber (serve --kv-events)

// Every subcommand above, in the order --help lists them (commands.cc).
void register_commands(CLI::App& app);

}  // namespace kvcache::tools
