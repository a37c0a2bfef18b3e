// `kvcache events --endpoint tcp://HOST:PORT`: subscribes to a KV events publisher (`kvcache
// serve --kv-events`, or vLLM's --kv-events-config publisher: the same format, either event
// layout) and prints one line per event (--json: one JSON object per line, hashes in hex).
// Ends after --count events (exit 0), or when --timeout seconds pass without a message: exit 0
// when it saw --count events (or no --count was given), else 1 with a message. A message that
// is not a KVEventBatch is reported on stderr, skipped and counted. --replay ENDPOINT first asks
// the publisher's replay socket for what it published before (ZeroMQ's PUB drops messages sent
// before a subscription arrives) and fills any later gap in the batch numbers from it.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "core/error.h"
#include "server/kv_events.h"
#include "tools/commands.h"
#include "tools/option_rules.h"

namespace kvcache::tools {
namespace {

struct EventsOptions {
  std::string endpoint;
  std::string replay;  // the publisher's replay (ROUTER) address; empty: none
  std::string topic;
  int64_t from_seq = 0;
  int64_t count = 0;
  double timeout_s = 10;
  bool json = false;
};

uint64_t read_be64(const zmq::message_t& m) {
  uint64_t v = 0;
  const auto* p = static_cast<const unsigned char*>(m.data());
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

std::string be64_string(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return s;
}

// Every frame of the next message on `s`; empty when nothing came before the socket's timeout.
std::vector<zmq::message_t> recv_frames(zmq::socket_t& s) {
  std::vector<zmq::message_t> frames;
  zmq::message_t m;
  if (!s.recv(m)) return frames;
  bool more = m.more();
  frames.push_back(std::move(m));
  while (more) {
    zmq::message_t part;
    if (!s.recv(part)) break;
    more = part.more();
    frames.push_back(std::move(part));
  }
  return frames;
}

class Printer {
 public:
  explicit Printer(const EventsOptions& o) : o_(o) {}

  // One batch numbered `seq`: printed unless it was already (a live copy of a replayed batch, or
  // the reverse). False when it is not a KVEventBatch.
  bool batch(uint64_t seq, const zmq::message_t& payload) {
    if (started_ && seq < next_) return true;
    KvEventBatchView batch;
    try {
      batch = decode_kv_event_batch(payload.to_string_view());
    } catch (const Error& e) {
      ++malformed_;
      std::fprintf(stderr, "kvcache events: skipped batch #%llu: %s\n",
                   static_cast<unsigned long long>(seq), e.what());
      return false;
    }
    if (started_ && seq > next_)
      std::fprintf(stderr, "kvcache events: batches #%llu..#%llu were missed%s\n",
                   static_cast<unsigned long long>(next_), static_cast<unsigned long long>(seq - 1),
                   o_.replay.empty() ? " (--replay ENDPOINT asks the publisher for them)"
                                     : " (no longer in the publisher's replay buffer)");
    started_ = true;
    next_ = seq + 1;
    for (const KvEventView& e : batch.events) {
      if (done()) break;
      const std::string line = o_.json ? kv_event_json(e, seq, batch.ts) : kv_event_line(e, seq);
      std::printf("%s\n", line.c_str());
      ++seen_;
    }
    std::fflush(stdout);
    return true;
  }
  void malformed(const char* what, size_t frames) {
    ++malformed_;
    std::fprintf(stderr, "kvcache events: skipped a %s message of %zu frames\n", what, frames);
  }
  bool done() const { return o_.count > 0 && seen_ >= o_.count; }
  bool started() const { return started_; }
  uint64_t next() const { return next_; }
  int64_t seen() const { return seen_; }
  int64_t malformed_count() const { return malformed_; }

 private:
  const EventsOptions& o_;
  bool started_ = false;
  uint64_t next_ = 0;
  int64_t seen_ = 0, malformed_ = 0;
};

// Asks the replay socket for every batch from `start` on and prints them, up to its end marker.
void replay_from(zmq::socket_t& replay, uint64_t start, Printer& out, const EventsOptions& o) {
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);  // the REQ envelope's empty frame
  replay.send(zmq::buffer(be64_string(start)));
  for (;;) {
    std::vector<zmq::message_t> f = recv_frames(replay);
    if (f.empty())
      throw std::runtime_error("events: --replay " + o.replay + " did not answer within " +
                               std::to_string(o.timeout_s) +
                               " s (is it the publisher's --kv-events-replay address?)");
    if (f.size() != 3 || f[0].size() != 0 || f[1].size() != 8) {
      out.malformed("replay", f.size());
      continue;
    }
    const uint64_t seq = read_be64(f[1]);
    if (seq == ~uint64_t{0}) return;  // -1: the end of the replay
    out.batch(seq, f[2]);
  }
}

void run_events(const EventsOptions& o) {
  check_kv_events_endpoint(o.endpoint, "--endpoint");
  if (!o.replay.empty()) check_kv_events_endpoint(o.replay, "--replay");
  if (o.count < 0)
    throw Error(ErrorKind::kInvalidArgument,
                "--count must be >= 0 (0: until --timeout), got " + std::to_string(o.count));
  if (o.from_seq < 0)
    throw Error(ErrorKind::kInvalidArgument,
                "--from-seq must be >= 0, got " + std::to_string(o.from_seq));
  if (o.from_seq > 0 && o.replay.empty())
    throw Error(ErrorKind::kInvalidArgument,
                "--from-seq asks the publisher's replay socket for past batches: give --replay "
                "ENDPOINT too");
  if (!(o.timeout_s > 0) || o.timeout_s > 86400)
    throw Error(ErrorKind::kInvalidArgument,
                "--timeout must be in (0, 86400] seconds, got " + std::to_string(o.timeout_s));
  zmq::context_t ctx(1);
  auto open = [&](zmq::socket_type type, const std::string& endpoint, const char* flag) {
    zmq::socket_t s(ctx, type);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, static_cast<int>(o.timeout_s * 1000));
    try {
      s.connect(endpoint);
    } catch (const zmq::error_t& e) {
      throw Error(ErrorKind::kIo,
                  std::string(flag) + " " + endpoint + ": cannot connect: " + e.what());
    }
    return s;
  };
  zmq::socket_t sub = open(zmq::socket_type::sub, o.endpoint, "--endpoint");
  sub.set(zmq::sockopt::subscribe, o.topic);
  std::fprintf(stderr, "kvcache events: subscribed to %s (topic '%s')\n", o.endpoint.c_str(),
               o.topic.c_str());
  std::fflush(stderr);
  Printer out(o);
  // A subscriber misses what was published before its subscription reached the publisher (ZeroMQ
  // drops it). With --replay, those batches come from the publisher's buffer first; later gaps
  // in the sequence numbers are asked for again.
  std::optional<zmq::socket_t> replay;
  if (!o.replay.empty()) {
    replay.emplace(open(zmq::socket_type::dealer, o.replay, "--replay"));
    replay_from(*replay, static_cast<uint64_t>(o.from_seq), out, o);
  }
  while (!out.done()) {
    std::vector<zmq::message_t> frames = recv_frames(sub);
    if (frames.empty()) break;  // --timeout without a message
    if (frames.size() != 3 || frames[1].size() != 8) {
      out.malformed("live", frames.size());  // want topic, 8-byte sequence number, payload
      continue;
    }
    const uint64_t seq = read_be64(frames[1]);
    if (replay && seq > (out.started() ? out.next() : static_cast<uint64_t>(o.from_seq)))
      replay_from(*replay, out.started() ? out.next() : static_cast<uint64_t>(o.from_seq), out, o);
    if (!out.done()) out.batch(seq, frames[2]);
  }
  if (out.malformed_count() > 0)
    std::fprintf(stderr, "kvcache events: %lld malformed message(s) skipped\n",
                 static_cast<long long>(out.malformed_count()));
  if (o.count > 0 && out.seen() < o.count)
    throw std::runtime_error("events: saw " + std::to_string(out.seen()) + " of " +
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
  cmd->add_option("--replay", o->replay,
                  "The publisher's replay address (serve --kv-events-replay): batches published "
                  "before this subscriber connected, and any gap later, are asked for there");
  cmd->add_option("--from-seq", o->from_seq,
                  "With --replay: the first batch number to replay (default 0: all it keeps)");
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
