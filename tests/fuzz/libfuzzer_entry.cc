// libFuzzer's entry point for one target: `make fuzz` compiles this file once per target with
// KVCACHE_FUZZ_FUNCTION naming the target's function (fuzz_targets.h), and for the targets
// whose input is JSON with KVCACHE_FUZZ_JSON, which adds the structure-aware mutation of
// json_mutator.h.
#include "fuzz_targets.h"

#ifndef KVCACHE_FUZZ_FUNCTION
#error "compile with -DKVCACHE_FUZZ_FUNCTION=fuzz_<target>"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kvcache::fuzz::KVCACHE_FUZZ_FUNCTION(data, size);
}

#ifdef KVCACHE_FUZZ_JSON
#include "json_mutator.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  return kvcache::fuzz::mutate_json(data, size, max_size, seed, LLVMFuzzerMutate);
}
#endif
