#include "tools/commands.h"

namespace kvcache::tools {

void register_commands(CLI::App& app) {
  register_run(app);
  register_generate(app);
  register_logits(app);
  register_convert(app);
  register_plan(app);
  register_bench(app);
  register_tokenize(app);
  register_serve(app);
  register_batch(app);
  register_events(app);
}

}  // namespace kvcache::tools
