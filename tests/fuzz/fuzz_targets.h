// The fuzz targets: one plain function per parser of outside bytes, each in its own file
// (fuzz_<name>.cc). libFuzzer calls them through libfuzzer_entry.cc (`make fuzz`); the normal
// build replays every file of corpus/<name>/ and regressions/<name>/ through the same functions
// (fuzz_replay_test.cc), so the targets never rot and every crash found stays a test.
// Contract: a target returns 0 and lets only findings escape. Expected refusals
// (kvcache::Error, the server's ApiError) are caught inside; anything else (a library
// exception, a crash, a sanitizer report, a timeout, a huge allocation) is a bug in the parser.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace kvcache::fuzz {

// GgufFile, every metadata getter and tensor view, load_gguf_model, the planner's GGUF reader,
// tokenizer_from_gguf with encode/decode.
int fuzz_gguf(const uint8_t* data, size_t size);
// SafetensorsFile (header JSON, dtypes, shapes, offsets, overlaps), the ModelFile built from it
// against a tiny llama config, and the shard index JSON.
int fuzz_safetensors(const uint8_t* data, size_t size);
// A llama2.c checkpoint: header checks, the size it implies, the tensor views.
int fuzz_llama2c_checkpoint(const uint8_t* data, size_t size);
// A llama2.c tokenizer.bin: entry counting, loading (as counted and as a 512-token vocabulary),
// encode/decode.
int fuzz_llama2c_tokenizer(const uint8_t* data, size_t size);
// config.json: parse_hf_config (+ the planner model built from it) and the planner's own reader
// plan_model_from_hf_json with the plan, its table, JSON and SVG.
int fuzz_hf_config(const uint8_t* data, size_t size);
// tokenizer.json [NUL tokenizer_config.json]: parse_hf_tokenizer with encode/decode.
int fuzz_hf_tokenizer(const uint8_t* data, size_t size);
// An OpenAI request body: parse_api_request as completions and as chat (each chat template),
// with and without a tokenizer.
int fuzz_openai_request(const uint8_t* data, size_t size);
// Chat templates: classifying / choosing a model's Jinja template, encode_chat of fuzzed
// messages with either tiny tokenizer (input layout in fuzz_chat_template.cc).
int fuzz_chat_template(const uint8_t* data, size_t size);
// One raw HTTP/1.1 request through HttpServer::handle_raw (cpp-httplib's parser, every route)
// served by an Engine on a tiny model; the engine must hold no block afterwards.
int fuzz_http(const uint8_t* data, size_t size);

struct Target {
  std::string_view name;  // the folder name under corpus/ and regressions/
  int (*run)(const uint8_t* data, size_t size);
};
std::span<const Target> all_targets();

}  // namespace kvcache::fuzz
