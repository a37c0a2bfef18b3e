// `kvcache batch`: offline continuous batching. Reads JSON lines (OpenAI completion bodies:
// "prompt" text or token ids, or chat "messages"; plus an optional "id"), runs them all through
// one engine, and writes one JSON line per input line, in input order, with per-request stats.
// A bad line gets {"error": ...} in its place; the others still run.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "server/chat_template.h"
#include "server/openai.h"
#include "tools/commands.h"
#include "tools/engine_options.h"

namespace kvcache::tools {
namespace {

using nlohmann::json;

struct BatchOptions {
  EngineOptions engine;
  std::string input;
  std::string output;  // empty: stdout
  std::string chat_template;
};

void run_batch(const BatchOptions& o) {
  check_engine_options(o.engine);
  std::ifstream in(o.input);
  if (!in) throw Error(ErrorKind::kIo, "cannot open --input " + o.input);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) lines.push_back(line);

  LoadedModel lm = load_model(o.engine.model.model, load_options(o.engine.model));
  check_engine_options(o.engine, &lm);
  EngineOptions eo = o.engine;
  eo.max_waiting = std::max<int64_t>(eo.max_waiting, static_cast<int64_t>(lines.size()) + 1);
  const EngineConfig ec = engine_config(eo, *lm.model);
  Engine engine(*lm.model, lm.tokenizer.get(), ec);
  ServedModel sm;
  sm.name = o.engine.model.model;
  sm.tokenizer = lm.tokenizer.get();
  sm.add_bos = lm.add_bos;
  sm.stop_ids = lm.stop_ids;
  sm.limits.max_context = engine.max_context();
  std::unique_ptr<SpecialTokens> specials;
  if (lm.tokenizer) {
    specials = std::make_unique<SpecialTokens>(*lm.tokenizer);
    sm.specials = specials.get();
    const ChatTemplateChoice choice =
        choose_chat_template(o.chat_template, lm.chat_template, *lm.tokenizer);
    sm.chat_template = choice.tmpl;
    sm.chat_template_error = choice.error;
  }

  std::vector<json> results(lines.size());
  std::vector<std::optional<ApiRequest>> reqs(lines.size());
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < lines.size(); ++i) {
    json id = static_cast<int64_t>(i);
    try {
      const json body = json::parse(lines[i]);
      if (body.is_object() && body.contains("id")) id = body["id"];
      json b = body;
      b.erase("model");  // one model per run
      b.erase("id");     // the line's label, echoed in its result
      reqs[i] = parse_api_request(b, b.contains("messages"), sm);
      engine.submit(reqs[i]->params, [&results, &reqs, i, id](const StreamEvent& ev) {
        if (ev.output == nullptr) return;
        const RequestOutput& out = *ev.output;
        json choices = json::array();
        for (size_t s = 0; s < out.samples.size(); ++s) {
          json c{{"index", s},
                 {"text", choice_text(*reqs[i], out, s)},
                 {"tokens", out.samples[s].tokens},
                 {"finish_reason", openai_finish_reason(out.samples[s].reason)}};
          if (reqs[i]->params.logprobs >= 0) c["logprobs"] = choice_logprobs(*reqs[i], out, s);
          choices.push_back(std::move(c));
        }
        json r{{"id", id},
               {"line", i + 1},
               {"choices", choices},
               {"usage", usage_json(out.stats)},
               {"stats",
                {{"queue_s", out.stats.queue_seconds},
                 {"ttft_s", out.stats.ttft_seconds},
                 {"total_s", out.stats.total_seconds},
                 {"preemptions", out.stats.preemptions}}}};
        if (!out.error.empty()) r["error"] = out.error;
        results[i] = std::move(r);
      });
    } catch (const json::exception& e) {
      results[i] = {
          {"id", id}, {"line", i + 1}, {"error", std::string("malformed JSON: ") + e.what()}};
    } catch (const ApiError& e) {
      results[i] = {{"id", id}, {"line", i + 1}, {"error", e.what()}};
    } catch (const Error& e) {
      results[i] = {{"id", id}, {"line", i + 1}, {"error", e.what()}};
    }
  }
  engine.run_until_idle();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::ofstream file;
  if (!o.output.empty()) {
    file.open(o.output);
    if (!file) throw Error(ErrorKind::kIo, "cannot write --output " + o.output);
  }
  std::ostream& out = o.output.empty() ? std::cout : file;
  for (const json& r : results) out << to_json_text(r) << "\n";
  out.flush();
  const EngineMetrics m = engine.metrics();
  // Speculative decoding's acceptance rate: accepted / drafted over every request.
  char spec[160] = "";
  if (engine.config().spec_k > 0)
    std::snprintf(spec, sizeof spec,
                  ", speculative (ngram, k %lld): acceptance rate %.3f (%lld of %lld drafts)",
                  static_cast<long long>(engine.config().spec_k),
                  m.spec_drafted > 0
                      ? static_cast<double>(m.spec_accepted) / static_cast<double>(m.spec_drafted)
                      : 0.0,
                  static_cast<long long>(m.spec_accepted), static_cast<long long>(m.spec_drafted));
  std::fprintf(stderr,
               "kvcache batch: %zu requests in %.3f s: %lld prompt tokens (%lld from the prefix "
               "cache), %lld generated "
               "(%.1f tok/s), %lld preemptions, %lld steps%s\n",
               lines.size(), secs, static_cast<long long>(m.prompt_tokens),
               static_cast<long long>(m.cached_prompt_tokens),
               static_cast<long long>(m.generation_tokens),
               secs > 0 ? static_cast<double>(m.generation_tokens) / secs : 0.0,
               static_cast<long long>(m.preemptions), static_cast<long long>(m.steps), spec);
}

}  // namespace

void register_batch(CLI::App& app) {
  auto o = std::make_shared<BatchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "batch", "Offline continuous batching: JSON lines of requests -> JSON lines of completions");
  add_engine_options(cmd, o->engine);
  cmd->get_option("--max-waiting")
      ->description("Refused: batch queues every input line at once (serve's queue limit)");
  cmd->add_option("--input,-i", o->input,
                  "JSON lines: {\"prompt\": ... | \"messages\": [...], \"max_tokens\", ...}")
      ->required();
  cmd->add_option("--output,-o", o->output, "Where to write the results (default: stdout)");
  cmd->add_option("--chat-template", o->chat_template,
                  "The chat format: " + chat_template_names() +
                      " (default: the model's tokenizer.chat_template, else "
                      "its vocabulary)");
  cmd->callback([o] { run_batch(*o); });
}

}  // namespace kvcache::tools
