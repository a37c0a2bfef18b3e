// SentencePiece BPE tokenizer (GGUF tokenizer.ggml.model = "llama": Llama 1/2, Mistral v0.1,
// TinyLlama). Encoding follows llama.cpp's llm_tokenizer_spm: spaces become U+2581, a U+2581 is
// prefixed to text at the start or after a user-defined token (add_space_prefix), the text is
// split into UTF-8 characters, and adjacent pairs whose concatenation is a vocabulary token are
// merged highest score first (ties: leftmost); symbols that are not tokens fall back to their
// bytes as <0xNN> tokens.
#pragma once

#include "model/vocab_tokenizer.h"

namespace kvcache {

// The byte a SentencePiece byte-fallback token "<0xNN>" stands for (exactly two hex digits),
// or -1 for any other text.
int spm_byte_token_value(std::string_view text);

class SpmTokenizer : public VocabTokenizer {
 public:
  SpmTokenizer(Vocabulary vocab, bool add_space_prefix);

  std::vector<int32_t> encode(std::string_view text) const override;
  const char* kind() const override { return "llama"; }

 private:
  void encode_run(const std::string& text, std::vector<int32_t>& out) const;
  void push_bytes(std::string_view piece, std::vector<int32_t>& out) const;
  // <unk> as llama.cpp renders it, byte tokens as their byte, U+2581 as a space.
  std::string decode_piece(int32_t id, const std::string& text) const override;

  bool add_space_prefix_;
  int32_t byte_tokens_[256];  // <0xNN> ids, -1 when absent
};

}  // namespace kvcache
