// Dummy models, like vLLM's `--load-format dummy`: a preset architecture with seeded random
// weights, written as a real GGUF and then loaded through the real GGUF loader — so benchmarks
// and demos exercise exactly the code a downloaded model would, without downloading one.
// Presets: "tiny" (tests: dim 64, 2 layers) and "llama-125m" (dim 768, 12 layers, 12 query
// heads over 4 KV heads, FFN 2048, vocab 32000) as GGUF; "gemma2-tiny", "gptoss-tiny" and
// "mla-tiny" (DeepSeek-V3 MLA + MoE) as Hugging Face folders through the safetensors loader. When a
// SentencePiece vocabulary GGUF is given
// (../shared/vocab/ggml-vocab-llama-spm.gguf), its tokenizer.ggml.* metadata is embedded so
// text prompts work.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_file.h"

namespace kvcache {

struct DummyModelOptions {
  std::string preset = "tiny";
  DType weight_dtype = DType::kF16;  // matrices; norms stay f32
  uint64_t seed = 0;
  std::string vocab_gguf;  // optional GGUF whose tokenizer.ggml.* keys are copied
  std::string cache_dir;   // where the GGUF goes; empty: $KVCACHE_CACHE_DIR,
                           // $XDG_CACHE_HOME/kvcache, ~/.cache/kvcache
};

// Where generated and built-in models are written: $KVCACHE_CACHE_DIR, else
// $XDG_CACHE_HOME/kvcache, else ~/.cache/kvcache, else the temp folder's kvcache.
std::string default_model_cache_dir();

std::vector<std::string> dummy_preset_names();
// The preset's config; throws Error naming the known presets.
ModelConfig dummy_preset(const std::string& name);

// Writes (or reuses, when an identical one exists) the dummy GGUF and returns its path.
// "dummy:NAME[:DTYPE]" parsing is the caller's (runtime's load_model).
std::string build_dummy_gguf(const DummyModelOptions& options);
// The other families' presets (gemma2-tiny, gptoss-tiny, mla-tiny) are Hugging Face folders:
// config.json (the preset's text) + model.safetensors with the transformers tensor names
// (model/weight_spec.h), f32/f16/bf16. Returns the folder.
std::string build_dummy_hf(const DummyModelOptions& options);
bool dummy_preset_is_hf(const std::string& name);
std::string dummy_preset_config_json(const std::string& name);  // throws for GGUF presets
// build_dummy_hf or build_dummy_gguf, whichever the preset is.
std::string build_dummy_model(const DummyModelOptions& options);

}  // namespace kvcache
