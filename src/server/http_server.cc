#include "server/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <future>
#include <optional>

#include "core/error.h"
#include "runtime/session_file.h"

namespace kvcache {

using nlohmann::json;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& type, const std::string& code = "") {
  res.status = status;
  res.set_content(to_json_text(error_body(message, type, code)), "application/json");
}

// A finished request that did not complete: its HTTP status and OpenAI error body, or 0 when it
// completed. `stopping`: the server cancelled it while shutting down.
int failed_status(const RequestOutput& out, bool stopping, nlohmann::json& body) {
  if (!out.error.empty()) {
    const bool client = out.error_kind == RequestErrorKind::kCapacity;
    body = error_body(out.error, client ? "invalid_request_error" : "server_error",
                      client ? "context_length_exceeded" : "");
    return client ? 400 : 500;
  }
  for (const SampleOutput& s : out.samples)
    if (s.reason == FinishReason::kCancelled) {
      body = error_body(stopping ? "the server is shutting down; the request was cancelled"
                                 : "the request was cancelled",
                        "server_error", "");
      return 503;
    }
  return 0;
}

// Messages for the statuses cpp-httplib sets itself (it leaves their bodies empty).
std::string transport_error_message(int status, const httplib::Request& req,
                                    const TransportLimits& l) {
  switch (status) {
    case 400:
      return "malformed HTTP request";
    case 404:
      return "no route " + req.method + " " + req.path;
    case 413:
      return "the request body is larger than " + std::to_string(l.max_body_bytes) +
             " bytes (--max-body-bytes)";
    case 414:
      return "the request URI is too long";
    case 416:
      return "range not satisfiable";
    default:
      return "HTTP error " + std::to_string(status);
  }
}

// The request body as ApiRequests (several for a completions batch, parse_completion_batch), or
// nothing once the client's error is answered.
std::optional<std::vector<ApiRequest>> read_api_request(const httplib::Request& req, bool chat,
                                                        const ServedModel& model,
                                                        httplib::Response& res) {
  json body;
  try {
    body = json::parse(req.body);
  } catch (const json::exception& e) {  // syntax, or a number out of double's range (1e400)
    send_error(res, 400, std::string("malformed JSON body: ") + e.what(), "invalid_request_error");
    return std::nullopt;
  }
  try {
    if (chat) return std::vector<ApiRequest>{parse_api_request(body, true, model)};
    return parse_completion_batch(body, model);
  } catch (const ApiError& e) {
    send_error(res, e.status, e.what(), e.type, e.code);
  } catch (const Error& e) {
    send_error(res, 400, e.what(), "invalid_request_error");
  } catch (const json::exception& e) {
    // A field of a type the parser did not check: still the client's error.
    send_error(res, 400, std::string("malformed request: ") + e.what(), "invalid_request_error");
  }
  return std::nullopt;
}

// A Prometheus histogram: counts per upper bound (le), their sum and count; cumulative when
// written out. Not thread-safe: LatencyHistograms' mutex guards it.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v) {
    // The first bound >= v: "le" is inclusive.
    const auto i =
        static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
    ++counts_[i];
    sum_ += v;
  }
  void write(std::string& out, const char* name, const char* help) const {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " histogram\n";
    uint64_t cumulative = 0;
    char line[200];
    for (size_t i = 0; i <= bounds_.size(); ++i) {
      cumulative += counts_[i];
      if (i < bounds_.size())
        std::snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name, bounds_[i],
                      static_cast<unsigned long long>(cumulative));
      else
        std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n", name,
                      static_cast<unsigned long long>(cumulative));
      out += line;
    }
    std::snprintf(line, sizeof line, "%s_sum %.17g\n%s_count %llu\n", name, sum_, name,
                  static_cast<unsigned long long>(cumulative));
    out += line;
  }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // [bounds + 1]: the last one past every bound (+Inf)
  double sum_ = 0;
};

}  // namespace

// Buckets as vLLM's (vllm/v1/metrics/loggers.py: time_to_first_token, inter_token_latency,
// request_latency for e2e and queue time): seconds, from milliseconds to hours.
struct LatencyHistograms {
  std::mutex mu;
  Histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                  1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}};
  Histogram itl{{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 20.0, 40.0, 80.0}};
  Histogram e2e{{0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}};
  Histogram queue{{0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                   30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}};
};

// Events of one request, handed from the engine thread to the handler thread.
struct HttpServer::Channel {
  explicit Channel(std::shared_ptr<LatencyHistograms> h = nullptr) : latency(std::move(h)) {}
  std::shared_ptr<LatencyHistograms> latency;  // nullptr: not observed (the /health probe)
  std::vector<double> last_token_s;            // [sample]: when its previous token came
  std::mutex mu;
  std::condition_variable cv;
  std::deque<StreamEvent> events;       // output pointers cleared (the output is copied below)
  std::optional<RequestOutput> output;  // set with the request's last event
  bool token = false;                   // a token event arrived (the answer has begun)

  // The engine's callback for a completion: queues the event and, with the last one, keeps
  // the request's output.
  void push(const StreamEvent& ev) {
    if (latency) observe(ev);
    std::lock_guard<std::mutex> lock(mu);
    StreamEvent copy = ev;
    copy.output = nullptr;
    if (ev.output != nullptr) {
      output = *ev.output;
      copy.index = -1;  // marks the request's last event
    }
    token = token || ev.token >= 0;
    events.push_back(std::move(copy));
    cv.notify_all();
  }

  // On the engine thread, as the events come: the gap between a sample's tokens (inter-token
  // latency, per token as vLLM counts it) and, with the output, the request's times. A request
  // that failed adds no latencies: its times would describe the failure.
  void observe(const StreamEvent& ev) {
    const double t = now_seconds();
    std::lock_guard<std::mutex> lock(latency->mu);
    if (ev.token >= 0 && ev.index >= 0) {
      const auto i = static_cast<size_t>(ev.index);
      if (last_token_s.size() <= i) last_token_s.resize(i + 1, 0);
      if (last_token_s[i] > 0) latency->itl.observe(t - last_token_s[i]);
      last_token_s[i] = t;
    }
    if (ev.output != nullptr && ev.output->error.empty()) {
      const RequestStats& st = ev.output->stats;
      if (st.completion_tokens > 0) latency->ttft.observe(st.ttft_seconds);
      latency->e2e.observe(st.total_seconds);
      latency->queue.observe(st.queue_seconds);
    }
  }
};

HttpServer::HttpServer(Engine& engine, const ServedModel& model, const HttpServerConfig& config)
    : engine_(engine),
      model_(model),
      config_(config),
      http_(std::make_unique<HttpTransport>(config.transport)) {
  created_ = unix_now();
  latency_ = std::make_shared<LatencyHistograms>();
  if (model_.limits.max_context <= 0) model_.limits.max_context = engine_.max_context();
  if (!config_.kv_events.endpoint.empty()) {
    // Before run() starts the driver thread: the store is not stepping yet.
    kv_events_ =
        std::make_shared<KvEventPublisher>(config_.kv_events, kv_event_groups(engine_.store()));
    engine_.store().add_event_sink(kv_events_);
  }
  install_routes();
}

HttpServer::~HttpServer() {
  stop();
  if (driver_.joinable()) driver_.join();
  // The store keeps the sink: later events are counted as dropped.
  if (kv_events_) kv_events_->close();
}

void HttpServer::bind() {
  if (config_.port == 0) {
    port_ = http_->bind_to_any_port(config_.host);
    if (port_ <= 0) throw Error(ErrorKind::kIo, "cannot bind " + config_.host + " to a free port");
  } else {
    if (!http_->bind_to_port(config_.host, config_.port))
      throw Error(ErrorKind::kIo,
                  "cannot bind " + config_.host + ":" + std::to_string(config_.port) +
                      " (address in use or not local?); pick another --port or --host");
    port_ = config_.port;
  }
  http_->widen_backlog(std::max(512, config_.transport.max_connections));
}

void HttpServer::drive_engine() {
  // Runs until run() saw the HTTP side finish: in-flight handlers need the engine to end.
  while (!stopping_.load() || engine_.has_work() || http_->is_running()) {
    if (!engine_.has_work()) {
      engine_.wait_for_work(0.05);
      continue;
    }
    try {
      step_began_s_.store(now_seconds());
      engine_.step();
      step_began_s_.store(0);
    } catch (const std::exception& e) {
      // The engine contains every failure it can attribute to requests; what escapes is a bug,
      // and stepping again from an unknown state could spin or serve wrong answers.
      std::fprintf(stderr, "kvcache serve: fatal: the engine failed outside any request: %s\n",
                   e.what());
      std::fflush(stderr);
      std::abort();
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
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::milliseconds(static_cast<int64_t>(config_.drain_timeout_s * 1000));
    drained_.wait_until(lock, deadline, [&] { return in_flight_.empty() || drain_cut_; });
    for (uint64_t id : in_flight_) engine_.cancel(id);
    // Cancelled requests end at the engine's next step; their handlers then answer and leave.
    drained_.wait_for(lock, std::chrono::seconds(2), [&] { return in_flight_.empty(); });
  }
  http_->stop();
  http_->close_connections();  // idle keep-alive and slow clients end now, not at their timeouts
}

void HttpServer::stop_now() {
  std::lock_guard<std::mutex> lock(mu_);
  drain_cut_ = true;
  drained_.notify_all();
}

void HttpServer::forget(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_.erase(id);
  drained_.notify_all();
}

std::string HttpServer::handle_raw(std::string_view request) {
  return http_->handle_raw(request);
}

bool HttpServer::probe_engine(std::string& error) {
  std::lock_guard<std::mutex> probe_lock(probe_mu_);
  if (engine_.metrics().consecutive_failed_forwards == 0) return true;  // another probe answered
  auto ch = std::make_shared<Channel>();
  RequestParams rp;
  const int32_t bos = model_.tokenizer != nullptr ? model_.tokenizer->bos_id() : -1;
  rp.prompt = {bos >= 0 ? bos : 0};
  rp.max_tokens = 1;
  rp.sampler.temperature = 0;
  uint64_t id = 0;
  try {
    id = engine_.submit(rp, [ch](const StreamEvent& ev) {
      if (ev.output == nullptr) return;
      std::lock_guard<std::mutex> lock(ch->mu);
      ch->output = *ev.output;
      ch->cv.notify_all();
    });
  } catch (const Error& e) {
    error = e.what();
    return false;
  }
  if (id == 0) {
    error = engine_.metrics().last_error + " (no probe: the queue is full)";
    return false;
  }
  std::unique_lock<std::mutex> lock(ch->mu);
  if (!ch->cv.wait_for(
          lock,
          std::chrono::milliseconds(static_cast<int64_t>(config_.health_probe_timeout_s * 1000)),
          [&] { return ch->output.has_value(); })) {
    engine_.cancel(id);
    error = "a one-token probe did not finish within " +
            std::to_string(config_.health_probe_timeout_s) +
            " s after a failed forward: " + engine_.metrics().last_error;
    return false;
  }
  if (!ch->output->error.empty()) {
    error = ch->output->error;
    return false;
  }
  return true;
}

std::string HttpServer::metrics_text() {
  // Scraping changes nothing: rates are the scraper's (rate() over the counters), so any
  // number of scrapers read the same values.
  const EngineMetrics m = engine_.metrics();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, double v) {
    char line[160];
    std::snprintf(line, sizeof line, "%.17g", v);
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" +
           name + " " + line + "\n";
  };
  metric("kvcache_requests_running", "gauge", "Sequences resident in the KV cache.",
         static_cast<double>(m.running));
  metric("kvcache_requests_waiting", "gauge", "Sequences queued (new or preempted).",
         static_cast<double>(m.waiting));
  metric("kvcache_kv_blocks_total", "gauge", "KV blocks in the pool.",
         static_cast<double>(m.blocks_total));
  metric("kvcache_kv_blocks_used", "gauge", "KV blocks held by sequences.",
         static_cast<double>(m.blocks_used));
  metric("kvcache_kv_blocks_free", "gauge", "KV blocks free and unkeyed.",
         static_cast<double>(m.blocks_free));
  metric("kvcache_kv_blocks_cached", "gauge", "Free KV blocks kept in the prefix index.",
         static_cast<double>(m.blocks_cached));
  if (m.linear_state_bytes > 0) {  // hybrid models only
    metric("kvcache_linear_state_bytes", "gauge",
           "Linear-attention state slots of the running sequences (constant).",
           static_cast<double>(m.linear_state_bytes));
    metric("kvcache_linear_snapshots", "gauge",
           "Linear-attention state snapshots held for the prefix cache.",
           static_cast<double>(m.snapshots));
  }
  // An info metric (Prometheus' convention: value 1, the facts in labels): the pool's page
  // format and eviction policy, also in every response's usage.kv_cache.
  out +=
      "# HELP kvcache_kv_cache_info The KV pool's page format and eviction policy.\n"
      "# TYPE kvcache_kv_cache_info gauge\nkvcache_kv_cache_info{pages=\"" +
      engine_.kv_pages_label() + "\",policy=\"" + engine_.kv_policy_label() + "\"} 1\n";
  // Which policy served the finished requests (a request may send its own kv_policy).
  out +=
      "# HELP kvcache_requests_kv_policy_total Requests finished, by the KV eviction policy "
      "that served them.\n# TYPE kvcache_requests_kv_policy_total counter\n";
  for (const auto& [policy, n] : engine_.requests_by_kv_policy())
    out +=
        "kvcache_requests_kv_policy_total{policy=\"" + policy + "\"} " + std::to_string(n) + "\n";
  if (m.compressed_model)  // a labelled counter: why prefix hits were refused
    out +=
        "# HELP kvcache_prefix_refused_total Prefix cache hits refused (the prompt was "
        "recomputed), by reason.\n# TYPE kvcache_prefix_refused_total counter\n"
        "kvcache_prefix_refused_total{reason=\"compressed_state\"} " +
        std::to_string(m.prefix_refused_compressed) + "\n";
  metric("kvcache_prefix_cache_hit_rate", "gauge",
         "Prompt tokens served from the prefix cache / prompt tokens.", m.prefix_hit_rate());
  metric("kvcache_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
         static_cast<double>(m.prompt_tokens));
  metric("kvcache_prompt_tokens_cached_total", "counter",
         "Prompt tokens taken from the prefix cache.", static_cast<double>(m.cached_prompt_tokens));
  out +=
      "# HELP kvcache_prompt_tokens_cached_by_tier_total Prompt tokens taken from the prefix "
      "cache, by the tier that held their blocks.\n# TYPE "
      "kvcache_prompt_tokens_cached_by_tier_total "
      "counter\nkvcache_prompt_tokens_cached_by_tier_total{tier=\"ram\"} " +
      std::to_string(m.cached_prompt_tokens - m.cached_prompt_tokens_disk -
                     m.cached_prompt_tokens_remote) +
      "\nkvcache_prompt_tokens_cached_by_tier_total{tier=\"disk\"} " +
      std::to_string(m.cached_prompt_tokens_disk) +
      "\nkvcache_prompt_tokens_cached_by_tier_total{tier=\"remote\"} " +
      std::to_string(m.cached_prompt_tokens_remote) + "\n";
  if (m.disk_tier) {  // serve --kv-disk
    const DiskTierStats& d = m.disk;
    const struct {
      const char *name, *type, *help;
      double value;
    } disk[] = {
        {"kvcache_disk_blocks", "gauge", "Blocks (files) held by the disk tier.",
         static_cast<double>(d.blocks)},
        {"kvcache_disk_bytes", "gauge", "Bytes of the disk tier's files.",
         static_cast<double>(d.bytes)},
        {"kvcache_disk_budget_bytes", "gauge", "The disk tier's budget (--kv-disk-budget).",
         static_cast<double>(m.disk_budget_bytes)},
        {"kvcache_disk_stored_total", "counter",
         "Blocks evicted from RAM and written to the disk tier.", static_cast<double>(d.stored)},
        {"kvcache_disk_dropped_total", "counter",
         "Evicted blocks not written (too many writes in flight, or a write error).",
         static_cast<double>(d.dropped)},
        {"kvcache_disk_hits_total", "counter", "Blocks read back from the disk tier and verified.",
         static_cast<double>(d.hits)},
        {"kvcache_disk_misses_total", "counter", "Disk tier lookups that found no file.",
         static_cast<double>(d.misses)},
        {"kvcache_disk_corrupt_total", "counter",
         "Disk tier files refused on read (checksum, size or header): misses, never served.",
         static_cast<double>(d.corrupt)},
        {"kvcache_disk_evicted_total", "counter",
         "Disk tier files removed to stay within the budget.", static_cast<double>(d.evicted)},
        {"kvcache_disk_read_bytes_total", "counter", "Bytes read from the disk tier.",
         static_cast<double>(d.bytes_read)},
        {"kvcache_disk_written_bytes_total", "counter", "Bytes written to the disk tier.",
         static_cast<double>(d.bytes_written)},
        {"kvcache_disk_read_seconds_total", "counter",
         "Time spent reading disk tier hits (on the engine thread).", d.read_seconds},
    };
    for (const auto& x : disk) metric(x.name, x.type, x.help, x.value);
  }
  if (m.remote_tier) {  // serve --kv-remote
    const RemoteTierStats& r = m.remote;
    const struct {
      const char *name, *type, *help;
      double value;
    } remote[] = {
        {"kvcache_remote_lookups_total", "counter", "Remote tier lookups answered.",
         static_cast<double>(r.lookups)},
        {"kvcache_remote_hits_total", "counter",
         "Blocks found in the remote tier and verified (every layer group).",
         static_cast<double>(r.hit_blocks)},
        {"kvcache_remote_misses_total", "counter", "Blocks looked up and not found (or not kept).",
         static_cast<double>(r.miss_blocks)},
        {"kvcache_remote_corrupt_total", "counter",
         "Remote values refused (checksum, layout, key, tokens or size): misses, never served.",
         static_cast<double>(r.corrupt)},
        {"kvcache_remote_errors_total", "counter",
         "Remote calls that failed (an error reply, no connection, a timeout).",
         static_cast<double>(r.errors)},
        {"kvcache_remote_timeouts_total", "counter", "Remote calls that reached their deadline.",
         static_cast<double>(r.timeouts)},
        {"kvcache_remote_bytes_in_total", "counter", "Bytes received from the remote tier.",
         static_cast<double>(r.bytes_in)},
        {"kvcache_remote_bytes_out_total", "counter", "Bytes written to the remote tier.",
         static_cast<double>(r.bytes_out)},
        {"kvcache_remote_writes_total", "counter", "Blocks written to the remote tier.",
         static_cast<double>(r.writes_stored)},
        {"kvcache_remote_writes_dropped_total", "counter",
         "Blocks not written (write budget full, breaker open, a failed write).",
         static_cast<double>(r.writes_dropped)},
        {"kvcache_remote_breaker_state", "gauge",
         "The remote tier's circuit breaker: 0 closed, 1 open, 2 half-open.",
         static_cast<double>(static_cast<int>(r.breaker))},
        {"kvcache_remote_breaker_opens_total", "counter", "Times the circuit breaker opened.",
         static_cast<double>(r.breaker_opens)},
        {"kvcache_remote_lookup_seconds_total", "counter",
         "Time spent in remote lookups (on the tier's lookup thread).", r.lookup_seconds},
        {"kvcache_remote_waits_expired_total", "counter",
         "Requests that stopped waiting for a remote lookup and computed locally.",
         static_cast<double>(m.remote_waits_expired)},
    };
    for (const auto& x : remote) metric(x.name, x.type, x.help, x.value);
  }
  metric("kvcache_prefill_tokens_total", "counter", "Tokens prefilled (recomputation included).",
         static_cast<double>(m.computed_prompt_tokens));
  metric("kvcache_generation_tokens_total", "counter", "Tokens sampled.",
         static_cast<double>(m.generation_tokens));
  // Speculative decoding (serve --spec): the acceptance rate is
  // rate(kvcache_spec_accepted_tokens_total) / rate(kvcache_spec_draft_tokens_total).
  metric("kvcache_spec_draft_tokens_total", "counter",
         "Draft tokens verified by speculative decoding.", static_cast<double>(m.spec_drafted));
  metric("kvcache_spec_accepted_tokens_total", "counter",
         "Draft tokens accepted by speculative decoding.", static_cast<double>(m.spec_accepted));
  {
    std::lock_guard<std::mutex> lock(latency_->mu);
    latency_->ttft.write(out, "kvcache_time_to_first_token_seconds",
                         "Time from a request's arrival to its first token.");
    latency_->itl.write(out, "kvcache_inter_token_latency_seconds",
                        "Time between two tokens of one sample.");
    latency_->e2e.write(out, "kvcache_e2e_request_latency_seconds",
                        "Time from a request's arrival to its end (completed requests).");
    latency_->queue.write(out, "kvcache_request_queue_time_seconds",
                          "Time a request waited before its first admission.");
  }
  metric("kvcache_preemptions_total", "counter",
         "Sequences preempted (blocks freed, recomputed later).",
         static_cast<double>(m.preemptions));
  metric("kvcache_requests_finished_total", "counter", "Requests finished (cancelled included).",
         static_cast<double>(m.requests_finished));
  metric("kvcache_requests_cancelled_total", "counter",
         "Requests cancelled (client gone, shutdown).", static_cast<double>(m.requests_cancelled));
  metric("kvcache_engine_steps_total", "counter", "Scheduling steps.",
         static_cast<double>(m.steps));
  metric("kvcache_requests_failed_total", "counter", "Requests that ended with an error.",
         static_cast<double>(m.requests_failed));
  metric("kvcache_engine_failed_forwards_total", "counter",
         "Model forwards that threw (their requests failed).",
         static_cast<double>(m.failed_forwards));
  metric("kvcache_http_handler_exceptions_total", "counter",
         "Handlers that threw (a bug; each answered 500).",
         static_cast<double>(handler_exceptions_.load()));
  const TransportStats t = http_->stats();
  metric("kvcache_http_connections", "gauge", "HTTP connections open.",
         static_cast<double>(t.open));
  metric("kvcache_http_connections_rejected_total", "counter",
         "Connections answered 503 past --max-connections.", static_cast<double>(t.rejected));
  metric("kvcache_http_request_timeouts_total", "counter",
         "Requests not received whole within --request-timeout.", static_cast<double>(t.timed_out));
  if (kv_events_) {
    metric("kvcache_kv_events_published_total", "counter",
           "KV events sent (a block stored or removed counts one, a clear one).",
           static_cast<double>(kv_events_->published()));
    metric("kvcache_kv_events_dropped_total", "counter",
           "KV events lost (publisher queue full or a subscriber past its high-water mark).",
           static_cast<double>(kv_events_->dropped()));
  }
  return out;
}

void HttpServer::install_routes() {
  install_guards();
  install_health();
  install_models();
  install_metrics();
  install_completions();
  install_slots();
  install_reset_prefix_cache();
  install_tokenize();
}

void HttpServer::install_guards() {
  httplib::Server& s = *http_;
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (config_.api_key.empty() || req.path == "/health")
      return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + config_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "Incorrect API key provided", "invalid_request_error", "invalid_api_key");
    return httplib::Server::HandlerResponse::Handled;
  });
  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.is_chunked_content_provider_) return;
    send_error(res, res.status, transport_error_message(res.status, req, config_.transport),
               res.status >= 500 ? "server_error" : "invalid_request_error",
               res.status == 404 ? "not_found" : "");
  });
  // A handler that throws is a bug; the client still gets a JSON 500 that says what failed.
  s.set_exception_handler(
      [this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        ++handler_exceptions_;
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        std::fprintf(stderr, "kvcache serve: internal error in %s %s: %s\n", req.method.c_str(),
                     req.path.c_str(), what.c_str());
        send_error(res, 500, "internal error: " + what, "server_error");
      });
}

// /health: 200 while the engine makes progress. After a failed forward it probes the engine
// with a one-token request before answering, so a lasting failure reads 503 with its cause and
// a passing one (a single allocation) does not keep the server out of rotation.
void HttpServer::install_health() {
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (stopping_.load()) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
      return;
    }
    // A step that does not end (a hung kernel, a deadlock) leaves every request waiting.
    const double began = step_began_s_.load();
    if (began > 0 && now_seconds() - began > config_.health_stall_s) {
      res.status = 503;
      const std::string error = "the engine has been inside one step for " +
                                std::to_string(static_cast<int64_t>(now_seconds() - began)) + " s";
      res.set_content(to_json_text(json{{"status", "unhealthy"}, {"error", error}}),
                      "application/json");
      return;
    }
    std::string error;
    if (engine_.metrics().consecutive_failed_forwards > 0 && !probe_engine(error)) {
      res.status = 503;
      res.set_content(to_json_text(json{{"status", "unhealthy"}, {"error", error}}),
                      "application/json");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
}

void HttpServer::install_models() {
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const json body{{"object", "list"},
                    {"data", json::array({json{{"id", model_.name},
                                               {"object", "model"},
                                               {"created", created_},
                                               {"owned_by", "kvcache"},
                                               {"max_model_len", engine_.max_context()}}})}};
    res.set_content(to_json_text(body), "application/json");
  });
}

void HttpServer::install_metrics() {
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
}

void HttpServer::install_completions() {
  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    serve_completion(req, res, false);
  });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    serve_completion(req, res, true);
  });
}

// llama.cpp's slot save / restore. kvcache has no slots: {id} is a finished request's id, as
// its response named it ("cmpl-7", "chatcmpl-7" or just 7), among the engine's last
// Engine::kFinishedKept. The work runs on the engine thread (Engine::post), between steps.
void HttpServer::install_reset_prefix_cache() {
  // vLLM's POST /reset_prefix_cache: every cached prefix is dropped (blocks of running requests
  // keep their content); KV event subscribers get AllBlocksCleared.
  http_->Post("/reset_prefix_cache", [this](const httplib::Request&, httplib::Response& res) {
    auto done = std::make_shared<std::promise<void>>();
    std::future<void> cleared = done->get_future();
    engine_.post([this, done] {
      engine_.store().clear_prefix_cache();
      done->set_value();
    });
    if (cleared.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
      return send_error(res, 503, "the engine did not take the reset within 30 s", "server_error");
    res.set_content(json{{"status", "ok"}, {"reset", true}}.dump(), "application/json");
  });
}

// llama-server's POST /tokenize {"content", "add_special"} -> {"tokens"} and POST /detokenize
// {"tokens"} -> {"content"} (tools/server/README.md), with vLLM's request spellings accepted
// too ("prompt", "add_special_tokens"); the replies add vLLM's "count" and "max_model_len".
// add_special defaults to false as llama-server's (vLLM's defaults to true: send it).
void HttpServer::install_tokenize() {
  auto parse_body = [](const httplib::Request& req, httplib::Response& res) -> std::optional<json> {
    try {
      json body = json::parse(req.body);
      if (body.is_object()) return body;
      send_error(res, 400, "the request body must be a JSON object", "invalid_request_error");
    } catch (const json::exception& e) {
      send_error(res, 400, std::string("malformed JSON body: ") + e.what(),
                 "invalid_request_error");
    }
    return std::nullopt;
  };
  auto no_tokenizer = [this](httplib::Response& res) {
    if (model_.tokenizer != nullptr) return false;
    send_error(res, 400, "this model has no tokenizer: start serve with --tokenizer FILE",
               "invalid_request_error");
    return true;
  };
  http_->Post("/tokenize", [this, parse_body, no_tokenizer](const httplib::Request& req,
                                                            httplib::Response& res) {
    const std::optional<json> body = parse_body(req, res);
    if (!body || no_tokenizer(res)) return;
    const char* text_key = body->contains("content") ? "content" : "prompt";
    const auto text = body->find(text_key);
    if (text == body->end() || !text->is_string())
      return send_error(res, 400, "'content' (or 'prompt') must be a string",
                        "invalid_request_error");
    bool add_special = false;
    for (const char* key : {"add_special", "add_special_tokens"}) {
      const auto it = body->find(key);
      if (it == body->end() || it->is_null()) continue;
      if (!it->is_boolean())
        return send_error(res, 400, std::string("'") + key + "' must be a boolean",
                          "invalid_request_error");
      add_special = it->get<bool>();
    }
    for (const auto& item : body->items()) {
      const std::string& k = item.key();
      if (k != "content" && k != "prompt" && k != "add_special" && k != "add_special_tokens" &&
          k != "model")
        return send_error(res, 400,
                          "unrecognized field '" + k +
                              "'; /tokenize takes content (or prompt), add_special (or "
                              "add_special_tokens) and model",
                          "invalid_request_error");
    }
    const std::string& s = text->get_ref<const std::string&>();
    std::vector<int32_t> ids;
    if (add_special && model_.tokenizer->bos_id() >= 0) ids.push_back(model_.tokenizer->bos_id());
    const std::vector<int32_t> enc = model_.tokenizer->encode(s);
    ids.insert(ids.end(), enc.begin(), enc.end());
    res.set_content(
        to_json_text(
            json{{"tokens", ids}, {"count", ids.size()}, {"max_model_len", engine_.max_context()}}),
        "application/json");
  });
  http_->Post("/detokenize", [this, parse_body, no_tokenizer](const httplib::Request& req,
                                                              httplib::Response& res) {
    const std::optional<json> body = parse_body(req, res);
    if (!body || no_tokenizer(res)) return;
    const auto tokens = body->find("tokens");
    if (tokens == body->end() || !tokens->is_array())
      return send_error(res, 400, "'tokens' must be an array of token ids",
                        "invalid_request_error");
    for (const auto& item : body->items())
      if (item.key() != "tokens" && item.key() != "model")
        return send_error(res, 400,
                          "unrecognized field '" + item.key() + "'; /detokenize takes tokens",
                          "invalid_request_error");
    const int32_t vocab = model_.tokenizer->vocab_size();
    std::string text;
    int32_t prev = -1;
    for (const json& t : *tokens) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
        return send_error(res, 400,
                          "'tokens' holds " + t.dump() +
                              ", not a token id of this vocabulary (0.." +
                              std::to_string(vocab - 1) + ")",
                          "invalid_request_error");
      const auto id = static_cast<int32_t>(t.get<int64_t>());
      text += model_.tokenizer->piece_after(prev, id);
      prev = id;
    }
    res.set_content(to_json_text(json{{"content", text}}), "application/json");
  });
}

void HttpServer::install_slots() {
  http_->Post(R"(/slots/([A-Za-z0-9_-]+))", [this](const httplib::Request& req,
                                                   httplib::Response& res) {
    if (config_.slot_save_path.empty())
      return send_error(res, 501,
                        "slot save/restore is disabled: start serve with --slot-save-path DIR",
                        "not_supported_error");
    const std::string action = req.get_param_value("action");
    if (action != "save" && action != "restore")
      return send_error(res, 400, "action must be 'save' or 'restore', got '" + action + "'",
                        "invalid_request_error");
    const std::string slot = req.matches[1];
    const size_t digits = slot.find_last_not_of("0123456789");
    const std::string number = digits == std::string::npos ? slot : slot.substr(digits + 1);
    if (number.empty() || number.size() > 18)
      return send_error(res, 400, "slot id '" + slot + "' is not a request id (cmpl-N, N)",
                        "invalid_request_error");
    const uint64_t id = std::stoull(number);
    std::string filename;
    try {
      const json body = json::parse(req.body);
      if (body.contains("filename") && body["filename"].is_string())
        filename = body["filename"].get<std::string>();
    } catch (const json::exception& e) {
      return send_error(res, 400, std::string("malformed JSON body: ") + e.what(),
                        "invalid_request_error");
    }
    if (filename.empty() || filename.find('/') != std::string::npos ||
        filename.find('\\') != std::string::npos || filename.find("..") != std::string::npos)
      return send_error(
          res, 400,
          "filename must be a plain file name (not empty, no '/', no '..'), got '" + filename + "'",
          "invalid_request_error");
    const std::string path = config_.slot_save_path + "/" + filename;
    const bool save = action == "save";
    auto done = std::make_shared<std::promise<std::pair<int, json>>>();
    std::future<std::pair<int, json>> answer = done->get_future();
    engine_.post([this, done, save, id, path, slot, filename] {
      const auto t0 = std::chrono::steady_clock::now();
      std::pair<int, json> r;
      try {
        PagedSessionResult out;
        if (save) {
          bool salted = false;
          std::string policy;
          const std::vector<int32_t> tokens = engine_.finished_tokens(id, &salted, &policy);
          if (!tokens.empty() && policy != "exact") {
            // Its blocks were computed under a lossy policy and keyed under it: a slot file
            // restores exact, unsalted blocks.
            r = {400, error_body("request " + slot + " ran under kv_policy " + policy +
                                     "; slots save and restore exact KV only",
                                 "invalid_request_error", "")};
            done->set_value(r);
            return;
          }
          if (salted) {
            // Its blocks are keyed under its tenant's salt, which a slot file does not carry
            // (restore puts blocks back unsalted): saving it would serve its prefix to anyone.
            r = {400, error_body("request " + slot +
                                     " used a cache_salt; slots save and restore unsalted "
                                     "prefixes only",
                                 "invalid_request_error", "")};
            done->set_value(r);
            return;
          }
          if (tokens.empty()) {
            r = {404, error_body("request " + slot + " is not among the last " +
                                     std::to_string(Engine::kFinishedKept) + " finished requests",
                                 "invalid_request_error", "")};
            done->set_value(r);
            return;
          }
          out = save_paged_session(engine_.store(), engine_.model(), tokens, path);
        } else {
          out = load_paged_session(engine_.store(), engine_.model(), path);
        }
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        r.first = 200;
        r.second = json{{"id_slot", slot}, {"filename", filename}};
        r.second[save ? "n_saved" : "n_restored"] = out.tokens;
        r.second[save ? "n_written" : "n_read"] = out.bytes;
        r.second["timings"] = json{{save ? "save_ms" : "restore_ms", ms}};
      } catch (const Error& e) {
        const int status = e.kind() == ErrorKind::kOutOfRange    ? 409
                           : e.kind() == ErrorKind::kUnsupported ? 501
                           : e.kind() == ErrorKind::kIo          ? (save ? 500 : 404)
                                                                 : 400;
        const char* type = status == 501   ? "not_supported_error"
                           : status >= 500 ? "server_error"
                                           : "invalid_request_error";
        r = {status, error_body(e.what(), type, "")};
      } catch (const std::exception& e) {
        r = {500, error_body(e.what(), "server_error", "")};
      }
      done->set_value(r);
    });
    const auto [status, body] = answer.get();
    res.status = status;
    res.set_content(to_json_text(body), "application/json");
  });
}

void HttpServer::serve_completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  if (stopping_.load()) return send_error(res, 503, "the server is shutting down", "server_error");
  std::optional<std::vector<ApiRequest>> batch = read_api_request(req, chat, model_, res);
  if (!batch) return;
  if (batch->size() > 1) return answer_batch(res, *batch);
  const ApiRequest* ar = &batch->front();
  auto ch = std::make_shared<Channel>(latency_);
  uint64_t id = 0;
  try {
    id = engine_.submit(ar->params, [ch](const StreamEvent& ev) { ch->push(ev); });
  } catch (const Error& e) {
    return send_error(res, 400, e.what(), "invalid_request_error");
  }
  if (id == 0)
    return send_error(res, 429, "the request queue is full; retry later", "rate_limit_error",
                      "queue_full");
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.insert(id);
  }
  if (ar->stream) {
    answer_stream(res, *ar, ch, id);
  } else {
    answer_whole(res, *ar, ch, id);
  }
}

// A completions batch: one engine request per prompt, all queued at once, answered whole when
// the last one ends. The stream of several prompts would interleave their chunks under one id;
// it is refused rather than half done. A client gone meanwhile is not noticed (the requests
// run to max_tokens): the same as a single request before its first token.
void HttpServer::answer_batch(httplib::Response& res, const std::vector<ApiRequest>& batch) {
  if (batch.front().stream)
    return send_error(res, 400,
                      "'stream': true with a batch 'prompt' (a list of prompts) is not supported; "
                      "stream one prompt per request, or send the batch with \"stream\": false",
                      "invalid_request_error");
  std::vector<std::shared_ptr<Channel>> channels;
  std::vector<uint64_t> ids;
  for (const ApiRequest& ar : batch) {
    auto ch = std::make_shared<Channel>(latency_);
    uint64_t id = 0;
    std::string error;
    try {
      id = engine_.submit(ar.params, [ch](const StreamEvent& ev) { ch->push(ev); });
    } catch (const Error& e) {
      error = e.what();
    }
    if (id == 0) {
      for (const uint64_t done : ids) release(done, false);
      if (!error.empty()) return send_error(res, 400, error, "invalid_request_error");
      return send_error(res, 429, "the request queue is full; retry later", "rate_limit_error",
                        "queue_full");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.insert(id);
    }
    ids.push_back(id);
    channels.push_back(std::move(ch));
  }
  const int64_t created = unix_now();
  std::vector<json> responses;
  json err;
  int failed = 0;
  for (size_t i = 0; i < channels.size(); ++i) {
    Channel& ch = *channels[i];
    {
      std::unique_lock<std::mutex> lock(ch.mu);
      ch.cv.wait(lock, [&] { return ch.output.has_value(); });
      ch.events.clear();
    }
    forget(ids[i]);
    const RequestOutput& out = *ch.output;  // final: no writer any more
    json e;
    if (const int status = failed_status(out, stopping_.load(), e); status != 0) {
      if (failed == 0) {
        failed = status;
        err = e;
      }
      continue;
    }
    responses.push_back(completion_response(batch[i], out, model_.name, created));
  }
  if (failed != 0) {
    res.status = failed;
    res.set_content(to_json_text(err), "application/json");
    return;
  }
  res.set_content(to_json_text(merge_batch_responses(responses, batch.front().params.n)),
                  "application/json");
}

void HttpServer::release(uint64_t id, bool success) {
  if (!success) engine_.cancel(id);
  forget(id);
}

// cpp-httplib 0.11 gives a handler no view of its socket, so a client that goes away is only
// seen from a content provider (sink.is_writable() peeks at the socket), and a provider runs
// after the status line is sent. Hence two phases: the handler waits for the request's first
// token (queue + prefill; an admission error comes before any token and still gets its status),
// then, unless it already finished, a chunked provider waits for the rest in 100 ms slices and
// cancels the request (freeing its blocks) when the client is gone. A disconnect while queued
// or prefilling is noticed at the first token. Only a token ends the first phase: a request
// failed or cancelled before any token delivers its samples' finish events, then (separately)
// its output, and a handler waking between the two must still answer with the error's status.
void HttpServer::answer_whole(httplib::Response& res, const ApiRequest& ar,
                              const std::shared_ptr<Channel>& ch, uint64_t id) {
  auto forget = [this, id] { this->forget(id); };
  const std::string model_name = model_.name;
  const int64_t created = unix_now();
  {
    std::unique_lock<std::mutex> lock(ch->mu);
    ch->cv.wait(lock, [&] { return ch->token || ch->output.has_value(); });
    if (ch->output.has_value()) {
      lock.unlock();
      forget();
      const RequestOutput& out = *ch->output;
      json err;
      if (const int status = failed_status(out, stopping_.load(), err); status != 0) {
        res.status = status;
        res.set_content(to_json_text(err), "application/json");
        return;
      }
      res.set_content(to_json_text(completion_response(ar, out, model_name, created)),
                      "application/json");
      return;
    }
  }
  res.set_chunked_content_provider(
      "application/json",
      [this, ch, ar, id, created, model_name, forget](size_t, httplib::DataSink& sink) {
        {
          std::unique_lock<std::mutex> lock(ch->mu);
          ch->events.clear();  // only the final output is sent
          if (!ch->cv.wait_for(lock, std::chrono::milliseconds(100),
                               [&] { return ch->output.has_value(); })) {
            lock.unlock();
            if (sink.is_writable()) return true;
            release(id, false);  // the client went away
            return false;
          }
        }
        forget();
        const RequestOutput& out = *ch->output;  // final: no writer any more
        // The status (200) is already out: a request that failed after its first token
        // answers with an OpenAI error object as the body.
        json err;
        const std::string body =
            to_json_text(failed_status(out, stopping_.load(), err) != 0
                             ? err
                             : completion_response(ar, out, model_name, created));
        if (!sink.write(body.data(), body.size())) return false;
        sink.done();
        return true;
      },
      [this, id](bool success) { release(id, success); });
}

// Server-sent events: a chunk per token with text (or per finish), an error event if the
// request fails mid-stream, the usage chunk when asked for, then `data: [DONE]`.
void HttpServer::answer_stream(httplib::Response& res, const ApiRequest& ar,
                               const std::shared_ptr<Channel>& ch, uint64_t id) {
  auto forget = [this, id] { this->forget(id); };
  const std::string model_name = model_.name;
  const int64_t created = unix_now();
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
      [this, ch, ar, id, created, model_name, first, pending, forget,
       has_text = model_.tokenizer != nullptr](size_t, httplib::DataSink& sink) {
        std::deque<StreamEvent> batch;
        {
          std::unique_lock<std::mutex> lock(ch->mu);
          ch->cv.wait_for(lock, std::chrono::milliseconds(100),
                          [&] { return !ch->events.empty(); });
          batch.swap(ch->events);
        }
        auto write = [&](const std::string& data) {
          if (sink.write(data.data(), data.size())) return true;
          release(id, false);  // the client went away
          return false;
        };
        if (batch.empty()) {
          if (sink.is_writable()) return true;
          release(id, false);
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
          if (ev.token >= 0 && ev.text.empty() && has_text &&
              !(*first)[static_cast<size_t>(ev.index)])
            continue;
          const std::string finish = ev.finished ? openai_finish_reason(ev.reason) : "";
          const bool is_first = (*first)[static_cast<size_t>(ev.index)];
          (*first)[static_cast<size_t>(ev.index)] = false;
          const json chunk =
              stream_chunk(ar, id, model_name, created, ev.index, ev.text, finish, is_first,
                           pd.logprobs, pd.offset, ev.prompt_logprobs.get());
          for (const TokenLogprob& t : pd.logprobs) pd.offset += t.chosen.piece.size();
          pd.logprobs.clear();
          if (!write("data: " + to_json_text(chunk) + "\n\n")) return false;
        }
        if (!done) return true;
        RequestStats stats;
        json err;
        int failed = 0;
        {
          std::lock_guard<std::mutex> lock(ch->mu);
          stats = ch->output->stats;
          failed = failed_status(*ch->output, stopping_.load(), err);
        }
        // A request that failed mid-stream says why in an error event, then ends as usual.
        if (failed != 0 && !write("data: " + to_json_text(err) + "\n\n")) return false;
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
      [this, id](bool success) { release(id, success); });
}

}  // namespace kvcache
