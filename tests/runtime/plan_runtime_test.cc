// The plan's bill is what the runtime really allocates: after a run on stories260K, the
// cache's measured bytes() equal the planner's prediction from the same config.
#include <gtest/gtest.h>

#include <vector>

#include "golden_util.h"
#include "model/kv_plan.h"
#include "model/llama2c.h"
#include "runtime/session.h"

namespace kvcache {
namespace {

TEST(PlanRuntime, PredictionEqualsStaticCacheBytesAfterARun) {
  KVCACHE_REQUIRE_STORIES();
  const Model model(load_llama2c(testing_util::stories_dir() + "/stories260K.bin"));
  const PlanModel plan = plan_model_from_config(model.config(), "stories260K");
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 280, 365, 3, 71, 92, 265};
  for (const auto& [dtype, name] : {std::pair{DType::kF32, "f32"}, std::pair{DType::kF16, "f16"},
                                    std::pair{DType::kBF16, "bf16"}}) {
    for (int64_t len : {64, 200}) {
      SessionConfig sc;
      sc.cache.implementation = "static";
      sc.cache.max_cache_len = len;
      sc.cache.kv_dtype = dtype;
      Session session(model, sc);
      session.prefill(ids);
      PlanOptions o;
      o.format = parse_kv_format(name);
      o.context = len;
      EXPECT_EQ(static_cast<double>(session.kv_bytes()), plan_request_bytes(plan, o, len))
          << name << " max_cache_len " << len;
      // And the per-token figure: 2 (K,V) x 5 layers x 4 KV heads x 8 dims x b.
      EXPECT_EQ(compute_plan(plan, o).kv_bytes_per_token,
                2.0 * 5 * 4 * 8 * static_cast<double>(dtype_elem_size(dtype)));
    }
  }
}

}  // namespace
}  // namespace kvcache
