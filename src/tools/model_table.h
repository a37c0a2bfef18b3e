// `kvcache run --model M`: the per-container table on a model (runtime/container_report.h).
#pragma once

#include <string>

namespace kvcache::tools {

struct ModelTableOptions {
  std::string model;  // file, folder or dummy:NAME
  int64_t prompt = 32;
  int64_t decode = 64;
  std::string kernel = "fused";
};

// Prints the table; throws Error when a container's logits leave its tolerance.
void print_model_table(const ModelTableOptions& o);

}  // namespace kvcache::tools
