#include "server/kv_events.h"

#include <chrono>
#include <cstdio>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "core/error.h"

namespace kvcache {

namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[static_cast<size_t>(i)] = static_cast<char>(v & 0xff);
  return s;
}

using Packer = msgpack::packer<msgpack::sbuffer>;

void pack_str(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void pack_key(Packer& pk, const BlockKey& k) {
  const std::string b = block_key_bytes(k);
  pk.pack_bin(static_cast<uint32_t>(b.size()));
  pk.pack_bin_body(b.data(), static_cast<uint32_t>(b.size()));
}

void pack_event(Packer& pk, const KvEvent& e, const std::vector<KvEventGroup>& groups) {
  static const KvEventGroup kDefaultGroup;
  const KvEventGroup& g = e.group >= 0 && static_cast<size_t>(e.group) < groups.size()
                              ? groups[static_cast<size_t>(e.group)]
                              : kDefaultGroup;
  switch (e.kind) {
    case KvEvent::Kind::kStored: {
      const bool window = g.sliding_window > 0;
      pk.pack_array(window ? 12 : 11);
      pack_str(pk, "BlockStored");
      pk.pack_array(static_cast<uint32_t>(e.keys.size()));
      for (const BlockKey& k : e.keys) pack_key(pk, k);
      if (e.parent == BlockKey{})
        pk.pack_nil();
      else
        pack_key(pk, e.parent);
      pk.pack_array(static_cast<uint32_t>(e.tokens.size()));
      for (int32_t t : e.tokens) pk.pack_int64(t);
      pk.pack_int64(e.block_size);
      pk.pack_nil();        // lora_id
      pack_str(pk, "CPU");  // medium
      pk.pack_nil();        // lora_name
      pk.pack_nil();        // extra_keys
      pk.pack_int64(e.group);
      pack_str(pk, g.kind);
      if (window) pk.pack_int64(g.sliding_window);
      break;
    }
    case KvEvent::Kind::kRemoved:
      pk.pack_array(4);
      pack_str(pk, "BlockRemoved");
      pk.pack_array(static_cast<uint32_t>(e.keys.size()));
      for (const BlockKey& k : e.keys) pack_key(pk, k);
      pack_str(pk, "CPU");
      pk.pack_int64(e.group);
      break;
    case KvEvent::Kind::kCleared:
      pk.pack_array(1);
      pack_str(pk, "AllBlocksCleared");
      break;
  }
}

size_t event_blocks(const KvEvent& e) {
  return e.kind == KvEvent::Kind::kCleared ? 1 : e.keys.size();
}

}  // namespace

void check_kv_events_endpoint(const std::string& endpoint, const char* flag) {
  auto bad = [&](const std::string& why) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string(flag) + " " + endpoint + ": " + why +
                    "; give tcp://HOST:PORT (e.g. tcp://127.0.0.1:5557, port * for any free one) "
                    "or ipc://PATH");
  };
  if (endpoint.rfind("ipc://", 0) == 0) {
    if (endpoint.size() == 6) bad("no path");
    return;
  }
  if (endpoint.rfind("tcp://", 0) != 0) bad("not a tcp:// or ipc:// address");
  const size_t colon = endpoint.rfind(':');
  if (colon <= 6 || colon + 1 >= endpoint.size()) bad("no host:port");
  const std::string port = endpoint.substr(colon + 1);
  if (port == "*") return;
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
      std::stoi(port) < 1 || std::stoi(port) > 65535)
    bad("port '" + port + "' is not in [1, 65535] or *");
}

std::string block_key_bytes(const BlockKey& key) {
  return be64(key.hi) + be64(key.lo);
}

std::vector<KvEventGroup> kv_event_groups(const PagedKVStore& store) {
  std::vector<KvEventGroup> out;
  for (int g = 0; g < store.num_groups(); ++g) {
    const PagedGroup& pg = store.group(g);
    KvEventGroup e;
    switch (pg.kind) {
      case GroupKind::kFull:
        e.kind = "full_attention";
        break;
      case GroupKind::kSliding:
        e.kind = "sliding_window";
        e.sliding_window = pg.window;
        break;
      case GroupKind::kCompressed:
        e.kind = "unknown";  // vLLM's KVCacheSpecKind has nothing for compressed entries
        break;
    }
    out.push_back(e);
  }
  return out;
}

std::string encode_kv_event_batch(double ts, const std::vector<KvEvent>& events,
                                  const std::vector<KvEventGroup>& groups) {
  msgpack::sbuffer buf;
  Packer pk(&buf);
  pk.pack_array(3);
  pk.pack_double(ts);
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvEvent& e : events) pack_event(pk, e, groups);
  pk.pack_int64(0);  // data_parallel_rank
  return std::string(buf.data(), buf.size());
}

// --- publisher -----------------------------------------------------------------------------

struct KvEventPublisher::Sockets {
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
};

KvEventPublisher::KvEventPublisher(const KvEventsOptions& options, std::vector<KvEventGroup> groups)
    : options_(options), groups_(std::move(groups)), sockets_(std::make_unique<Sockets>()) {
  check_kv_events_endpoint(options_.endpoint, "--kv-events");
  if (!options_.replay_endpoint.empty())
    check_kv_events_endpoint(options_.replay_endpoint, "--kv-events-replay");
  if (options_.max_batch_events < 1) options_.max_batch_events = 1;
  Sockets& s = *sockets_;
  try {
    s.pub.set(zmq::sockopt::linger, 0);
    s.pub.set(zmq::sockopt::sndhwm, options_.send_hwm);
    // A subscriber past its high-water mark makes the send fail (EAGAIN), so that the loss is
    // counted, instead of PUB's silent drop (zmq_setsockopt(3): ZMQ_XPUB_NODROP, XPUB and PUB).
    s.pub.set(zmq::sockopt::xpub_nodrop, 1);
    s.pub.bind(options_.endpoint);
    endpoint_ = s.pub.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    throw Error(ErrorKind::kIo, "--kv-events " + options_.endpoint + ": cannot bind: " + e.what() +
                                    " (address in use or not local?)");
  }
  if (!options_.replay_endpoint.empty()) {
    try {
      s.replay.emplace(s.ctx, zmq::socket_type::router);
      s.replay->set(zmq::sockopt::linger, 0);
      s.replay->bind(options_.replay_endpoint);
      replay_endpoint_ = s.replay->get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      throw Error(ErrorKind::kIo, "--kv-events-replay " + options_.replay_endpoint +
                                      ": cannot bind: " + e.what() +
                                      " (address in use or not local?)");
    }
  }
  thread_ = std::thread([this] { run(); });
}

KvEventPublisher::~KvEventPublisher() {
  close();
}

void KvEventPublisher::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  flush();  // what came between the thread's last flush and closed_
  sockets_.reset();
}

void KvEventPublisher::push(KvEvent&& e, size_t blocks) {
  // The store's thread: a mutex nobody holds for long, no allocation beyond the event's.
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || pending_blocks_ + blocks > options_.max_pending) {
    dropped_ += static_cast<int64_t>(blocks);
    return;
  }
  pending_blocks_ += blocks;
  pending_.push_back(std::move(e));
}

void KvEventPublisher::on_stored(const StoredBlock& block) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The next block of the chain the last event stored: one BlockStored for both, as vLLM
    // sends one per run of newly cached blocks.
    if (!closed_ && !pending_.empty() && pending_blocks_ < options_.max_pending) {
      KvEvent& last = pending_.back();
      if (last.kind == KvEvent::Kind::kStored && last.group == block.group &&
          last.keys.back() == block.parent &&
          static_cast<size_t>(last.block_size) == block.tokens.size() &&
          last.keys.size() < options_.max_batch_events) {
        last.keys.push_back(block.key);
        last.tokens.insert(last.tokens.end(), block.tokens.begin(), block.tokens.end());
        ++pending_blocks_;
        return;
      }
    }
  }
  KvEvent e;
  e.kind = KvEvent::Kind::kStored;
  e.group = block.group;
  e.keys = {block.key};
  e.parent = block.parent;
  e.tokens.assign(block.tokens.begin(), block.tokens.end());
  e.block_size = static_cast<int32_t>(block.tokens.size());
  push(std::move(e), 1);
}

void KvEventPublisher::on_removed(int32_t group, const BlockKey& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_ && !pending_.empty() && pending_blocks_ < options_.max_pending) {
      KvEvent& last = pending_.back();
      if (last.kind == KvEvent::Kind::kRemoved && last.group == group &&
          last.keys.size() < options_.max_batch_events) {
        last.keys.push_back(key);
        ++pending_blocks_;
        return;
      }
    }
  }
  KvEvent e;
  e.kind = KvEvent::Kind::kRemoved;
  e.group = group;
  e.keys = {key};
  push(std::move(e), 1);
}

void KvEventPublisher::on_cleared() {
  KvEvent e;
  e.kind = KvEvent::Kind::kCleared;
  push(std::move(e), 1);
}

void KvEventPublisher::run() {
  const auto interval = std::chrono::milliseconds(
      std::max<int64_t>(1, static_cast<int64_t>(options_.flush_interval_ms + 0.5)));
  while (!stop_.load()) {
    if (sockets_->replay) {
      zmq::pollitem_t item{sockets_->replay->handle(), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, interval);
        if ((item.revents & ZMQ_POLLIN) != 0) service_replay();
      } catch (const zmq::error_t& e) {
        std::fprintf(stderr, "kvcache: kv events replay: %s\n", e.what());
      }
    } else {
      std::this_thread::sleep_for(interval);
    }
    flush();
  }
}

void KvEventPublisher::flush() {
  std::vector<KvEvent> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    events.swap(pending_);
    pending_blocks_ = 0;
  }
  if (!sockets_) {
    for (const KvEvent& e : events) dropped_ += static_cast<int64_t>(event_blocks(e));
    return;
  }
  size_t i = 0;
  while (i < events.size()) {
    // A batch: events up to max_batch_events blocks (one longer event goes alone).
    size_t j = i, blocks = 0;
    while (j < events.size() &&
           (j == i || blocks + event_blocks(events[j]) <= options_.max_batch_events))
      blocks += event_blocks(events[j++]);
    const std::vector<KvEvent> batch(std::make_move_iterator(events.begin() + i),
                                     std::make_move_iterator(events.begin() + j));
    i = j;
    std::string payload = encode_kv_event_batch(unix_seconds(), batch, groups_);
    const uint64_t seq = seq_++;
    const std::string seq_bytes = be64(seq);
    bool sent = false;
    try {
      zmq::socket_t& pub = sockets_->pub;
      if (pub.send(zmq::buffer(options_.topic),
                   zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        pub.send(zmq::buffer(payload), zmq::send_flags::dontwait);
        sent = true;
      }
    } catch (const zmq::error_t& e) {
      std::fprintf(stderr, "kvcache: kv events: send failed: %s\n", e.what());
    }
    (sent ? published_ : dropped_) += static_cast<int64_t>(blocks);
    ++batches_;
    if (options_.replay_batches > 0) {
      replay_.emplace_back(seq, std::move(payload));
      while (replay_.size() > options_.replay_batches) replay_.pop_front();
    }
  }
}

void KvEventPublisher::service_replay() {
  zmq::socket_t& r = *sockets_->replay;
  std::vector<zmq::message_t> frames;
  for (;;) {
    zmq::message_t m;
    if (!r.recv(m, zmq::recv_flags::dontwait)) break;
    const bool more = m.more();
    frames.push_back(std::move(m));
    if (!more) break;
  }
  // [identity, "", start_seq] (a REQ client), as vLLM's _service_replay expects.
  if (frames.size() != 3 || frames[2].size() != 8) return;
  uint64_t start = 0;
  const auto* p = static_cast<const unsigned char*>(frames[2].data());
  for (int i = 0; i < 8; ++i) start = (start << 8) | p[i];
  const std::string id(static_cast<const char*>(frames[0].data()), frames[0].size());
  auto send3 = [&](const std::string& seq, const std::string& payload) {
    r.send(zmq::buffer(id), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    r.send(zmq::message_t(), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    r.send(zmq::buffer(seq), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    r.send(zmq::buffer(payload), zmq::send_flags::dontwait);
  };
  for (const auto& [seq, payload] : replay_)
    if (seq >= start) send3(be64(seq), payload);
  send3(std::string(8, '\xff'), "");  // -1: the end of the replay
}

// --- decoding --------------------------------------------------------------------------------

namespace {

[[noreturn]] void malformed(const std::string& why) {
  throw Error(ErrorKind::kFormat, "not a vLLM KVEventBatch: " + why);
}

std::string hex(const char* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(p[i]);
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

std::string hash_text(const msgpack::object& o, const char* what) {
  if (o.type == msgpack::type::BIN) return hex(o.via.bin.ptr, o.via.bin.size);
  if (o.type == msgpack::type::STR) return hex(o.via.str.ptr, o.via.str.size);
  if (o.type == msgpack::type::POSITIVE_INTEGER || o.type == msgpack::type::NEGATIVE_INTEGER) {
    char b[17];
    std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(o.via.u64));
    return b;
  }
  malformed(std::string(what) + " is neither bytes nor an integer");
}

int64_t as_int(const msgpack::object& o, const char* what) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) return static_cast<int64_t>(o.via.u64);
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return o.via.i64;
  malformed(std::string(what) + " is not an integer");
}

std::optional<std::string> opt_str(const msgpack::object& o, const char* what) {
  if (o.type == msgpack::type::NIL) return std::nullopt;
  if (o.type != msgpack::type::STR) malformed(std::string(what) + " is not a string");
  return std::string(o.via.str.ptr, o.via.str.size);
}

std::optional<int64_t> opt_int(const msgpack::object& o, const char* what) {
  if (o.type == msgpack::type::NIL) return std::nullopt;
  return as_int(o, what);
}

void hashes(const msgpack::object& o, std::vector<std::string>& out) {
  if (o.type != msgpack::type::ARRAY) malformed("block_hashes is not an array");
  for (uint32_t i = 0; i < o.via.array.size; ++i)
    out.push_back(hash_text(o.via.array.ptr[i], "a block hash"));
}

// The event's fields by name: a positional array mapped through vLLM's field order, or a map.
KvEventView decode_event(const msgpack::object& o) {
  static const std::vector<std::string> kStored = {"block_hashes",
                                                   "parent_block_hash",
                                                   "token_ids",
                                                   "block_size",
                                                   "lora_id",
                                                   "medium",
                                                   "lora_name",
                                                   "extra_keys",
                                                   "group_idx",
                                                   "kv_cache_spec_kind",
                                                   "kv_cache_spec_sliding_window"};
  static const std::vector<std::string> kRemoved = {"block_hashes", "medium", "group_idx"};
  KvEventView v;
  std::vector<std::pair<std::string, const msgpack::object*>> fields;
  if (o.type == msgpack::type::ARRAY) {
    if (o.via.array.size < 1 || o.via.array.ptr[0].type != msgpack::type::STR)
      malformed("an event array without its tag string first");
    v.type.assign(o.via.array.ptr[0].via.str.ptr, o.via.array.ptr[0].via.str.size);
    if (v.type.empty()) malformed("an event with an empty tag");
    const auto& names = v.type == "BlockStored"    ? kStored
                        : v.type == "BlockRemoved" ? kRemoved
                                                   : std::vector<std::string>{};
    for (uint32_t i = 1; i < o.via.array.size && i - 1 < names.size(); ++i)
      fields.emplace_back(names[i - 1], &o.via.array.ptr[i]);
  } else if (o.type == msgpack::type::MAP) {
    for (uint32_t i = 0; i < o.via.map.size; ++i) {
      const msgpack::object_kv& kv = o.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) malformed("an event map with a non-string key");
      std::string k(kv.key.via.str.ptr, kv.key.via.str.size);
      if (k == "type")
        v.type = opt_str(kv.val, "type").value_or("");
      else
        fields.emplace_back(std::move(k), &kv.val);
    }
    if (v.type.empty()) malformed("an event map without \"type\"");
  } else {
    malformed("an event is neither an array nor a map");
  }
  for (const auto& [name, val] : fields) {
    const msgpack::object& f = *val;
    if (name == "block_hashes") {
      hashes(f, v.block_hashes);
    } else if (name == "parent_block_hash") {
      if (f.type != msgpack::type::NIL) v.parent_block_hash = hash_text(f, "parent_block_hash");
    } else if (name == "token_ids") {
      if (f.type != msgpack::type::ARRAY) malformed("token_ids is not an array");
      for (uint32_t i = 0; i < f.via.array.size; ++i)
        v.token_ids.push_back(as_int(f.via.array.ptr[i], "a token id"));
    } else if (name == "block_size") {
      v.block_size = as_int(f, "block_size");
    } else if (name == "medium") {
      v.medium = opt_str(f, "medium");
    } else if (name == "group_idx") {
      v.group_idx = opt_int(f, "group_idx");
    } else if (name == "kv_cache_spec_kind") {
      v.kv_cache_spec_kind = opt_str(f, "kv_cache_spec_kind");
    } else if (name == "kv_cache_spec_sliding_window") {
      v.sliding_window = opt_int(f, "kv_cache_spec_sliding_window");
    }
  }
  if ((v.type == "BlockStored" || v.type == "BlockRemoved") && v.block_hashes.empty())
    malformed(v.type + " without block_hashes");
  return v;
}

}  // namespace

KvEventBatchView decode_kv_event_batch(std::string_view payload) {
  msgpack::object_handle oh;
  try {
    size_t off = 0;
    oh = msgpack::unpack(payload.data(), payload.size(), off);
    if (off != payload.size())
      malformed(std::to_string(payload.size() - off) + " bytes after the batch");
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    malformed(std::string("msgpack: ") + e.what());
  }
  const msgpack::object& o = oh.get();
  KvEventBatchView b;
  const msgpack::object *ts = nullptr, *events = nullptr, *rank = nullptr;
  if (o.type == msgpack::type::ARRAY) {
    if (o.via.array.size < 2) malformed("a batch array of fewer than 2 items");
    ts = &o.via.array.ptr[0];
    events = &o.via.array.ptr[1];
    if (o.via.array.size > 2) rank = &o.via.array.ptr[2];
  } else if (o.type == msgpack::type::MAP) {
    for (uint32_t i = 0; i < o.via.map.size; ++i) {
      const msgpack::object_kv& kv = o.via.map.ptr[i];
      if (kv.key.type != msgpack::type::STR) continue;
      const std::string_view k(kv.key.via.str.ptr, kv.key.via.str.size);
      if (k == "ts") ts = &kv.val;
      if (k == "events") events = &kv.val;
      if (k == "data_parallel_rank") rank = &kv.val;
    }
    if (ts == nullptr || events == nullptr) malformed("a batch map without ts or events");
  } else {
    malformed("the payload is neither an array nor a map");
  }
  if (ts->type == msgpack::type::FLOAT64 || ts->type == msgpack::type::FLOAT32)
    b.ts = ts->via.f64;
  else
    b.ts = static_cast<double>(as_int(*ts, "ts"));
  if (events->type != msgpack::type::ARRAY) malformed("events is not an array");
  for (uint32_t i = 0; i < events->via.array.size; ++i)
    b.events.push_back(decode_event(events->via.array.ptr[i]));
  if (rank != nullptr) b.data_parallel_rank = opt_int(*rank, "data_parallel_rank");
  return b;
}

std::string kv_event_json(const KvEventView& e, uint64_t seq, double ts) {
  nlohmann::json j;
  j["seq"] = seq;
  j["ts"] = ts;
  j["type"] = e.type;
  if (e.type == "BlockStored" || e.type == "BlockRemoved") {
    j["block_hashes"] = e.block_hashes;
    if (e.type == "BlockStored") {
      j["parent_block_hash"] =
          e.parent_block_hash ? nlohmann::json(*e.parent_block_hash) : nlohmann::json(nullptr);
      j["token_ids"] = e.token_ids;
      j["block_size"] = e.block_size;
      if (e.kv_cache_spec_kind) j["kv_cache_spec_kind"] = *e.kv_cache_spec_kind;
      if (e.sliding_window) j["kv_cache_spec_sliding_window"] = *e.sliding_window;
    }
    j["medium"] = e.medium ? nlohmann::json(*e.medium) : nlohmann::json(nullptr);
    j["group_idx"] = e.group_idx ? nlohmann::json(*e.group_idx) : nlohmann::json(nullptr);
  }
  return j.dump();
}

std::string kv_event_line(const KvEventView& e, uint64_t seq) {
  std::string s = "#" + std::to_string(seq) + " " + e.type;
  if (e.type == "AllBlocksCleared") return s;
  s += " group " + (e.group_idx ? std::to_string(*e.group_idx) : std::string("-"));
  s += " " + std::to_string(e.block_hashes.size()) + " block" +
       (e.block_hashes.size() == 1 ? "" : "s");
  if (e.type == "BlockStored") {
    s += " of " + std::to_string(e.block_size) + " tokens, parent " +
         (e.parent_block_hash ? e.parent_block_hash->substr(0, 12) : std::string("none"));
  }
  s += ":";
  for (const std::string& h : e.block_hashes) s += " " + h.substr(0, 12);
  if (e.medium) s += " (" + *e.medium + ")";
  return s;
}

}  // namespace kvcache
