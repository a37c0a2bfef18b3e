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
#include <vector>

#include "core/dtype.h"
#include "model/model_file.h"

namespace kvcache {

class Llama2cTokenizer;

// llama.cpp's mixed quantisations (llama-quantize), the dtype chosen per tensor.
enum class QuantMix {
  kNone,
  // Q4_K_M (llama.cpp src/llama-quant.cpp, llama_tensor_get_type, LLAMA_FTYPE_MOSTLY_Q4_K_M),
  // simplified to the llama architecture: output.weight q6_K; blk.N.attn_v and blk.N.ffn_down
  // q6_K in the layers where llama.cpp's use_more_bits(N, n_layers) holds (the first and last
  // eighth, and every third layer between), q4_K elsewhere; every other matrix q4_K.
  kQ4_K_M,
};

struct GgufConvertOptions {
  // Dtype of 2-D weight matrices; unset keeps each tensor's own dtype. q8_0 applies only to
  // rows whose length is a multiple of 32 (others stay as they are); the k-quants (q2_K..q6_K)
  // to rows that are multiples of 256: other rows fall back to q8_0 (multiples of 32), else
  // keep their dtype, as llama-quantize falls back — each fallback is listed in the report.
  std::optional<DType> matrix_dtype;
  QuantMix mix = QuantMix::kNone;  // set: chooses per tensor, matrix_dtype must be unset
  const Llama2cTokenizer* tokenizer = nullptr;  // vocabulary to embed, or none
};

struct GgufConvertReport {
  std::vector<std::string> fallbacks;  // "NAME: q8_0 instead of q4_K (rows of 640 ...)"
};

// Parses a --dtype value of `kvcache convert`: a dtype name, or "q4_K_M" (a mix).
void parse_convert_dtype(const std::string& name, GgufConvertOptions& options);

// Writes `out_path`. Throws Error(kIo) when it cannot be written, Error(kUnsupported) for
// tensors whose dtype cannot be converted.
GgufConvertReport convert_to_gguf(const ModelFile& model, const GgufConvertOptions& options,
                                  const std::string& out_path);

}  // namespace kvcache
