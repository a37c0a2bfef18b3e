#include "tools/option_rules.h"

#include <algorithm>
#include <iterator>
#include <string_view>

#include "cache/cache.h"
#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/paged_attention.h"

namespace kvcache::tools {
namespace {

// Subcommands as bits, so that one entry serves every subcommand sharing an option.
enum Command : unsigned {
  kRun = 1u << 0,
  kGenerate = 1u << 1,
  kLogits = 1u << 2,
  kBench = 1u << 3,
  kServe = 1u << 4,
  kBatch = 1u << 5,
  kPlan = 1u << 6,
  kConvert = 1u << 7,
  kTokenize = 1u << 8,
  kEvents = 1u << 9,
};
constexpr unsigned kEngine = kServe | kBatch;                        // the paged cache, always
constexpr unsigned kModel = kGenerate | kLogits | kBench | kEngine;  // add_model_options

unsigned command_bit(const std::string& name) {
  static const std::pair<const char*, Command> kNames[] = {
      {"run", kRun},           {"generate", kGenerate}, {"logits", kLogits}, {"bench", kBench},
      {"serve", kServe},       {"batch", kBatch},       {"plan", kPlan},     {"convert", kConvert},
      {"tokenize", kTokenize}, {"events", kEvents},
  };
  for (const auto& [n, bit] : kNames)
    if (name == n) return bit;
  return 0;
}

// One option the user gave, as a rule sees it.
struct Given {
  const std::string& command;
  std::string option;  // as registered: "-t/--threads"
  std::string value;   // its values joined by ','
  const RunShape& shape;
};
// The reason `g` has no effect (or cannot be used), or nothing when it takes effect.
using Refusal = std::optional<std::string> (*)(const Given& g);

struct OptionRule {
  unsigned commands;
  const char* option;  // any of its names
  Refusal refusal;     // nullptr: takes effect in every run of these subcommands
};

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool contains(const std::vector<std::string>& items, std::string_view x) {
  return std::find(items.begin(), items.end(), x) != items.end();
}

bool is_engine(const Given& g) {
  return g.command == "serve" || g.command == "batch";
}

// "with --cache dynamic" / "in serve (always the paged cache)".
std::string situation(const Given& g) {
  if (is_engine(g)) return "in " + g.command + ", which always uses the paged cache";
  std::string caches;
  for (const std::string& c : g.shape.caches) caches += (caches.empty() ? "" : ",") + c;
  return "with --cache " + caches;
}

std::string no_effect(const Given& g, const std::string& when, const std::string& honoured) {
  return g.command + ": " + g.option + " has no effect " + when + ": " + honoured;
}

// Renamed options: the old spelling stays registered only to be refused naming the new one.
struct Renamed {
  unsigned commands;
  const char* old_name;
  const char* new_name;
};
constexpr Renamed kRenamed[] = {
    // One name for a block's token count in the code, the flags and the JSON.
    {kModel, "--block-size", "--block-tokens"},
    {kPlan, "--block", "--block-tokens"},
};

std::optional<std::string> renamed(const Given& g) {
  const Renamed* r = std::find_if(std::begin(kRenamed), std::end(kRenamed), [&](const Renamed& x) {
    return (x.commands & command_bit(g.command)) != 0 && g.option == x.old_name;
  });
  KV_CHECK(r != std::end(kRenamed), "option_rules: " + g.command + " " + g.option +
                                        " is refused as renamed but has no kRenamed entry");
  return g.command + ": " + g.option + " was renamed " + r->new_name + "; use " + r->new_name +
         " " + g.value;
}

// The no-cache reference's container (cache/recompute_layer.h) keeps only one forward's tokens:
// what --verify compares against, never a cache to generate, score or benchmark with.
constexpr const char* kRecompute = "recompute";

// The caches a user may choose.
std::vector<std::string> cache_names() {
  std::vector<std::string> out;
  for (const std::string& entry : LayerRegistry::names()) {
    const std::string impl = entry.substr(0, entry.find('/'));
    if (impl != kRecompute && !contains(out, impl)) out.push_back(impl);
  }
  return out;
}

std::optional<std::string> cache_value(const Given& g) {
  if (is_engine(g)) {
    // paged: pages in --kv-dtype (what happens anyway); quantized: packed pages (--kv-bits,
    // --kv-quant select their format, and imply it).
    if (g.value == "paged" || g.value == "quantized") return std::nullopt;
    return g.command + ": --cache " + g.value + ": serve and batch serve from the paged pool: " +
           "--cache paged (pages in --kv-dtype, the default) or --cache quantized (packed pages, " +
           "--kv-bits / --kv-quant); the other caches are honoured by generate, logits and bench";
  }
  const std::vector<std::string> known = cache_names();
  for (const std::string& c : g.shape.caches) {
    if (c == kRecompute)
      return g.command +
             ": --cache recompute is the no-cache reference of --verify: it keeps only one "
             "forward's tokens, so nothing after the first chunk could attend to them; use " +
             join(known);
    if (!contains(known, c))
      return g.command + ": --cache " + c + ": no such cache; registered: " + join(known);
  }
  return std::nullopt;
}

// Static capacities: --cache static, and the paged pool when no budget sizes it.
std::optional<std::string> capacity(const Given& g) {
  const bool paged = contains(g.shape.caches, "paged");
  if (contains(g.shape.caches, "static") || contains(g.shape.caches, "offloaded_static") ||
      (paged && !g.shape.kv_budget))
    return std::nullopt;
  if (paged)
    return no_effect(g, "with --kv-budget", "the budget sizes the paged pool; give one of the two");
  return no_effect(
      g, situation(g),
      "a dynamic, offloaded or quantized cache grows as it needs, with no capacity; it is the "
      "capacity of --cache static and offloaded_static, and of the paged cache (--cache paged, "
      "serve, batch) when no --kv-budget "
      "is given");
}

std::optional<std::string> kernel(const Given& g) {
  const std::vector<std::string> dense = attention_kernel_names(),
                                 paged = paged_attention_kernel_names();
  const std::string kinds = "the dynamic and static caches run " + join(dense) +
                            "; the paged cache (--cache paged, serve, batch) runs " + join(paged);
  if (!contains(dense, g.value) && !contains(paged, g.value))
    return g.command + ": --kernel " + g.value + ": no such attention kernel; " + kinds;
  if (contains(g.shape.caches, "paged") && !contains(paged, g.value))
    return g.command + ": --kernel " + g.value + " cannot run on the paged cache" +
           (is_engine(g) ? " (serve and batch always use it)" : "") + ": its kernels are " +
           join(paged) + "; " + g.value +
           " is a kernel of the dynamic and static caches (generate, logits, bench)";
  const bool all_quantized = std::all_of(g.shape.caches.begin(), g.shape.caches.end(),
                                         [](const std::string& c) { return c == "quantized"; });
  if (all_quantized && !g.shape.verify)  // --verify's no-cache reference runs the kernel
    return no_effect(g, situation(g),
                     "the quantized cache attends through its own dequantizing kernel; --kernel "
                     "chooses the kernel of the other caches and of generate --verify's no-cache "
                     "reference (" +
                         kinds + ")");
  return std::nullopt;
}

std::optional<std::string> needs_paged(const Given& g) {
  if (contains(g.shape.caches, "paged")) return std::nullopt;
  return no_effect(
      g, situation(g),
      "it configures the paged cache, which --cache paged builds in generate, logits and bench, "
      "and serve and batch always use");
}

std::optional<std::string> needs_quantized(const Given& g) {
  if (contains(g.shape.caches, "quantized")) return std::nullopt;
  if (is_engine(g))
    return g.command + ": " + g.option +
           " configures quantized pages, which --kv-bits N or --kv-quant SCHEME (or --cache "
           "quantized) select; without them the pages hold --kv-dtype rows";
  return no_effect(g, situation(g),
                   "it configures the quantized cache, which --cache quantized builds in generate, "
                   "logits and bench");
}

std::optional<std::string> needs_offloaded(const Given& g) {
  for (const std::string& c : g.shape.caches)
    if (c == "offloaded" || c == "offloaded_static") return std::nullopt;
  return no_effect(g, situation(g),
                   "it configures the offloaded cache, which --cache offloaded or offloaded_static "
                   "builds in generate, logits and bench");
}

// --kv-policy: a lossy policy acts where a container honours it (cache/evicting_layer.h).
std::optional<std::string> kv_policy(const Given& g) {
  KVPolicy policy;
  try {
    policy = KVPolicy::parse(g.value);
  } catch (const Error& e) {
    return g.command + ": " + e.what();
  }
  if (policy.exact()) return std::nullopt;
  const std::vector<std::string> ok = PolicyLayerRegistry::implementations();
  // serve / batch: the paged store evicts whole blocks shared between requests, by position
  // (cache/paged_store.h, "StreamingLLM"); per-head choices by attention cannot be shared.
  if (is_engine(g) && policy.kind == KVPolicyKind::kStreaming) return std::nullopt;
  if (is_engine(g))
    return g.command + ": --kv-policy " + policy.key() +
           ": the paged cache of serve and batch evicts whole blocks that requests share, so it "
           "runs only streaming:sink=S,window=W (a choice by position); " +
           std::string(policy.kind_name()) +
           " chooses tokens per KV head by attention, which generate and logits honour (--cache " +
           join(ok) + "); use --kv-policy exact or streaming here";
  if (g.command == "bench")
    return g.command + ": --kv-policy " + policy.key() +
           ": bench measures the exact containers; lossy policies are honoured by generate and "
           "logits (--cache " +
           join(ok) + ") and streaming by serve and batch; use --kv-policy exact here";
  for (const std::string& c : g.shape.caches)
    if (!contains(ok, c))
      return g.command + ": --kv-policy " + policy.key() + " cannot act on --cache " + c +
             "; the caches that honour a lossy policy: " + join(ok);
  return std::nullopt;
}

std::optional<std::string> chunk(const Given& g) {
  if (g.shape.prefill) return std::nullopt;
  const std::string honoured =
      "--chunk is the prefill chunk of generate and bench (pp tests, depths, --prefix-reuse) and "
      "the step budget of serve and batch";
  if (g.command == "logits")
    return no_effect(g, "in logits",
                     "every position comes from one forward (token by token with --cache), "
                     "never a chunked prefill; " +
                         honoured);
  return no_effect(g, "when nothing is prefilled (every -p and -d is 0)", honoured);
}

std::optional<std::string> tokenizer(const Given& g) {
  if (g.shape.text) return std::nullopt;
  const std::string honoured =
      "a tokenizer is used where text is read or written: generate with --prompt or --output text, "
      "serve, batch, and convert (llama2.c vocabularies)";
  if (g.command == "logits") return no_effect(g, "in logits, which reads token ids only", honoured);
  if (g.command == "bench") return no_effect(g, "in bench, which feeds random token ids", honoured);
  return no_effect(g, "with --prompt-ids and --output ids, where no text is read or written",
                   honoured);
}

std::optional<std::string> convert_tokenizer(const Given& g) {
  if (g.shape.embeds_vocab.value_or(true)) return std::nullopt;
  return g.command + ": --tokenizer " + g.value +
         " has no effect: convert embeds only llama2.c vocabularies "
         "(tokenizer.bin, tok512.bin); this one would be left out of the GGUF";
}

std::optional<std::string> sampling(const Given& g) {
  if (g.shape.sampling) return std::nullopt;
  return no_effect(g, "with --temp 0",
                   "greedy decoding takes the most likely token; it applies when --temp > 0");
}

std::optional<std::string> repeat_window(const Given& g) {
  if (g.shape.repeat_penalty) return std::nullopt;
  return no_effect(
      g, "with --repeat-penalty 1 (off)",
      "it is how far back the repetition penalty looks; give a --repeat-penalty other than 1");
}

std::optional<std::string> verify_tolerance(const Given& g) {
  if (g.shape.verify) return std::nullopt;
  return no_effect(g, "without --verify", "it is the tolerance of --verify's comparison");
}

std::optional<std::string> bench_tests(const Given& g) {
  if (!g.shape.prefix_reuse) return std::nullopt;
  return no_effect(
      g, "with --prefix-reuse",
      "that test replaces the pp/tg tests and takes its prompt length from TOKENS:FRACTION");
}

std::optional<std::string> batch_queue(const Given& g) {
  return no_effect(g, "in batch",
                   "batch queues every input line at once; the queue limit is serve's");
}

std::optional<std::string> chat_template(const Given& g) {
  if (g.shape.has_tokenizer.value_or(true)) return std::nullopt;
  return no_effect(g, "with a model that has no tokenizer",
                   "chat messages cannot be tokenised, so only token-id prompts are served; pass "
                   "--tokenizer FILE");
}

std::optional<std::string> hybrid_snapshots(const Given& g) {
  if (g.shape.hybrid.value_or(true)) return std::nullopt;
  return no_effect(g, "with a model that has no linear_attention layers",
                   "state snapshots serve the prefix cache of hybrid models (Qwen3-Next); "
                   "attention layers' blocks need none");
}

std::optional<std::string> kv_disk_budget(const Given& g) {
  if (g.shape.kv_disk) return std::nullopt;
  return no_effect(g, "without --kv-disk",
                   "it bounds the disk tier's files; give the tier's directory with --kv-disk DIR");
}

std::optional<std::string> kv_remote_option(const Given& g) {
  if (g.shape.kv_remote) return std::nullopt;
  return no_effect(g, "without --kv-remote",
                   "it tunes the shared remote tier; give its Redis with --kv-remote "
                   "redis://HOST:PORT");
}

std::optional<std::string> bench_kv_disk(const Given& g) {
  if (g.shape.prefix_reuse) return std::nullopt;
  return no_effect(g, "without --prefix-reuse",
                   "the disk tier serves prefix hits; --prefix-reuse N:F times them");
}

std::optional<std::string> bench_kv_disk_cold(const Given& g) {
  if (!g.shape.prefix_reuse || g.shape.kv_disk) return bench_kv_disk(g);
  return no_effect(g, "without --kv-disk", "it drops the disk tier's files from the page cache");
}

std::optional<std::string> plan_option(const Given& g) {
  if (!g.shape.list_presets) return std::nullopt;
  return no_effect(g, "with --list-presets", "it only prints the preset names");
}

std::optional<std::string> plan_snapshots(const Given& g) {
  if (g.shape.list_presets) return plan_option(g);
  return hybrid_snapshots(g);
}

std::optional<std::string> plan_kv_group(const Given& g) {
  if (g.shape.list_presets || g.shape.grouped_kv) return plan_option(g);
  return no_effect(g, "with a float --kv-dtype",
                   "only the q8, q4 and q2 formats have scale groups");
}

std::optional<std::string> plan_weight_dtype(const Given& g) {
  if (g.shape.list_presets || g.shape.weights_from_params.value_or(true)) return plan_option(g);
  return no_effect(g, "for this model",
                   "its weights are priced as stored (GGUF) or not at all; --weight-dtype prices "
                   "weights known as a parameter count (presets, config.json)");
}

// The table. Order matters only for which of several refused options is named: values that no
// cache can use first, then the rest in roughly the order of --help.
const OptionRule kRules[] = {
    // Old spellings (kRenamed), refused before anything else.
    {kModel, "--block-size", renamed},
    {kPlan, "--block", renamed},
    // Every subcommand that runs a model (add_model_options; serve and batch through
    // add_engine_options).
    {kModel, "--cache", cache_value},
    {kModel, "--kernel", kernel},
    {kModel | kRun | kConvert | kTokenize, "--model", nullptr},
    {kModel, "--tokenizer", tokenizer},
    {kConvert, "--tokenizer", convert_tokenizer},
    {kModel, "--max-cache-len", capacity},
    {kModel, "--kv-dtype", nullptr},
    {kModel, "--threads", nullptr},
    {kModel, "--chunk", chunk},
    {kModel, "--progress", nullptr},
    {kModel, "--no-mmap", nullptr},
    {kModel, "--block-tokens", needs_paged},
    {kModel, "--kv-budget", needs_paged},
    {kModel, "--kv-policy", kv_policy},
    {kModel, "--kv-bits", needs_quantized},
    {kModel, "--kv-quant", needs_quantized},
    {kModel, "--kv-group", needs_quantized},
    {kModel, "--kv-residual", needs_quantized},
    {kModel, "--offload-dir", needs_offloaded},
    // generate
    {kGenerate, "--prompt", nullptr},
    {kGenerate | kLogits, "--prompt-ids", nullptr},
    {kGenerate, "--n-predict", nullptr},
    {kGenerate, "--temp", nullptr},
    {kGenerate, "--top-k", sampling},
    {kGenerate, "--top-p", sampling},
    {kGenerate, "--min-p", sampling},
    {kGenerate, "--seed", sampling},
    {kGenerate, "--repeat-penalty", nullptr},  // greedy decoding applies it too
    {kGenerate, "--repeat-last-n", repeat_window},
    {kGenerate, "--ignore-eos", nullptr},
    {kGenerate | kLogits | kBench | kBatch | kConvert, "--output", nullptr},
    {kLogits, "--n-prompt", nullptr},
    {kLogits, "--compare-exact", nullptr},
    {kGenerate, "--verify", nullptr},
    {kGenerate, "--verify-tol", verify_tolerance},
    {kGenerate, "--save-session", nullptr},
    {kGenerate, "--load-session", nullptr},
    // refused by generate itself for a decoder-only model (it has no encoder)
    {kGenerate, "--encoder-ids", nullptr},
    // speculative decoding: generate refuses --spec-k, --spec-ngram and --draft-model itself
    // when --spec does not use them
    {kGenerate, "--spec", nullptr},
    {kGenerate, "--spec-k", nullptr},
    {kGenerate, "--spec-ngram", nullptr},
    {kGenerate, "--draft-model", nullptr},
    // bench (its --cache is a list, checked above)
    {kBench, "--n-prompt", bench_tests},
    {kBench, "--n-gen", bench_tests},
    {kBench, "--n-depth", bench_tests},
    {kBench, "--repetitions", nullptr},
    {kBench, "--prefix-reuse", nullptr},
    {kBench, "--kv-disk", bench_kv_disk},
    {kBench, "--kv-disk-cold", bench_kv_disk_cold},
    {kBench, "--offload-cold", needs_offloaded},
    // serve and batch
    {kEngine, "--max-running", nullptr},
    {kEngine, "--scheduler", nullptr},      // values checked by engine_config
    {kEngine, "--safety-margin", nullptr},  // refused there with --scheduler prefill-first
    {kServe, "--max-waiting", nullptr},
    {kBatch, "--max-waiting", batch_queue},
    {kEngine, "--fast-prefill", nullptr},
    {kEngine, "--chat-template", chat_template},
    {kEngine, "--snapshot-every-blocks", hybrid_snapshots},
    {kEngine, "--max-snapshots", hybrid_snapshots},
    {kEngine, "--kv-disk", nullptr},
    {kEngine, "--kv-disk-budget", kv_disk_budget},
    {kEngine, "--kv-remote", nullptr},
    {kEngine, "--kv-remote-deadline-ms", kv_remote_option},
    {kEngine, "--kv-remote-write-budget", kv_remote_option},
    // speculative decoding: engine_config refuses --spec-k and --spec-ngram without --spec
    {kEngine, "--spec", nullptr},
    {kEngine, "--spec-k", nullptr},
    {kEngine, "--spec-ngram", nullptr},
    {kServe, "--host", nullptr},
    {kServe, "--port", nullptr},
    {kServe, "--slot-save-path", nullptr},
    {kServe, "--api-key", nullptr},
    {kServe, "--served-model-name", nullptr},
    {kServe, "--default-max-tokens", nullptr},
    // serve's limits: each bounds every request or connection
    {kServe, "--max-connections", nullptr},
    {kServe, "--request-timeout", nullptr},
    {kServe, "--idle-timeout", nullptr},
    {kServe, "--write-timeout", nullptr},
    {kServe, "--max-body-bytes", nullptr},
    {kServe, "--drain-timeout", nullptr},
    {kServe, "--max-prompt-tokens", nullptr},
    {kServe, "--max-n", nullptr},
    {kServe, "--max-stop-strings", nullptr},
    {kServe, "--max-stop-bytes", nullptr},
    {kServe, "--check-invariants", nullptr},
    {kServe, "--kv-events", nullptr},
    {kServe, "--kv-events-topic", nullptr},  // refused without --kv-events (cmd_serve.cc)
    {kServe, "--kv-events-replay", nullptr},
    // events: the KV events subscriber, each option always in effect
    {kEvents, "--endpoint", nullptr},
    {kEvents, "--topic", nullptr},
    {kEvents, "--replay", nullptr},
    {kEvents, "--from-seq", nullptr},  // refused without --replay (cmd_events.cc)
    {kEvents, "--count", nullptr},
    {kEvents, "--timeout", nullptr},
    {kEvents, "--json", nullptr},
    {kBatch, "--input", nullptr},
    // run: the container demo feeds every container, so each of its options reaches one.
    {kRun, "--prefill", nullptr},
    {kRun, "--decode", nullptr},
    {kRun, "--batch", nullptr},
    {kRun, "--kv-heads", nullptr},
    {kRun, "--head-dim", nullptr},
    {kRun, "--window", nullptr},
    {kRun, "--chunk", nullptr},
    {kRun | kConvert, "--dtype", nullptr},
    {kRun, "--seed", nullptr},
    // plan
    {kPlan, "--list-presets", nullptr},
    {kPlan, "--config", plan_option},
    {kPlan, "--preset", plan_option},
    {kPlan, "--context", plan_option},
    {kPlan, "--batch", plan_option},
    {kPlan, "--kv-dtype", plan_option},
    {kPlan, "--kv-group", plan_kv_group},
    {kPlan, "--block-tokens", plan_option},
    {kPlan, "--budget", plan_option},
    {kPlan, "--snapshot-every-blocks", plan_snapshots},
    {kPlan, "--max-snapshots", plan_snapshots},
    {kPlan, "--weight-dtype", plan_weight_dtype},
    {kPlan, "--output", plan_option},
    {kPlan, "--json", plan_option},
    {kPlan, "--svg", plan_option},
    // tokenize
    {kTokenize, "--pieces", nullptr},
};

const OptionRule* find_rule(unsigned bit, const CLI::Option& option) {
  for (const OptionRule& r : kRules)
    if ((r.commands & bit) != 0 && option.check_name(r.option)) return &r;
  return nullptr;
}

bool is_help(const CLI::App& cmd, const CLI::Option* option) {
  return option == cmd.get_help_ptr();
}

}  // namespace

void add_renamed_options(CLI::App* cmd) {
  const unsigned bit = command_bit(cmd->get_name());
  for (const Renamed& r : kRenamed)
    if ((r.commands & bit) != 0) cmd->add_option(r.old_name)->group("");
}

void check_options(const CLI::App& cmd, const RunShape& shape) {
  const std::string& command = cmd.get_name();
  const unsigned bit = command_bit(command);
  KV_CHECK(bit != 0, "option_rules: no rules for subcommand '" + command + "'");
  for (const CLI::Option* option : cmd.get_options())
    KV_CHECK(is_help(cmd, option) || find_rule(bit, *option) != nullptr,
             "option_rules: " + command + " " + option->get_name(false, true) +
                 " has no entry in the option table (src/tools/option_rules.cc)");
  for (const OptionRule& r : kRules) {
    if ((r.commands & bit) == 0 || r.refusal == nullptr) continue;
    const CLI::Option* option = cmd.get_option_no_throw(r.option);
    if (option == nullptr || option->count() == 0) continue;
    std::string value;
    for (const std::string& v : option->results()) value += (value.empty() ? "" : ",") + v;
    std::string name = option->get_name(false, true);
    if (name.empty()) name = r.option;  // CLI11 names no hidden option (renamed ones)
    std::replace(name.begin(), name.end(), ',', '/');
    if (const std::optional<std::string> why = r.refusal(Given{command, name, value, shape}))
      throw Error(ErrorKind::kInvalidArgument, *why);
  }
}

bool option_has_rule(const std::string& command, const CLI::Option& option) {
  return find_rule(command_bit(command), option) != nullptr;
}

std::vector<std::string> stale_option_rules(const CLI::App& app) {
  const std::vector<const CLI::App*> subs = app.get_subcommands({});
  unsigned registered = 0;
  for (const CLI::App* sub : subs) registered |= command_bit(sub->get_name());
  std::vector<std::string> stale;
  for (const OptionRule& r : kRules) {
    if ((r.commands & ~registered) != 0)
      stale.push_back(std::string("(an unregistered subcommand) ") + r.option);
    for (const CLI::App* sub : subs)
      if ((r.commands & command_bit(sub->get_name())) != 0 &&
          sub->get_option_no_throw(r.option) == nullptr)
        stale.push_back(sub->get_name() + " " + r.option);
  }
  return stale;
}

}  // namespace kvcache::tools
