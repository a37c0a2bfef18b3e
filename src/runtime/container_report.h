// The per-container comparison `kvcache run --model` prints: the same greedy generation on a
// real (or dummy) model through every cache implementation and KV dtype, with what each costs
// (KV bytes per token, total KV bytes, decode tok/s) and how far its logits are from a
// no-cache recompute — swapping the container changes memory and speed, never the answer
// (f32: to rounding; f16/bf16: within their stated tolerance).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/forward.h"

namespace kvcache {

struct ContainerReportParams {
  int64_t prompt_tokens = 32;       // seeded random ids
  int64_t new_tokens = 64;          // greedy decode steps
  std::vector<std::string> caches;  // empty: every implementation registered for the layer types
  std::vector<DType> kv_dtypes = {DType::kF32, DType::kF16, DType::kBF16};
  std::string kernel = "fused";
  uint64_t seed = 1;
};

struct ContainerRow {
  std::string cache;  // implementation ("dynamic", "static", "dynamic+window")
  DType kv_dtype = DType::kF32;
  int64_t tokens = 0;   // positions in the cache at the end
  size_t kv_bytes = 0;  // resident at the end
  double decode_tps = 0.0;
  double max_rel_diff = 0.0;  // vs one no-cache forward over the whole sequence (every step)
  double tolerance = 0.0;     // verify_tolerance_for(kv_dtype)
  bool same_ids = true;       // greedy ids equal to the first row of the same dtype
};

std::vector<ContainerRow> container_report(const Model& model, const ContainerReportParams& params);

}  // namespace kvcache
