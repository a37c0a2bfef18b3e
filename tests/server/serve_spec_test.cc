// serve with speculative decoding (EngineConfig::spec_k, serve --spec ngram): usage.speculative
// per request, the /metrics counters, and the per-request "speculative" field (k 0 turns it
// off, a k above --spec-k is a 400). dummy:tiny with the shared vocabulary.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "raw_http.h"
#include "server_test_util.h"

namespace kvcache {
namespace {

using json = nlohmann::json;
using testing_util::http;
using testing_util::HttpReply;
using testing_util::metric;
using testing_util::TestServer;
using testing_util::tiny_with_vocab;

TEST(ServeSpec, UsageAndMetricsReportDraftsAndAcceptance) {
  const LoadedModel* lm = tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf";
  EngineConfig ec;
  ec.spec_k = 4;
  TestServer ts(*lm, "", ec);
  // A passage told three times: prompt lookup drafts its continuation.
  std::vector<int32_t> prompt = {1};
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 15; ++i) prompt.push_back(300 + i * 41);
  json req{{"prompt", prompt}, {"max_tokens", 40}, {"temperature", 0}};
  const HttpReply a = http(ts.port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  const json ua = json::parse(a.body)["usage"];
  ASSERT_TRUE(ua.contains("speculative")) << a.body;
  const int64_t drafted = ua["speculative"]["drafted"], accepted = ua["speculative"]["accepted"];
  EXPECT_GT(drafted, 0);
  EXPECT_LE(accepted, drafted);

  req["speculative"] = {{"k", 0}};
  const HttpReply b = http(ts.port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(b.status, 200) << b.body;
  const json jb = json::parse(b.body);
  EXPECT_FALSE(jb["usage"].contains("speculative"));
  EXPECT_EQ(jb["choices"][0]["text"], json::parse(a.body)["choices"][0]["text"]);

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
