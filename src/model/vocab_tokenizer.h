// The base of the tokenizers built on a Vocabulary (SentencePiece BPE, byte-level BPE): it owns
// the vocabulary and answers what the vocabulary alone decides (token texts, size, BOS/EOS, the
// decoding of control, unused and user-defined tokens), so that a subclass holds only its
// encoding and its decoding of the other tokens.
#pragma once

#include "model/tokenizer.h"
#include "model/vocabulary.h"

namespace kvcache {

class VocabTokenizer : public Tokenizer {
 public:
  // Control and unused tokens decode to "", user-defined ones to their text as stored; any
  // other token as decode_piece() says.
  std::string decode(int32_t id) const final;
  using Tokenizer::decode;
  const std::string& token_text(int32_t id) const final;
  int32_t vocab_size() const final { return vocab_.size(); }
  int32_t bos_id() const final { return vocab_.bos; }
  int32_t eos_id() const final { return vocab_.eos; }

 protected:
  // Builds the vocabulary's index.
  explicit VocabTokenizer(Vocabulary vocab);
  // The bytes of token `id` (a valid id, of none of the types decode() settles), `text` its
  // vocabulary entry.
  virtual std::string decode_piece(int32_t id, const std::string& text) const = 0;

  Vocabulary vocab_;
};

}  // namespace kvcache
