#include "model/vocab_tokenizer.h"

#include "core/error.h"

namespace kvcache {

VocabTokenizer::VocabTokenizer(Vocabulary vocab) : vocab_(std::move(vocab)) {
  vocab_.build_index();
}

const std::string& VocabTokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_.size()) {
    throw Error(ErrorKind::kInvalidArgument, "token id " + std::to_string(id) +
                                                 " is outside the vocabulary of " +
                                                 std::to_string(vocab_.size()));
  }
  return vocab_.tokens[static_cast<size_t>(id)];
}

std::string VocabTokenizer::decode(int32_t id) const {
  const std::string& t = token_text(id);
  switch (vocab_.types[static_cast<size_t>(id)]) {
    case TokenType::kControl:
    case TokenType::kUnused:
      return "";
    case TokenType::kUserDefined:
      return t;
    default:
      return decode_piece(id, t);
  }
}

}  // namespace kvcache
