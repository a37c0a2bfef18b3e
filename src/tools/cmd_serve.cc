// `kvcache serve`: the OpenAI-compatible server over the continuous-batching engine. Prints
// one line `listening on http://HOST:PORT` to stderr when ready; SIGINT/SIGTERM stop it
// cleanly (in-flight requests are cancelled and answered, every thread joined, exit code 0).
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "server/chat_template.h"
#include "server/http_server.h"
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
};

// SIGINT/SIGTERM -> one byte on a pipe (write() is async-signal-safe); a watcher thread turns
// it into HttpServer::stop(). A handler rather than a blocked mask: OpenBLAS starts its threads
// before main(), so no mask set here would cover them.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int) {
  const char c = 1;
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &c, 1);
}

void run_serve(const ServeOptions& o) {
  if (::pipe(g_signal_pipe) != 0) throw Error(ErrorKind::kIo, "serve: cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-stream is a failed write, not a crash

  if (o.port < 0 || o.port > 65535) throw Error(ErrorKind::kInvalidArgument, "--port must be in [0, 65535]");
  if (o.default_max_tokens < 1)  // every request without max_tokens would be refused
    throw Error(ErrorKind::kInvalidArgument,
                "--default-max-tokens must be >= 1, got " + std::to_string(o.default_max_tokens));
  check_engine_options(o.engine);
  LoadedModel lm = load_model(o.engine.model.model, load_options(o.engine.model));
  check_engine_options(o.engine, &lm);
  const EngineConfig ec = engine_config(o.engine, *lm.model);
  Engine engine(*lm.model, lm.tokenizer.get(), ec);

  ServedModel sm;
  sm.name = o.served_name.empty() ? o.engine.model.model : o.served_name;
  sm.tokenizer = lm.tokenizer.get();
  sm.add_bos = lm.add_bos;
  sm.stop_ids = lm.stop_ids;
  sm.default_max_tokens = o.default_max_tokens;
  std::unique_ptr<SpecialTokens> specials;
  std::string template_source = "none";
  if (lm.tokenizer) {
    specials = std::make_unique<SpecialTokens>(*lm.tokenizer);
    sm.specials = specials.get();
    const ChatTemplateChoice choice = choose_chat_template(o.chat_template, lm.chat_template, *lm.tokenizer);
    sm.chat_template = choice.tmpl;
    template_source = choice.source;
  } else if (!o.chat_template.empty()) {
    parse_chat_template(o.chat_template);  // still reject unknown names
  }

  HttpServerConfig hc;
  hc.host = o.host;
  hc.port = o.port;
  hc.api_key = o.api_key;
  HttpServer server(engine, sm, hc);
  server.bind();
  std::fprintf(stderr, "kvcache serve: model %s, %s KV blocks of %lld tokens, context %lld, chat template %s (from %s)%s\n",
               sm.name.c_str(), std::to_string(engine.metrics().blocks_total).c_str(),
               static_cast<long long>(ec.block_tokens), static_cast<long long>(engine.max_context()),
               chat_template_name(sm.chat_template), template_source.c_str(), lm.tokenizer ? "" : " (no tokenizer: token-id prompts only)");
  std::fprintf(stderr, "listening on http://%s:%d\n", o.host.c_str(), server.port());
  std::fflush(stderr);

  std::thread watcher([&] {
    char c = 0;
    while (::read(g_signal_pipe[0], &c, 1) < 0 && errno == EINTR) {
    }
    if (c == 1) server.stop();  // 0: run() returned on its own, nothing to stop
  });
  server.run();
  const char wake = 0;
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &wake, 1);
  watcher.join();
  std::fprintf(stderr, "kvcache serve: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching");
  add_engine_options(cmd, o->engine);
  cmd->add_option("--host", o->host, "Address to bind (default 127.0.0.1)");
  cmd->add_option("--port", o->port, "Port (0: any free port; the ready line shows it)")->required();
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on every route but /health");
  cmd->add_option("--chat-template", o->chat_template, "chatml, llama2 or llama3 (default: the model's tokenizer.chat_template, else its vocabulary)");
  cmd->add_option("--served-model-name", o->served_name, "The model id clients send (default: the --model string)");
  cmd->add_option("--default-max-tokens", o->default_max_tokens, "max_tokens of requests that give none (default 256)");
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace kvcache::tools
