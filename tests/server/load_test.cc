// Load without loss: 64 concurrent clients (random prompts, n, stop strings, temperatures; a
// quarter of the streams dropped mid-reply) against a block pool small enough to force
// preemption, the engine checking its invariants after every step (a broken one ends the
// process, failing the test). Afterwards every block is back in the pool and a deterministic
// request returns exactly what it returned before the load. The large-scale run is
// bench/bench_chaos.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "chaos_load.h"
#include "raw_http.h"
#include "server_test_util.h"

namespace kvcache {
namespace {

using nlohmann::json;

TEST(LoadTest, SixtyFourChaoticClientsLeaveNoBlockBehindAndChangeNoAnswer) {
  const LoadedModel* lm = testing_util::tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf";
  testing_util::TestServerOptions o;
  o.engine.num_blocks = 40;  // 640 tokens for 64 clients of up to ~100 tokens each: preemption
  o.engine.max_tokens_per_step = 64;
  o.engine.check_invariants_every_step = true;
  o.http.transport.max_connections = 512;
  testing_util::TestServer ts(*lm, o);

  const std::string probe =
      R"({"prompt": "Once upon a time there was", "max_tokens": 16, "temperature": 0,
                                "ignore_eos": true})";
  const testing_util::HttpReply before =
      testing_util::http(ts.port, "POST", "/v1/completions", probe, "", 30);
  ASSERT_EQ(before.status, 200) << before.body;
  const std::string text = json::parse(before.body)["choices"][0]["text"];

  testing_util::ChaosOptions co;
  co.clients = 64;
  co.requests_per_client = 2;
  co.seed = 36;
  const testing_util::ChaosResult r = testing_util::run_chaos(ts.port, co);
  std::printf(
      "chaos: %lld requests in %.1f s: %lld completed, %lld dropped mid-stream, %lld refused\n",
      static_cast<long long>(r.requests), r.seconds, static_cast<long long>(r.completed),
      static_cast<long long>(r.disconnected), static_cast<long long>(r.refused));
  for (const std::string& p : r.problems) ADD_FAILURE() << p;
  EXPECT_EQ(r.requests, 128);
  EXPECT_GT(r.completed, 64);
  EXPECT_GT(r.disconnected, 0);

  // Cancellations of dropped streams reach the engine at its next steps.
  EngineMetrics m = ts.engine->metrics();
  for (int i = 0; i < 200 && (m.running > 0 || m.waiting > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    m = ts.engine->metrics();
  }
  EXPECT_EQ(m.running, 0);
  EXPECT_EQ(m.waiting, 0);
  EXPECT_EQ(m.blocks_used, 0) << "blocks leaked";
  EXPECT_EQ(m.blocks_free + m.blocks_cached, m.blocks_total);
  std::printf("engine: %lld preemptions, %lld cancelled, %lld steps\n",
              static_cast<long long>(m.preemptions), static_cast<long long>(m.requests_cancelled),
              static_cast<long long>(m.steps));
  EXPECT_GT(m.preemptions, 0) << "the pool was meant to force preemption";
  EXPECT_GT(m.requests_cancelled, 0);
  EXPECT_EQ(m.requests_failed, 0);

  const testing_util::HttpReply after =
      testing_util::http(ts.port, "POST", "/v1/completions", probe, "", 30);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(json::parse(after.body)["choices"][0]["text"], text);
  ts.shutdown();
  EXPECT_EQ(ts.engine->check_invariants(), "");
}

}  // namespace
}  // namespace kvcache
