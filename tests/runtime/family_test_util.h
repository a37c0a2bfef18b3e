// Helpers of the per-family tests on dummy presets (qwen3_next_family_test.cc,
// deepseek_v4_family_test.cc, and the reference tests): the preset's folder in the process's
// scratch, a deterministic prompt, the largest difference of two logit rows, the message of an
// expected Error.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/dummy.h"
#include "scratch_dir.h"

namespace kvcache::testing_util {

// The process's scratch folder for `tag`.
inline std::string family_scratch(const std::string& tag) {
  return process_scratch().file(tag);
}

// dummy:<preset> written as an f32 Hugging Face folder (seed 7) under family_scratch(tag).
inline std::string family_folder(const std::string& preset, const std::string& tag) {
  DummyModelOptions o;
  o.preset = preset;
  o.weight_dtype = DType::kF32;
  o.seed = 7;
  o.cache_dir = family_scratch(tag);
  return build_dummy_model(o);
}

// n ids (i * 37 + 11) mod vocab.
inline std::vector<int32_t> ramp_prompt(int64_t n, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return ids;
}

// The largest |a[i] - b[i]| over two equally long sequences of numbers (a size mismatch fails
// the test and compares the common part).
template <typename A, typename B>
double max_abs_diff(const A& a, const B& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min<size_t>(a.size(), b.size()); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

// What f throws as an Error, or "no error".
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace kvcache::testing_util
