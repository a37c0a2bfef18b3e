// What the fuzz targets share: the input as text, a workout for any tokenizer a target builds,
// two tiny in-memory tokenizers (SentencePiece and byte-level BPE, with the chat templates'
// control tokens) for the targets whose input is not a vocabulary, and the tiny llama config
// the safetensors target checks tensors against. Nothing here reads ../shared: targets and
// their replay must run anywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/gguf.h"
#include "model/model_file.h"
#include "model/tokenizer.h"
#include "model/vocabulary.h"

namespace kvcache::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Encodes a fixed set of awkward texts (empty, multi-byte, invalid UTF-8, control-token text,
// contractions and digits) and decodes what comes out, then decodes every id of the
// vocabulary alone and after BOS. An encode may refuse with kvcache::Error (a vocabulary
// without byte fallback); decoding an in-range id must not fail, nor may encode produce an id
// outside the vocabulary.
void exercise_tokenizer(const Tokenizer& tokenizer);

// SentencePiece ("llama") and byte-level BPE ("gpt2") tokenizers of a few hundred tokens: byte
// fallback, some merges, a user-defined token, and the control tokens <s>, </s>, <|im_start|>,
// <|im_end|>, <|begin_of_text|>, <|start_header_id|>, <|end_header_id|>, <|eot_id|>.
const Tokenizer& tiny_spm_tokenizer();
const Tokenizer& tiny_bpe_tokenizer();
// Their tables, for the seed generator (make_seeds.cc writes them into GGUF and tokenizer.json).
Vocabulary tiny_spm_vocabulary();
Vocabulary tiny_bpe_vocabulary();
std::vector<std::pair<std::string, std::string>> tiny_bpe_merges();

// Llama block: dim 8, FFN 16, 1 layer, 2 heads over 1 KV head, vocabulary 16, context 32,
// half-split RoPE (HF layout), untied.
ModelConfig tiny_llama_config();

// Tensors with deterministic small values; owns their storage until a GgufWriter is done.
class Weights {
 public:
  TensorView add(DType dtype, const Shape& shape);

 private:
  std::mt19937 rng_{1234};
  std::vector<Tensor> owned_;
};
// A vocabulary's tokenizer.ggml.* metadata (model "llama" or "gpt2").
void put_vocabulary(GgufWriter& w, const Vocabulary& v, const char* model);
// The llama tensors of `c` (GGUF names), matrices in `dtype`, norms f32; tied when no output.
void put_llama_tensors(GgufWriter& w, Weights& ws, const ModelConfig& c, DType dtype);

}  // namespace kvcache::fuzz
