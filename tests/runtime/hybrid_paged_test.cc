// Hybrid models in the paged runtime (issue 38): the memory plan bills the linear-attention
// state per running sequence and the snapshot arena, exactly as the store allocates them.
// (End-to-end tests on dummy:qwen3next-tiny come with the Qwen3-Next family.)
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cache/paged_store.h"
#include "core/error.h"
#include "model/paged_plan.h"
#include "runtime/model_loader.h"

namespace kvcache {
namespace {

PagedPlanOptions hybrid_options(const ModelConfig& c, uint64_t budget, int32_t slots,
                                int32_t snapshots) {
  PagedPlanOptions po;
  po.budget_bytes = budget;
  po.block_tokens = 16;
  po.kv_dtype = DType::kF16;
  po.max_tokens_per_step = 512;
  po.max_cached_tokens = 4096;
  po.layer_types = c.layer_types;
  for (size_t l = 0; l < po.layer_types.size(); l += 2) po.layer_types[l] = "linear_attention";
  po.sliding_window = c.sliding_window;
  po.linear = {.conv_kernel = 4, .conv_dim = 96, .heads_v = 4, .head_dim_k = 16, .head_dim_v = 16};
  po.linear_slots = slots;
  po.snapshot_every_blocks = 4;
  po.max_snapshots = snapshots;
  return po;
}

TEST(HybridPagedPlan, BillsStatePerSequenceAndSnapshotsExactly) {
  const LoadedModel m = load_model("dummy:tiny");
  const ModelConfig& c = m.model->config();
  ASSERT_GE(c.layer_types.size(), 2u);
  const auto n_linear = static_cast<size_t>((c.layer_types.size() + 1) / 2);
  const size_t per_seq = n_linear * (4 * 16 * 16 + 3 * 96) * sizeof(float);
  for (const uint64_t budget : {uint64_t{0}, uint64_t{8} << 20}) {
    const PagedPlanOptions po = hybrid_options(c, budget, 8, 10);
    const PagedMemoryPlan plan = plan_paged_memory(c, po);
    EXPECT_EQ(plan.linear_bytes_per_sequence, per_seq);
    EXPECT_GE(plan.linear_state_bytes, 8 * per_seq);
    EXPECT_GE(plan.snapshot_bytes, 10 * per_seq);
    const PagedKVStore store(plan.store);
    EXPECT_EQ(store.pool_bytes(), plan.pool_bytes);
    EXPECT_EQ(store.linear_state_bytes(), plan.linear_state_bytes);
    EXPECT_EQ(store.snapshot_bytes(), plan.snapshot_bytes);
    EXPECT_EQ(store.free_linear_slots(), 8);
    if (budget > 0) {
      EXPECT_LE(plan.total_bytes(), budget);
      // The state comes out of the budget before the blocks: more state, fewer blocks.
      const PagedMemoryPlan more = plan_paged_memory(c, hybrid_options(c, budget, 64, 40));
      EXPECT_LT(more.pool_bytes, plan.pool_bytes);
      EXPECT_LE(more.total_bytes(), budget);
    }
  }
  // A budget the state alone exceeds is refused, naming the state.
  try {
    (void)plan_paged_memory(c, hybrid_options(c, uint64_t{2} << 20, 4096, 0));
    FAIL() << "a budget smaller than the state must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear-attention state"), std::string::npos) << e.what();
  }
  // No linear layers: nothing billed.
  PagedPlanOptions plain = hybrid_options(c, 0, 8, 10);
  plain.layer_types = c.layer_types;
  const PagedMemoryPlan p = plan_paged_memory(c, plain);
  EXPECT_EQ(p.linear_state_bytes + p.snapshot_bytes + p.linear_bytes_per_sequence, 0u);
}

}  // namespace
}  // namespace kvcache
