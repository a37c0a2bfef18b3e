// The dummy presets of the non-llama families (dummy:<preset>) that the family tests of every
// layer run on, and gtest's names for them, so that a new family is added in one place.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvcache::testing_util {

inline const std::vector<std::string>& family_presets() {
  static const std::vector<std::string> presets = {"gemma2-tiny",      "gptoss-tiny",  "mla-tiny",
                                                   "deepseek-v2-tiny", "gemma3n-tiny", "qwen3-tiny",
                                                   "phi3-tiny",        "gemma3-tiny"};
  return presets;
}

// "gemma2-tiny" -> "gemma2_tiny": a test name takes no '-'.
inline std::string preset_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
}

}  // namespace kvcache::testing_util
