// The server's llama-server / vLLM compatible parts: /tokenize and /detokenize, latency
// histograms and token counters on /metrics, /v1/completions' batch prompt form, and a chat
// request without a usable template refused with the way out (--chat-template NAME).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "raw_http.h"
#include "server/chat_template.h"
#include "server_test_util.h"

namespace kvcache {
namespace {

using nlohmann::json;
using testing_util::http;
using testing_util::HttpReply;
using testing_util::metric;
using testing_util::TestServer;
using testing_util::TestServerOptions;
using testing_util::tiny_with_vocab;

#define NEED_VOCAB()                            \
  const LoadedModel* lm = tiny_with_vocab();    \
  if (lm == nullptr)                            \
    GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR \
                    "/vocab/"                   \
                    "ggml-vocab-llama-spm.gguf";

TEST(ServeApi, TokenizeAndDetokenizeRoundTripInBothSpellings) {
  NEED_VOCAB();
  TestServer ts(*lm);
  const std::string text = "Hello world, a cat and a dog.";
  HttpReply r = http(ts.port, "POST", "/tokenize", json{{"content", text}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json tok = json::parse(r.body);
  const std::vector<int32_t> expected = lm->tokenizer->encode(text);
  EXPECT_EQ(tok["tokens"].get<std::vector<int32_t>>(), expected);
  EXPECT_EQ(tok["count"], expected.size());
  // vLLM's spelling, with the BOS asked for.
  r = http(ts.port, "POST", "/tokenize",
           json{{"prompt", text}, {"add_special_tokens", true}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<int32_t> with_bos = json::parse(r.body)["tokens"].get<std::vector<int32_t>>();
  ASSERT_EQ(with_bos.size(), expected.size() + 1);
  EXPECT_EQ(with_bos[0], lm->tokenizer->bos_id());

  r = http(ts.port, "POST", "/detokenize", json{{"tokens", with_bos}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["content"], text);

  // Bad input: the client's error, saying what is wrong.
  r = http(ts.port, "POST", "/detokenize", json{{"tokens", {1, 999999}}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("999999"), std::string::npos) << r.body;
  r = http(ts.port, "POST", "/tokenize", json{{"content", 5}}.dump());
  EXPECT_EQ(r.status, 400);
  r = http(ts.port, "POST", "/tokenize", json{{"content", "x"}, {"with_pieces", true}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("with_pieces"), std::string::npos) << r.body;
}

// The count of a histogram series (its _count line), or -1.
double histogram_count(const std::string& text, const std::string& name) {
  return metric(text, name + "_count");
}

TEST(ServeApi, MetricsHaveLatencyHistogramsAndCountersThatScrapingDoesNotReset) {
  NEED_VOCAB();
  TestServer ts(*lm);
  const HttpReply r = http(ts.port, "POST", "/v1/completions",
                           json{{"prompt", "Once upon a time"},
                                {"max_tokens", 6},
                                {"temperature", 0},
                                {"ignore_eos", true}}
                               .dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json usage = json::parse(r.body)["usage"];
  const std::string m1 = http(ts.port, "GET", "/metrics").body;
  const std::string m2 = http(ts.port, "GET", "/metrics").body;
  for (const char* h :
       {"kvcache_time_to_first_token_seconds", "kvcache_e2e_request_latency_seconds",
        "kvcache_request_queue_time_seconds"}) {
    EXPECT_NE(m1.find(std::string("# TYPE ") + h + " histogram"), std::string::npos) << h;
    EXPECT_EQ(histogram_count(m1, h), 1) << h << "\n" << m1;
    EXPECT_GE(metric(m1, std::string(h) + "_sum"), 0) << h;
    EXPECT_NE(m1.find(std::string(h) + "_bucket{le=\"+Inf\"} 1\n"), std::string::npos) << h;
  }
  // 6 tokens: 5 gaps between them.
  EXPECT_EQ(histogram_count(m1, "kvcache_inter_token_latency_seconds"), 5) << m1;
  EXPECT_NE(m1.find("kvcache_time_to_first_token_seconds_bucket{le=\"0.001\"}"), std::string::npos);
  // Counters, and the same values at the second scrape (no per-scrape reset).
  EXPECT_EQ(metric(m1, "kvcache_generation_tokens_total"),
            usage["completion_tokens"].get<double>());
  EXPECT_EQ(metric(m1, "kvcache_prompt_tokens_total"), usage["prompt_tokens"].get<double>());
  EXPECT_EQ(metric(m2, "kvcache_generation_tokens_total"),
            metric(m1, "kvcache_generation_tokens_total"));
  EXPECT_EQ(m1.find("tokens_per_second"), std::string::npos) << "rate gauges reset per scrape";
}

TEST(ServeApi, CompletionsTakeABatchOfPromptsOneChoicePerPromptAndSample) {
  NEED_VOCAB();
  TestServerOptions o;
  o.limits.max_n = 8;
  TestServer ts(*lm, o);
  const std::vector<std::string> prompts = {"The cat", "A dog ran to the", "Hello"};
  // Each prompt alone first (greedy: the batch must give the same texts).
  std::vector<std::string> single_text;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  for (const std::string& p : prompts) {
    const HttpReply r = http(
        ts.port, "POST", "/v1/completions",
        json{{"prompt", p}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    const json j = json::parse(r.body);
    single_text.push_back(j["choices"][0]["text"]);
    prompt_tokens += j["usage"]["prompt_tokens"].get<int64_t>();
    completion_tokens += j["usage"]["completion_tokens"].get<int64_t>();
  }
  HttpReply r = http(ts.port, "POST", "/v1/completions",
                     json{{"prompt", prompts},
                          {"max_tokens", 4},
                          {"temperature", 0},
                          {"ignore_eos", true},
                          {"n", 2}}
                         .dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json j = json::parse(r.body);
  ASSERT_EQ(j["choices"].size(), 6u) << r.body;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], single_text[i / 2]) << i;  // prompt i / 2, greedy
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], 2 * completion_tokens);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt_tokens + 2 * completion_tokens);

  // Token-id lists, one of them refused: the error names which.
  r = http(ts.port, "POST", "/v1/completions",
           json{{"prompt", {{1, 450, 4996}, {1, 17354}}}, {"max_tokens", 2}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  j = json::parse(r.body);
  EXPECT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  r = http(ts.port, "POST", "/v1/completions",
           json{{"prompt", {{1, 450}, json::array()}}, {"max_tokens", 2}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("prompt[1]"), std::string::npos) << r.body;
  // Past --max-n (prompts x n) and streamed: 400 saying why.
  r = http(ts.port, "POST", "/v1/completions",
           json{{"prompt", prompts}, {"max_tokens", 2}, {"n", 3}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("--max-n"), std::string::npos) << r.body;
  r = http(ts.port, "POST", "/v1/completions",
           json{{"prompt", prompts}, {"max_tokens", 2}, {"stream", true}}.dump());
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("stream"), std::string::npos) << r.body;
  // A one-string list is still one prompt.
  r = http(
      ts.port, "POST", "/v1/completions",
      json{{"prompt", {"The cat"}}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}}
          .dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], single_text[0]);
}

TEST(ServeApi, ChatWithoutAKnownTemplateIsA400NamingTheWayOut) {
  NEED_VOCAB();
  TestServerOptions o;
  ChatTemplateChoice c =
      choose_chat_template("", "{{ '<|START_OF_TURN_TOKEN|>' }}", *lm->tokenizer);
  ASSERT_FALSE(c.tmpl.has_value());
  o.chat_template = c.tmpl;
  o.chat_template_error = c.error;
  TestServer ts(*lm, o);
  const HttpReply r =
      http(ts.port, "POST", "/v1/chat/completions",
           json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}}.dump());
  EXPECT_EQ(r.status, 400);
  const std::string msg = json::parse(r.body)["error"]["message"];
  EXPECT_NE(msg.find("--chat-template NAME"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gemma"), std::string::npos) << msg;  // the names
  // Completions do not need a template.
  EXPECT_EQ(
      http(ts.port, "POST", "/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}}.dump())
          .status,
      200);
}

TEST(ServeApi, ChatRendersWithTheChosenFamily) {
  NEED_VOCAB();
  // Gemma on a vocabulary without its control tokens: they are encoded as text, and the prompt
  // is the rendered text's tokens (what the server queued: usage.prompt_tokens).
  TestServerOptions o;
  o.chat_template = ChatTemplate::kGemma;
  TestServer ts(*lm, o);
  const std::vector<ChatMessage> msgs = {{"system", "Be brief."}, {"user", "Hello"}};
  const SpecialTokens specials(*lm->tokenizer);
  const std::vector<int32_t> ids =
      encode_chat(ChatTemplate::kGemma, msgs, *lm->tokenizer, specials);
  const HttpReply r = http(ts.port, "POST", "/v1/chat/completions",
                           json{{"messages",
                                 {{{"role", "system"}, {"content", "Be brief."}},
                                  {{"role", "user"}, {"content", "Hello"}}}},
                                {"max_tokens", 1}}
                               .dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["usage"]["prompt_tokens"], ids.size());
  EXPECT_EQ(ids.front(), lm->tokenizer->bos_id());
}

}  // namespace
}  // namespace kvcache
