// `kvcache logits`: the next-token logits of every position of a sequence, written as raw
// little-endian float32 [n_tokens][vocab] (llama.cpp's logits_all), for debugging and
// comparison with other engines. Default: one prefill; --cache NAME: token by token through
// that container; --n-prompt N: the first N ids as one prefill, then token by token (how
// generate feeds a prompt and its tokens: what a lossy --kv-policy needs to act as it does
// there). --compare-exact: also the exact logits (one forward, no policy), and the difference
// after the prompt on stderr: the measured cost of a policy (docs/architecture.md, "Lossy KV
// policies").
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "tools/commands.h"
#include "tools/model_options.h"
#include "tools/option_rules.h"

namespace kvcache::tools {
namespace {

struct LogitsOptions {
  ModelOptions model;
  std::string prompt_ids;
  std::string out;
  bool by_token = false;
  int64_t n_prompt = 0;  // 0: unset
  bool compare_exact = false;
};

// Position i's logits [vocab] of `all` ([n][vocab]).
std::span<const float> row(const std::vector<float>& all, size_t vocab, size_t i) {
  return {all.data() + i * vocab, vocab};
}

size_t argmax(std::span<const float> l) {
  return static_cast<size_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

void run_logits(LogitsOptions& o) {
  const std::vector<int32_t> ids = parse_ids(o.prompt_ids);
  if (ids.empty()) throw Error(ErrorKind::kInvalidArgument, "--prompt-ids holds no ids");
  RunShape shape;  // token ids in, floats out, every position from one forward or token by token
  shape.caches = {o.model.cache};
  shape.kv_budget = !o.model.kv_budget.empty();
  check_options(*o.model.cmd, shape);
  LoadedModel lm = load_model(o.model.model, load_options(o.model));
  const Model& model = *lm.model;
  SessionConfig sc = session_config(o.model, model);
  const auto vocab = static_cast<size_t>(model.config().vocab_size);
  std::vector<float> all;
  all.reserve(ids.size() * vocab);
  const auto n_ids = static_cast<int64_t>(ids.size());
  if (o.n_prompt < 0 || o.n_prompt > n_ids)
    throw Error(ErrorKind::kInvalidArgument, "--n-prompt " + std::to_string(o.n_prompt) +
                                                 " must be in [1, " + std::to_string(n_ids) +
                                                 "] (the number of --prompt-ids)");
  if (!sc.cache.policy.exact() && o.n_prompt == 0 && !o.by_token)
    throw Error(ErrorKind::kInvalidArgument,
                "--kv-policy " + sc.cache.policy.key() +
                    " evicts between steps, and logits without --cache or --n-prompt computes "
                    "every position in one step: give --n-prompt N (N ids prefilled, the rest "
                    "token by token, as generate runs)");
  if (o.n_prompt > 0) {
    sc.prefill_chunk = o.n_prompt;
    Session s(model, sc);
    std::span<const float> l =
        s.forward_all(std::span<const int32_t>(ids).first(static_cast<size_t>(o.n_prompt)));
    all.assign(l.begin(), l.end());
    for (size_t i = static_cast<size_t>(o.n_prompt); i < ids.size(); ++i) {
      l = s.decode(ids[i]);
      all.insert(all.end(), l.begin(), l.end());
    }
  } else if (o.by_token) {
    Session s(model, sc);
    for (int32_t id : ids) {
      std::span<const float> l = s.decode(id);
      all.insert(all.end(), l.begin(), l.end());
    }
  } else {
    sc.prefill_chunk = static_cast<int64_t>(ids.size());
    Session s(model, sc);
    std::span<const float> l = s.forward_all(ids);
    all.assign(l.begin(), l.end());
  }
  if (o.compare_exact) {
    SessionConfig exact = sc;
    exact.cache.policy = KVPolicy{};
    exact.prefill_chunk = n_ids;
    Session s(model, exact);
    std::span<const float> l = s.forward_all(ids);
    const std::vector<float> ref(l.begin(), l.end());
    // The logits after the prompt: those that predict the tokens fed one by one.
    const size_t first = o.n_prompt > 0 ? static_cast<size_t>(o.n_prompt - 1) : 0;
    double max_diff = 0, sum_diff = 0;
    size_t agree = 0;
    for (size_t i = first; i < ids.size(); ++i) {
      const std::span<const float> a = row(all, vocab, i), b = row(ref, vocab, i);
      for (size_t j = 0; j < vocab; ++j) {
        const double d = std::fabs(static_cast<double>(a[j]) - b[j]);
        max_diff = std::max(max_diff, d);
        sum_diff += d;
      }
      agree += argmax(a) == argmax(b) ? 1 : 0;
    }
    const size_t n = ids.size() - first;
    std::printf(
        "{\"policy\": \"%s\", \"positions\": %zu, \"max_abs_logit_diff\": %.6g, "
        "\"mean_abs_logit_diff\": %.6g, \"top1_agreement\": %.4f}\n",
        sc.cache.policy.key().c_str(), n, max_diff, sum_diff / static_cast<double>(n * vocab),
        static_cast<double>(agree) / static_cast<double>(n));
  }
  std::FILE* f = std::fopen(o.out.c_str(), "wb");
  if (f == nullptr) throw Error(ErrorKind::kIo, o.out + ": cannot open for writing");
  const size_t written = std::fwrite(all.data(), sizeof(float), all.size(), f);
  const bool ok = std::fclose(f) == 0 && written == all.size();
  if (!ok) throw Error(ErrorKind::kIo, o.out + ": write failed (disk full?)");
  std::fprintf(stderr, "wrote %zu x %zu float32 logits to %s\n", ids.size(), vocab, o.out.c_str());
}

}  // namespace

void register_logits(CLI::App& app) {
  auto o = std::make_shared<LogitsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "logits", "Write the next-token logits of every position (float32 [n][vocab])");
  add_model_options(cmd, o->model);
  cmd->add_option("--prompt-ids", o->prompt_ids, "Token ids, e.g. \"1 403 407\"")->required();
  cmd->add_option("-o,--output", o->out, "Output file")->required();
  cmd->add_option("--n-prompt", o->n_prompt,
                  "Feed the first N ids as one prefill, then the rest token by token (as "
                  "generate does; a lossy --kv-policy needs it or --cache)");
  cmd->add_flag("--compare-exact", o->compare_exact,
                "Also compute the exact logits and print, as JSON on stdout, the max and mean "
                "|logit - exact| and the top-1 agreement over the positions after the prompt");
  // --cache given explicitly: feed token by token through that container.
  cmd->get_option("--cache")->each([o](const std::string&) { o->by_token = true; });
  cmd->callback([o] { run_logits(*o); });
}

}  // namespace kvcache::tools
