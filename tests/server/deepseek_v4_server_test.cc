// DeepSeek-V4 (compressed CSA/HCA layers) served over HTTP (issue 39): a repeated prompt is
// recomputed, never served from a prefix whose compressed state (window buffers, CSA overlap)
// the cache cannot restore, and /metrics counts the refusal; the answers are identical.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "raw_http.h"
#include "server_test_util.h"

namespace kvcache::testing_util {
namespace {

using nlohmann::json;

TEST(ServerDeepseekV4, RepeatedPromptIsRecomputedAndTheRefusalCounted) {
  LoadOptions lo;
  lo.dummy_cache_dir = process_scratch().file("server-v4");
  const LoadedModel lm = load_model("dummy:deepseekv4-tiny", lo);
  EngineConfig ec;
  ec.cache.paged.block_tokens = 4;
  TestServer ts(lm, "", ec);

  std::vector<int32_t> prompt;
  for (int i = 0; i < 37; ++i) prompt.push_back((i * 37 + 11) % 512);
  const json req{{"prompt", prompt}, {"max_tokens", 8}, {"temperature", 0}};
  const HttpReply a = http(ts.port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(a.status, 200) << a.body;
  const HttpReply b = http(ts.port, "POST", "/v1/completions", req.dump());
  ASSERT_EQ(b.status, 200) << b.body;
  const json ja = json::parse(a.body), jb = json::parse(b.body);
  EXPECT_EQ(ja["choices"][0]["text"], jb["choices"][0]["text"]);
  EXPECT_EQ(ja["usage"]["completion_tokens"], 8);
  // 37 tokens fill 9 blocks of 4: a model without compressed layers would hit 36 of them.
  EXPECT_EQ(jb["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << b.body;

  const std::string m = http(ts.port, "GET", "/metrics").body;
  EXPECT_GE(metric(m, "kvcache_prefix_refused_total{reason=\"compressed_state\"}"), 1) << m;
  ts.shutdown();
  EXPECT_EQ(ts.engine->check_invariants(), "");
}

}  // namespace
}  // namespace kvcache::testing_util
