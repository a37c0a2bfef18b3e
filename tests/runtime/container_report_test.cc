#include "runtime/container_report.h"

#include <gtest/gtest.h>

#include "golden_util.h"
#include "model/llama2c.h"

namespace kvcache {
namespace {

TEST(ContainerReport, EveryContainerGivesTheNoCacheAnswer) {
  KVCACHE_REQUIRE_STORIES();
  const Model model(load_llama2c(testing_util::stories_dir() + "/stories260K.bin"));
  ContainerReportParams p;
  p.prompt_tokens = 9;
  p.new_tokens = 24;
  const std::vector<ContainerRow> rows = container_report(model, p);
  ASSERT_GE(rows.size(), 6u);  // dynamic, static (+window) x 3 dtypes
  const size_t per_token_f32 = 2 * 5 * 32 * 4;
  for (const ContainerRow& r : rows) {
    EXPECT_EQ(r.tokens, 32);  // 9 + 24 - 1 fed
    EXPECT_LE(r.max_rel_diff, r.tolerance) << r.cache << " " << dtype_name(r.kv_dtype);
    if (r.kv_dtype == DType::kF32) {
      EXPECT_LE(r.max_rel_diff, 1e-5) << r.cache;
      EXPECT_TRUE(r.same_ids) << r.cache;
    }
    if (r.cache == "static") {  // capacity = prompt + new tokens, exactly
      const size_t elem = r.kv_dtype == DType::kF32 ? 4 : 2;
      EXPECT_EQ(r.kv_bytes, per_token_f32 / 4 * elem * 33) << dtype_name(r.kv_dtype);
    }
  }
}

}  // namespace
}  // namespace kvcache
