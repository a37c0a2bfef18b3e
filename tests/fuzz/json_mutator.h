// A structure-aware mutation for the JSON targets (config.json, tokenizer.json, OpenAI request
// bodies): parses the input and changes one node — a value replaced by one of another type or
// an extreme one, a key (from anywhere in the document) added to an object, a node removed or
// duplicated — so that "type": 3 where a parser expects a string is one step away. Byte-level
// mutations alone almost never turn a valid document into another valid one. Used only by the
// libFuzzer build (libfuzzer_entry.cc's LLVMFuzzerCustomMutator); half the time, and whenever
// the input does not parse, libFuzzer's own byte mutations run instead.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcache::fuzz {

// Mutates data[0, size) in place into at most max_size bytes; returns the new size. An input
// that holds a NUL byte has its JSON before the NUL mutated and the rest kept (hf_tokenizer's
// tokenizer_config.json rides behind one). `byte_mutate` is libFuzzer's LLVMFuzzerMutate.
size_t mutate_json(uint8_t* data, size_t size, size_t max_size, unsigned int seed,
                   size_t (*byte_mutate)(uint8_t* data, size_t size, size_t max_size));

}  // namespace kvcache::fuzz
