// Shared helpers of the runtime tests: llama2.c's golden ids, its greedy generation and
// comparisons of logits (where ../shared's data lives and how to read it: shared_data.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/softmax.h"
#include "runtime/session.h"
#include "shared_data.h"

namespace kvcache::testing_util {

// Bit-for-bit equality of two logit rows (the normwise relative difference is
// kvcache::max_rel_diff, runtime/generate.h).
inline bool bits_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct GoldenIds {
  std::vector<int32_t> prompt, generated;
};

// Parses "<name>.ids": lines "prompt_ids: ..." and "generated_ids: ..." (comments start with #).
inline GoldenIds read_golden_ids(const std::string& name) {
  GoldenIds g;
  std::istringstream in(read_file(golden_dir() + "/" + name + ".ids"));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    std::vector<int32_t>* dst = key == "prompt_ids:"      ? &g.prompt
                                : key == "generated_ids:" ? &g.generated
                                                          : nullptr;
    if (dst == nullptr) continue;
    int32_t id;
    while (ls >> id) dst->push_back(id);
  }
  return g;
}

// Greedy ids as llama2.c's generate() picks them, up to `new_tokens` or BOS (which separates
// stories: llama2.c stops there). llama2.c forces the prompt token by token; this prefills it in
// one chunk instead.
inline std::vector<int32_t> greedy_ids(Session& s, const std::vector<int32_t>& prompt,
                                       int64_t new_tokens) {
  std::vector<int32_t> out;
  std::span<const float> logits = s.prefill(prompt);
  for (int64_t i = 0; i < new_tokens; ++i) {
    const auto next =
        static_cast<int32_t>(argmax(logits.data(), static_cast<int64_t>(logits.size())));
    out.push_back(next);
    if (next == 1) break;
    if (i + 1 < new_tokens) logits = s.decode(next);
  }
  return out;
}

}  // namespace kvcache::testing_util
