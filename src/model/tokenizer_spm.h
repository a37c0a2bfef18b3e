// SentencePiece BPE tokenizer (GGUF tokenizer.ggml.model = "llama": Llama 1/2, Mistral v0.1,
// TinyLlama). Encoding follows llama.cpp's llm_tokenizer_spm: spaces become U+2581, a U+2581 is
// prefixed to text at the start or after a user-defined token (add_space_prefix), the text is
// split into UTF-8 characters, and adjacent pairs whose concatenation is a vocabulary token are
// merged highest score first (ties: leftmost); symbols that are not tokens fall back to their
// bytes as <0xNN> tokens.
#pragma once

#include "model/tokenizer.h"
#include "model/vocabulary.h"

namespace kvcache {

// The byte a SentencePiece byte-fallback token "<0xNN>" stands for (exactly two hex digits),
// or -1 for any other text.
int spm_byte_token_value(std::string_view text);

class SpmTokenizer : public Tokenizer {
 public:
  SpmTokenizer(Vocabulary vocab, bool add_space_prefix);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(int32_t id) const override;
  using Tokenizer::decode;
  const std::string& token_text(int32_t id) const override;
  int32_t vocab_size() const override { return vocab_.size(); }
  int32_t bos_id() const override { return vocab_.bos; }
  int32_t eos_id() const override { return vocab_.eos; }
  const char* kind() const override { return "llama"; }

 private:
  void encode_run(const std::string& text, std::vector<int32_t>& out) const;
  void push_bytes(std::string_view piece, std::vector<int32_t>& out) const;

  Vocabulary vocab_;
  bool add_space_prefix_;
  int32_t byte_tokens_[256];  // <0xNN> ids, -1 when absent
};

}  // namespace kvcache
