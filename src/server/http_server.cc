#include "server/http_server.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <optional>

#include "core/error.h"

namespace kvcache {

using nlohmann::json;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                const std::string& code = "") {
  res.status = status;
  res.set_content(to_json_text(error_body(message, type, code)), "application/json");
}

}  // namespace

// Events of one request, handed from the engine thread to the handler thread.
struct HttpServer::Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<StreamEvent> events;       // output pointers cleared (the output is copied below)
  std::optional<RequestOutput> output;  // set with the request's last event
};

HttpServer::HttpServer(Engine& engine, const ServedModel& model, const HttpServerConfig& config)
    : engine_(engine), model_(model), config_(config), http_(std::make_unique<httplib::Server>()) {
  created_ = unix_now();
  last_scrape_s_ = now_seconds();
  const int threads = std::max(4, config_.http_threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  install_routes();
}

HttpServer::~HttpServer() {
  stop();
  if (driver_.joinable()) driver_.join();
}

void HttpServer::bind() {
  if (config_.port == 0) {
    port_ = http_->bind_to_any_port(config_.host);
    if (port_ <= 0) throw Error(ErrorKind::kIo, "cannot bind " + config_.host + " to a free port");
  } else {
    if (!http_->bind_to_port(config_.host, config_.port))
      throw Error(ErrorKind::kIo, "cannot bind " + config_.host + ":" + std::to_string(config_.port) +
                                      " (address in use or not local?); pick another --port or --host");
    port_ = config_.port;
  }
}

void HttpServer::drive_engine() {
  // Runs until run() saw the HTTP side finish: in-flight handlers need the engine to end.
  while (!stopping_.load() || engine_.has_work() || http_->is_running()) {
    if (!engine_.has_work()) {
      engine_.wait_for_work(0.05);
      continue;
    }
    try {
      engine_.step();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kvcache serve: engine step failed: %s\n", e.what());
    }
  }
}

void HttpServer::run() {
  driver_ = std::thread([this] { drive_engine(); });
  http_->listen_after_bind();  // returns after stop(), once every handler returned
  stopping_.store(true);
  engine_.notify();
  driver_.join();
}

void HttpServer::stop() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t id : in_flight_) engine_.cancel(id);
  }
  http_->stop();
}

std::string HttpServer::metrics_text() {
  const EngineMetrics m = engine_.metrics();
  double prompt_rate = 0, gen_rate = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const double t = now_seconds(), dt = t - last_scrape_s_;
    if (dt > 0) {
      prompt_rate = static_cast<double>(m.computed_prompt_tokens - last_prompt_) / dt;
      gen_rate = static_cast<double>(m.generation_tokens - last_gen_) / dt;
    }
    last_scrape_s_ = t;
    last_prompt_ = m.computed_prompt_tokens;
    last_gen_ = m.generation_tokens;
  }
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    char line[160];
    std::snprintf(line, sizeof line, "%.17g", v);
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + line + "\n";
  };
  metric("kvcache_requests_running", "gauge", "Sequences resident in the KV cache.", static_cast<double>(m.running));
  metric("kvcache_requests_waiting", "gauge", "Sequences queued (new or preempted).", static_cast<double>(m.waiting));
  metric("kvcache_kv_blocks_total", "gauge", "KV blocks in the pool.", static_cast<double>(m.blocks_total));
  metric("kvcache_kv_blocks_used", "gauge", "KV blocks held by sequences.", static_cast<double>(m.blocks_used));
  metric("kvcache_kv_blocks_free", "gauge", "KV blocks free and unkeyed.", static_cast<double>(m.blocks_free));
  metric("kvcache_kv_blocks_cached", "gauge", "Free KV blocks kept in the prefix index.", static_cast<double>(m.blocks_cached));
  metric("kvcache_prefix_cache_hit_rate", "gauge", "Prompt tokens served from the prefix cache / prompt tokens.",
         m.prefix_hit_rate());
  metric("kvcache_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.", static_cast<double>(m.prompt_tokens));
  metric("kvcache_prompt_tokens_cached_total", "counter", "Prompt tokens taken from the prefix cache.",
         static_cast<double>(m.cached_prompt_tokens));
  metric("kvcache_prefill_tokens_total", "counter", "Tokens prefilled (recomputation included).",
         static_cast<double>(m.computed_prompt_tokens));
  metric("kvcache_generation_tokens_total", "counter", "Tokens sampled.", static_cast<double>(m.generation_tokens));
  metric("kvcache_prompt_tokens_per_second", "gauge", "Prefill tokens/s since the previous scrape.", prompt_rate);
  metric("kvcache_generation_tokens_per_second", "gauge", "Sampled tokens/s since the previous scrape.", gen_rate);
  metric("kvcache_preemptions_total", "counter", "Sequences preempted (blocks freed, recomputed later).",
         static_cast<double>(m.preemptions));
  metric("kvcache_requests_finished_total", "counter", "Requests finished (cancelled included).",
         static_cast<double>(m.requests_finished));
  metric("kvcache_requests_cancelled_total", "counter", "Requests cancelled (client gone, shutdown).",
         static_cast<double>(m.requests_cancelled));
  metric("kvcache_engine_steps_total", "counter", "Scheduling steps.", static_cast<double>(m.steps));
  return out;
}

void HttpServer::install_routes() {
  httplib::Server& s = *http_;
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (config_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + config_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key");
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404 && res.body.empty())
      send_error(res, 404, "no route " + req.method + " " + req.path, "invalid_request_error", "not_found");
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping_.load()) {
      send_error(res, 503, "shutting down", "server_error");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json body{{"object", "list"},
                    {"data", json::array({json{{"id", model_.name},
                                               {"object", "model"},
                                               {"created", created_},
                                               {"owned_by", "kvcache"},
                                               {"max_model_len", engine_.max_context()}}})}};
    res.set_content(to_json_text(body), "application/json");
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });

  auto completions = [this](const httplib::Request& req, httplib::Response& res, bool chat) {
    if (stopping_.load()) return send_error(res, 503, "the server is shutting down", "server_error");
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::exception& e) {  // syntax, or a number out of double's range (1e400)
      return send_error(res, 400, std::string("malformed JSON body: ") + e.what(), "invalid_request_error");
    }
    ApiRequest ar;
    try {
      ar = parse_api_request(body, chat, model_);
    } catch (const ApiError& e) {
      return send_error(res, e.status, e.what(), e.type, e.code);
    } catch (const Error& e) {
      return send_error(res, 400, e.what(), "invalid_request_error");
    }
    auto ch = std::make_shared<Channel>();
    uint64_t id = 0;
    try {
      id = engine_.submit(ar.params, [ch](const StreamEvent& ev) {
        std::lock_guard<std::mutex> lock(ch->mu);
        StreamEvent copy = ev;
        copy.output = nullptr;
        if (ev.output != nullptr) {
          ch->output = *ev.output;
          copy.index = -1;  // marks the request's last event
        }
        ch->events.push_back(std::move(copy));
        ch->cv.notify_all();
      });
    } catch (const Error& e) {
      return send_error(res, 400, e.what(), "invalid_request_error");
    }
    if (id == 0)
      return send_error(res, 429, "the request queue is full; retry later", "rate_limit_error", "queue_full");
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.insert(id);
    }
    auto forget = [this, id] {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.erase(id);
    };
    const std::string model_name = model_.name;
    const int64_t created = unix_now();
    if (!ar.stream) {
      // cpp-httplib 0.11 gives a handler no view of its socket, so a client that goes away is
      // only seen from a content provider (sink.is_writable() peeks at the socket), and a
      // provider runs after the status line is sent. Hence two phases: the handler waits for
      // the request's first event (queue + prefill; an admission error comes before any
      // token and still gets its status), then, unless it already finished, a chunked
      // provider waits for the rest in 100 ms slices and cancels the request (freeing its
      // blocks) when the client is gone. A disconnect while queued or prefilling is noticed
      // at the first token.
      {
        std::unique_lock<std::mutex> lock(ch->mu);
        ch->cv.wait(lock, [&] { return !ch->events.empty() || ch->output.has_value(); });
        if (ch->output.has_value()) {
          lock.unlock();
          forget();
          const RequestOutput& out = *ch->output;
          if (!out.error.empty()) return send_error(res, 503, out.error, "server_error");
          res.set_content(to_json_text(completion_response(ar, out, model_name, created)), "application/json");
          return;
        }
      }
      res.set_chunked_content_provider(
          "application/json",
          [this, ch, ar, id, created, model_name, forget](size_t, httplib::DataSink& sink) {
            {
              std::unique_lock<std::mutex> lock(ch->mu);
              ch->events.clear();  // only the final output is sent
              if (!ch->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return ch->output.has_value(); })) {
                lock.unlock();
                if (sink.is_writable()) return true;
                engine_.cancel(id);  // the client went away
                forget();
                return false;
              }
            }
            forget();
            const RequestOutput& out = *ch->output;  // final: no writer any more
            // The status (200) is already out; an engine error after the first token (none
            // exists today) would arrive as an OpenAI error object in the body.
            const std::string body = to_json_text(out.error.empty() ? completion_response(ar, out, model_name, created)
                                                                     : error_body(out.error, "server_error", ""));
            if (!sink.write(body.data(), body.size())) return false;
            sink.done();
            return true;
          },
          [this, id, forget](bool success) {
            if (!success) engine_.cancel(id);
            forget();
          });
      return;
    }
    res.set_header("Cache-Control", "no-cache");
    auto first = std::make_shared<std::vector<bool>>(static_cast<size_t>(ar.params.n), true);
    // Per sample: log-probabilities of tokens whose text is still held back (they go out with
    // the next chunk), and the piece bytes of the tokens already sent (completions' text_offset,
    // counted as the non-streamed response counts it).
    struct Pending {
      std::vector<TokenLogprob> logprobs;
      size_t offset = 0;
    };
    auto pending = std::make_shared<std::vector<Pending>>(static_cast<size_t>(ar.params.n));
    for (Pending& pd : *pending) pd.offset = ar.echo ? ar.prompt_text.size() : 0;
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ch, ar, id, created, model_name, first, pending, forget, has_text = model_.tokenizer != nullptr](
            size_t, httplib::DataSink& sink) {
          std::deque<StreamEvent> batch;
          {
            std::unique_lock<std::mutex> lock(ch->mu);
            ch->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return !ch->events.empty(); });
            batch.swap(ch->events);
          }
          auto write = [&](const std::string& data) {
            if (sink.write(data.data(), data.size())) return true;
            engine_.cancel(id);  // the client went away
            forget();
            return false;
          };
          if (batch.empty()) {
            if (sink.is_writable()) return true;
            engine_.cancel(id);
            forget();
            return false;
          }
          bool done = false;
          for (const StreamEvent& ev : batch) {
            if (ev.index < 0) {  // the request's last event: ch->output is set
              done = true;
              continue;
            }
            Pending& pd = (*pending)[static_cast<size_t>(ev.index)];
            if (ev.logprob) pd.logprobs.push_back(*ev.logprob);
            // Text held back (a possible stop string, half a character) makes no chunk; without
            // a tokenizer there is no text at all and every token gets its (empty) chunk.
            if (ev.token >= 0 && ev.text.empty() && has_text && !(*first)[static_cast<size_t>(ev.index)]) continue;
            const std::string finish = ev.finished ? openai_finish_reason(ev.reason) : "";
            const bool is_first = (*first)[static_cast<size_t>(ev.index)];
            (*first)[static_cast<size_t>(ev.index)] = false;
            const json chunk = stream_chunk(ar, id, model_name, created, ev.index, ev.text, finish, is_first,
                                            pd.logprobs, pd.offset, ev.prompt_logprobs.get());
            for (const TokenLogprob& t : pd.logprobs) pd.offset += t.chosen.piece.size();
            pd.logprobs.clear();
            if (!write("data: " + to_json_text(chunk) + "\n\n")) return false;
          }
          if (!done) return true;
          RequestStats stats;
          {
            std::lock_guard<std::mutex> lock(ch->mu);
            stats = ch->output->stats;
          }
          if (ar.include_usage) {
            const json usage{{"id", response_id(ar, id)},
                             {"object", ar.chat ? "chat.completion.chunk" : "text_completion"},
                             {"created", created},
                             {"model", model_name},
                             {"choices", json::array()},
                             {"usage", usage_json(stats)}};
            if (!write("data: " + to_json_text(usage) + "\n\n")) return false;
          }
          if (!write("data: [DONE]\n\n")) return false;
          forget();
          sink.done();
          return true;
        },
        [this, id, forget](bool success) {
          if (!success) engine_.cancel(id);
          forget();
        });
  };
  s.Post("/v1/completions", [completions](const httplib::Request& req, httplib::Response& res) {
    completions(req, res, false);
  });
  s.Post("/v1/chat/completions", [completions](const httplib::Request& req, httplib::Response& res) {
    completions(req, res, true);
  });
}

}  // namespace kvcache
