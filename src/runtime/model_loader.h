// Opens what `--model` names — a llama2.c checkpoint, a GGUF file or a Hugging Face folder —
// as a LlamaModel, plus the tokenizer that goes with it and the generation conventions of its
// format (BOS handling, end tokens). The CLI and the tests share this one entry point.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/llama.h"
#include "model/tokenizer.h"

namespace kvcache {

struct LoadedModel {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<Tokenizer> tokenizer;  // nullptr when none was found (use --prompt-ids)
  std::string tokenizer_path;
  // Generation stops after sampling one of these (not fed, not printed). llama2.c: BOS (1),
  // which separates stories, exactly as run.c stops; otherwise the model's EOS.
  std::vector<int32_t> stop_ids;
  bool add_bos = true;  // prepend BOS to an encoded prompt (llama2.c and SentencePiece do)
};

struct LoadOptions {
  std::string tokenizer_path;  // empty: look beside the model (tokenizer.bin, tok512.bin)
  bool require_tokenizer = false;  // throw when none is found
  // For --model dummy:NAME[:DTYPE]: the SentencePiece vocabulary GGUF to embed (empty: none)
  // and where the generated GGUF is kept (empty: the user's cache folder).
  std::string dummy_vocab;
  std::string dummy_cache_dir;
};

// `path` may also be "dummy:NAME[:DTYPE]" (model/dummy.h: a seeded random-weight GGUF, f16
// unless DTYPE says f32/bf16/q8_0). Throws Error naming the file and the problem (format,
// size, missing tensor, ...).
LoadedModel load_model(const std::string& path, const LoadOptions& options = {});

}  // namespace kvcache
