// The server under failure and abuse: an engine that fails answers with errors and /health
// says so; wrong types and values out of range are 400s; every limit (prompt, body, n, stop,
// connections, request time) has its error; a drain lets short requests finish and cancels
// long ones with an error event. In-process server on a loopback port (server_test_util.h);
// faults and delays are injected at core/fault.h's points.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "core/fault.h"
#include "raw_http.h"
#include "server_test_util.h"

namespace kvcache {
namespace {

using nlohmann::json;
using testing_util::http;
using testing_util::HttpReply;
using testing_util::metric;
using testing_util::sse_events;
using testing_util::TestServer;
using testing_util::TestServerOptions;
using testing_util::tiny_with_vocab;
using Clock = std::chrono::steady_clock;

#define NEED_VOCAB(lm) \
  if ((lm) == nullptr) \
  GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf"

json error_of(const HttpReply& r) {
  const json b = json::parse(r.body, nullptr, false);
  return b.is_object() && b.contains("error") ? b["error"] : json();
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(ServerRobustness, AnEngineFailureIsARequestErrorAndHealthTellsTheTruth) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServer ts(*lm);
  const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 5})";
  ASSERT_EQ(http(ts.port, "GET", "/health").status, 200);
  {
    fault::Scoped broken(
        "paged_attention",
        [] {
          throw Error(ErrorKind::kUnsupported,
                      "paged_attention: this kernel cannot read the span (injected)");
        },
        0, /*times=*/-1);
    const HttpReply r = http(ts.port, "POST", "/v1/completions", body, "", 10);
    EXPECT_EQ(r.status, 500) << r.body;
    EXPECT_NE(error_of(r)["message"].get<std::string>().find("cannot read the span"),
              std::string::npos)
        << r.body;
    EXPECT_EQ(error_of(r)["type"], "server_error");

    // Streamed: the status is already 200 when the engine fails; an error event, then [DONE].
    const HttpReply s =
        http(ts.port, "POST", "/v1/completions",
             R"({"prompt": "Once upon a time", "max_tokens": 5, "stream": true})", "", 10);
    EXPECT_EQ(s.status, 200);
    const std::vector<std::string> ev = sse_events(s.body);
    ASSERT_GE(ev.size(), 2u) << s.body;
    EXPECT_EQ(ev.back(), "[DONE]");
    const json err = json::parse(ev[ev.size() - 2]);
    ASSERT_TRUE(err.contains("error")) << ev[ev.size() - 2];
    EXPECT_NE(err["error"]["message"].get<std::string>().find("cannot read the span"),
              std::string::npos);

    // The engine cannot make progress: /health probes it and says why.
    const HttpReply h = http(ts.port, "GET", "/health", "", "", 10);
    EXPECT_EQ(h.status, 503) << h.body;
    const json hb = json::parse(h.body, nullptr, false);
    EXPECT_EQ(hb["status"], "unhealthy");
    EXPECT_NE(hb["error"].get<std::string>().find("cannot read the span"), std::string::npos)
        << h.body;
    EXPECT_GE(metric(http(ts.port, "GET", "/metrics").body, "kvcache_engine_failed_forwards_total"),
              2);
  }
  // The fault is gone: the probe goes through, and so does the next request.
  EXPECT_EQ(http(ts.port, "GET", "/health", "", "", 10).status, 200);
  const HttpReply ok = http(ts.port, "POST", "/v1/completions", body, "", 10);
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(metric(http(ts.port, "GET", "/metrics").body, "kvcache_kv_blocks_used"), 0);
  ts.shutdown();  // check_invariants() reads the engine thread's state: only once it has ended
  EXPECT_EQ(ts.engine->check_invariants(), "");
}

TEST(ServerRobustness, HealthSaysUnhealthyWhileOneStepDoesNotEnd) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServerOptions o;
  o.http.health_stall_s = 0.3;
  TestServer ts(*lm, o);
  HttpReply reply;
  {
    // One attention call hangs for 1.5 s: the step it is in stalls.
    fault::Scoped hang("paged_attention",
                       [] { std::this_thread::sleep_for(std::chrono::milliseconds(1500)); });
    std::thread client([&] {
      reply = http(ts.port, "POST", "/v1/completions", R"({"prompt": "Once", "max_tokens": 2})");
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    const HttpReply h = http(ts.port, "GET", "/health", "", "", 5);
    EXPECT_EQ(h.status, 503) << h.body;
    EXPECT_NE(h.body.find("inside one step"), std::string::npos) << h.body;
    client.join();
  }
  EXPECT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(http(ts.port, "GET", "/health", "", "", 5).status, 200);
}

// A request failed before its first token delivers its finish event, then its output. The
// handler used to leave its first phase at any event: woken between the two, it answered 200
// with the error as the body (seen under TSan's timing). The output is held back here so that
// the handler wakes in between every time.
TEST(ServerRobustness, AFailureBeforeTheFirstTokenKeepsItsStatusWhenTheOutputComesLate) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServer ts(*lm);
  fault::Scoped broken(
      "paged_attention",
      [] {
        throw Error(ErrorKind::kUnsupported,
                    "paged_attention: this kernel cannot read the span (injected)");
      },
      0, /*times=*/1);
  fault::Scoped late(
      "engine.request_output", [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
      0, /*times=*/1);
  const HttpReply r = http(ts.port, "POST", "/v1/completions",
                           R"({"prompt": "Once upon a time", "max_tokens": 5})", "", 10);
  EXPECT_EQ(r.status, 500) << r.body;
  EXPECT_EQ(error_of(r)["type"], "server_error") << r.body;
  EXPECT_EQ(late.fired(), 1);
}

// Each of these was a 500 with an empty body, an accepted value silently replaced by a default,
// an overflow, or a field silently dropped.
TEST(ServerRobustness, WrongTypesAndValuesOutOfRangeAre400s) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServerOptions o;
  o.limits.max_n = 4;
  TestServer ts(*lm, o);
  const std::string ctx = std::to_string(ts.engine->max_context());
  const auto expect_400 = [&](const std::string& path, const std::string& body,
                              const std::string& says) {
    const HttpReply r = http(ts.port, "POST", path, body, "", 10);
    EXPECT_EQ(r.status, 400) << body << " -> " << r.body;
    const json e = error_of(r);
    ASSERT_TRUE(e.is_object()) << body << " -> " << r.body;
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_NE(e["message"].get<std::string>().find(says), std::string::npos)
        << body << " -> " << r.body;
  };
  const std::string chat = "/v1/chat/completions", cmpl = "/v1/completions";
  expect_400(chat,
             R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": 5}})",
             "response_format");
  expect_400(chat, R"({"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]})",
             "content parts");
  expect_400(chat, R"({"messages": [{"role": "user", "content": "hi", "name": "bob"}]})", "'name'");
  expect_400(chat, R"({"messages": [{"role": "user", "content": "hi", "tool_call_id": "x"}]})",
             "tool_call_id");
  for (const char* mt :
       {"-3", "0", "9223372036854775807", "18446744073709551615", "4611686018427387904"})
    expect_400(cmpl, std::string(R"({"prompt": "hi", "max_tokens": )") + mt + "}", "max_tokens");
  expect_400(
      cmpl,
      R"({"prompt": "hi", "max_tokens": )" + std::to_string(ts.engine->max_context() + 1) + "}",
      ctx);
  expect_400(chat,
             R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1})",
             "max_completion_tokens");
  expect_400(cmpl, R"({"prompt": "hi", "n": 5})", "'n' must be in [1, 4]");
  expect_400(cmpl, R"({"prompt": "hi", "stop_token_ids": [-1]})", "stop_token_ids");
  expect_400(cmpl, R"({"prompt": "hi", "stream_options": {"include_usage": true, "x": 1}})",
             "stream_options");
  expect_400(cmpl, R"({"prompt": "hi", "frobnicate": 1})",
             "unrecognized request argument 'frobnicate'");
  expect_400(cmpl, R"({"prompt": "hi", "messages": []})", "chat/completions parameter");
  expect_400(cmpl, R"({"prompt": "hi", "cache_salt": ""})", "'cache_salt' must be a non-empty");
  expect_400(chat, R"({"messages": [{"role": "user", "content": "hi"}], "cache_salt": 7})",
             "'cache_salt' must be a non-empty string");
  expect_400(cmpl, json{{"prompt", "hi"}, {"cache_salt", std::string(1025, 's')}}.dump(),
             "'cache_salt' has 1025 bytes");
  json many = {{"prompt", "hi"}, {"stop", json::array()}};
  for (int i = 0; i < 17; ++i) many["stop"].push_back(std::to_string(i) + "s");
  expect_400(cmpl, many.dump(), "at most 16");
  expect_400(cmpl, json{{"prompt", "hi"}, {"stop", std::string(257, 'x')}}.dump(), "at most 256");
  // Fields that cannot change an answer are accepted (and documented as ignored).
  EXPECT_EQ(http(ts.port, "POST", cmpl,
                 R"({"prompt": "hi", "max_tokens": 1, "user": "u1", "metadata": {"k": "v"}})")
                .status,
            200);
  // Without max_tokens the default shrinks to what the context leaves.
  EXPECT_EQ(
      http(ts.port, "POST", cmpl, R"({"prompt": "hi", "n": 1, "stop": ["."], "temperature": 0})")
          .status,
      200);
}

TEST(ServerRobustness, ALongPromptIsRefusedBeforeItIsTokenized) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServerOptions o;
  o.limits.max_prompt_tokens = 100;
  TestServer ts(*lm, o);
  auto prompt_of = [](int words) {
    std::string p;
    for (int i = 0; i < words; ++i) p += "cat ";
    return json{{"prompt", p}, {"max_tokens", 1}}.dump();
  };
  // 64,000 characters: refused from their byte count alone (the message says so).
  HttpReply r = http(ts.port, "POST", "/v1/completions", prompt_of(16000), "", 10);
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(error_of(r)["code"], "context_length_exceeded");
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("64000 bytes, at least"),
            std::string::npos)
      << r.body;
  // Short enough in bytes to need tokenizing, but 151 tokens.
  r = http(ts.port, "POST", "/v1/completions", prompt_of(150), "", 10);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("at most 100"), std::string::npos)
      << r.body;
  // Chat messages are bounded the same way.
  json chat = {
      {"messages", json::array({json{{"role", "user"}, {"content", std::string(64000, 'a')}}})}};
  r = http(ts.port, "POST", "/v1/chat/completions", chat.dump(), "", 10);
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("'messages' has 64000 bytes"),
            std::string::npos)
      << r.body;
  EXPECT_EQ(http(ts.port, "POST", "/v1/completions", prompt_of(60), "", 10).status, 200);
}

TEST(ServerRobustness, ABodyPastTheLimitIs413WithAnErrorBody) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServerOptions o;
  o.http.transport.max_body_bytes = 4096;
  TestServer ts(*lm, o);
  const HttpReply r = http(ts.port, "POST", "/v1/completions",
                           json{{"prompt", std::string(5000, 'a')}}.dump(), "", 10);
  EXPECT_EQ(r.status, 413);
  EXPECT_NE(error_of(r)["message"].get<std::string>().find("4096 bytes"), std::string::npos)
      << r.body;
  EXPECT_EQ(http(ts.port, "GET", "/health").status, 200);
}

// Past --max-connections a connection is answered 503 at once; a client that trickles its
// headers is cut at the request deadline; when the slow ones are gone /health answers again.
TEST(ServerRobustness, TheConnectionCapAnswers503AndSlowClientsAreCut) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServerOptions o;
  o.http.transport.max_connections = 3;
  o.http.transport.request_timeout_s = 1.5;
  TestServer ts(*lm, o);
  std::vector<int> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(testing_util::connect_loopback(ts.port));
    ASSERT_TRUE(
        testing_util::send_all(held.back(), "GET /health HTTP/1.1\r\n"));  // and never the rest
  }
  const HttpReply full = http(ts.port, "GET", "/health", "", "", 5);
  EXPECT_EQ(full.status, 503) << full.body;
  EXPECT_EQ(error_of(full)["code"], "too_many_connections");

  // The held connections trickle a header byte every 200 ms: each is closed by the server
  // within its 1.5 s request deadline.
  const Clock::time_point t0 = Clock::now();
  std::vector<bool> closed(held.size(), false);
  while (seconds_since(t0) < 6) {
    bool all = true;
    for (size_t i = 0; i < held.size(); ++i) {
      if (closed[i]) continue;
      char buf[512];
      const ssize_t n = ::recv(held[i], buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        closed[i] = true;
        continue;
      }
      testing_util::send_all(held[i], "X");
      all = false;
    }
    if (all) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_TRUE(closed[i]) << "connection " << i << " still open after " << seconds_since(t0)
                           << " s";
    ::close(held[i]);
  }
  EXPECT_LT(seconds_since(t0), 4.0);
  HttpReply back;
  for (int i = 0; i < 50 && back.status != 200; ++i) {
    back = http(ts.port, "GET", "/health", "", "", 5);
    if (back.status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(back.status, 200);
  const std::string m = http(ts.port, "GET", "/metrics").body;
  EXPECT_GE(metric(m, "kvcache_http_connections_rejected_total"), 1);
  EXPECT_GE(metric(m, "kvcache_http_request_timeouts_total"), 3);
}

// 140 clients sending headers slowly used to take every one of 128 fixed HTTP threads, and
// /health timed out behind them.
TEST(ServerRobustness, ManySlowClientsDoNotStopHealthFromAnswering) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServer ts(*lm);
  std::vector<int> slow;
  const Clock::time_point c0 = Clock::now();
  for (int i = 0; i < 140; ++i) {
    const int fd = testing_util::connect_loopback(ts.port);
    ASSERT_GE(fd, 0);
    testing_util::send_all(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
    slow.push_back(fd);
  }
  const Clock::time_point t0 = Clock::now();
  const HttpReply h = http(ts.port, "GET", "/health", "", "", 3);
  EXPECT_EQ(h.status, 200) << "after " << seconds_since(t0) << " s";
  for (const int fd : slow) ::close(fd);
  // A burst of connections is accepted at once (the listen backlog is widened past
  // cpp-httplib's 5; with 5, dropped SYNs came back a second later: 140 connects took 16 s).
  EXPECT_LT(std::chrono::duration<double>(t0 - c0).count(), 5.0);
}

TEST(ServerRobustness, AnIdleKeepAliveConnectionIsClosedAfterTheIdleTimeout) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServerOptions o;
  o.http.transport.idle_timeout_s = 0.5;
  TestServer ts(*lm, o);
  const int fd = testing_util::connect_loopback(ts.port);
  ASSERT_GE(fd, 0);
  testing_util::set_receive_timeout(fd, 5);
  ASSERT_TRUE(testing_util::send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));  // keep-alive
  std::string got;
  char buf[1024];
  while (got.find("{\"status\":\"ok\"}") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0) << got;
    got.append(buf, static_cast<size_t>(n));
  }
  const Clock::time_point t0 = Clock::now();
  EXPECT_EQ(::recv(fd, buf, sizeof buf, 0), 0) << "the idle connection was not closed";
  EXPECT_LT(seconds_since(t0), 3.0);
  ::close(fd);
}

// A streaming client that stops reading: once the socket buffers are full the server's write
// blocks, and after --write-timeout the request is cancelled and its blocks freed.
TEST(ServerRobustness, AClientThatStopsReadingIsCutAfterTheWriteTimeout) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServerOptions o;
  o.http.transport.write_timeout_s = 1.0;
  // A fixed 16 KB send buffer (no autotuning to 4 MB): the stream outgrows it within a few
  // tokens however slowly the build runs (ASan, a loaded CI host).
  o.http.transport.send_buffer_bytes = 16 * 1024;
  o.engine.cache.max_cache_len = 32 * 1024 + 64;
  TestServer ts(*lm, o);
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);  // before connect: a small window
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(ts.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  const std::string body =
      json{{"prompt", "Once"}, {"max_tokens", 900}, {"ignore_eos", true}, {"stream", true},
           {"logprobs", 20},   {"n", 32},           {"temperature", 0}}
          .dump();
  ASSERT_TRUE(
      testing_util::send_all(fd, testing_util::request_text("POST", "/v1/completions", body, "")));
  // Never read. The stream (32 samples, ~1.5 KB an event: ~40 MB) outgrows the socket buffers
  // long before its 900 tokens.
  EngineMetrics m = ts.engine->metrics();
  const Clock::time_point t0 = Clock::now();
  while (m.requests_cancelled == 0 && seconds_since(t0) < 30) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    m = ts.engine->metrics();
  }
  EXPECT_EQ(m.requests_cancelled, 1) << "after " << seconds_since(t0) << " s";
  EXPECT_LT(m.generation_tokens, 32 * 900)
      << "the whole stream fit the buffers: the test did not block a write";
  for (int i = 0; i < 50 && ts.engine->metrics().blocks_used != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(ts.engine->metrics().blocks_used, 0);
  ::close(fd);
}

TEST(ServerRobustness, StopDrainsShortRequestsAndCancelsLongOnesWithAnErrorEvent) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServerOptions o;
  o.http.drain_timeout_s = 1.0;
  TestServer ts(*lm, o);
  // Every attention call takes 10 ms: a token ~20 ms, so 900 tokens outlast the drain.
  fault::Scoped slow(
      "paged_attention", [] { std::this_thread::sleep_for(std::chrono::milliseconds(10)); }, 0, -1);
  HttpReply long_reply, short_reply;
  std::thread long_client([&] {
    long_reply = http(
        ts.port, "POST", "/v1/completions",
        R"({"prompt": "Once", "max_tokens": 900, "ignore_eos": true, "stream": true})", "", 20);
  });
  std::thread short_client([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    short_reply =
        http(ts.port, "POST", "/v1/completions", R"({"prompt": "Once", "max_tokens": 3})", "", 20);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both in flight
  const Clock::time_point t0 = Clock::now();
  std::thread stopper([&] { ts.server->stop(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(http(ts.port, "GET", "/health", "", "", 5).status, 503);  // draining
  EXPECT_EQ(
      http(ts.port, "POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 1})", "", 5).status,
      503);
  stopper.join();
  EXPECT_LT(seconds_since(t0), 4.0) << "stop() outlasted its drain";
  long_client.join();
  short_client.join();
  ts.thread.join();
  EXPECT_EQ(short_reply.status, 200) << short_reply.body;
  EXPECT_EQ(long_reply.status, 200);
  const std::vector<std::string> ev = sse_events(long_reply.body);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_NE(ev[ev.size() - 2].find("shutting down"), std::string::npos) << ev[ev.size() - 2];
  EXPECT_EQ(ts.engine->metrics().blocks_used, 0);
}

TEST(ServerRobustness, HandleRawRunsTheParserAndRoutesOnBytes) {
  const LoadedModel* lm = tiny_with_vocab();
  NEED_VOCAB(lm);
  TestServer ts(*lm);
  const std::string body = R"({"prompt": "Once", "max_tokens": 2, "stream": true})";
  const std::string ok = ts.server->handle_raw(
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
      "\r\n\r\n" + body);
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok;
  EXPECT_NE(ok.find("data: [DONE]"), std::string::npos) << ok;
  const std::string bad = ts.server->handle_raw("NONSENSE\r\n\r\n");
  EXPECT_EQ(bad.rfind("HTTP/1.1 400", 0), 0u) << bad;
  EXPECT_NE(bad.find("malformed HTTP request"), std::string::npos) << bad;
}

}  // namespace
}  // namespace kvcache
