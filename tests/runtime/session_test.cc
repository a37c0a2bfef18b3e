// Prefill-then-decode equals token-by-token decode equals a no-cache recompute.
#include "runtime/session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "golden_util.h"
#include "model/llama2c.h"
#include "runtime/generate.h"

namespace kvcache {
namespace {

TEST(Session, PrefillThenDecodeEqualsTokenByTokenAndRecompute) {
  KVCACHE_REQUIRE_STORIES();
  const Model model(load_llama2c(testing_util::stories_dir() + "/stories260K.bin"));
  const auto golden = testing_util::read_golden_ids("once_upon_a_time");
  std::vector<int32_t> seq = golden.prompt;
  seq.insert(seq.end(), golden.generated.begin(), golden.generated.begin() + 40);
  const size_t n_prefill = 29;
  for (const char* cache : {"dynamic", "static"}) {
    for (const char* kernel : {"eager", "fused"}) {
      SessionConfig sc;
      sc.cache.implementation = cache;
      sc.kernel = kernel;
      sc.prefill_chunk = 16;  // two chunks: the second attends to keys cached by the first
      Session a(model, sc), b(model, sc);
      Forward oracle(model, kernel, static_cast<int64_t>(seq.size()));
      double worst = 0, worst_oracle = 0;
      const std::vector<float> pa = [&] {
        auto l = a.prefill({seq.data(), n_prefill});
        return std::vector<float>(l.begin(), l.end());
      }();
      std::vector<float> pb;
      for (size_t i = 0; i < n_prefill; ++i) {
        auto l = b.decode(seq[i]);
        pb.assign(l.begin(), l.end());
      }
      worst = max_rel_diff(pa, pb);
      for (size_t i = n_prefill; i < seq.size(); ++i) {
        auto la = a.decode(seq[i]);
        const std::vector<float> va(la.begin(), la.end());
        auto lb = b.decode(seq[i]);
        worst = std::max(worst, max_rel_diff(va, lb));
        auto lo = recompute_last_logits(oracle, {seq.data(), i + 1});
        worst_oracle = std::max(worst_oracle, max_rel_diff(va, lo));
      }
      EXPECT_EQ(a.position(), static_cast<int64_t>(seq.size()));
      EXPECT_LE(worst, 1e-5) << cache << "/" << kernel;
      EXPECT_LE(worst_oracle, 1e-5) << cache << "/" << kernel;
      std::printf("[%s/%s] prefill+decode vs token-by-token: %.3g, vs no-cache recompute: %.3g\n",
                  cache, kernel, worst, worst_oracle);
    }
  }
}

TEST(Session, StaticCacheFullIsAnErrorNotACrash) {
  KVCACHE_REQUIRE_STORIES();
  const Model model(load_llama2c(testing_util::stories_dir() + "/stories260K.bin"));
  SessionConfig sc;
  sc.cache.implementation = "static";
  sc.cache.max_cache_len = 4;
  Session s(model, sc);
  const std::vector<int32_t> ids = {1, 403, 407, 261};
  s.prefill(ids);
  EXPECT_THROW(s.decode(378), Error);
}

TEST(Session, OutOfVocabularyIdIsAnError) {
  KVCACHE_REQUIRE_STORIES();
  const Model model(load_llama2c(testing_util::stories_dir() + "/stories260K.bin"));
  Session s(model, SessionConfig{});
  EXPECT_THROW(s.decode(512), Error);
  EXPECT_THROW(s.decode(-1), Error);
  EXPECT_EQ(s.position(), 0);
}

}  // namespace
}  // namespace kvcache
