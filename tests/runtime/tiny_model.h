// dummy:tiny, built once per test process into its scratch folder and shared by the engine
// tests that run in that process.
#pragma once

#include "runtime/model_loader.h"
#include "scratch_dir.h"

namespace kvcache::testing_util {

inline const LoadedModel& tiny_model() {
  static const LoadedModel m = [] {
    LoadOptions lo;
    lo.dummy_cache_dir = process_scratch().file("tiny");
    return load_model("dummy:tiny", lo);
  }();
  return m;
}

}  // namespace kvcache::testing_util
