// `kvcache serve`: the OpenAI-compatible server over the continuous-batching engine. Prints
// one line `listening on http://HOST:PORT` to stderr when ready. SIGINT/SIGTERM drain it: new
// requests get 503, in-flight ones may finish for --drain-timeout seconds, then are cancelled
// and answered; every thread is joined and the exit code is 0. A second signal cuts the drain
// short; a server still running --drain-timeout + 10 s after the first signal exits with 1.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "core/error.h"
#include "model/kv_plan.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/kv_events.h"
#include "tools/commands.h"
#include "tools/engine_options.h"

namespace kvcache::tools {
namespace {

struct ServeOptions {
  EngineOptions engine;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string chat_template;  // empty: the model's tokenizer.chat_template, else its vocabulary
  std::string served_name;    // empty: the --model string
  int64_t default_max_tokens = 256;
  // Limits (docs/architecture.md, "Limits").
  int max_connections = 256;
  double request_timeout_s = 10;
  double idle_timeout_s = 5;
  double write_timeout_s = 10;
  std::string max_body = "8MiB";
  double drain_timeout_s = 5;
  std::string slot_save_path;  // --slot-save-path: /slots/{id}?action=save|restore
  int64_t max_prompt_tokens = 0;
  int32_t max_n = 64;
  int32_t max_stop_strings = 16;
  int64_t max_stop_bytes = 256;
  bool check_invariants = false;
  // --kv-events / --kv-events-topic / --kv-events-replay (server/kv_events.h).
  std::string kv_events, kv_events_topic, kv_events_replay;
};

void check_positive(double v, const char* flag) {
  if (!(v > 0) || v > 86400)
    throw Error(ErrorKind::kInvalidArgument,
                std::string(flag) + " must be in (0, 86400] seconds, got " + std::to_string(v));
}

void check_at_least(int64_t v, int64_t least, const char* flag) {
  if (v < least)
    throw Error(
        ErrorKind::kInvalidArgument,
        std::string(flag) + " must be >= " + std::to_string(least) + ", got " + std::to_string(v));
}

// SIGINT/SIGTERM -> one byte on a pipe (write() is async-signal-safe); a watcher thread turns
// it into HttpServer::stop(). A handler rather than a blocked mask: OpenBLAS starts its threads
// before main(), so no mask set here would cover them.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int) {
  const char c = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &c, 1);
}

void run_serve(const ServeOptions& o) {
  if (::pipe(g_signal_pipe) != 0)
    throw Error(ErrorKind::kIo, "serve: cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-stream is a failed write, not a crash

  if (o.port < 0 || o.port > 65535)
    throw Error(ErrorKind::kInvalidArgument, "--port must be in [0, 65535]");
  if (o.default_max_tokens < 1)  // every request without max_tokens would be refused
    throw Error(ErrorKind::kInvalidArgument,
                "--default-max-tokens must be >= 1, got " + std::to_string(o.default_max_tokens));
  check_engine_options(o.engine);
  check_at_least(o.max_connections, 1, "--max-connections");
  if (o.max_connections > 65536)
    throw Error(ErrorKind::kInvalidArgument,
                "--max-connections must be at most 65536 (a thread each)");
  check_positive(o.request_timeout_s, "--request-timeout");
  check_positive(o.idle_timeout_s, "--idle-timeout");
  check_positive(o.write_timeout_s, "--write-timeout");
  check_positive(o.drain_timeout_s, "--drain-timeout");
  check_at_least(o.max_prompt_tokens, 0, "--max-prompt-tokens");
  check_at_least(o.max_n, 1, "--max-n");
  check_at_least(o.max_stop_strings, 0, "--max-stop-strings");
  check_at_least(o.max_stop_bytes, 1, "--max-stop-bytes");
  uint64_t max_body = 0;
  try {
    max_body = parse_byte_size(o.max_body);
  } catch (const Error& e) {
    throw Error(e.kind(), std::string("--max-body-bytes: ") + e.what());
  }
  if (max_body < 1024 || max_body > (uint64_t{1} << 32))
    throw Error(ErrorKind::kInvalidArgument,
                "--max-body-bytes must be in [1KiB, 4GiB], got " + o.max_body);
  if (!o.kv_events.empty()) {
    check_kv_events_endpoint(o.kv_events, "--kv-events");
    if (!o.kv_events_replay.empty())
      check_kv_events_endpoint(o.kv_events_replay, "--kv-events-replay");
  } else if (!o.kv_events_replay.empty() || !o.kv_events_topic.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "--kv-events-topic and --kv-events-replay need --kv-events ENDPOINT (the address "
                "to publish on)");
  }
  LoadedModel lm = load_model(o.engine.model.model, load_options(o.engine.model));
  check_engine_options(o.engine, &lm);
  EngineConfig ec = engine_config(o.engine, *lm.model);
  ec.check_invariants_every_step = o.check_invariants;
  if (o.engine.model.max_cache_len == 0 && o.engine.model.kv_budget.empty()) {
    const PoolSize ps = size_pool_from_memory(pool_size_inputs(*lm.model, ec));
    ec.cache.max_cache_len = ps.tokens;
    std::fprintf(stderr,
                 "kvcache serve: KV pool sized from free memory: %lld tokens, %s; %s "
                 "(--max-cache-len or --kv-budget sets it)\n",
                 static_cast<long long>(ps.tokens),
                 format_bytes(static_cast<double>(ps.bytes)).c_str(), ps.why.c_str());
  }
  if (o.max_n > ec.max_running)
    throw Error(ErrorKind::kInvalidArgument,
                "--max-n " + std::to_string(o.max_n) + " is more than --max-running " +
                    std::to_string(ec.max_running) + ": a request's samples run at once");
  Engine engine(*lm.model, lm.tokenizer.get(), ec);

  ServedModel sm;
  sm.name = o.served_name.empty() ? served_model_id(o.engine.model.model) : o.served_name;
  sm.tokenizer = lm.tokenizer.get();
  sm.add_bos = lm.add_bos;
  sm.stop_ids = lm.stop_ids;
  sm.default_max_tokens = o.default_max_tokens;
  sm.limits.max_prompt_tokens = o.max_prompt_tokens;
  sm.limits.max_context = engine.max_context();
  sm.limits.max_n = o.max_n;
  sm.limits.max_stop_strings = o.max_stop_strings;
  sm.limits.max_stop_bytes = o.max_stop_bytes;
  std::unique_ptr<SpecialTokens> specials;
  std::string template_source = "none";
  if (lm.tokenizer) {
    specials = std::make_unique<SpecialTokens>(*lm.tokenizer);
    sm.specials = specials.get();
    const ChatTemplateChoice choice =
        choose_chat_template(o.chat_template, lm.chat_template, *lm.tokenizer);
    sm.chat_template = choice.tmpl;
    sm.chat_template_error = choice.error;
    template_source = choice.source;
  } else if (!o.chat_template.empty()) {
    parse_chat_template(o.chat_template);  // still reject unknown names
  }

  HttpServerConfig hc;
  hc.host = o.host;
  hc.port = o.port;
  hc.api_key = o.api_key;
  hc.transport.max_connections = o.max_connections;
  hc.transport.request_timeout_s = o.request_timeout_s;
  hc.transport.idle_timeout_s = o.idle_timeout_s;
  hc.transport.write_timeout_s = o.write_timeout_s;
  hc.transport.max_body_bytes = static_cast<size_t>(max_body);
  hc.drain_timeout_s = o.drain_timeout_s;
  if (!o.slot_save_path.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.slot_save_path, ec);
    if (!std::filesystem::is_directory(o.slot_save_path))
      throw Error(ErrorKind::kIo, "--slot-save-path " + o.slot_save_path +
                                      " is not a directory and cannot be created");
    hc.slot_save_path = o.slot_save_path;
  }
  hc.kv_events.endpoint = o.kv_events;
  hc.kv_events.topic = o.kv_events_topic;
  hc.kv_events.replay_endpoint = o.kv_events_replay;
  HttpServer server(engine, sm, hc);
  server.bind();
  std::fprintf(stderr,
               "kvcache serve: model %s, %s KV blocks of %lld tokens, context %lld, chat template "
               "%s (from %s)%s\n",
               sm.name.c_str(), std::to_string(engine.metrics().blocks_total).c_str(),
               static_cast<long long>(ec.cache.paged.block_tokens),
               static_cast<long long>(engine.max_context()),
               sm.chat_template ? chat_template_name(*sm.chat_template) : "none",
               template_source.c_str(),
               lm.tokenizer ? "" : " (no tokenizer: token-id prompts only)");
  if (ec.spec_k > 0)
    std::fprintf(stderr,
                 "kvcache serve: speculative decoding: ngram (longest %lld), up to %lld drafts "
                 "per sequence and step\n",
                 static_cast<long long>(ec.spec_ngram), static_cast<long long>(ec.spec_k));
  if (const DiskTier* disk = engine.store().disk_tier()) {
    const DiskTierStats d = disk->stats();
    std::fprintf(stderr, "kvcache serve: disk tier %s: %lld blocks, %llu of %llu bytes\n",
                 disk->options().dir.c_str(), static_cast<long long>(d.blocks),
                 static_cast<unsigned long long>(d.bytes),
                 static_cast<unsigned long long>(disk->options().budget_bytes));
  }
  if (engine.store().remote_tier() != nullptr) {
    // A Redis down at start is not fatal: the tier's lookups miss and its breaker opens; the
    // server computes locally and picks the tier up when Redis comes back.
    std::string status;
    try {
      std::unique_ptr<KvClient> probe = engine.config().kv_remote_client();
      const std::string key = "kvc:probe";
      KvStatus st = KvStatus::kError;
      probe->get(std::span<const std::string>(&key, 1),
                 std::chrono::steady_clock::now() + std::chrono::milliseconds(500),
                 [&](size_t, KvStatus s, std::span<const std::byte>) { st = s; });
      status = st == KvStatus::kError ? "" : probe->describe();
    } catch (const std::exception&) {
      status.clear();
    }
    if (status.empty())
      std::fprintf(stderr,
                   "kvcache serve: warning: the remote tier %s does not answer; serving with "
                   "local compute until it does\n",
                   ec.kv_remote_url.c_str());
    else
      std::fprintf(stderr, "kvcache serve: remote tier %s (%s), lookup deadline %d ms\n",
                   ec.kv_remote_url.c_str(), status.c_str(), ec.kv_remote_deadline_ms);
  }
  if (const KvEventPublisher* ev = server.kv_events())
    std::fprintf(stderr, "kvcache serve: kv events on %s (topic '%s')%s%s\n",
                 ev->endpoint().c_str(), o.kv_events_topic.c_str(),
                 ev->replay_endpoint().empty() ? "" : ", replay on ",
                 ev->replay_endpoint().c_str());
  std::fprintf(stderr, "listening on http://%s:%d\n", o.host.c_str(), server.port());
  std::fflush(stderr);

  // The first signal starts the drain (on its own thread: stop() blocks until done), a second
  // one cuts it short; past the drain and a grace the process ends whatever is stuck.
  std::thread stopper;
  std::thread watcher([&] {
    using Clock = std::chrono::steady_clock;
    int signals = 0;
    Clock::time_point hard_deadline{};
    for (;;) {
      int timeout_ms = -1;
      if (signals > 0)
        timeout_ms = static_cast<int>(std::max<int64_t>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(hard_deadline - Clock::now())
                   .count()));
      pollfd p{g_signal_pipe[0], POLLIN, 0};
      const int r = ::poll(&p, 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r == 0) {
        std::fprintf(stderr,
                     "kvcache serve: still running %.0f s after the stop signal; exiting now\n",
                     o.drain_timeout_s + 10);
        std::fflush(stderr);
        std::_Exit(1);
      }
      char c = 0;
      if (::read(g_signal_pipe[0], &c, 1) < 0 && errno == EINTR) continue;
      if (c == 0) return;  // run() returned
      if (++signals == 1) {
        std::fprintf(stderr,
                     "kvcache serve: stopping: draining in-flight requests for up to %.0f s\n",
                     o.drain_timeout_s);
        hard_deadline = Clock::now() + std::chrono::milliseconds(
                                           static_cast<int64_t>((o.drain_timeout_s + 10) * 1000));
        stopper = std::thread([&server] { server.stop(); });
      } else {
        server.stop_now();
      }
    }
  });
  server.run();
  const char wake = 0;
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &wake, 1);
  watcher.join();
  if (stopper.joinable()) stopper.join();
  std::fprintf(stderr, "kvcache serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd =
      app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  add_engine_options(cmd, o->engine);
  cmd->add_option("--host", o->host, "Address to bind (default 127.0.0.1)");
  cmd->add_option("--slot-save-path", o->slot_save_path,
                  "Folder of POST /slots/{id}?action=save|restore session files (a finished "
                  "request's cached blocks; llama.cpp's option)");
  cmd->add_option("--port", o->port, "Port (0: any free port; the ready line shows it)")
      ->capture_default_str();
  cmd->add_option("--api-key", o->api_key,
                  "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--chat-template", o->chat_template,
                  "The chat format: " + chat_template_names() +
                      " (default: the family of the model's own template, else its vocabulary's "
                      "control tokens; neither certain: chat requests get 400)");
  cmd->add_option("--served-model-name", o->served_name,
                  "The model id clients send (default: the --model file or folder name)");
  cmd->add_option(
      "--default-max-tokens", o->default_max_tokens,
      "max_tokens of requests that give none (default 256, cut to what the context leaves)");
  cmd->add_option("--max-connections", o->max_connections,
                  "Open HTTP connections (a thread each); past it a connection gets 503 at once")
      ->capture_default_str();
  cmd->add_option("--request-timeout", o->request_timeout_s,
                  "Seconds to receive a whole request (headers and body) once it starts")
      ->capture_default_str();
  cmd->add_option("--idle-timeout", o->idle_timeout_s,
                  "Seconds a keep-alive connection may wait for its next request")
      ->capture_default_str();
  cmd->add_option(
         "--write-timeout", o->write_timeout_s,
         "Seconds one write to a client may block (a client not reading its stream is cut)")
      ->capture_default_str();
  cmd->add_option("--max-body-bytes", o->max_body, "Largest request body, e.g. 8MiB (larger: 413)")
      ->capture_default_str();
  cmd->add_option(
         "--drain-timeout", o->drain_timeout_s,
         "On SIGTERM/SIGINT, seconds in-flight requests may finish before they are cancelled")
      ->capture_default_str();
  cmd->add_option("--max-prompt-tokens", o->max_prompt_tokens,
                  "Most prompt tokens a request may have (0: the context); longer text is refused "
                  "before it is tokenized")
      ->capture_default_str();
  cmd->add_option("--max-n", o->max_n,
                  "Most samples ('n') one request may ask for (at most --max-running)")
      ->capture_default_str();
  cmd->add_option("--max-stop-strings", o->max_stop_strings,
                  "Most 'stop' strings one request may give")
      ->capture_default_str();
  cmd->add_option("--max-stop-bytes", o->max_stop_bytes, "Longest 'stop' string in bytes")
      ->capture_default_str();
  cmd->add_option("--kv-events", o->kv_events,
                  "Publish the prefix cache's changes as vLLM KV events (ZeroMQ PUB, vLLM's "
                  "KVEventBatch format) bound at this address: tcp://HOST:PORT (port * = any "
                  "free one, shown at start) or ipc://PATH");
  cmd->add_option("--kv-events-topic", o->kv_events_topic,
                  "Topic frame of every KV events message (default empty, as vLLM's)");
  cmd->add_option("--kv-events-replay", o->kv_events_replay,
                  "ROUTER address answering replay requests (an 8-byte big-endian start sequence "
                  "number) with the last 10000 batches, as vLLM's --kv-events-config "
                  "replay_endpoint");
  cmd->add_flag(
      "--check-invariants", o->check_invariants,
      "Debug: check the engine's invariants after every step; a broken one ends the process");
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace kvcache::tools
