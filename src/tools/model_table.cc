#include "tools/model_table.h"

#include <fmt/format.h>

#include "core/error.h"
#include "runtime/container_report.h"
#include "runtime/model_loader.h"
#include "tools/model_options.h"

namespace kvcache::tools {

void print_model_table(const ModelTableOptions& o) {
  ModelOptions mo;
  mo.model = o.model;
  LoadedModel lm = load_model(o.model, load_options(mo));
  const Model& model = *lm.model;
  ContainerReportParams p;
  p.prompt_tokens = o.prompt;
  p.new_tokens = o.decode;
  p.kernel = o.kernel;
  fmt::print("kvcache run --model {}: {}\n", o.model, model.config().summary());
  fmt::print(
      "  greedy: {} random prompt tokens, then {} decode steps; logits compared at every step with "
      "one\n"
      "  no-cache forward over the whole sequence (normwise relative difference)\n\n",
      o.prompt, o.decode);
  fmt::print("{:<16} {:>4} {:>12} {:>14} {:>12} {:>13} {:>9} {:>9}\n", "container", "kv",
             "KV B/token", "KV bytes", "decode t/s", "max rel diff", "tol", "same ids");
  int bad = 0;
  for (const ContainerRow& r : container_report(model, p)) {
    const bool ok = r.max_rel_diff <= r.tolerance;
    bad += !ok;
    fmt::print("{:<16} {:>4} {:>12.1f} {:>14} {:>12.1f} {:>13.3g} {:>9.0e} {:>9}{}\n", r.cache,
               dtype_name(r.kv_dtype),
               static_cast<double>(r.kv_bytes) / static_cast<double>(r.tokens), r.kv_bytes,
               r.decode_tps, r.max_rel_diff, r.tolerance, r.same_ids ? "yes" : "NO",
               ok ? "" : "  <- past tolerance");
  }
  fmt::print("\n{}\n\n",
             bad == 0 ? "check: every container gives the no-cache answer within its tolerance"
                      : "check FAILED");
  if (bad != 0)
    throw Error(ErrorKind::kUnsupported, fmt::format("{} container(s) past tolerance", bad));
}

}  // namespace kvcache::tools
