// End to end: the OpenAI-compatible server on a free loopback port, driven by a plain socket
// client (raw_http.h): SSE framing and [DONE], usage with cached tokens, OpenAI error bodies and
// statuses, API keys, client disconnects cancelling, /metrics. dummy:tiny with the shared
// SentencePiece vocabulary (skipped without it: text prompts need a tokenizer).
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>

#include "raw_http.h"
#include "runtime/model_loader.h"
#include "scratch_dir.h"
#include "server/chat_template.h"
#include "server/http_server.h"
#include "server/openai.h"
#include "server_test_util.h"

namespace kvcache {
namespace {

using nlohmann::json;
using testing_util::http;
using testing_util::HttpReply;
using testing_util::metric;
using testing_util::sse_events;
using testing_util::TestServer;
using testing_util::tiny_with_vocab;

TEST(Server, StreamsAChatCompletionAsServerSentEventsEndingInDone) {
  const LoadedModel* lm = tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf";
  TestServer ts(*lm);
  EXPECT_EQ(http(ts.port, "GET", "/health").status, 200);
  const HttpReply models = http(ts.port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "dummy:tiny");

  const json req{{"model", "dummy:tiny"},
                 {"messages",
                  {{{"role", "system"}, {"content", "You are terse."}},
                   {{"role", "user"}, {"content", "Tell me a story about a cat and a dog."}}}},
                 {"max_tokens", 12},
                 {"temperature", 0},
                 {"stream", true},
                 {"stream_options", {{"include_usage", true}}}};
  const HttpReply r = http(ts.port, "POST", "/v1/chat/completions", req.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.headers.find("Content-Type: text/event-stream"), std::string::npos) << r.headers;
  EXPECT_NE(r.headers.find("Transfer-Encoding: chunked"), std::string::npos);
  const std::vector<std::string> events = sse_events(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_EQ(r.body.substr(r.body.size() - 14), "data: [DONE]\n\n");
  std::string streamed;
  std::string finish;
  json usage;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    EXPECT_EQ(c["model"], "dummy:tiny");
    EXPECT_EQ(c["id"], json::parse(events[0])["id"]);
    if (c.contains("usage")) {
      usage = c["usage"];
      EXPECT_TRUE(c["choices"].empty());
      continue;
    }
    const json& ch = c["choices"][0];
    if (i == 0) {
      EXPECT_EQ(ch["delta"]["role"], "assistant");
    }
    if (ch["delta"].contains("content")) streamed += ch["delta"]["content"].get<std::string>();
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_TRUE(finish == "length" || finish == "stop") << finish;
  ASSERT_TRUE(usage.is_object());
  EXPECT_GT(usage["prompt_tokens"].get<int>(), 10);
  EXPECT_LE(usage["completion_tokens"].get<int>(), 12);
  EXPECT_TRUE(usage["prompt_tokens_details"].contains("cached_tokens"));

  // The same request without streaming: the same text (greedy), and now the prompt's full
  // blocks come from the prefix cache.
  json once = req;
  once["stream"] = false;
  once.erase("stream_options");
  const HttpReply r2 = http(ts.port, "POST", "/v1/chat/completions", once.dump());
  ASSERT_EQ(r2.status, 200) << r2.body;
  const json body = json::parse(r2.body);
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], streamed);
  EXPECT_EQ(body["choices"][0]["finish_reason"], finish);
  const int cached = body["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, 16);
  EXPECT_LT(cached, body["usage"]["prompt_tokens"].get<int>());

  // cache_salt (vLLM's): another tenant's identical request finds nothing cached and gets the
  // same text; its own repeat hits.
  json salted = once;
  salted["cache_salt"] = "tenant-b";
  for (int repeat = 0; repeat < 2; ++repeat) {
    const HttpReply rs = http(ts.port, "POST", "/v1/chat/completions", salted.dump());
    ASSERT_EQ(rs.status, 200) << rs.body;
    const json bs = json::parse(rs.body);
    EXPECT_EQ(bs["choices"][0]["message"]["content"], streamed);
    EXPECT_EQ(bs["usage"]["prompt_tokens_details"]["cached_tokens"], repeat == 0 ? 0 : cached)
        << "repeat " << repeat;
  }

  // Completions with a stop string: the text ends before it.
  const HttpReply free_run =
      http(ts.port, "POST", "/v1/completions",
           json{{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0}}.dump());
  ASSERT_EQ(free_run.status, 200);
  const std::string text = json::parse(free_run.body)["choices"][0]["text"];
  ASSERT_GE(text.size(), 4u);
  const std::string stop = text.substr(text.size() / 2, 2);
  const HttpReply cut = http(
      ts.port, "POST", "/v1/completions",
      json{{"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0}, {"stop", stop}}
          .dump());
  ASSERT_EQ(cut.status, 200);
  const json cj = json::parse(cut.body);
  EXPECT_EQ(cj["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cj["choices"][0]["finish_reason"], "stop");

  const std::string m = http(ts.port, "GET", "/metrics").body;
  EXPECT_EQ(metric(m, "kvcache_kv_blocks_used"), 0) << m;
  EXPECT_GT(metric(m, "kvcache_kv_blocks_cached"), 0);
  EXPECT_GT(metric(m, "kvcache_prefix_cache_hit_rate"), 0);
  EXPECT_GE(metric(m, "kvcache_generation_tokens_total"), 12);
  EXPECT_NE(m.find("# TYPE kvcache_preemptions_total counter"), std::string::npos);
  ts.shutdown();
  EXPECT_EQ(ts.engine->check_invariants(), "");
}

TEST(Server, LogprobsInOpenAIsShapesStreamedOrNot) {
  const LoadedModel* lm = tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf";
  TestServer ts(*lm);
  auto post = [&](const std::string& path, const json& body) {
    return http(ts.port, "POST", path, body.dump());
  };
  // Completions: four parallel arrays, one entry per generated token; greedy takes the top one.
  const json req{
      {"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}};
  const HttpReply r = post("/v1/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  const json body = json::parse(r.body);
  const json& lp = body["choices"][0]["logprobs"];
  const size_t n = body["usage"]["completion_tokens"].get<size_t>();
  ASSERT_EQ(lp["tokens"].size(), n);
  ASSERT_EQ(lp["token_logprobs"].size(), n);
  ASSERT_EQ(lp["top_logprobs"].size(), n);
  ASSERT_EQ(lp["text_offset"].size(), n);
  std::string joined;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size());
    joined += lp["tokens"][i].get<std::string>();
    const float chosen = lp["token_logprobs"][i];
    EXPECT_LT(chosen, 0.0f);
    float best = -1e30f;
    for (const auto& [piece, v] : lp["top_logprobs"][i].items())
      best = std::max(best, v.get<float>());
    EXPECT_EQ(chosen, best) << i;
  }
  EXPECT_EQ(joined, body["choices"][0]["text"]);
  // Streamed: the same tokens and values, spread over the chunks.
  json sreq = req;
  sreq["stream"] = true;
  const HttpReply sr = post("/v1/completions", sreq);
  ASSERT_EQ(sr.status, 200);
  json tokens = json::array(), values = json::array();
  for (const std::string& ev : sse_events(sr.body)) {
    if (ev == "[DONE]") break;
    const json chunk = json::parse(ev);
    const json& c = chunk["choices"][0];
    if (c["logprobs"].is_null()) continue;
    for (const json& t : c["logprobs"]["tokens"]) tokens.push_back(t);
    for (const json& v : c["logprobs"]["token_logprobs"]) values.push_back(v);
  }
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(values, lp["token_logprobs"]);
  // Chat: {"content": [{token, logprob, bytes, top_logprobs}]}.
  json chat{{"max_tokens", 3}, {"logprobs", true}, {"top_logprobs", 1}};
  chat["messages"] = json::array({json{{"role", "user"}, {"content", "Hi"}}});
  const HttpReply cr = post("/v1/chat/completions", chat);
  ASSERT_EQ(cr.status, 200) << cr.body;
  const json cb = json::parse(cr.body);
  const json& content = cb["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), cb["usage"]["completion_tokens"].get<size_t>());
  for (const json& t : content) {
    ASSERT_EQ(t["top_logprobs"].size(), 1u);
    std::string from_bytes;
    for (const json& b : t["bytes"]) from_bytes += static_cast<char>(b.get<int>());
    EXPECT_EQ(from_bytes, t["token"].get<std::string>());
    EXPECT_LE(t["logprob"].get<float>(), t["top_logprobs"][0]["logprob"].get<float>());
  }
  // Without the parameters the field stays null.
  EXPECT_TRUE(json::parse(post("/v1/completions", json{{"prompt", "Hi"}, {"max_tokens", 2}})
                              .body)["choices"][0]["logprobs"]
                  .is_null());
  ts.shutdown();
}

// echo with logprobs and max_tokens 0, as evaluation harnesses (lm-evaluation-harness's
// local-completions) score a text: the prompt comes back with a score for every token but the
// first, and equals what a generating request reports for the same continuation.
TEST(Server, EchoReturnsThePromptAndItsLogprobs) {
  const LoadedModel* lm = tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf";
  TestServer ts(*lm);
  auto post = [&](const json& body) {
    return http(ts.port, "POST", "/v1/completions", body.dump());
  };
  const std::string prompt = "Once upon a time";
  const HttpReply gen =
      post(json{{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"logprobs", 1}});
  ASSERT_EQ(gen.status, 200) << gen.body;
  const json g = json::parse(gen.body)["choices"][0];
  const std::string next = g["text"];

  EXPECT_EQ(post(json{{"prompt", json::array()}, {"max_tokens", 0}, {"echo", true}}).status,
            400);  // still empty
  json ids = json::array();
  for (const int32_t t : lm->tokenizer->encode(prompt)) ids.push_back(t);
  ids.insert(ids.begin(), lm->tokenizer->bos_id());
  const HttpReply sr =
      post(json{{"prompt", prompt}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 1}});
  ASSERT_EQ(sr.status, 200) << sr.body;
  const json body = json::parse(sr.body);
  const json& c = body["choices"][0];
  EXPECT_EQ(c["text"], prompt);  // the string as sent
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["completion_tokens"], 0);
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size());
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size());
  ASSERT_EQ(lp["top_logprobs"].size(), ids.size());
  ASSERT_EQ(lp["text_offset"].size(), ids.size());
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());  // nothing precedes the first token
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i], lm->tokenizer->decode(ids[i].get<int32_t>())) << i;
    // text_offset: where the token's text starts in the echoed text (BOS adds none, and the
    // word after it loses its leading space, as in the text).
    std::string piece = lp["tokens"][i];
    if (i == 0) piece.clear();
    if (i == 1 && piece[0] == ' ') piece.erase(0, 1);
    const auto at = lp["text_offset"][i].get<size_t>();
    EXPECT_EQ(prompt.substr(at, piece.size()), piece) << i;
    if (i + 1 < ids.size()) {
      EXPECT_EQ(lp["text_offset"][i + 1].get<size_t>(), at + piece.size()) << i;
    }
    if (i == 0) continue;
    const float v = lp["token_logprobs"][i];
    EXPECT_LT(v, 0.0f);
    ASSERT_EQ(lp["top_logprobs"][i].size(), 1u);
    EXPECT_LE(v, lp["top_logprobs"][i].begin().value().get<float>());
  }
  // Echo with a generated token: the prompt's entries, then the token's, as the plain request
  // reported it; the text is the prompt's then the token's.
  const HttpReply er = post(json{
      {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"echo", true}, {"logprobs", 1}});
  ASSERT_EQ(er.status, 200) << er.body;
  const json e = json::parse(er.body)["choices"][0];
  EXPECT_EQ(e["text"], prompt + next);
  ASSERT_EQ(e["logprobs"]["tokens"].size(), ids.size() + 1);
  EXPECT_EQ(e["logprobs"]["tokens"].back(), g["logprobs"]["tokens"][0]);
  EXPECT_EQ(e["logprobs"]["token_logprobs"].back(), g["logprobs"]["token_logprobs"][0]);
  EXPECT_EQ(e["logprobs"]["text_offset"].back().get<size_t>(), prompt.size());
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(e["logprobs"]["token_logprobs"][i], lp["token_logprobs"][i]) << i;
  // Streamed: the first chunk carries the prompt's text and scores, and the chunks joined give
  // the reply above; with max_tokens 0 the one chunk is the prompt.
  for (const int max_tokens : {3, 0}) {
    json req{{"prompt", prompt},
             {"max_tokens", max_tokens},
             {"temperature", 0},
             {"echo", true},
             {"logprobs", 1}};
    const json whole = json::parse(post(req).body)["choices"][0];
    req["stream"] = true;
    const HttpReply st = post(req);
    ASSERT_EQ(st.status, 200) << st.body;
    std::string text;
    json joined{{"tokens", json::array()},
                {"token_logprobs", json::array()},
                {"text_offset", json::array()}};
    for (const std::string& ev : sse_events(st.body)) {
      if (ev == "[DONE]") break;
      const json ch = json::parse(ev)["choices"][0];
      text += ch["text"].get<std::string>();
      if (ch["logprobs"].is_null()) continue;
      for (const char* key : {"tokens", "token_logprobs", "text_offset"})
        for (const json& v : ch["logprobs"][key]) joined[key].push_back(v);
    }
    EXPECT_EQ(text, whole["text"]) << max_tokens;
    for (const char* key : {"tokens", "token_logprobs", "text_offset"})
      EXPECT_EQ(joined[key], whole["logprobs"][key]) << key << " " << max_tokens;
  }
  // A prompt of token ids echoes their text; echo without logprobs leaves them null.
  const HttpReply ir = post(json{{"prompt", ids}, {"max_tokens", 0}, {"echo", true}});
  ASSERT_EQ(ir.status, 200) << ir.body;
  const json i0 = json::parse(ir.body)["choices"][0];
  EXPECT_EQ(i0["text"], prompt);
  EXPECT_TRUE(i0["logprobs"].is_null());
  ts.shutdown();
}

TEST(Server, BadRequestsGetOpenAIErrorsWithTheRightStatus) {
  const LoadedModel* lm = tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs the shared SentencePiece vocabulary";
  TestServer ts(*lm);
  auto post = [&](const std::string& path, const std::string& body) {
    return http(ts.port, "POST", path, body);
  };
  auto expect_error = [](const HttpReply& r, int status) {
    EXPECT_EQ(r.status, status) << r.body;
    const json b = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(b.is_object()) << r.body;
    EXPECT_TRUE(b["error"]["message"].is_string());
    EXPECT_TRUE(b["error"]["type"].is_string());
  };
  expect_error(post("/v1/completions", "{\"prompt\": \"hi\""), 400);  // malformed
  expect_error(post("/v1/completions", R"({"prompt": "hi", "max_tokens": "ten"})"),
               400);  // wrong type
  expect_error(post("/v1/completions", R"({"prompt": "hi", "stream": 1})"), 400);
  expect_error(post("/v1/completions", R"({"prompt": ""})"), 400);     // empty
  expect_error(post("/v1/completions", R"({"max_tokens": 3})"), 400);  // missing
  // Features this server does not implement are refused, not silently dropped; their no-op
  // values (which clients send by default) are accepted.
  for (const char* b :
       {R"({"prompt": "hi", "max_tokens": 0})",  // 0 only with echo
        R"({"prompt": "hi", "echo": "yes"})",    // a boolean
        R"({"prompt": "hi", "presence_penalty": 0.5})",
        R"({"prompt": "hi", "logit_bias": {"50": 10}})", R"({"prompt": "hi", "logprobs": 21})",
        R"({"prompt": "hi", "logprobs": -2})"})
    expect_error(post("/v1/completions", b), 400);
  expect_error(post("/v1/chat/completions",
                    R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})"),
               400);  // without "logprobs": true
  expect_error(
      post("/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]})"),
      400);
  EXPECT_EQ(post("/v1/completions",
                 R"({"prompt": "hi", "max_tokens": 1, "presence_penalty": 0, "frequency_penalty": 0,
                                        "logit_bias": {}, "echo": false, "best_of": 1, "logprobs": null})")
                .status,
            200);
  EXPECT_EQ(post("/v1/chat/completions",
                 R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                                             "logprobs": false, "tools": [], "response_format": {"type": "text"}})")
                .status,
            200);
  expect_error(post("/v1/completions", R"({"prompt": "hi", "top_k": -1})"), 400);  // out of range
  expect_error(post("/v1/completions", R"({"prompt": "hi", "repetition_penalty": 1e400})"), 400);
  expect_error(post("/v1/chat/completions", R"({"messages": []})"), 400);
  expect_error(post("/v1/chat/completions", R"({"messages": [{"role": 3}]})"), 400);
  std::string long_prompt;
  for (int i = 0; i < 1200; ++i) long_prompt += "cat ";
  expect_error(post("/v1/completions", json{{"prompt", long_prompt}}.dump()),
               400);  // beyond the context
  const HttpReply nf = post("/v1/completions", R"({"model": "gpt-9", "prompt": "hi"})");
  expect_error(nf, 404);
  EXPECT_EQ(json::parse(nf.body)["error"]["code"], "model_not_found");
  expect_error(http(ts.port, "GET", "/v1/nothing"), 404);
}

TEST(Server, ApiKeyGuardsEveryRouteButHealth) {
  const LoadedModel* lm = tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs the shared SentencePiece vocabulary";
  TestServer ts(*lm, "sekret");
  EXPECT_EQ(http(ts.port, "GET", "/health").status, 200);
  EXPECT_EQ(http(ts.port, "GET", "/v1/models").status, 401);
  EXPECT_EQ(http(ts.port, "GET", "/metrics", "", "Authorization: Bearer wrong\r\n").status, 401);
  const HttpReply bad = http(ts.port, "POST", "/v1/completions", R"({"prompt": "hi"})");
  EXPECT_EQ(bad.status, 401);
  EXPECT_EQ(json::parse(bad.body)["error"]["code"], "invalid_api_key");
  EXPECT_EQ(http(ts.port, "GET", "/v1/models", "", "Authorization: Bearer sekret\r\n").status, 200);
}

TEST(Server, ClientDisconnectMidStreamCancelsAndFreesBlocks) {
  const LoadedModel* lm = tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs the shared SentencePiece vocabulary";
  TestServer ts(*lm);
  const int fd = testing_util::connect_loopback(ts.port);
  ASSERT_GE(fd, 0);
  const std::string body = json{
      {"prompt", "The quick brown fox"},
      {"max_tokens", 900},
      {"stream", true},
      {"ignore_eos", true}}.dump();
  ASSERT_TRUE(
      testing_util::send_all(fd, testing_util::request_text("POST", "/v1/completions", body, "")));
  std::string got;
  char buf[512];
  while (got.find("data: {") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);  // gone mid-stream
  double cancelled = 0;
  std::string m;
  for (int i = 0; i < 200 && cancelled < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    m = http(ts.port, "GET", "/metrics").body;
    cancelled = metric(m, "kvcache_requests_cancelled_total");
  }
  EXPECT_EQ(cancelled, 1) << m;
  EXPECT_EQ(metric(m, "kvcache_kv_blocks_used"), 0) << m;
  EXPECT_LT(metric(m, "kvcache_generation_tokens_total"), 900);
  ts.shutdown();
  EXPECT_EQ(ts.engine->check_invariants(), "");
}

// Polls /metrics until `name` reaches `want` (polls * 25 ms at most); returns the last scrape.
std::string wait_metric(int port, const std::string& name, double want, int polls = 200) {
  std::string m;
  for (int i = 0; i < polls; ++i) {
    m = http(port, "GET", "/metrics").body;
    if (metric(m, name) >= want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return m;
}

// Opens a streaming completion and reads until its first token event; returns the socket.
int open_stream_until_first_token(int port, int max_tokens) {
  const int fd = testing_util::connect_loopback(port);
  if (fd < 0) return -1;
  const std::string body = json{
      {"prompt", "The quick brown fox"},
      {"max_tokens", max_tokens},
      {"stream", true},
      {"ignore_eos", true}}.dump();
  if (!testing_util::send_all(fd, testing_util::request_text("POST", "/v1/completions", body, "")))
    return -1;
  std::string got;
  char buf[512];
  while (got.find("data: {") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return -1;
    got.append(buf, static_cast<size_t>(n));
  }
  return fd;
}

// A bounded queue: one running request, one waiting, the third is refused with 429 (OpenAI's
// rate_limit_error) through HTTP; the refused one leaves no trace in the engine. The tiny model
// may finish the running request (1000 tokens, a fraction of a second) before the queue is seen
// full on a loaded machine: then the attempt is repeated, and one of five must see the 429.
TEST(Server, FullQueueAnswers429) {
  const LoadedModel* lm = tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs the shared SentencePiece vocabulary";
  EngineConfig ec;
  ec.max_running = 1;
  ec.max_waiting = 1;
  TestServer ts(*lm, "", ec);
  bool refused = false;
  for (int attempt = 0; attempt < 5 && !refused; ++attempt) {
    const int running =
        open_stream_until_first_token(ts.port, 1000);  // admitted: holds the only slot
    ASSERT_GE(running, 0);
    const int queued = testing_util::connect_loopback(ts.port);
    ASSERT_GE(queued, 0);
    ASSERT_TRUE(testing_util::send_all(
        queued, testing_util::request_text(
                    "POST", "/v1/completions",
                    json{{"prompt", "hello"}, {"max_tokens", 1000}, {"stream", true}}.dump(), "")));
    const std::string m = wait_metric(ts.port, "kvcache_requests_waiting", 1, 40);
    if (metric(m, "kvcache_requests_waiting") == 1) {
      const HttpReply full =
          http(ts.port, "POST", "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})");
      if (full.status == 429) {
        refused = true;
        const json b = json::parse(full.body, nullptr, false);
        ASSERT_TRUE(b.is_object()) << full.body;
        EXPECT_EQ(b["error"]["type"], "rate_limit_error");
        EXPECT_EQ(b["error"]["code"], "queue_full");
      } else {
        EXPECT_EQ(full.status, 200) << full.body;  // the queue had drained meanwhile: admitted
      }
    }
    ::close(running);
    ::close(queued);
    // Both streams end (cancelled, or finished already); nothing stays queued or resident.
    for (int i = 0; i < 200; ++i) {
      const std::string mm = http(ts.port, "GET", "/metrics").body;
      if (metric(mm, "kvcache_requests_running") == 0 &&
          metric(mm, "kvcache_requests_waiting") == 0)
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  EXPECT_TRUE(refused) << "the queue was never seen full";
  const std::string m = http(ts.port, "GET", "/metrics").body;
  EXPECT_EQ(metric(m, "kvcache_requests_running"), 0) << m;
  EXPECT_EQ(metric(m, "kvcache_kv_blocks_used"), 0) << m;
  // With room again, a request goes through.
  EXPECT_EQ(http(ts.port, "POST", "/v1/completions", R"({"prompt": "hi", "max_tokens": 2})").status,
            200);
  ts.shutdown();
  EXPECT_EQ(ts.engine->check_invariants(), "");
}

// A non-streaming client that closes its connection while its completion is generated: the
// request is cancelled and its blocks freed (seen by the response provider's socket check).
TEST(Server, NonStreamingClientDisconnectCancelsAndFreesBlocks) {
  const LoadedModel* lm = tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs the shared SentencePiece vocabulary";
  TestServer ts(*lm);
  const int fd = testing_util::connect_loopback(ts.port);
  ASSERT_GE(fd, 0);
  const std::string body =
      json{{"prompt", "The quick brown fox"}, {"max_tokens", 900}, {"ignore_eos", true}}.dump();
  ASSERT_TRUE(
      testing_util::send_all(fd, testing_util::request_text("POST", "/v1/completions", body, "")));
  std::string m = wait_metric(ts.port, "kvcache_generation_tokens_total", 1);
  ASSERT_GE(metric(m, "kvcache_generation_tokens_total"), 1) << m;
  ::close(fd);
  m = wait_metric(ts.port, "kvcache_requests_cancelled_total", 1);
  EXPECT_EQ(metric(m, "kvcache_requests_cancelled_total"), 1) << m;
  EXPECT_EQ(metric(m, "kvcache_kv_blocks_used"), 0) << m;
  EXPECT_LT(metric(m, "kvcache_generation_tokens_total"), 900) << m;
  // A client that stays gets its whole JSON body (chunked once generation outlives the wait).
  const HttpReply ok = http(
      ts.port, "POST", "/v1/completions",
      json{{"prompt", "The quick brown fox"}, {"max_tokens", 40}, {"ignore_eos", true}}.dump());
  EXPECT_EQ(ok.status, 200) << ok.body;
  const json r = json::parse(ok.body, nullptr, false);
  ASSERT_TRUE(r.is_object()) << ok.body;
  EXPECT_EQ(r["usage"]["completion_tokens"], 40);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  ts.shutdown();
  EXPECT_EQ(ts.engine->check_invariants(), "");
}

}  // namespace
}  // namespace kvcache
