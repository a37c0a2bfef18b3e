// The Redis / Redis Cluster KvClient (core/kv_client.h) over hiredis 0.14.1.
//
// hiredis provides the connection (redisConnectNonBlock: a non-blocking socket, TCP_NODELAY)
// and the reply parser (the context's redisReader, fed with redisReaderFeed). The output side
// is ours: commands are queued as byte segments per node and sent with sendmsg(MSG_NOSIGNAL),
// because hiredis 0.14's redisBufferWrite uses write(2) (SIGPIPE on a peer that closed) and
// redisAppendCommandArgv copies every value into its output buffer; here a SET's value is sent
// from the caller's memory (a borrowed segment, valid for the call). One event loop per call
// polls every node with work (ppoll, so the deadline is kept to the microsecond), so the nodes
// of a cluster are served concurrently and each node's commands are pipelined.
//
// References (facts only): Redis Cluster specification, "Key distribution model" (CRC16
// XMODEM, 16384 slots, hash tags) and "Redirection and resharding" (-MOVED slot host:port,
// -ASK slot host:port, ASKING) https://redis.io/docs/reference/cluster-spec/ ; CLUSTER SLOTS
// reply layout https://redis.io/commands/cluster-slots/ ; RESP
// https://redis.io/docs/reference/protocol-spec/ ; hiredis 0.14 README (non-blocking use of
// the reader).
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>
#include <map>
#include <optional>

#include "core/error.h"
#include "core/kv_client.h"

namespace kvcache {

// ---------------------------------------------------------------------------------------------
// URL parsing

namespace {

int parse_port(std::string_view s, const std::string& url, std::string_view part) {
  int port = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), port);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || port < 1 || port > 65535)
    throw Error(ErrorKind::kInvalidArgument,
                "Redis URL '" + url + "': port '" + std::string(s) + "' in '" + std::string(part) +
                    "' is not a number in 1..65535 (write redis://host:port[,host:port...])");
  return port;
}

}  // namespace

RedisOptions parse_redis_url(const std::string& url) {
  static constexpr std::string_view kScheme = "redis://";
  const std::string_view u(url);
  if (u.substr(0, kScheme.size()) != kScheme) {
    const size_t colon = u.find("://");
    throw Error(ErrorKind::kInvalidArgument,
                "Redis URL '" + url + "': scheme '" +
                    std::string(colon == std::string_view::npos ? u : u.substr(0, colon)) +
                    "' is not supported (only redis://host:port[,host:port...]; TLS "
                    "(rediss://) and unix sockets are not)");
  }
  std::string_view rest = u.substr(kScheme.size());
  RedisOptions o;
  if (const size_t q = rest.find_first_of("?#"); q != std::string_view::npos)
    throw Error(ErrorKind::kInvalidArgument,
                "Redis URL '" + url + "': query '" + std::string(rest.substr(q)) +
                    "' is not supported (options go in their own flags)");
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    if (slash + 1 != rest.size())
      throw Error(ErrorKind::kInvalidArgument,
                  "Redis URL '" + url + "': path '" + std::string(rest.substr(slash)) +
                      "' is not supported (database numbers are not: Redis Cluster has only "
                      "database 0; drop the path)");
    rest = rest.substr(0, slash);
  }
  if (const size_t at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = userinfo.find(':');
    const std::string_view user = userinfo.substr(0, colon);
    if (colon == std::string_view::npos || (!user.empty() && user != "default"))
      throw Error(ErrorKind::kInvalidArgument,
                  "Redis URL '" + url + "': user info '" + std::string(userinfo) +
                      "' is not supported (write redis://:password@host:port; ACL users "
                      "other than 'default' are not supported)");
    o.password = std::string(userinfo.substr(colon + 1));
  }
  if (rest.empty())
    throw Error(ErrorKind::kInvalidArgument,
                "Redis URL '" + url + "': no host (write redis://host:port[,host:port...])");
  size_t start = 0;
  while (start <= rest.size()) {
    size_t comma = rest.find(',', start);
    if (comma == std::string_view::npos) comma = rest.size();
    const std::string_view part = rest.substr(start, comma - start);
    RedisOptions::Endpoint e;
    std::string_view host = part;
    std::string_view port;
    if (!part.empty() && part.front() == '[') {  // [ipv6]:port
      const size_t close = part.find(']');
      if (close == std::string_view::npos)
        throw Error(ErrorKind::kInvalidArgument,
                    "Redis URL '" + url + "': host '" + std::string(part) + "' lacks its ']'");
      host = part.substr(1, close - 1);
      const std::string_view after = part.substr(close + 1);
      if (!after.empty()) {
        if (after.front() != ':')
          throw Error(ErrorKind::kInvalidArgument, "Redis URL '" + url + "': '" +
                                                       std::string(part) +
                                                       "' has text after ']' that is not :port");
        port = after.substr(1);
        e.port = parse_port(port, url, part);
      }
    } else if (const size_t colon = part.rfind(':'); colon != std::string_view::npos) {
      host = part.substr(0, colon);
      port = part.substr(colon + 1);
      e.port = parse_port(port, url, part);
    }
    if (host.empty())
      throw Error(ErrorKind::kInvalidArgument, "Redis URL '" + url + "': empty host in '" +
                                                   std::string(part) +
                                                   "' (write host:port, e.g. 127.0.0.1:6379)");
    e.host = std::string(host);
    o.seeds.push_back(std::move(e));
    start = comma + 1;
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// Hash slots (cluster spec, "Key distribution model": CRC16-CCITT XMODEM, poly 0x1021, init 0,
// no reflection; the {hash tag} is the text between the first '{' and the first '}' after it,
// when not empty).

uint16_t redis_key_slot(std::string_view key) {
  const size_t open = key.find('{');
  if (open != std::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string_view::npos && close > open + 1)
      key = key.substr(open + 1, close - open - 1);
  }
  uint16_t crc = 0;
  for (const char ch : key) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(ch) << 8);
    for (int b = 0; b < 8; ++b)
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
  }
  return crc & 16383;
}

// ---------------------------------------------------------------------------------------------
// The client

namespace {

constexpr int kSlots = 16384;

using Clock = std::chrono::steady_clock;

struct ReplyFree {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyFree>;

// One command's bytes to send: owned (formatted here) or borrowed (a caller's value).
struct Segment {
  std::string owned;
  const char* borrowed = nullptr;
  size_t size = 0;
  size_t sent = 0;
  const char* data() const { return borrowed ? borrowed : owned.data(); }
};

enum class OpKind { kGet, kSet, kSlots };

// One key of a call (or the slot map read).
struct Op {
  OpKind kind = OpKind::kGet;
  size_t index = 0;  // key index
  int redirects = 0;
  bool asking = false;  // send ASKING first (after -ASK)
  bool done = false;
};

// What a reply on a connection answers, in send order.
struct Expect {
  enum Kind { kOp, kAsking, kAuth } kind = kOp;
  int op = -1;
};

struct Node {
  std::string host;
  int port = 0;
  std::string name;  // host:port
  redisContext* ctx = nullptr;
  bool connecting = false;  // non-blocking connect in progress
  SteadyTime retry_after{};
  // Per call:
  std::deque<Segment> out;
  std::deque<Expect> expect;
  bool dialled_this_call = false;
  int replies_this_call = 0;
};

std::string endpoint_name(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" +
         std::to_string(port);
}

// "MOVED 3999 127.0.0.1:6381" / "ASK ..." -> slot, host, port (host may be empty: "unknown
// endpoint", then the replying node's host is meant).
bool parse_redirect(std::string_view msg, int* slot, std::string* host, int* port) {
  const size_t sp1 = msg.find(' ');
  if (sp1 == std::string_view::npos) return false;
  const size_t sp2 = msg.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos) return false;
  const std::string_view s = msg.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view ep = msg.substr(sp2 + 1);
  const size_t colon = ep.rfind(':');
  if (colon == std::string_view::npos) return false;
  auto [p1, e1] = std::from_chars(s.data(), s.data() + s.size(), *slot);
  const std::string_view ps = ep.substr(colon + 1);
  auto [p2, e2] = std::from_chars(ps.data(), ps.data() + ps.size(), *port);
  if (e1 != std::errc() || e2 != std::errc() || *slot < 0 || *slot >= kSlots) return false;
  std::string_view h = ep.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = std::string(h);
  return true;
}

bool starts_with(const redisReply* r, std::string_view prefix) {
  return r->type == REDIS_REPLY_ERROR &&
         std::string_view(r->str, r->len).substr(0, prefix.size()) == prefix;
}

class RedisClient final : public KvClient {
 public:
  explicit RedisClient(const RedisOptions& o) : options_(o) {
    if (options_.seeds.empty())
      throw Error(ErrorKind::kInvalidArgument, "Redis client: no seed endpoint given");
    for (const auto& s : options_.seeds) seed_nodes_.push_back(node_for(s.host, s.port));
    slot_owner_.fill(-1);
  }
  ~RedisClient() override {
    for (Node& n : nodes_) close(n);
  }

  void get(std::span<const std::string> keys, SteadyTime deadline,
           const ValueFn& on_value) override {
    keys_ = keys;
    values_ = {};
    on_value_ = &on_value;
    acked_ = 0;
    run_call(OpKind::kGet, keys.size(), deadline);
    on_value_ = nullptr;
  }

  size_t set(std::span<const std::string> keys, std::span<const std::span<const std::byte>> values,
             SteadyTime deadline, int64_t ttl_ms) override {
    if (keys.size() != values.size())
      throw Error(ErrorKind::kInvalidArgument, "KvClient::set: " + std::to_string(keys.size()) +
                                                   " keys but " + std::to_string(values.size()) +
                                                   " values");
    keys_ = keys;
    values_ = values;
    on_value_ = nullptr;
    ttl_ms_ = ttl_ms;
    acked_ = 0;
    run_call(OpKind::kSet, keys.size(), deadline);
    values_ = {};
    return acked_;
  }

  KvClientStats stats() const override { return stats_; }

  std::string describe() const override {
    auto list = [](const std::vector<std::string>& names) {
      std::string s;
      for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
      return s;
    };
    if (mode_ == Mode::kStandalone) return "redis standalone " + nodes_[standalone_].name;
    if (mode_ == Mode::kCluster) {
      std::vector<bool> is_master(nodes_.size(), false);
      for (const int16_t o : slot_owner_)
        if (o >= 0) is_master[o] = true;
      std::vector<std::string> names;
      for (size_t i = 0; i < nodes_.size(); ++i)
        if (is_master[i]) names.push_back(nodes_[i].name);
      return "redis cluster, " + std::to_string(names.size()) + " masters (" + list(names) + ")";
    }
    std::vector<std::string> names;
    for (const int s : seed_nodes_) names.push_back(nodes_[s].name);
    return "redis (not connected yet: " + list(names) + ")";
  }

 private:
  enum class Mode { kUnknown, kStandalone, kCluster };

  int node_for(const std::string& host, int port) {
    const std::string name = endpoint_name(host, port);
    if (const auto it = node_index_.find(name); it != node_index_.end()) return it->second;
    Node n;
    n.host = host;
    n.port = port;
    n.name = name;
    nodes_.push_back(std::move(n));
    node_index_[name] = static_cast<int>(nodes_.size() - 1);
    return static_cast<int>(nodes_.size() - 1);
  }

  static void close(Node& n) {
    if (n.ctx) redisFree(n.ctx);
    n.ctx = nullptr;
    n.connecting = false;
  }

  // ---- the call -----------------------------------------------------------------------------

  void run_call(OpKind kind, size_t n, SteadyTime deadline) {
    ops_.assign(n, Op{});
    for (size_t i = 0; i < n; ++i) {
      ops_[i].kind = kind;
      ops_[i].index = i;
    }
    remaining_ = n;
    if (n == 0) return;
    if (mode_ == Mode::kUnknown) discover(deadline);
    if (mode_ == Mode::kUnknown) {  // no seed answered in time
      for (Op& op : ops_) finish_error(op);
      return;
    }
    begin_loop();
    if (mode_ == Mode::kCluster && refresh_map_ && Clock::now() >= next_refresh_) {
      const int target = refresh_target();
      if (target >= 0) {
        ops_.push_back(Op{OpKind::kSlots, 0, 0, false, false});
        ++remaining_;
        enqueue(static_cast<int>(ops_.size() - 1), target);
        next_refresh_ = Clock::now() + retry_interval();
        refresh_map_ = false;
      }
    }
    for (size_t i = 0; i < n; ++i) enqueue(static_cast<int>(i), route((*this).key(i)));
    loop(deadline);
  }

  // First contact: the first seed that answers CLUSTER SLOTS (an array: cluster) or "cluster
  // support disabled" (standalone), each tried until the deadline.
  // A seed that does not answer (a paused server) gets an equal share of the time left, so
  // the next ones still get theirs; it is held back afterwards like any timed-out node.
  void discover(SteadyTime deadline) {
    for (size_t k = 0; k < seed_nodes_.size(); ++k) {
      const int s = seed_nodes_[k];
      const SteadyTime now = Clock::now();
      if (now >= deadline) return;
      if (Clock::now() < nodes_[s].retry_after) continue;
      const std::vector<Op> saved = std::move(ops_);
      const size_t saved_remaining = remaining_;
      ops_.assign(1, Op{OpKind::kSlots, 0, 0, false, false});
      remaining_ = 1;
      begin_loop();
      enqueue(0, s);
      loop(now + (deadline - now) / static_cast<int64_t>(seed_nodes_.size() - k));
      ops_ = saved;
      remaining_ = saved_remaining;
      if (mode_ != Mode::kUnknown) return;
    }
  }

  void begin_loop() {
    for (Node& nd : nodes_) {
      nd.dialled_this_call = false;
      nd.replies_this_call = 0;
    }
  }

  std::chrono::nanoseconds retry_interval() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(options_.node_retry_seconds));
  }

  const std::string& key(size_t i) const { return keys_[i]; }

  int route(const std::string& k) const {
    if (mode_ == Mode::kStandalone) return standalone_;
    const int16_t owner = slot_owner_[redis_key_slot(k)];
    return owner >= 0 ? owner : default_node_;
  }

  // A node to read CLUSTER SLOTS from: a connected one, else any not held back.
  int refresh_target() const {
    const SteadyTime now = Clock::now();
    int fallback = -1;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (now < nodes_[i].retry_after) continue;
      if (nodes_[i].ctx && !nodes_[i].connecting) return static_cast<int>(i);
      if (fallback < 0) fallback = static_cast<int>(i);
    }
    return fallback;
  }

  // Opens a connection to `n` unless it has one; false when held back or refused at once.
  bool ensure_connection(int ni) {
    Node& n = nodes_[ni];
    if (n.ctx) return true;
    if (Clock::now() < n.retry_after) return false;
    // A numeric host resolves without blocking; a name goes through getaddrinfo (not bounded
    // by the deadline: the tier's seeds are addresses).
    redisContext* c = redisConnectNonBlock(n.host.c_str(), n.port);
    ++stats_.connects;
    n.dialled_this_call = true;
    if (c == nullptr || c->err) {
      if (c) redisFree(c);
      n.retry_after = Clock::now() + retry_interval();
      return false;
    }
    n.ctx = c;
    n.connecting = true;
    if (!options_.password.empty()) {
      const char* argv[] = {"AUTH", options_.password.c_str()};
      const size_t lens[] = {4, options_.password.size()};
      push_formatted(n, 2, argv, lens);
      n.expect.push_back(Expect{Expect::kAuth, -1});
    }
    return true;
  }

  void push_formatted(Node& n, int argc, const char** argv, const size_t* lens) {
    char* cmd = nullptr;
    const int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    KV_CHECK(len >= 0 && cmd != nullptr, "redisFormatCommandArgv failed (out of memory)");
    Segment s;
    s.owned.assign(cmd, static_cast<size_t>(len));
    s.size = s.owned.size();
    redisFreeCommand(cmd);
    n.out.push_back(std::move(s));
  }

  void push_owned(Node& n, std::string bytes) {
    Segment s;
    s.owned = std::move(bytes);
    s.size = s.owned.size();
    n.out.push_back(std::move(s));
  }

  // Queues op `oi` on node `ni` (its commands after those already queued there).
  void enqueue(int oi, int ni) {
    Op& op = ops_[oi];
    if (ni < 0 || !ensure_connection(ni)) {
      finish_error(op);
      return;
    }
    Node& n = nodes_[ni];
    if (op.asking) {
      const char* argv[] = {"ASKING"};
      const size_t lens[] = {6};
      push_formatted(n, 1, argv, lens);
      n.expect.push_back(Expect{Expect::kAsking, -1});
    }
    if (op.kind == OpKind::kSlots) {
      const char* argv[] = {"CLUSTER", "SLOTS"};
      const size_t lens[] = {7, 5};
      push_formatted(n, 2, argv, lens);
      ++stats_.slot_map_reads;
    } else if (op.kind == OpKind::kGet) {
      const std::string& k = key(op.index);
      const char* argv[] = {"GET", k.data()};
      const size_t lens[] = {3, k.size()};
      push_formatted(n, 2, argv, lens);
      ++stats_.commands;
    } else {
      // SET key value [PX ttl]: the RESP header and trailer are formatted here, the value is
      // sent from the caller's memory.
      const std::string& k = key(op.index);
      const std::span<const std::byte> v = values_[op.index];
      const std::string ttl = std::to_string(ttl_ms_);
      std::string head = ttl_ms_ > 0 ? "*5\r\n" : "*3\r\n";
      head += "$3\r\nSET\r\n$" + std::to_string(k.size()) + "\r\n";
      head += k;
      head += "\r\n$" + std::to_string(v.size()) + "\r\n";
      push_owned(n, std::move(head));
      if (!v.empty()) {
        Segment s;
        s.borrowed = reinterpret_cast<const char*>(v.data());
        s.size = v.size();
        n.out.push_back(s);
      }
      std::string tail = "\r\n";
      if (ttl_ms_ > 0) tail += "$2\r\nPX\r\n$" + std::to_string(ttl.size()) + "\r\n" + ttl + "\r\n";
      push_owned(n, std::move(tail));
      ++stats_.commands;
      stats_.bytes_out += v.size();
    }
    n.expect.push_back(Expect{Expect::kOp, oi});
    op.asking = false;
  }

  void finish_error(Op& op) {
    if (op.done) return;
    op.done = true;
    --remaining_;
    if (op.kind == OpKind::kSlots) return;
    ++stats_.errors;
    if (op.kind == OpKind::kGet) (*on_value_)(op.index, KvStatus::kError, {});
  }

  void finish(Op& op) {
    op.done = true;
    --remaining_;
  }

  // Closes `n` and ends its unanswered keys kError. A stale connection (opened by an earlier
  // call) that failed before answering anything in this call is redialled once, its commands
  // re-sent (GET and SET are idempotent); a refused or timed-out node is held back.
  void fail_node(int ni, bool timed_out) {
    Node& n = nodes_[ni];
    std::vector<int> ops;
    bool after_asking = false;
    for (const Expect& e : n.expect) {
      if (e.kind == Expect::kOp && e.op >= 0 && !ops_[e.op].done) {
        ops.push_back(e.op);
        ops_[e.op].asking = after_asking;  // a redial sends its ASKING again
      }
      after_asking = e.kind == Expect::kAsking;
    }
    const bool redial = !timed_out && !n.dialled_this_call && n.replies_this_call == 0;
    close(n);
    n.out.clear();
    n.expect.clear();
    if (mode_ == Mode::kCluster) refresh_map_ = true;
    if (redial) {
      for (const int oi : ops) enqueue(oi, ni);
      return;
    }
    n.retry_after = Clock::now() + retry_interval();
    for (const int oi : ops) finish_error(ops_[oi]);
  }

  void loop(SteadyTime deadline) {
    std::vector<pollfd> fds;
    std::vector<int> fd_node;
    while (remaining_ > 0) {
      const SteadyTime now = Clock::now();
      if (now >= deadline) {
        bool any = false;
        for (size_t i = 0; i < nodes_.size(); ++i)
          if (nodes_[i].ctx && (!nodes_[i].expect.empty() || !nodes_[i].out.empty())) {
            fail_node(static_cast<int>(i), /*timed_out=*/true);
            any = true;
          }
        for (Op& op : ops_) finish_error(op);  // (none left, unless a bug)
        if (any) ++stats_.timeouts;
        break;
      }
      fds.clear();
      fd_node.clear();
      for (size_t i = 0; i < nodes_.size(); ++i) {
        Node& n = nodes_[i];
        if (!n.ctx || (n.expect.empty() && n.out.empty())) continue;
        short ev = 0;
        if (n.connecting || !n.out.empty()) ev |= POLLOUT;
        if (!n.connecting && !n.expect.empty()) ev |= POLLIN;
        fds.push_back(pollfd{n.ctx->fd, ev, 0});
        fd_node.push_back(static_cast<int>(i));
      }
      if (fds.empty()) {  // every op ended without a reply pending (cannot happen: a guard)
        for (Op& op : ops_) finish_error(op);
        break;
      }
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
      timespec ts{static_cast<time_t>(left.count() / 1000000000),
                  static_cast<long>(left.count() % 1000000000)};
      const int rc = ::ppoll(fds.data(), fds.size(), &ts, nullptr);
      if (rc < 0) {
        if (errno == EINTR) continue;
        for (size_t k = 0; k < fds.size(); ++k) fail_node(fd_node[k], true);
        continue;
      }
      for (size_t k = 0; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        const int ni = fd_node[k];
        if (!nodes_[ni].ctx || nodes_[ni].ctx->fd != fds[k].fd) continue;  // closed meanwhile
        service(ni, fds[k].revents);
      }
    }
    if (remaining_ == 0) {
      // Nothing may stay queued past the call (borrowed values): a node with bytes unsent or
      // replies unread (a retried op answered elsewhere cannot leave any; a guard).
      for (size_t i = 0; i < nodes_.size(); ++i)
        if (nodes_[i].ctx && (!nodes_[i].out.empty() || !nodes_[i].expect.empty()))
          fail_node(static_cast<int>(i), true);
    }
  }

  void service(int ni, short revents) {
    Node& n = nodes_[ni];
    if (n.connecting) {
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(n.ctx->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0 ||
          (revents & (POLLERR | POLLHUP))) {
        fail_node(ni, /*timed_out=*/false);  // refused
        // a refused dial of this call is held back (dialled_this_call) -> keys kError
        return;
      }
      n.connecting = false;
    }
    if ((revents & POLLOUT) && !n.out.empty()) {
      if (!flush(n)) {
        fail_node(ni, false);
        return;
      }
    }
    if (revents & (POLLIN | POLLERR | POLLHUP)) read_and_drain(ni);
  }

  bool flush(Node& n) {
    while (!n.out.empty()) {
      iovec iov[64];
      int cnt = 0;
      for (auto it = n.out.begin(); it != n.out.end() && cnt < 64; ++it, ++cnt)
        iov[cnt] = iovec{const_cast<char*>(it->data() + it->sent), it->size - it->sent};
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(cnt);
      const ssize_t w = ::sendmsg(n.ctx->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      size_t left = static_cast<size_t>(w);
      while (left > 0) {
        Segment& s = n.out.front();
        const size_t take = std::min(left, s.size - s.sent);
        s.sent += take;
        left -= take;
        if (s.sent == s.size) n.out.pop_front();
      }
    }
    return true;
  }

  // Reads what the socket has, handing each chunk's complete replies on before the next read:
  // hiredis 0.14's reader memmoves its unread buffer after every reply it returns, so a buffer
  // of many pipelined replies would cost quadratic copying (measured, 256 x 64 KiB GETs on a
  // loaded 2-core host: 3 masters 14 -> 9 ms, standalone 56 -> 42 ms, the rest server time).
  void read_and_drain(int ni) {
    char buf[64 * 1024];
    for (int rounds = 0; rounds < 64; ++rounds) {
      Node& n = nodes_[ni];
      const ssize_t r = ::recv(n.ctx->fd, buf, sizeof buf, MSG_DONTWAIT);
      if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
      if (r <= 0 || redisReaderFeed(n.ctx->reader, buf, static_cast<size_t>(r)) != REDIS_OK) {
        fail_node(ni, false);  // EOF, reset or a reader error (replies before it were handled)
        return;
      }
      if (!drain(ni)) return;  // failed (closed) while handling
      if (static_cast<size_t>(r) < sizeof buf) return;
    }
  }

  // Handles the complete replies read so far; false when the node was failed (closed).
  bool drain(int ni) {
    for (;;) {
      Node& n = nodes_[ni];
      if (!n.ctx) return false;
      void* raw = nullptr;
      if (redisReaderGetReply(n.ctx->reader, &raw) != REDIS_OK) {  // protocol error
        fail_node(ni, false);
        return false;
      }
      if (raw == nullptr) return true;
      ReplyPtr reply(static_cast<redisReply*>(raw));
      if (n.expect.empty()) {  // a reply nobody asked for: the stream is out of step
        fail_node(ni, false);
        return false;
      }
      const Expect e = n.expect.front();
      n.expect.pop_front();
      ++n.replies_this_call;
      if (e.kind == Expect::kAsking) continue;  // an -ASK retry's GET reports any failure
      if (e.kind == Expect::kAuth) {
        if (reply->type == REDIS_REPLY_ERROR) {
          fail_node(ni, /*timed_out=*/true);  // held back: AUTH will not pass at once
          return false;
        }
        continue;
      }
      on_reply(ni, e.op, reply.get());
    }
  }

  void on_reply(int ni, int oi, const redisReply* r) {
    Op& op = ops_[oi];
    if (op.done) return;
    if (op.kind == OpKind::kSlots) {
      on_slots(ni, r);
      finish(op);
      return;
    }
    const bool moved = starts_with(r, "MOVED ");
    const bool ask = starts_with(r, "ASK ");
    if (moved || ask) {
      int slot = 0, port = 0;
      std::string host;
      if (!parse_redirect(std::string_view(r->str, r->len), &slot, &host, &port) ||
          op.redirects >= options_.max_redirects) {
        finish_error(op);
        return;
      }
      if (host.empty()) host = nodes_[ni].host;
      const int target = node_for(host, port);
      ++op.redirects;
      if (moved) {
        ++stats_.moved;
        slot_owner_[slot] = static_cast<int16_t>(target);
        refresh_map_ = true;
      } else {
        ++stats_.asked;
        op.asking = true;
      }
      // node_for may have grown nodes_; `enqueue` reads it afresh.
      enqueue(oi, target);
      return;
    }
    if (op.kind == OpKind::kGet) {
      if (r->type == REDIS_REPLY_STRING) {
        finish(op);
        stats_.bytes_in += r->len;
        (*on_value_)(
            op.index, KvStatus::kHit,
            std::span<const std::byte>(reinterpret_cast<const std::byte*>(r->str), r->len));
      } else if (r->type == REDIS_REPLY_NIL) {
        finish(op);
        (*on_value_)(op.index, KvStatus::kMiss, {});
      } else {
        finish_error(op);
      }
      return;
    }
    if (r->type == REDIS_REPLY_STATUS && std::string_view(r->str, r->len) == "OK") {
      finish(op);
      ++acked_;
    } else {
      finish_error(op);
    }
  }

  // CLUSTER SLOTS: [[start, end, [ip, port, id...], replicas...], ...]
  void on_slots(int ni, const redisReply* r) {
    if (r->type == REDIS_REPLY_ERROR) {
      if (mode_ == Mode::kUnknown &&
          std::string_view(r->str, r->len).find("cluster support disabled") !=
              std::string_view::npos) {
        mode_ = Mode::kStandalone;
        standalone_ = ni;
      }
      return;
    }
    if (r->type != REDIS_REPLY_ARRAY) return;
    std::array<int16_t, kSlots> owner;
    owner.fill(-1);
    bool any = false;
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* e = r->element[i];
      if (e->type != REDIS_REPLY_ARRAY || e->elements < 3) continue;
      const redisReply* m = e->element[2];
      if (e->element[0]->type != REDIS_REPLY_INTEGER ||
          e->element[1]->type != REDIS_REPLY_INTEGER || m->type != REDIS_REPLY_ARRAY ||
          m->elements < 2 || m->element[1]->type != REDIS_REPLY_INTEGER)
        continue;
      const long long lo = e->element[0]->integer, hi = e->element[1]->integer;
      if (lo < 0 || hi >= kSlots || lo > hi) continue;
      std::string host = m->element[0]->type == REDIS_REPLY_STRING
                             ? std::string(m->element[0]->str, m->element[0]->len)
                             : std::string();
      if (host.empty() || host == "?") host = nodes_[ni].host;  // "unknown endpoint"
      const int node = node_for(host, static_cast<int>(m->element[1]->integer));
      for (long long s = lo; s <= hi; ++s) owner[s] = static_cast<int16_t>(node);
      any = true;
    }
    if (!any) return;  // an empty map (a node not yet in a cluster): keep the old one
    slot_owner_ = owner;
    default_node_ = ni;
    mode_ = Mode::kCluster;
  }

  RedisOptions options_;
  std::deque<Node> nodes_;  // deque: references stay valid as nodes are added
  std::map<std::string, int> node_index_;
  std::vector<int> seed_nodes_;
  std::array<int16_t, kSlots> slot_owner_{};
  Mode mode_ = Mode::kUnknown;
  int standalone_ = -1;
  int default_node_ = -1;
  bool refresh_map_ = false;
  SteadyTime next_refresh_{};
  KvClientStats stats_;

  // The running call.
  std::span<const std::string> keys_;
  std::span<const std::span<const std::byte>> values_;
  const ValueFn* on_value_ = nullptr;
  int64_t ttl_ms_ = 0;
  size_t acked_ = 0;
  std::vector<Op> ops_;
  size_t remaining_ = 0;
};

}  // namespace

std::unique_ptr<KvClient> make_redis_client(const RedisOptions& options) {
  return std::make_unique<RedisClient>(options);
}

}  // namespace kvcache
