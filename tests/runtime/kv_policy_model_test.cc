// Lossy KV policies on a real model (stories260K, fp32): with a budget that covers the whole
// sequence each policy gives the exact logits bit for bit (the queries reach H2O and SnapKV
// through the GQA attention, and nothing is evicted); with a small budget each one evicts and
// the logits move away from exact — by how much is docs/architecture.md's "Lossy KV policies"
// table (scripts/policy_quality.sh).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cache/evicting_layer.h"
#include "model/llama2c.h"
#include "runtime/session.h"
#include "shared_data.h"

namespace kvcache {
namespace {

// The prompt (one prefill) then `decode` tokens fed one by one; every position's logits.
std::vector<float> run(const Model& model, const std::string& spec, int64_t* evicted) {
  SessionConfig sc;
  sc.cache.policy = KVPolicy::parse(spec);
  Session s(model, sc);
  std::vector<int32_t> prompt;
  for (int32_t i = 0; i < 40; ++i) prompt.push_back(1 + (i * 37) % 500);
  std::span<const float> l = s.forward_all(prompt);
  std::vector<float> all(l.begin(), l.end());
  for (int32_t i = 0; i < 60; ++i) {
    l = s.decode(1 + (i * 11) % 500);
    all.insert(all.end(), l.begin(), l.end());
  }
  *evicted = 0;
  for (int i = 0; i < s.cache().num_layers(); ++i)
    if (auto* e = dynamic_cast<const EvictingLayer*>(&s.cache().layer(i)))
      *evicted += e->evicted_tokens();
  return all;
}

TEST(KVPolicyModel, CoveringBudgetsAreExactAndSmallOnesEvict) {
  KVCACHE_REQUIRE_STORIES();
  const Model model(load_llama2c(testing_util::stories_model()));
  int64_t evicted = 0;
  const std::vector<float> exact = run(model, "exact", &evicted);
  for (const char* spec : {"streaming:sink=4,window=200", "h2o:heavy=100,recent=100",
                           "snapkv:budget=64,window=8,kernel=7"}) {
    SCOPED_TRACE(spec);
    const std::vector<float> got = run(model, spec, &evicted);
    ASSERT_EQ(got.size(), exact.size());
    EXPECT_EQ(evicted, 0);
    EXPECT_EQ(std::memcmp(got.data(), exact.data(), got.size() * sizeof(float)), 0);
  }
  for (const char* spec : {"streaming:sink=4,window=16", "h2o:heavy=8,recent=8",
                           "snapkv:budget=16,window=4,kernel=3"}) {
    SCOPED_TRACE(spec);
    const std::vector<float> got = run(model, spec, &evicted);
    EXPECT_GT(evicted, 0);
    EXPECT_NE(std::memcmp(got.data(), exact.data(), got.size() * sizeof(float)), 0);
    // The prompt's logits come from the prefill step, before any eviction: still exact.
    const size_t vocab = exact.size() / 100;
    EXPECT_EQ(std::memcmp(got.data(), exact.data(), 40 * vocab * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace kvcache
