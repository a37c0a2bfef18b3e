// stories260K against llama2.c's golden outputs: ids, logits and text, through every dense
// cache container and both attention kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "golden_util.h"
#include "kernels/softmax.h"
#include "model/forward.h"
#include "model/llama2c.h"
#include "runtime/session.h"

namespace kvcache {
namespace {

using testing_util::golden_dir;
using testing_util::read_golden_ids;
using testing_util::stories_dir;

const Model& stories() {
  static const Model model(load_llama2c(stories_dir() + "/stories260K.bin"));
  return model;
}

struct Variant {
  const char* cache;
  const char* kernel;
  int64_t window;  // > 0: every layer sliding with this window
};

class GoldenIdsTest : public ::testing::TestWithParam<Variant> {};

TEST_P(GoldenIdsTest, GreedyIdsMatchLlama2c) {
  KVCACHE_REQUIRE_STORIES();
  const Variant var = GetParam();
  if (var.window > 0 && !LayerRegistry::contains(var.cache, "sliding_attention")) {
    GTEST_SKIP() << "no " << var.cache << "/sliding_attention container registered yet";
  }
  for (const char* name : {"once_upon_a_time", "empty"}) {
    const auto golden = read_golden_ids(name);
    SessionConfig sc;
    sc.cache.implementation = var.cache;
    sc.kernel = var.kernel;
    sc.sliding_window_override = var.window;
    Session s(stories(), sc);
    // llama2.c ran 256 positions; the last sampled id is never fed back.
    const int64_t n = 256 - static_cast<int64_t>(golden.prompt.size()) + 1;
    EXPECT_EQ(testing_util::greedy_ids(s, golden.prompt, n), golden.generated) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Containers, GoldenIdsTest,
                         ::testing::Values(Variant{"dynamic", "eager", 0},
                                           Variant{"dynamic", "fused", 0},
                                           Variant{"static", "eager", 0},
                                           Variant{"static", "fused", 0},
                                           Variant{"dynamic", "fused", 256}),
                         [](const auto& info) {
                           return std::string(info.param.cache) + "_" + info.param.kernel +
                                  (info.param.window > 0 ? "_sliding" : "");
                         });

TEST(Golden, FirstEightLogitsWithin1e4) {
  KVCACHE_REQUIRE_STORIES();
  const std::string raw = testing_util::read_file(golden_dir() + "/logits_once_upon_a_time.f32");
  ASSERT_EQ(raw.size(), 8u * 512 * 4);
  std::vector<float> want(8 * 512);
  std::memcpy(want.data(), raw.data(), raw.size());
  const auto golden = read_golden_ids("once_upon_a_time");
  std::vector<int32_t> seq = golden.prompt;
  seq.insert(seq.end(), golden.generated.begin(), golden.generated.end());
  for (const char* kernel : {"eager", "fused"}) {
    SessionConfig sc;
    sc.kernel = kernel;
    Session s(stories(), sc);
    double worst = 0;
    for (int p = 0; p < 8; ++p) {  // token by token, as llama2.c
      std::span<const float> got = s.decode(seq[p]);
      for (int i = 0; i < 512; ++i)
        worst = std::max(worst, double(std::fabs(got[i] - want[p * 512 + i])));
    }
    EXPECT_LE(worst, 1e-4) << kernel;
    std::printf("[%s] max |logit - llama2.c| over 8 positions: %.3g\n", kernel, worst);
    // One 8-token prefill (BLAS path) gives the same logits within the same bound.
    Session s2(stories(), sc);
    std::span<const float> all = s2.forward_all({seq.data(), 8});
    double worst_all = 0;
    for (int i = 0; i < 8 * 512; ++i)
      worst_all = std::max(worst_all, double(std::fabs(all[i] - want[i])));
    EXPECT_LE(worst_all, 1e-4) << kernel;
  }
}

}  // namespace
}  // namespace kvcache
