// Which CLI options take effect in which run: one table for every subcommand (issue 36: no
// option is accepted and then ignored). A subcommand describes its run as a RunShape and calls
// check_options before it loads anything; an option the user gave that would change nothing in
// that run is an Error(kInvalidArgument) saying which option, why, and which subcommands or
// caches honour it. Every option a subcommand registers has an entry (an "always used" one
// included): a new option without one aborts the CLI, and tests/tools/cli_options_test.cc walks
// the registered app to say so first.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

namespace kvcache::tools {

// What one run will do, as far as the effect of an option depends on it. A subcommand sets the
// facts it has and leaves the others at their defaults. Facts known only once a file is read
// stay unset until then; an unset fact refuses nothing (the subcommand checks again after).
struct RunShape {
  // Cache implementations the run builds (bench: each listed; serve, batch: paged).
  std::vector<std::string> caches;
  bool kv_budget = false;             // --kv-budget sizes the paged pool
  bool kv_disk = false;               // --kv-disk: a disk tier under the pool (serve, batch, bench)
  bool kv_remote = false;             // --kv-remote: the shared remote tier (serve, batch)
  bool prefill = false;               // chunked prefills (serve, batch: step budgets)
  bool text = false;                  // text is tokenised or printed
  bool sampling = false;              // generate: --temp > 0
  bool repeat_penalty = false;        // generate: --repeat-penalty other than 1
  bool verify = false;                // generate --verify
  bool prefix_reuse = false;          // bench --prefix-reuse
  bool list_presets = false;          // plan --list-presets
  bool grouped_kv = false;            // plan: a --kv-dtype with scale groups (q8, q4, q2)
  std::optional<bool> has_tokenizer;  // serve, batch: the loaded model has a tokenizer
  std::optional<bool> hybrid;         // serve, batch, plan: the model has linear_attention layers
  std::optional<bool> weights_from_params;  // plan: weights priced as parameters x bytes
  std::optional<bool> embeds_vocab;         // convert: the tokenizer is a llama2.c vocabulary
};

// Registers on `cmd` the old spellings of its renamed options (hidden from --help), which
// check_options then refuses naming the new spelling: a user's old command line fails saying
// what to write instead, rather than as an unknown option.
void add_renamed_options(CLI::App* cmd);

// Throws Error(kInvalidArgument) for the first option given to `cmd` (in the table's order)
// that has no effect in `shape`, or whose value no cache of the run can use (--cache nonsense,
// --kernel flex on the paged cache). Options left at their defaults are never refused.
void check_options(const CLI::App& cmd, const RunShape& shape);

// Coverage, for tests: whether the table has an entry for `option` of subcommand `command`;
// and the entries naming an option that none of their subcommands registers ("serve --foo").
bool option_has_rule(const std::string& command, const CLI::Option& option);
std::vector<std::string> stale_option_rules(const CLI::App& app);

}  // namespace kvcache::tools
