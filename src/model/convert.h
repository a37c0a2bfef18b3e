// Conversion of any loaded ModelFile (llama2.c, GGUF, HF safetensors) into a GGUF v3 file of
// architecture `llama` with our GGUF writer: llama metadata, the canonical tensors (matrices
// optionally re-encoded as f16/bf16/q8_0; norms stay f32; Q/K rows of half-split-RoPE models
// such as HF checkpoints permuted to the interleaved order GGUF `llama` implies), and — when a
// llama2.c tokenizer is given — its vocabulary as a SentencePiece (`llama`) tokenizer: ' ' becomes
// U+2581, <s>/</s> are control tokens, <0xNN> byte tokens, scores kept, so llama.cpp-style
// tokenizers reproduce its ids.
#pragma once

#include <optional>
#include <string>

#include "core/dtype.h"
#include "model/model_file.h"

namespace kvcache {

class Llama2cTokenizer;

struct GgufConvertOptions {
  // Dtype of 2-D weight matrices; unset keeps each tensor's own dtype. q8_0 applies only to
  // rows whose length is a multiple of 32 (others stay as they are).
  std::optional<DType> matrix_dtype;
  const Llama2cTokenizer* tokenizer = nullptr;  // vocabulary to embed, or none
};

// Writes `out_path`. Throws Error(kIo) when it cannot be written, Error(kUnsupported) for
// tensors whose dtype cannot be converted.
void convert_to_gguf(const ModelFile& model, const GgufConvertOptions& options,
                     const std::string& out_path);

}  // namespace kvcache
