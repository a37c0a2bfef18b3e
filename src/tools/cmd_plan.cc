// `kvcache plan`: the KV memory bill of a model from its own config (config.json, a GGUF file,
// or an embedded preset), before anything is allocated. Table by default, -o json for scripts,
// --svg FILE for a plot of KV memory against context length.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "core/error.h"
#include "model/dummy.h"
#include "model/kv_plan.h"
#include "tools/commands.h"
#include "tools/option_rules.h"

namespace kvcache::tools {
namespace {

struct PlanArgs {
  std::string config;
  std::string preset;
  int64_t context = 4096;
  int64_t batch = 1;
  std::string kv_dtype = "f16";
  int64_t kv_group = 64;
  int64_t block_tokens = 1;
  int64_t snapshot_every_blocks = 4;
  int64_t max_snapshots = 16;
  std::string budget;
  std::string weight_dtype = "bf16";
  std::string output = "table";
  std::string svg;
  bool list = false;
};

// --config dummy:NAME[:dtype]: the built-in test model's own config, as `generate --model
// dummy:NAME` would load it (HF-style presets through their config.json text, so layer_types,
// windows and MLA fields are read by the same parser as a real folder).
PlanModel plan_model_for(const std::string& config) {
  if (config.rfind("dummy:", 0) != 0) return plan_model_from_path(config);
  std::string name = config.substr(6);
  if (const size_t colon = name.find(':'); colon != std::string::npos) name.resize(colon);
  if (dummy_preset_is_hf(name))
    return plan_model_from_hf_json(dummy_preset_config_json(name), config);
  return plan_model_from_config(dummy_preset(name), config);
}

void run_plan(const CLI::App& cmd, const PlanArgs& a) {
  RunShape shape;
  shape.list_presets = a.list;
  shape.grouped_kv = a.kv_dtype == "q8" || a.kv_dtype == "q4" || a.kv_dtype == "q2";
  check_options(cmd, shape);
  if (a.list) {
    for (const std::string& n : plan_preset_names()) std::printf("%s\n", n.c_str());
    return;
  }
  if (a.config.empty() == a.preset.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "plan needs exactly one of --config FILE (config.json, a model folder or a GGUF "
                "file) and --preset NAME (see --list-presets)");
  }
  const PlanModel model = a.preset.empty() ? plan_model_for(a.config) : plan_preset(a.preset);
  shape.weights_from_params = !model.weight_bytes_exact.has_value() && model.params.has_value();
  shape.hybrid = model.linear.has_value();
  check_options(cmd, shape);
  PlanOptions o;
  o.context = a.context;
  o.batch = a.batch;
  o.format = parse_kv_format(a.kv_dtype, a.kv_group);
  o.block_tokens = a.block_tokens;
  o.snapshot_every_blocks = a.snapshot_every_blocks;
  o.max_snapshots = a.max_snapshots;
  if (a.weight_dtype == "f32") {
    o.weight_bytes_per_param = 4;
  } else if (a.weight_dtype == "f16" || a.weight_dtype == "bf16") {
    o.weight_bytes_per_param = 2;
  } else if (a.weight_dtype == "q8_0") {
    o.weight_bytes_per_param = 34.0 / 32.0;
  } else {
    throw Error(ErrorKind::kInvalidArgument,
                "unknown --weight-dtype '" + a.weight_dtype + "': expected f32, f16, bf16 or q8_0");
  }
  if (!a.budget.empty()) o.budget_bytes = parse_byte_size(a.budget);
  const PlanResult r = compute_plan(model, o);
  if (a.output == "json") {
    std::fputs(plan_json(model, o, r).c_str(), stdout);
  } else if (a.output == "table") {
    std::fputs(plan_table(model, o, r).c_str(), stdout);
  } else {
    throw Error(ErrorKind::kInvalidArgument,
                "unknown output format '" + a.output + "': expected table or json");
  }
  if (!a.svg.empty()) {
    std::ofstream out(a.svg, std::ios::binary);
    out << plan_svg(model, o);
    if (!out) throw Error(ErrorKind::kIo, a.svg + ": cannot write the SVG plot");
    std::fprintf(stderr, "plot written to %s\n", a.svg.c_str());
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "The KV memory bill of a model from its config: per layer type, totals, budget");
  cmd->add_option("--config", args->config,
                  "config.json, a Hugging Face folder, a GGUF file, or dummy:PRESET (the built-in "
                  "test models)");
  cmd->add_option("--preset", args->preset, "an embedded model config (see --list-presets)");
  cmd->add_flag("--list-presets", args->list, "print the preset names and exit");
  cmd->add_option("--context", args->context, "tokens per request")->capture_default_str();
  cmd->add_option("--batch", args->batch, "concurrent requests")->capture_default_str();
  cmd->add_option("--kv-dtype", args->kv_dtype, "f32, f16, bf16, f8, q8, q4, q2")
      ->capture_default_str();
  cmd->add_option("--kv-group", args->kv_group, "elements per scale group for q8/q4/q2")
      ->capture_default_str();
  cmd->add_option("--block-tokens", args->block_tokens,
                  "tokens per paged block (rounds kept tokens up)")
      ->capture_default_str();
  cmd->add_option("--snapshot-every-blocks", args->snapshot_every_blocks,
                  "hybrid models: a prefix-cache snapshot of the linear state every N blocks "
                  "(as serve's option)")
      ->capture_default_str();
  cmd->add_option("--max-snapshots", args->max_snapshots,
                  "hybrid models: snapshots kept (as serve's option), billed once per server")
      ->capture_default_str();
  cmd->add_option("--budget", args->budget,
                  "memory budget, e.g. 24GiB: how many requests fit, "
                  "and the longest context for --batch requests");
  cmd->add_option("--weight-dtype", args->weight_dtype,
                  "bytes per parameter when weights come from a parameter count")
      ->capture_default_str();
  cmd->add_option("-o,--output", args->output, "table or json")->capture_default_str();
  cmd->add_flag_callback(
      "--json", [args] { args->output = "json"; }, "same as -o json");
  cmd->add_option("--svg", args->svg, "write a log-log plot of KV bytes against context here");
  add_renamed_options(cmd);
  cmd->callback([args, cmd] { run_plan(*cmd, *args); });
}

}  // namespace kvcache::tools
