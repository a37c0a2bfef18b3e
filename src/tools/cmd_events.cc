// `kvcache events --endpoint tcp://HOST:PORT`: subscribes to a KV events publisher (`kvcache
// serve --kv-events`, or vLLM's --kv-events-config publisher: the same format, either event
// layout) and prints one line per event (--json: one JSON object per line, hashes in hex).
// Ends after --count events (exit 0), or when --timeout seconds pass without a message: exit 0
// when it saw --count events (or no --count was given), else 1 with a message. A message that
// is not a KVEventBatch is reported on stderr, skipped and counted.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <zmq.hpp>

#include "core/error.h"
#include "server/kv_events.h"
#include "tools/commands.h"
#include "tools/option_rules.h"

namespace kvcache::tools {
namespace {

struct EventsOptions {
  std::string endpoint;
  std::string topic;
  int64_t count = 0;
  double timeout_s = 10;
  bool json = false;
};

void run_events(const EventsOptions& o) {
  check_kv_events_endpoint(o.endpoint, "--endpoint");
  if (o.count < 0)
    throw Error(ErrorKind::kInvalidArgument,
                "--count must be >= 0 (0: until --timeout), got " + std::to_string(o.count));
  if (!(o.timeout_s > 0) || o.timeout_s > 86400)
    throw Error(ErrorKind::kInvalidArgument,
                "--timeout must be in (0, 86400] seconds, got " + std::to_string(o.timeout_s));
  zmq::context_t ctx(1);
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::rcvtimeo, static_cast<int>(o.timeout_s * 1000));
  try {
    sub.connect(o.endpoint);
  } catch (const zmq::error_t& e) {
    throw Error(ErrorKind::kIo, "--endpoint " + o.endpoint + ": cannot connect: " + e.what());
  }
  sub.set(zmq::sockopt::subscribe, o.topic);
  std::fprintf(stderr, "kvcache events: subscribed to %s (topic '%s')\n", o.endpoint.c_str(),
               o.topic.c_str());
  std::fflush(stderr);
  int64_t seen = 0, malformed = 0;
  while (o.count == 0 || seen < o.count) {
    std::vector<zmq::message_t> frames;
    zmq::message_t m;
    if (!sub.recv(m)) break;  // --timeout without a message
    bool more = m.more();
    frames.push_back(std::move(m));
    while (more) {
      zmq::message_t part;
      if (!sub.recv(part)) break;
      more = part.more();
      frames.push_back(std::move(part));
    }
    if (frames.size() != 3 || frames[1].size() != 8) {
      ++malformed;
      std::fprintf(stderr,
                   "kvcache events: skipped a message of %zu frames (want topic, 8-byte "
                   "sequence number, payload)\n",
                   frames.size());
      continue;
    }
    uint64_t seq = 0;
    const auto* p = static_cast<const unsigned char*>(frames[1].data());
    for (int i = 0; i < 8; ++i) seq = (seq << 8) | p[i];
    KvEventBatchView batch;
    try {
      batch = decode_kv_event_batch(frames[2].to_string_view());
    } catch (const Error& e) {
      ++malformed;
      std::fprintf(stderr, "kvcache events: skipped batch #%llu: %s\n",
                   static_cast<unsigned long long>(seq), e.what());
      continue;
    }
    for (const KvEventView& e : batch.events) {
      const std::string line = o.json ? kv_event_json(e, seq, batch.ts) : kv_event_line(e, seq);
      std::printf("%s\n", line.c_str());
      ++seen;
    }
    std::fflush(stdout);
  }
  if (malformed > 0)
    std::fprintf(stderr, "kvcache events: %lld malformed message(s) skipped\n",
                 static_cast<long long>(malformed));
  if (o.count > 0 && seen < o.count)
    throw std::runtime_error("events: saw " + std::to_string(seen) + " of " +
                             std::to_string(o.count) + " events before " +
                             std::to_string(o.timeout_s) + " s passed without one");
}

}  // namespace

void register_events(CLI::App& app) {
  auto o = std::make_shared<EventsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "events", "Print the KV events of a server (serve --kv-events, or vLLM's publisher)");
  cmd->add_option("--endpoint", o->endpoint, "Publisher address, e.g. tcp://127.0.0.1:5557")
      ->required();
  cmd->add_option("--topic", o->topic, "Topic to subscribe to (default: every message)");
  cmd->add_option("--count", o->count, "Exit after this many events (0: until --timeout)")
      ->capture_default_str();
  cmd->add_option("--timeout", o->timeout_s,
                  "Seconds without a message before giving up (exit 1 when --count was not "
                  "reached)")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "One JSON object per event, hashes in hex");
  cmd->callback([cmd, o] {
    check_options(*cmd, RunShape{});
    run_events(*o);
  });
}

}  // namespace kvcache::tools
