// libFuzzer's entry point for one target: `make fuzz` compiles this file once per target with
// KVCACHE_FUZZ_FUNCTION naming the target's function (fuzz_targets.h).
#include "fuzz_targets.h"

#ifndef KVCACHE_FUZZ_FUNCTION
#error "compile with -DKVCACHE_FUZZ_FUNCTION=fuzz_<target>"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kvcache::fuzz::KVCACHE_FUZZ_FUNCTION(data, size);
}
