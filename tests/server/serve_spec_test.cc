// serve with speculative decoding (EngineConfig::spec_k, serve --spec ngram): usage.speculative
// per request, the /metrics counters, and the per-request "speculative" field (k 0 turns it
// off, a k above --spec-k is a 400). stories260K, which retells a story it was told, so prompt
// lookup's drafts are accepted.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "raw_http.h"
#include "server_test_util.h"
#include "shared_data.h"

namespace kvcache {
namespace {

using json = nlohmann::json;
using testing_util::http;
using testing_util::HttpReply;
using testing_util::metric;
using testing_util::TestServer;

TEST(ServeSpec, UsageAndMetricsReportDraftsAndAcceptance) {
  KVCACHE_REQUIRE_STORIES();
  const LoadedModel lm = load_model(testing_util::stories_model());
  EngineConfig ec;
  ec.spec_k = 4;
  TestServer ts(lm, "", ec);
  // "Once upon a time" and the golden story's first 30 greedy ids
  // (../shared/golden/stories260K/once_upon_a_time.ids), twice, then the prompt again.
  const std::vector<int32_t> once = {1, 403, 407, 261, 378};
  const std::vector<int32_t> story = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317,
                                      426, 338, 401, 396, 267, 337, 410, 408, 419, 292,
                                      411, 322, 265, 282, 295, 433, 426, 385, 328, 432};
  std::vector<int32_t> prompt;
  for (int r = 0; r < 2; ++r) {
    prompt.insert(prompt.end(), once.begin(), once.end());
    prompt.insert(prompt.end(), story.begin(), story.end());
  }
  prompt.insert(prompt.end(), once.begin(), once.end());
  json req{{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}, {"ignore_eos", true}};
  const HttpReply a = http(ts.port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  const json ua = json::parse(a.body)["usage"];
  ASSERT_TRUE(ua.contains("speculative")) << a.body;
  const int64_t drafted = ua["speculative"]["drafted"], accepted = ua["speculative"]["accepted"];
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_LE(accepted, drafted);

  req["speculative"] = {{"k", 0}};
  const HttpReply b = http(ts.port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(b.status, 200) << b.body;
  const json jb = json::parse(b.body);
  EXPECT_FALSE(jb["usage"].contains("speculative"));
  EXPECT_EQ(jb["choices"][0]["text"], json::parse(a.body)["choices"][0]["text"]);
  EXPECT_NE(jb["choices"][0]["text"], "");

  req["speculative"] = {{"k", 9}};
  const HttpReply c = http(ts.port, "POST", "/v1/completions", req.dump());
  EXPECT_EQ(c.status, 400) << c.body;
  EXPECT_NE(c.body.find("speculative k must be in [0, 4]"), std::string::npos) << c.body;
  req["speculative"] = {{"draft", 2}};
  EXPECT_EQ(http(ts.port, "POST", "/v1/completions", req.dump()).status, 400);

  const std::string m = http(ts.port, "GET", "/metrics").body;
  EXPECT_EQ(metric(m, "kvcache_spec_draft_tokens_total"), static_cast<double>(drafted)) << m;
  EXPECT_EQ(metric(m, "kvcache_spec_accepted_tokens_total"), static_cast<double>(accepted));
  EXPECT_NE(m.find("# TYPE kvcache_spec_draft_tokens_total counter"), std::string::npos);
  ts.shutdown();
  EXPECT_EQ(ts.engine->check_invariants(), "");
}

}  // namespace
}  // namespace kvcache
