// `kvcache logits`: the next-token logits of every position of a sequence, written as raw
// little-endian float32 [n_tokens][vocab] (llama.cpp's logits_all), for debugging and
// comparison with other engines. Default: one prefill; --cache NAME: token by token through
// that container.
#include <CLI/CLI.hpp>
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
};

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
  if (o.by_token) {
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
  // --cache given explicitly: feed token by token through that container.
  cmd->get_option("--cache")->each([o](const std::string&) { o->by_token = true; });
  cmd->callback([o] { run_logits(*o); });
}

}  // namespace kvcache::tools
