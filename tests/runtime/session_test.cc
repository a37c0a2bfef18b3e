// Prefill-then-decode equals token-by-token decode equals a no-cache recompute.
#include "runtime/session.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "golden_util.h"
#include "model/llama2c.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

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

// A NaN in the cache (a fault) is not hidden on its way out: one key of layer 0 set to NaN makes
// every logit of the next decode NaN (the attention rows that see it, then o_proj and the rest),
// with the eager and the fused kernels, and the sampler refuses those logits with an error
// instead of returning a token.
TEST(Session, ANaNKeyInTheCacheReachesTheLogitsAndTheSamplerRefusesThem) {
  KVCACHE_REQUIRE_STORIES();
  const Model model(load_llama2c(testing_util::stories_dir() + "/stories260K.bin"));
  const auto golden = testing_util::read_golden_ids("once_upon_a_time");
  for (const char* cache : {"dynamic", "static"})
    for (const char* kernel : {"eager", "fused"}) {
      SessionConfig sc;
      sc.cache.implementation = cache;
      sc.kernel = kernel;
      Session s(model, sc);
      s.prefill(golden.prompt);
      KVSpan span;
      ASSERT_TRUE(s.cache().layer(0).stored(&span)) << cache;
      if (span.k.dtype() == DType::kF32)
        *span.k.ptr_as<float>(0, 0, 1, 0) = NAN;
      else
        *span.k.ptr_as<uint16_t>(0, 0, 1, 0) = 0x7fc0;  // a NaN in f16 and in bf16
      const auto logits = s.decode(golden.generated[0]);
      for (const float x : logits) ASSERT_TRUE(std::isnan(x)) << cache << "/" << kernel;
      SamplerParams sp;
      sp.temperature = 0.0f;
      Sampler sampler(sp, model.config().vocab_size);
      EXPECT_THROW(sampler.sample(logits, {}), Error) << cache << "/" << kernel;
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
