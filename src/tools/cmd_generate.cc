// `kvcache generate`: text generation on a real model through any cache container.
// stdout carries only text — the prompt followed by the generated text and one final newline,
// as llama2.c's `run` prints it (or the generated ids with --output ids); every statistic goes
// to stderr, so stdout can be compared byte for byte.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/t5.h"
#include "model/tokenizer_llama2c.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "runtime/sampler.h"
#include "runtime/session_file.h"
#include "runtime/speculative.h"
#include "runtime/t5_generate.h"
#include "tools/commands.h"
#include "tools/model_options.h"
#include "tools/option_rules.h"

namespace kvcache::tools {
namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string prompt;
  std::string prompt_ids;
  bool has_prompt = false;
  int64_t n = 256;
  SamplerParams sampler{0.8f, 40, 0.95f, 0.05f, 1.0f, 64, 42};  // llama.cpp's defaults, seed 42
  bool ignore_eos = false;
  std::string output = "text";
  bool verify = false;
  double verify_tol = 0.0;
  std::string save_session;  // --save-session FILE
  std::string load_session;  // --load-session FILE
  std::string encoder_ids;   // --encoder-ids: an encoder-decoder model's input
  std::string spec;          // --spec ngram|draft: speculative decoding (runtime/speculative.h)
  int64_t spec_k = 4;        // --spec-k
  int64_t spec_ngram = 3;    // --spec-ngram
  std::string draft_model;   // --draft-model (--spec draft)
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Text of token `id` following `prev` as the stream shows it: llama2.c's decode + safe_printf
// for its tokenizer; otherwise the token's bytes, minus the SentencePiece space after BOS.
std::string piece(const Tokenizer& tok, int32_t prev, int32_t id) {
  if (const auto* l2c = dynamic_cast<const Llama2cTokenizer*>(&tok))
    return l2c->decode_for_print(prev, id);
  return tok.piece_after(prev, id);
}

// An encoder-decoder model (T5): the encoder reads --encoder-ids once, the decoder starts from
// decoder_start_token_id (runtime/t5_generate.h). Its runner has its own attention loop and no
// tokenizer, sessions or prefill chunks: the options for those are refused, not ignored.
void run_generate_t5(const GenerateOptions& o) {
  const std::string& m = o.model.model;
  if (o.encoder_ids.empty())
    throw Error(ErrorKind::kInvalidArgument,
                m + " is an encoder-decoder model (T5): give its encoder input with --encoder-ids "
                    "\"IDS\" (the decoder starts from decoder_start_token_id)");
  if (o.has_prompt || !o.prompt_ids.empty())
    throw Error(ErrorKind::kInvalidArgument,
                "--prompt / --prompt-ids feed a decoder-only model; " + m +
                    " is an encoder-decoder model: its input is --encoder-ids and its decoder "
                    "starts from decoder_start_token_id");
  if (o.output != "ids")
    throw Error(ErrorKind::kInvalidArgument,
                m + " is an encoder-decoder model; its tokenizer is not loaded, so generate "
                    "prints token ids: add --output ids");
  for (const char* opt : {"--tokenizer", "--kernel", "--chunk", "--progress", "--kv-budget",
                          "--kv-policy", "--kv-bits", "--kv-quant", "--kv-group", "--kv-residual",
                          "--offload-dir", "--save-session", "--load-session"}) {
    if (o.model.cmd->count(opt) > 0)
      throw Error(ErrorKind::kInvalidArgument,
                  std::string("generate: ") + opt + " has no effect on the encoder-decoder model " +
                      m +
                      " (its runner, model/t5.h, has its own exact attention loop and no "
                      "tokenizer, prefill chunks, sessions or quantized/offloaded options); "
                      "drop it");
  }
  if (o.model.threads < 0) throw Error(ErrorKind::kInvalidArgument, "-t must be >= 0");
  if (o.model.threads > 0) set_default_threads(o.model.threads);
  std::unique_ptr<T5Model> model;
  if (m.starts_with("dummy:")) {
    const std::string preset = m.substr(6);
    if (preset.find(':') != std::string::npos)
      throw Error(ErrorKind::kInvalidArgument,
                  m + ": the T5 dummy presets are f32 only (drop the :DTYPE suffix)");
    model = T5Model::load(build_dummy_t5(preset, 0, ""));
  } else {
    model = T5Model::load(m);
  }
  T5GenerateParams p;
  p.encoder_ids = parse_ids(o.encoder_ids);
  if (p.encoder_ids.empty()) throw Error(ErrorKind::kInvalidArgument, "--encoder-ids holds no ids");
  p.max_new_tokens = o.n;
  p.sampler = o.sampler;
  p.ignore_eos = o.ignore_eos;
  p.verify = o.verify;
  p.verify_tolerance = o.verify_tol;
  p.cache.implementation = o.model.cache;
  if (o.model.max_cache_len < 0)
    throw Error(ErrorKind::kInvalidArgument, "--max-cache-len must be >= 0");
  p.cache.max_cache_len = o.model.max_cache_len;
  if (o.model.block_tokens < 1)
    throw Error(ErrorKind::kInvalidArgument, "--block-tokens must be >= 1");
  p.cache.paged.block_tokens = o.model.block_tokens;
  if (!o.model.kv_dtype.empty()) {
    p.cache.kv_dtype = parse_dtype(o.model.kv_dtype);
    if (!dtype_is_float(*p.cache.kv_dtype))
      throw Error(ErrorKind::kUnsupported,
                  "--kv-dtype " + o.model.kv_dtype + ": the T5 self cache stores f32, f16 or bf16");
  }
  const T5GenerateStats st = generate_t5(*model, p);
  std::string line;
  for (int32_t id : st.tokens) line += (line.empty() ? "" : " ") + std::to_string(id);
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
  std::fprintf(stderr,
               "%s\nencoder tokens: %zu | new tokens: %zu%s | encode: %.1f ms | decode: %.1f ms | "
               "cache: %s | KV bytes: self %zu + cross %zu\n",
               model->config().summary().c_str(), p.encoder_ids.size(), st.tokens.size(),
               st.stopped ? " (stopped at end token)" : "", st.encode_ms, st.decode_ms,
               p.cache.implementation.c_str(), st.self_bytes, st.cross_bytes);
  if (o.verify) {
    std::fprintf(
        stderr,
        "verify: max relative logit difference vs no-cache recompute: %.3g (tolerance %.3g)%s\n",
        st.verify_max_rel_diff, st.verify_tolerance, st.verify_failures ? " FAILED" : " ok");
    if (st.verify_failures > 0) {
      std::fflush(stderr);
      std::exit(3);
    }
  }
}

void run_generate(const GenerateOptions& o) {
  if (o.output != "text" && o.output != "ids") {
    throw Error(ErrorKind::kInvalidArgument,
                "--output must be 'text' or 'ids', got '" + o.output + "'");
  }
  if (o.has_prompt && !o.prompt_ids.empty()) {
    throw Error(ErrorKind::kInvalidArgument, "give either --prompt or --prompt-ids, not both");
  }
  validate_sampler_params(o.sampler);  // before the model loads and the prompt is echoed
  if (!(o.verify_tol >= 0 && std::isfinite(o.verify_tol)))  // 0: the default for the KV dtype
    throw Error(ErrorKind::kInvalidArgument,
                "--verify-tol must be a positive relative tolerance, got " +
                    fmt::format("{}", o.verify_tol));
  RunShape shape;
  shape.caches = {o.model.cache};
  shape.kv_budget = !o.model.kv_budget.empty();
  shape.prefill = true;
  shape.text = o.prompt_ids.empty() || o.output == "text";
  shape.sampling = o.sampler.temperature > 0;
  shape.repeat_penalty = o.sampler.repeat_penalty != 1.0f;
  shape.verify = o.verify;
  if (!o.spec.empty() && o.spec != "ngram" && o.spec != "draft")
    throw Error(ErrorKind::kInvalidArgument,
                "--spec must be 'ngram' (prompt lookup) or 'draft' (with --draft-model), got '" +
                    o.spec + "'");
  check_options(*o.model.cmd, shape);
  // The speculative options' own rules (option_rules.cc lists them without one).
  const auto spec_refuse = [&](const char* opt, bool used, const std::string& when,
                               const std::string& what) {
    if (used || o.model.cmd->count(opt) == 0) return;
    throw Error(ErrorKind::kInvalidArgument,
                std::string("generate: ") + opt + " has no effect " + when + ": " + what);
  };
  spec_refuse("--spec-k", !o.spec.empty(), "without --spec",
              "it is the number of drafts per target forward");
  spec_refuse("--spec-ngram", o.spec == "ngram", "without --spec ngram",
              "it is prompt lookup's longest n-gram");
  spec_refuse("--draft-model", o.spec == "draft", "without --spec draft",
              "it is the draft model of --spec draft");
  if (o.spec == "draft" && o.draft_model.empty())
    throw Error(ErrorKind::kInvalidArgument,
                "--spec draft needs the draft model: add --draft-model M (a model of the target's "
                "vocabulary)");
  // Encoder-decoder models take another path; encoder input for a decoder-only one is refused.
  if (is_encoder_decoder_model(o.model.model)) {
    if (!o.spec.empty())
      throw Error(ErrorKind::kUnsupported,
                  "--spec: " + o.model.model +
                      " is an encoder-decoder model (T5), whose runner has no speculative "
                      "decoding; drop --spec");
    return run_generate_t5(o);
  }
  if (!o.encoder_ids.empty())
    throw Error(ErrorKind::kInvalidArgument,
                "--encoder-ids: " + o.model.model +
                    " is a decoder-only model (no encoder); give its input with --prompt or "
                    "--prompt-ids");
  if (const KVPolicy policy = KVPolicy::parse(o.model.kv_policy); !policy.exact()) {
    const std::string lossy = "--kv-policy " + policy.key() +
                              " is lossy by design (its cost: docs/architecture.md, \"Lossy KV "
                              "policies\"); use --kv-policy exact";
    if (o.verify)
      throw Error(ErrorKind::kInvalidArgument,
                  "--verify compares every step with exact attention, and " + lossy);
    if (!o.save_session.empty() || !o.load_session.empty())
      throw Error(ErrorKind::kInvalidArgument,
                  "--save-session / --load-session hold an exact cache's tokens, and " + lossy);
  }
  LoadOptions lo = load_options(o.model);
  lo.require_tokenizer = o.prompt_ids.empty() || o.output == "text";
  LoadedModel lm = load_model(o.model.model, lo);
  const Model& model = *lm.model;
  const SessionConfig sc = session_config(o.model, model);

  std::vector<int32_t> prompt;
  if (!o.prompt_ids.empty()) {
    prompt = parse_ids(o.prompt_ids);
    if (prompt.empty()) throw Error(ErrorKind::kInvalidArgument, "--prompt-ids holds no ids");
  } else {
    if (lm.add_bos) prompt.push_back(lm.tokenizer->bos_id() >= 0 ? lm.tokenizer->bos_id() : 1);
    const std::vector<int32_t> text_ids = lm.tokenizer->encode(o.prompt);
    prompt.insert(prompt.end(), text_ids.begin(), text_ids.end());
    if (prompt.empty()) throw Error(ErrorKind::kInvalidArgument, "the prompt encodes to no tokens");
  }
  // --load-session: the saved conversation continues. A prompt that starts with the saved
  // tokens (llama.cpp's --prompt-cache rule) computes only what follows them; any other prompt
  // is appended after them (a text prompt without its BOS), as the conversation's next turn.
  Session session(model, sc);
  std::vector<int32_t> history;
  if (!o.load_session.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    SessionFileInfo info = load_session(session, o.load_session);
    history = std::move(info.tokens);
    std::fprintf(stderr, "session: restored %zu tokens from %s (%.1f MB) in %.1f ms\n",
                 history.size(), o.load_session.c_str(), info.file_bytes / 1e6, ms_since(t0));
    if (prompt.size() >= history.size() &&
        std::equal(history.begin(), history.end(), prompt.begin())) {
      if (prompt.size() == history.size())
        throw Error(ErrorKind::kInvalidArgument,
                    "--load-session: the prompt is the saved conversation itself (" +
                        std::to_string(history.size()) +
                        " tokens); add at least one token to continue it (the run that saved it "
                        "printed one more token than it saved: pass its whole output)");
    } else if (o.prompt_ids.empty() && lm.add_bos && !prompt.empty()) {
      prompt.erase(prompt.begin());  // appended mid-conversation: no second BOS
      if (prompt.empty())
        throw Error(ErrorKind::kInvalidArgument, "--load-session: the prompt adds no tokens");
    }
  }
  const bool continues = !history.empty() && prompt.size() > history.size() &&
                         std::equal(history.begin(), history.end(), prompt.begin());
  // What is fed now: the prompt past the saved tokens, or the whole prompt appended after them.
  const std::span<const int32_t> feed =
      continues ? std::span<const int32_t>(prompt).subspan(history.size())
                : std::span<const int32_t>(prompt);
  for (int32_t id : prompt) {
    if (id >= model.config().vocab_size) {
      throw Error(ErrorKind::kInvalidArgument, "prompt token id " + std::to_string(id) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(model.config().vocab_size) + ")");
    }
  }
  GenerateParams gp;
  gp.max_new_tokens = o.n;
  gp.sampler = o.sampler;
  gp.stop_ids = lm.stop_ids;
  gp.ignore_eos = o.ignore_eos;
  gp.verify = o.verify;
  gp.verify_tolerance = o.verify_tol;
  // Positions fed = prompt + new - 1 (the last sampled token is not fed): keep them within
  // the trained context, as llama2.c clamps its steps to seq_len.
  const int64_t ctx = model.config().max_seq_len;
  const int64_t held = static_cast<int64_t>(history.size() + feed.size());
  const int64_t room = ctx - held + 1;
  if (room <= 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "the prompt has " + std::to_string(held) + " tokens" +
                    (history.empty() ? "" : " with the restored session's") +
                    "; the model's context is " + std::to_string(ctx));
  }
  if (gp.max_new_tokens > room) {
    std::fprintf(stderr, "kvcache: -n %lld exceeds the context (%lld positions); generating %lld\n",
                 static_cast<long long>(gp.max_new_tokens), static_cast<long long>(ctx),
                 static_cast<long long>(room));
    gp.max_new_tokens = room;
  }

  gp.history = history;
  const bool text = o.output == "text";
  int32_t prev = continues || history.empty() ? -1 : history.back();
  if (text) {
    const Tokenizer& tok = *lm.tokenizer;
    for (size_t i = 0; i < prompt.size(); ++i) {
      if (!(i == 0 && prompt[i] == tok.bos_id()))
        std::fputs(piece(tok, prev, prompt[i]).c_str(), stdout);
      prev = prompt[i];
    }
    std::fflush(stdout);
  }
  std::vector<int32_t> generated;
  const auto print_token = [&](int32_t id) {
    if (!text) return;
    std::fputs(piece(*lm.tokenizer, prev, id).c_str(), stdout);
    std::fflush(stdout);
    prev = id;
  };
  GenerateStats st;
  SpecStats ss;
  std::unique_ptr<Session> draft_session;
  LoadedModel draft_lm;
  if (o.spec.empty()) {
    st = generate(session, feed, gp, print_token, &generated);
  } else {
    if (!o.save_session.empty())
      throw Error(ErrorKind::kInvalidArgument,
                  "--save-session with --spec: not supported yet (a session file records a "
                  "sliding layer's rollback bound as unbounded past recording); save without "
                  "--spec");
    SpecParams sp;
    sp.mode = o.spec == "draft" ? SpecMode::kDraft : SpecMode::kNgram;
    sp.k = o.spec_k;
    sp.ngram = o.spec_ngram;
    if (sp.mode == SpecMode::kDraft) {
      if (!history.empty())
        throw Error(ErrorKind::kInvalidArgument,
                    "--spec draft with --load-session: the session file holds the target's cache "
                    "only; use --spec ngram, or start without the session");
      LoadOptions dlo = load_options(o.model);
      dlo.require_tokenizer = false;
      draft_lm = load_model(o.draft_model, dlo);
      if (draft_lm.model->config().vocab_size != model.config().vocab_size)
        throw Error(ErrorKind::kInvalidArgument,
                    "--draft-model " + o.draft_model + ": its vocabulary has " +
                        std::to_string(draft_lm.model->config().vocab_size) +
                        " tokens, the target's (" + o.model.model + ") " +
                        std::to_string(model.config().vocab_size) +
                        "; a draft model must share the target's vocabulary");
      draft_session =
          std::make_unique<Session>(*draft_lm.model, session_config(o.model, *draft_lm.model));
    }
    st = generate_speculative(session, draft_session.get(), feed, gp, sp, print_token, &generated,
                              &ss);
  }
  if (!o.save_session.empty()) {
    // What the cache holds: the saved tokens, what was fed now and every generated token but
    // the last (sampled, never fed: the next run's prompt carries it).
    std::vector<int32_t> held_ids = history;
    held_ids.insert(held_ids.end(), feed.begin(), feed.end());
    if (!generated.empty()) held_ids.insert(held_ids.end(), generated.begin(), generated.end() - 1);
    const auto t0 = std::chrono::steady_clock::now();
    const uint64_t bytes = save_session(session, held_ids, o.save_session);
    std::fprintf(stderr, "session: saved %zu tokens to %s (%.1f MB) in %.1f ms\n", held_ids.size(),
                 o.save_session.c_str(), bytes / 1e6, ms_since(t0));
  }
  if (!text) {
    std::string line;
    for (int32_t id : generated) line += (line.empty() ? "" : " ") + std::to_string(id);
    std::fputs(line.c_str(), stdout);
  }
  std::fputs("\n", stdout);
  std::fflush(stdout);

  std::fprintf(
      stderr,
      "%s\nprompt tokens: %lld | new tokens: %lld%s | prefill: %.1f tok/s | decode: %.1f tok/s | "
      "cache: %s (%s, kv %s, policy %s) | KV bytes: %zu\n",
      model.config().summary().c_str(), static_cast<long long>(st.prompt_tokens),
      static_cast<long long>(st.new_tokens), st.stopped ? " (stopped at end token)" : "",
      st.prefill_tps(), st.decode_tps(), sc.cache.implementation.c_str(), sc.kernel.c_str(),
      dtype_name(sc.cache.kv_dtype.value_or(DType::kF32)), sc.cache.policy.key().c_str(),
      st.kv_bytes);
  if (!o.spec.empty()) {
    // Tokens per target forward: the decoded tokens (the first comes from the prefill) over the
    // verification forwards; plain decoding's is 1.
    const int64_t decoded = std::max<int64_t>(0, st.new_tokens - 1);
    std::fprintf(
        stderr,
        "speculative (%s, k %lld): acceptance rate %.3f (%lld of %lld drafts) | %.2f "
        "tokens per target forward (%lld forwards)%s\n",
        o.spec == "draft" ? ("draft " + o.draft_model).c_str() : "ngram",
        static_cast<long long>(o.spec_k), ss.acceptance_rate(), static_cast<long long>(ss.accepted),
        static_cast<long long>(ss.drafted),
        ss.target_forwards > 0 ? static_cast<double>(decoded) / ss.target_forwards : 0.0,
        static_cast<long long>(ss.target_forwards),
        o.spec == "draft" ? fmt::format(" | {} draft forwards", ss.draft_forwards).c_str() : "");
  }
  if (o.verify) {
    std::fprintf(
        stderr,
        "verify: max relative logit difference vs no-cache recompute: %.3g (tolerance %.3g)%s\n",
        st.verify_max_rel_diff, st.verify_tolerance, st.verify_failures ? " FAILED" : " ok");
    if (st.verify_failures > 0) {
      if (sc.cache.implementation == "quantized" && o.verify_tol <= 0)
        std::fprintf(stderr,
                     "verify: the quantized cache is lossy by design; the tolerance above is the "
                     "%s KV dtype's. "
                     "The difference measures quantization error (a defect shows as far larger); "
                     "set the error "
                     "you accept with --verify-tol\n",
                     dtype_name(sc.cache.kv_dtype.value_or(DType::kF32)));
      std::fflush(stderr);
      std::exit(3);
    }
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd =
      app.add_subcommand("generate", "Generate text with a model through a KV cache container");
  add_model_options(cmd, o->model);
  cmd->add_option("--prompt,-p", o->prompt, "Prompt text (BOS is prepended)")
      ->each([o](const std::string&) { o->has_prompt = true; });
  cmd->add_option("--prompt-ids", o->prompt_ids,
                  "Prompt as token ids, e.g. \"1 403 407\" (no BOS added)");
  cmd->add_option("-n,--n-predict", o->n, "New tokens to generate (the prompt not counted)");
  cmd->add_option("--temp", o->sampler.temperature, "Temperature; 0 = greedy");
  cmd->add_option("--top-k", o->sampler.top_k, "Top-k (0 = off)");
  cmd->add_option("--top-p", o->sampler.top_p, "Top-p (1 = off)");
  cmd->add_option("--min-p", o->sampler.min_p, "Min-p (0 = off)");
  cmd->add_option("--repeat-penalty", o->sampler.repeat_penalty, "Repetition penalty (1 = off)");
  cmd->add_option("--repeat-last-n", o->sampler.repeat_last_n, "Tokens the penalty looks back at");
  cmd->add_option("--seed", o->sampler.seed, "Sampler seed (PCG32)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Generate all N tokens, past end tokens");
  cmd->add_option("--output", o->output, "text (default) or ids");
  cmd->add_flag(
      "--verify", o->verify,
      "After each step compare logits with a no-cache recompute; exit 3 past the tolerance");
  cmd->add_option("--verify-tol", o->verify_tol,
                  "Relative tolerance of --verify (default: 1e-4 for f32 KV, 1e-2 f16, 5e-2 bf16)");
  cmd->add_option("--encoder-ids", o->encoder_ids,
                  "Encoder input ids of an encoder-decoder model (T5), e.g. \"13 7 1\"; the "
                  "decoder starts from decoder_start_token_id");
  cmd->add_option("--save-session", o->save_session,
                  "After generating, save the cache (prompt + generated tokens but the last) to "
                  "this session file");
  cmd->add_option("--load-session", o->load_session,
                  "Restore a session file first; a prompt starting with its tokens computes only "
                  "the rest, any other prompt is appended after them");
  cmd->add_option("--spec", o->spec,
                  "Speculative decoding: ngram (prompt lookup) or draft (a draft model, "
                  "--draft-model); greedy output is plain decoding's");
  cmd->add_option("--spec-k", o->spec_k, "Draft tokens verified per target forward (--spec)");
  cmd->add_option("--spec-ngram", o->spec_ngram,
                  "Longest n-gram prompt lookup matches (--spec ngram)");
  cmd->add_option("--draft-model", o->draft_model,
                  "Draft model of the target's vocabulary (--spec draft), with the target's "
                  "cache options");
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace kvcache::tools
