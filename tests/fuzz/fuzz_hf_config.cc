// Hugging Face config.json, through both readers: parse_hf_config (what the model loader runs;
// every family, rope scaling, MoE, MLA, Gemma-3n) with the planner model the runtime derives
// from it, and the planner's own lenient reader plan_model_from_hf_json with the plan and its
// three renderings — `kvcache plan --config` (with and without a budget).
#include "core/error.h"
#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "model/hf_config.h"
#include "model/kv_plan.h"

namespace kvcache::fuzz {

namespace {

void render_plan(const PlanModel& m, const PlanOptions& o) {
  const PlanResult r = compute_plan(m, o);
  (void)plan_table(m, o, r);
  (void)plan_json(m, o, r);
  (void)plan_svg(m, o);
}

}  // namespace

int fuzz_hf_config(const uint8_t* data, size_t size) {
  const std::string text(as_text(data, size));
  try {
    const ModelConfig c = parse_hf_config(text, "fuzz/config.json");
    (void)c.summary();
    render_plan(plan_model_from_config(c, "fuzz"), PlanOptions{});
  } catch (const Error&) {
  }
  try {
    const PlanModel m = plan_model_from_hf_json(text, "fuzz/config.json");
    PlanOptions o;
    render_plan(m, o);
    o.budget_bytes = uint64_t{24} << 30;
    o.format = parse_kv_format("q4", 64);
    o.block_tokens = 16;
    render_plan(m, o);
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace kvcache::fuzz
