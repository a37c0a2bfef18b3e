// Byte-level BPE tokenizer (GPT-2 family): GGUF tokenizer.ggml.model = "gpt2" and Hugging Face
// tokenizer.json models of type BPE with a ByteLevel pre-tokenizer (and, with byte_level =
// false, tokenizer.json BPE without one: SentencePiece-style, see BpeParams). Text is split by the
// pre-tokenizer (model/pretokenizer.h: the model's regex list), each piece's bytes are mapped to
// GPT-2's printable byte alphabet, and adjacent symbols are merged lowest merge rank first (ties:
// leftmost), as in llama.cpp's llm_tokenizer_bpe_session.
#pragma once

#include <functional>
#include <memory>
#include <unordered_map>

#include "model/pretokenizer.h"
#include "model/vocab_tokenizer.h"

namespace kvcache {

struct BpeParams {
  std::shared_ptr<const PreTokenizer> pre;  // required
  // Text edits applied to each stretch of text between added tokens before pre-tokenizing (a
  // tokenizer.json normalizer), in order.
  std::vector<std::function<std::string(std::string_view)>> normalizers;
  // Merges in rank order, each a pair of token texts (GGUF "a b", tokenizer.json "a b" / [a, b]).
  std::vector<std::pair<std::string, std::string>> merges;
  // Llama 3 style: a pre-token that is already a vocabulary token is emitted whole.
  bool ignore_merges = false;
  // false: SentencePiece-style BPE from a tokenizer.json without a ByteLevel step: the symbols
  // are the pieces' own characters, not GPT-2's byte alphabet, and `decode_text` decodes.
  bool byte_level = true;
  // A character that is no token after the merges (tokenizers' BPE::merge_word, models/bpe/
  // model.rs): its bytes as "<0xNN>" tokens when `byte_fallback` and all of them exist; else
  // `unk` (>= 0), one per character or one per run of such characters (`fuse_unk`); else it is
  // dropped. Byte-level tokenizers fall back to single-byte tokens instead.
  bool byte_fallback = false;
  int32_t unk = -1;
  bool fuse_unk = false;
  // The text of one token (its vocabulary entry) decoded: the tokenizer.json decoder applied to
  // that token alone. Required when !byte_level.
  std::function<std::string(const std::string&)> decode_text;
  // piece_after() drops the leading space of the piece after BOS (a decoder that strips the
  // space the encoder prefixed: Metaspace with a prepend scheme, Strip after Fuse).
  bool drop_space_after_bos = false;
  std::string kind = "gpt2";  // what kind() reports
};

class BpeTokenizer : public VocabTokenizer {
 public:
  BpeTokenizer(Vocabulary vocab, BpeParams params);

  std::vector<int32_t> encode(std::string_view text) const override;
  const char* kind() const override { return params_.kind.c_str(); }

 private:
  struct PairHash {
    size_t operator()(const std::pair<std::string, std::string>& p) const {
      return std::hash<std::string>{}(p.first) * 31u ^ std::hash<std::string>{}(p.second);
    }
  };
  int rank(const std::string& a, const std::string& b) const;
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;
  // A symbol of a non-byte-level word that is no token (see BpeParams::byte_fallback);
  // `pending_unk` carries an unknown-token run across symbols.
  void fall_back(std::string_view symbol, std::vector<int32_t>& out, bool& pending_unk) const;
  bool drops_space_after_bos() const override { return params_.drop_space_after_bos; }
  // GPT-2's byte alphabet back to bytes.
  std::string decode_piece(int32_t id, const std::string& text) const override;

  BpeParams params_;
  std::unordered_map<std::pair<std::string, std::string>, int, PairHash> ranks_;
};

}  // namespace kvcache
