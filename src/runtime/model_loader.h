// Opens what `--model` names — a llama2.c checkpoint, a GGUF file or a Hugging Face folder —
// as a Model, plus the tokenizer that goes with it and the generation conventions of its
// format (BOS handling, end tokens). The CLI and the tests share this one entry point.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/forward.h"
#include "model/mapped_file.h"
#include "model/tokenizer.h"

namespace kvcache {

struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;  // nullptr when none was found (use --prompt-ids)
  std::string tokenizer_path;
  // Generation stops after sampling one of these (not fed, not printed). llama2.c: BOS (1),
  // which separates stories, exactly as run.c stops; otherwise the model's EOS.
  std::vector<int32_t> stop_ids;
  bool add_bos = true;  // prepend BOS to an encoded prompt (llama2.c and SentencePiece do)
  // The model's own Jinja chat template, as shipped: GGUF `tokenizer.chat_template`, or
  // `chat_template` of tokenizer_config.json beside an HF tokenizer.json (a string, or the
  // entry named "default" of a list). Empty: the model has none. The server classifies it.
  std::string chat_template;
};

struct LoadOptions {
  std::string tokenizer_path;      // empty: look beside the model (tokenizer.bin, tok512.bin)
  bool require_tokenizer = false;  // throw when none is found
  // For --model dummy:NAME[:DTYPE]: the SentencePiece vocabulary GGUF to embed (empty: none)
  // and where the generated GGUF is kept (empty: the user's cache folder).
  std::string dummy_vocab;
  std::string dummy_cache_dir;
  // Model load progress. When set and the weights exceed kProgressMinBytes, load_model pages
  // every weight in (one read per 4 KiB page, in address order) and calls this after each
  // chunk of kProgressChunkBytes and once at the end (done == total). Without it, pages come
  // in lazily at first use (the mmap default) and nothing is reported.
  std::function<void(uint64_t done_bytes, uint64_t total_bytes)> on_progress;
  // How the model file's bytes get into memory (model/mapped_file.h): mapped (the default), or
  // read into transparent-huge-page memory (`--no-mmap`: faster decode, private memory).
  MapMode map_mode = MapMode::kMap;
};

inline constexpr uint64_t kProgressMinBytes = 100ull << 20;
inline constexpr uint64_t kProgressChunkBytes = 8ull << 20;

// Reads one byte of every page under every weight of `file` (so later first-touch page faults
// do not land inside the timed forward pass), reporting progress as above. Returns the bytes
// paged in (weights, shared tensors counted once).
uint64_t page_in_weights(
    const ModelFile& file,
    const std::function<void(uint64_t done_bytes, uint64_t total_bytes)>& on_progress);

// `path` may also be "dummy:NAME[:DTYPE]" (model/dummy.h: a seeded random-weight GGUF, f16
// unless DTYPE says f32/bf16/q8_0). Throws Error naming the file and the problem (format,
// size, missing tensor, ...).
LoadedModel load_model(const std::string& path, const LoadOptions& options = {});

}  // namespace kvcache
