// Vocabulary: the token table shared by the BPE-family tokenizers (SentencePiece BPE and
// byte-level BPE): token texts, scores, types (GGUF tokenizer.ggml.token_type numbering, which
// is llama.cpp's llama_token_type) and a text -> id index. Owned by the tokenizer built on it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace kvcache {

enum class TokenType : uint8_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // BOS, EOS, <|endoftext|>: never produced from text, decode to ""
  kUserDefined = 4,  // added tokens matched verbatim in text before the BPE runs
  kUnused = 5,
  kByte = 6,  // SentencePiece byte-fallback tokens <0xNN>
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct Vocabulary {
  std::vector<std::string> tokens;  // [n_vocab]
  std::vector<float> scores;        // [n_vocab] (0 when the source has none)
  std::vector<TokenType> types;     // [n_vocab]
  int32_t bos = -1, eos = -1, unk = -1;

  // Builds the text index; with duplicate texts the highest id wins (llama.cpp's behaviour).
  // Fills missing scores/types with 0 / kNormal. Call once after filling the vectors.
  void build_index();
  int32_t find(std::string_view text) const {
    auto it = index_.find(text);
    return it == index_.end() ? -1 : it->second;
  }
  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  // User-defined tokens, longest text first: the order in which they are split out of text.
  const std::vector<int32_t>& user_defined_by_length() const { return user_defined_; }

  // Splits text into raw runs and user-defined token matches (in place of llama.cpp's special
  // token partition with parse_special = false, which matches only user-defined tokens).
  struct Fragment {
    int32_t token = -1;     // >= 0: a user-defined token
    std::string_view text;  // raw text when token < 0
  };
  std::vector<Fragment> partition(std::string_view text) const;

 private:
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> index_;
  std::vector<int32_t> user_defined_;
};

}  // namespace kvcache
