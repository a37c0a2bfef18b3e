// What the remote tier's engine tests share: a seeded random prompt, and one request run to the
// end on an engine (its invariants checked).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace kvcache::testing_util {

inline std::vector<int32_t> random_prompt(size_t n, uint32_t seed, uint32_t vocab = 31000) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p = {1};
  while (p.size() < n) p.push_back(static_cast<int32_t>(rng() % (vocab - 3)) + 3);
  return p;
}

inline RequestOutput run_one(Engine& e, const std::vector<int32_t>& prompt,
                             const std::string& salt = "", int64_t max_tokens = 4) {
  RequestParams rp;
  rp.prompt = prompt;
  rp.max_tokens = max_tokens;
  rp.cache_salt = salt;
  RequestOutput out;
  EXPECT_NE(e.submit(rp,
                     [&out](const StreamEvent& ev) {
                       if (ev.output != nullptr) out = *ev.output;
                     }),
            0u);
  e.run_until_idle();
  EXPECT_EQ(e.check_invariants(), "");
  return out;
}

}  // namespace kvcache::testing_util
