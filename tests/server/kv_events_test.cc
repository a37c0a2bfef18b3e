// KV events (server/kv_events.h): the msgpack layout of vLLM's KVEventBatch, byte for byte on
// a batch built by hand from the spec; the publisher's merging, sequence numbers, replay and
// drop counting on its own; and a server with kv_events publishing what its store does: the
// prompt's blocks under their chained keys, removals when a small pool evicts them, and
// AllBlocksCleared on POST /reset_prefix_cache.
#include "server/kv_events.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <msgpack.hpp>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "core/error.h"
#include "raw_http.h"
#include "scratch_dir.h"
#include "server_test_util.h"

namespace kvcache {
namespace {

using nlohmann::json;
using testing_util::http;
using testing_util::HttpReply;
using testing_util::TestServer;
using testing_util::TestServerOptions;

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

std::string hex(const std::string& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

const BlockKey kA{0x0102030405060708ull, 0x1112131415161718ull};
const BlockKey kB{0x2122232425262728ull, 0x3132333435363738ull};

TEST(KvEventsEncoding, MatchesABatchBuiltByHandFromVllmsStructs) {
  KvEvent removed;
  removed.kind = KvEvent::Kind::kRemoved;
  removed.group = 1;
  removed.keys = {kA};
  KvEvent cleared;
  cleared.kind = KvEvent::Kind::kCleared;
  const std::string got = encode_kv_event_batch(1.5, {removed, cleared}, {});
  // [1.5, [["BlockRemoved", [bin16 A], "CPU", 1], ["AllBlocksCleared"]], 0]
  const std::string want = unhex(
      "93"                  // array of 3: ts, events, data_parallel_rank
      "cb3ff8000000000000"  // float64 1.5
      "92"                  // 2 events
      "94"
      "ac" +
      hex("BlockRemoved") +  // tag
      "91"
      "c410"
      "0102030405060708"
      "1112131415161718"  // block_hashes: [bin 16]
      "a3" +
      hex("CPU") +  // medium
      "01"          // group_idx
      "91"
      "b0" +
      hex("AllBlocksCleared") +  //
      "00");                     // data_parallel_rank 0
  EXPECT_EQ(hex(got), hex(want));
}

TEST(KvEventsEncoding, BlockStoredHasVllmsFieldOrder) {
  KvEvent e;
  e.kind = KvEvent::Kind::kStored;
  e.group = 1;
  e.keys = {kA, kB};
  e.parent = kB;
  e.tokens = {1, 2, 3, 4};
  e.block_size = 2;
  std::vector<KvEventGroup> groups(2);
  groups[1].kind = "sliding_window";
  groups[1].sliding_window = 512;
  const std::string payload = encode_kv_event_batch(2.0, {e}, groups);
  const msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& b = oh.get();
  ASSERT_EQ(b.type, msgpack::type::ARRAY);
  ASSERT_EQ(b.via.array.size, 3u);
  EXPECT_EQ(b.via.array.ptr[0].as<double>(), 2.0);
  EXPECT_EQ(b.via.array.ptr[2].as<int>(), 0);
  const msgpack::object& ev = b.via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(ev.type, msgpack::type::ARRAY);
  // tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium, lora_name,
  // extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window
  ASSERT_EQ(ev.via.array.size, 12u);
  const msgpack::object* f = ev.via.array.ptr;
  EXPECT_EQ(f[0].as<std::string>(), "BlockStored");
  ASSERT_EQ(f[1].via.array.size, 2u);
  EXPECT_EQ(f[1].via.array.ptr[0].type, msgpack::type::BIN);
  EXPECT_EQ(std::string(f[1].via.array.ptr[0].via.bin.ptr, 16), block_key_bytes(kA));
  EXPECT_EQ(std::string(f[1].via.array.ptr[1].via.bin.ptr, 16), block_key_bytes(kB));
  EXPECT_EQ(std::string(f[2].via.bin.ptr, f[2].via.bin.size), block_key_bytes(kB));
  EXPECT_EQ(f[3].as<std::vector<int>>(), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(f[4].as<int>(), 2);
  EXPECT_EQ(f[5].type, msgpack::type::NIL);  // lora_id
  EXPECT_EQ(f[6].as<std::string>(), "CPU");
  EXPECT_EQ(f[7].type, msgpack::type::NIL);  // lora_name
  EXPECT_EQ(f[8].type, msgpack::type::NIL);  // extra_keys
  EXPECT_EQ(f[9].as<int>(), 1);
  EXPECT_EQ(f[10].as<std::string>(), "sliding_window");
  EXPECT_EQ(f[11].as<int>(), 512);
  EXPECT_EQ(block_key_bytes(kA), unhex("01020304050607081112131415161718"));

  // The first block of a sequence has no parent; a full-attention group sends no window.
  e.parent = BlockKey{};
  e.group = 0;
  const std::string p2 = encode_kv_event_batch(2.0, {e}, groups);
  const msgpack::object_handle oh2 = msgpack::unpack(p2.data(), p2.size());
  const msgpack::object& ev2 = oh2.get().via.array.ptr[1].via.array.ptr[0];
  ASSERT_EQ(ev2.via.array.size, 11u);
  EXPECT_EQ(ev2.via.array.ptr[2].type, msgpack::type::NIL);
  EXPECT_EQ(ev2.via.array.ptr[10].as<std::string>(), "full_attention");

  // Our decoder reads it back, and vLLM's newer map layout too.
  const KvEventBatchView v = decode_kv_event_batch(payload);
  ASSERT_EQ(v.events.size(), 1u);
  EXPECT_EQ(v.events[0].type, "BlockStored");
  EXPECT_EQ(v.events[0].block_hashes[0], "01020304050607081112131415161718");
  EXPECT_EQ(v.events[0].sliding_window, 512);
  msgpack::sbuffer sb;
  msgpack::packer<msgpack::sbuffer> pk(&sb);
  pk.pack_array(3);
  pk.pack_double(3.0);
  pk.pack_array(1);
  pk.pack_map(3);
  pk.pack(std::string("type"));
  pk.pack(std::string("BlockRemoved"));
  pk.pack(std::string("block_hashes"));
  pk.pack(std::vector<uint64_t>{15760518052499183552ull});
  pk.pack(std::string("medium"));
  pk.pack(std::string("GPU"));
  pk.pack_int(0);
  const KvEventBatchView m = decode_kv_event_batch(std::string_view(sb.data(), sb.size()));
  ASSERT_EQ(m.events.size(), 1u);
  EXPECT_EQ(m.events[0].type, "BlockRemoved");
  EXPECT_EQ(m.events[0].block_hashes, std::vector<std::string>{"dab89baa7b5857c0"});
  EXPECT_EQ(m.events[0].medium, "GPU");
}

TEST(KvEventsEncoding, MalformedPayloadsAreFormatErrors) {
  for (const std::string& bad :
       {std::string(), std::string("\x93\x01", 2), unhex("92cb3ff800000000000001"),
        unhex("92cb3ff80000000000009191a0"),
        unhex("92cb3ff80000000000009191ac") + "BlockRemoved"}) {
    try {
      decode_kv_event_batch(bad);
      ADD_FAILURE() << "accepted " << hex(bad);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
    }
  }
}

// A SUB socket connected to `endpoint`, subscribed to everything.
struct Sub {
  zmq::context_t ctx{1};
  zmq::socket_t sock{ctx, zmq::socket_type::sub};
  explicit Sub(const std::string& endpoint) {
    sock.set(zmq::sockopt::linger, 0);
    sock.set(zmq::sockopt::rcvtimeo, 3000);
    sock.connect(endpoint);
    sock.set(zmq::sockopt::subscribe, "");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the subscription arrives
  }
  // The next message's frames (empty after the timeout).
  std::vector<std::string> recv() {
    std::vector<std::string> frames;
    zmq::message_t m;
    if (!sock.recv(m)) return frames;
    frames.push_back(m.to_string());
    while (m.more()) {
      if (!sock.recv(m)) break;
      frames.push_back(m.to_string());
    }
    return frames;
  }
  // The next `want` events (fewer after a timeout), with their batches' sequence numbers;
  // events of a batch past `want` wait for the next call.
  std::vector<KvEventView> events(size_t want, std::vector<uint64_t>* seqs = nullptr) {
    std::vector<KvEventView> out;
    while (out.size() < want) {
      if (!queued.empty()) {
        out.push_back(std::move(queued.front()));
        queued.pop_front();
        continue;
      }
      const std::vector<std::string> f = recv();
      if (f.empty()) break;
      EXPECT_EQ(f.size(), 3u);
      EXPECT_EQ(f[1].size(), 8u);
      uint64_t seq = 0;
      for (unsigned char c : f[1]) seq = (seq << 8) | c;
      if (seqs) seqs->push_back(seq);
      for (KvEventView& e : decode_kv_event_batch(f[2]).events) queued.push_back(std::move(e));
    }
    return out;
  }
  std::deque<KvEventView> queued;
};

StoredBlock stored(const BlockKey& key, const BlockKey& parent, const std::vector<int32_t>& t) {
  StoredBlock b;
  b.key = key;
  b.parent = parent;
  b.tokens = t;
  return b;
}

TEST(KvEventPublisher, MergesChainsSendsInOrderAndReplays) {
  KvEventsOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.replay_endpoint = "tcp://127.0.0.1:*";
  o.topic = "kv";
  KvEventPublisher pub(o, {KvEventGroup{}});
  ASSERT_NE(pub.endpoint().find("tcp://127.0.0.1:"), std::string::npos);
  Sub sub(pub.endpoint());
  const std::vector<int32_t> t1 = {1, 2}, t2 = {3, 4};
  pub.on_stored(stored(kA, BlockKey{}, t1));
  pub.on_stored(stored(kB, kA, t2));  // continues the chain: the same event
  pub.on_removed(0, kA);
  pub.on_removed(0, kB);  // the same event
  pub.on_cleared();
  std::vector<uint64_t> seqs;
  const std::vector<KvEventView> ev = sub.events(3, &seqs);
  ASSERT_EQ(ev.size(), 3u);
  EXPECT_EQ(seqs.front(), 0u);
  EXPECT_EQ(ev[0].type, "BlockStored");
  EXPECT_EQ(ev[0].block_hashes.size(), 2u);
  EXPECT_FALSE(ev[0].parent_block_hash.has_value());
  EXPECT_EQ(ev[0].token_ids, (std::vector<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(ev[0].block_size, 2);
  EXPECT_EQ(ev[1].type, "BlockRemoved");
  EXPECT_EQ(ev[1].block_hashes.size(), 2u);
  EXPECT_EQ(ev[2].type, "AllBlocksCleared");
  // The thread counts a batch once its send returned, which may be after it arrived here.
  for (int i = 0; i < 100 && pub.published() < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(pub.published(), 5);
  EXPECT_EQ(pub.dropped(), 0);

  // Replay, as vLLM's _service_replay answers a REQ client ([identity, "", start]): each
  // buffered batch from `start` as ["", seq, payload], then the -1 end marker. A DEALER reads
  // the several answers (a REQ takes only the first).
  zmq::context_t ctx(1);
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, 3000);
  dealer.connect(pub.replay_endpoint());
  auto replay = [&](uint64_t start) {
    std::string be(8, '\0');
    for (int i = 7; i >= 0; --i, start >>= 8) be[static_cast<size_t>(i)] = static_cast<char>(start);
    dealer.send(zmq::message_t(), zmq::send_flags::sndmore);
    dealer.send(zmq::buffer(be), zmq::send_flags::none);
    std::vector<KvEventView> out;
    for (int i = 0; i < 100; ++i) {
      zmq::message_t delim, seq, payload;
      if (!dealer.recv(delim)) {
        ADD_FAILURE() << "no replay answer";
        break;
      }
      EXPECT_EQ(delim.size(), 0u);
      EXPECT_TRUE(dealer.recv(seq));
      EXPECT_TRUE(dealer.recv(payload));
      EXPECT_EQ(seq.size(), 8u);
      if (seq.to_string() == std::string(8, '\xff')) {
        EXPECT_EQ(payload.size(), 0u);
        break;
      }
      for (KvEventView& e : decode_kv_event_batch(payload.to_string_view()).events)
        out.push_back(std::move(e));
    }
    return out;
  };
  const std::vector<KvEventView> all = replay(0);
  ASSERT_EQ(all.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(all[i].type, ev[i].type);
    EXPECT_EQ(all[i].block_hashes, ev[i].block_hashes);
  }
  EXPECT_TRUE(replay(seqs.back() + 1).empty());  // nothing after the last batch: the marker only
}

TEST(KvEventPublisher, AFullQueueDropsAndCountsWithoutBlocking) {
  KvEventsOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.max_pending = 4;
  o.flush_interval_ms = 200;
  KvEventPublisher pub(o, {KvEventGroup{}});
  for (int i = 0; i < 10; ++i) pub.on_removed(0, BlockKey{1, static_cast<uint64_t>(i)});
  EXPECT_EQ(pub.dropped(), 6);
  pub.close();
  EXPECT_EQ(pub.published(), 4);
  pub.on_cleared();  // after close: counted, not sent
  EXPECT_EQ(pub.dropped(), 7);
}

TEST(KvEventPublisher, ASubscriberThatDoesNotReadLosesBatchesCounted) {
  KvEventsOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  o.send_hwm = 2;
  KvEventPublisher pub(o, {KvEventGroup{}});
  zmq::context_t ctx(1);
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::rcvhwm, 1);
  sub.set(zmq::sockopt::rcvbuf, 4096);
  sub.connect(pub.endpoint());
  sub.set(zmq::sockopt::subscribe, "");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // ~40 MB of events at a subscriber that never reads: the store's calls never wait.
  const std::vector<int32_t> tokens(64, 7);
  const int n = 100000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    pub.on_stored(stored(BlockKey{2, static_cast<uint64_t>(i + 1)}, BlockKey{}, tokens));
    if (i % 5000 == 4999) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - 0.1;
  pub.close();
  EXPECT_GT(pub.dropped(), 0);
  EXPECT_EQ(pub.published() + pub.dropped(), n);
  // A publisher that waited for this subscriber would block for good once the buffers fill
  // (it never reads), so the bound only has to be finite; 20 s leaves room for sanitizer
  // builds on a loaded 2-core host (TSan beside an ASan run took 2.3 s).
  EXPECT_LT(s, 20.0) << "the store's calls waited for the subscriber";
}

TEST(KvEventPublisher, BadEndpointsAreClearErrors) {
  for (const char* bad : {"localhost:5557", "tcp://", "tcp://127.0.0.1", "tcp://127.0.0.1:0x1",
                          "tcp://127.0.0.1:70000", "udp://127.0.0.1:5557"}) {
    KvEventsOptions o;
    o.endpoint = bad;
    try {
      KvEventPublisher pub(o, {});
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << bad;
      EXPECT_NE(std::string(e.what()).find("--kv-events"), std::string::npos) << e.what();
    }
  }
  KvEventsOptions o;
  o.endpoint = "tcp://127.0.0.1:*";
  KvEventPublisher first(o, {});
  o.endpoint = first.endpoint();  // taken
  EXPECT_THROW(KvEventPublisher(o, {}), Error);
}

std::vector<int32_t> ids(int n, int from) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(from + (i * 7) % 200);
  return v;
}

HttpReply complete(int port, const std::vector<int32_t>& prompt, int max_tokens) {
  const json req{
      {"model", "dummy:tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  return http(port, "POST", "/v1/completions", req.dump());
}

// The keys the store gives a prompt's full blocks: block_key chained from the root.
std::vector<std::string> chain(const std::vector<int32_t>& tokens, int block) {
  std::vector<std::string> out;
  BlockKey parent;
  for (size_t i = 0; i + static_cast<size_t>(block) <= tokens.size(); i += block) {
    parent = block_key(parent, 0, {}, std::span<const int32_t>(tokens.data() + i, block));
    out.push_back(hex(block_key_bytes(parent)));
  }
  return out;
}

TEST(KvEventsServer, PublishesStoredRemovedAndCleared) {
  const LoadedModel* lm = testing_util::tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf";
  TestServerOptions o;
  o.engine.cache.max_cache_len = 128;  // 8 blocks of 16: the second prompt evicts the first
  o.http.kv_events.endpoint = "tcp://127.0.0.1:*";
  TestServer s(*lm, o);
  ASSERT_NE(s.server->kv_events(), nullptr);
  ASSERT_EQ(s.engine->store().num_groups(), 1);
  const int block = s.engine->store().block_tokens();
  Sub sub(s.server->kv_events()->endpoint());

  // 64 prompt tokens and the first sampled one fed: 4 full blocks.
  const std::vector<int32_t> p1 = ids(64, 10);
  ASSERT_EQ(complete(s.port, p1, 2).status, 200);
  const std::vector<std::string> want1 = chain(p1, block);
  ASSERT_EQ(want1.size(), 4u);
  std::vector<std::string> got;
  std::vector<KvEventView> ev;
  while (got.size() < want1.size()) {
    std::vector<KvEventView> e = sub.events(1);
    ASSERT_FALSE(e.empty()) << "no BlockStored after " << got.size() << " blocks";
    ASSERT_EQ(e[0].type, "BlockStored");
    EXPECT_EQ(e[0].group_idx, 0);
    EXPECT_EQ(e[0].medium, "CPU");
    EXPECT_EQ(e[0].kv_cache_spec_kind, "full_attention");
    EXPECT_EQ(e[0].block_size, block);
    EXPECT_EQ(e[0].token_ids.size(), e[0].block_hashes.size() * static_cast<size_t>(block));
    // The parent is the previous block's hash (none for the first).
    if (got.empty())
      EXPECT_FALSE(e[0].parent_block_hash.has_value());
    else
      EXPECT_EQ(e[0].parent_block_hash, got.back());
    for (size_t i = 0; i < e[0].token_ids.size(); ++i)
      EXPECT_EQ(e[0].token_ids[i], p1[got.size() * static_cast<size_t>(block) + i]);
    got.insert(got.end(), e[0].block_hashes.begin(), e[0].block_hashes.end());
  }
  EXPECT_EQ(got, want1);

  // Another 96-token prompt needs 6 of the 8 blocks: the first prompt's cached blocks go.
  const std::vector<int32_t> p2 = ids(96, 500);
  ASSERT_EQ(complete(s.port, p2, 2).status, 200);
  // POST /reset_prefix_cache: 200 with JSON; AllBlocksCleared ends what the store sent.
  const HttpReply r = http(s.port, "POST", "/reset_prefix_cache");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["status"], "ok");
  std::vector<std::string> removed;
  size_t stored2 = 0;
  bool cleared = false;
  for (int i = 0; i < 50 && !cleared; ++i) {
    const std::vector<KvEventView> e = sub.events(1);
    ASSERT_FALSE(e.empty()) << "no AllBlocksCleared";
    if (e[0].type == "BlockRemoved") {
      EXPECT_EQ(e[0].group_idx, 0);
      removed.insert(removed.end(), e[0].block_hashes.begin(), e[0].block_hashes.end());
    } else if (e[0].type == "BlockStored") {
      stored2 += e[0].block_hashes.size();
    } else {
      ASSERT_EQ(e[0].type, "AllBlocksCleared");
      cleared = true;
    }
  }
  EXPECT_EQ(stored2, 6u);
  ASSERT_FALSE(removed.empty());
  for (const std::string& h : removed)
    EXPECT_NE(std::find(want1.begin(), want1.end(), h), want1.end()) << h << " was not stored";
  // The prompt is computed again (no hit) after the reset.
  const HttpReply again = complete(s.port, p2, 1);
  ASSERT_EQ(again.status, 200);
  EXPECT_EQ(json::parse(again.body)["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
      << again.body;

  const std::string m = s.server->metrics_text();
  EXPECT_GE(testing_util::metric(m, "kvcache_kv_events_published_total"), 11);
  EXPECT_EQ(testing_util::metric(m, "kvcache_kv_events_dropped_total"), 0);
}

TEST(KvEventsServer, SlidingGroupsOfHybridModelsSayWhatTheyAre) {
  // gemma2-tiny: sliding (window 8) and full layers, two groups, each keyed with its group.
  LoadOptions lo;
  lo.dummy_cache_dir = testing_util::process_scratch().file("server-events-gemma2");
  const LoadedModel lm = load_model("dummy:gemma2-tiny", lo);
  TestServerOptions o;
  o.http.kv_events.endpoint = "tcp://127.0.0.1:*";
  TestServer s(lm, o);
  const PagedKVStore& store = s.engine->store();
  ASSERT_EQ(store.num_groups(), 2);
  const int block = store.block_tokens();
  Sub sub(s.server->kv_events()->endpoint());
  const std::vector<int32_t> p = ids(48, 10);  // and the first sampled token: 3 full blocks
  ASSERT_EQ(complete(s.port, p, 2).status, 200);
  ASSERT_EQ(http(s.port, "POST", "/reset_prefix_cache").status, 200);
  std::map<int64_t, std::vector<std::string>> stored;  // group -> hashes, in order
  for (int i = 0; i < 50; ++i) {
    const std::vector<KvEventView> e = sub.events(1);
    ASSERT_FALSE(e.empty()) << "no AllBlocksCleared";
    if (e[0].type == "AllBlocksCleared") break;
    if (e[0].type != "BlockStored") continue;
    ASSERT_TRUE(e[0].group_idx.has_value());
    const int g = static_cast<int>(*e[0].group_idx);
    ASSERT_LT(g, 2);
    if (store.group(g).kind == GroupKind::kSliding) {
      EXPECT_EQ(e[0].kv_cache_spec_kind, "sliding_window");
      EXPECT_EQ(e[0].sliding_window, store.group(g).window);
    } else {
      EXPECT_EQ(e[0].kv_cache_spec_kind, "full_attention");
      EXPECT_FALSE(e[0].sliding_window.has_value());
    }
    stored[g].insert(stored[g].end(), e[0].block_hashes.begin(), e[0].block_hashes.end());
  }
  for (int g = 0; g < 2; ++g) {
    if (store.group(g).kind != GroupKind::kFull) continue;
    std::vector<std::string> want;
    BlockKey parent;
    for (size_t i = 0; i + static_cast<size_t>(block) <= p.size(); i += block) {
      parent = block_key(parent, g, {}, std::span<const int32_t>(p.data() + i, block));
      want.push_back(hex(block_key_bytes(parent)));
    }
    EXPECT_EQ(stored[g], want) << "group " << g;
  }
  EXPECT_EQ(stored.size(), 2u) << "both groups publish their blocks";
}

TEST(KvEventsServer, NoPublisherWithoutAnEndpoint) {
  const LoadedModel* lm = testing_util::tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf";
  TestServer s(*lm);
  EXPECT_EQ(s.server->kv_events(), nullptr);
  EXPECT_EQ(testing_util::metric(s.server->metrics_text(), "kvcache_kv_events_published_total"),
            -1);
  EXPECT_EQ(http(s.port, "POST", "/reset_prefix_cache").status, 200);
}

}  // namespace
}  // namespace kvcache
