// The llama2.c tokenizer (`tokenizer.bin`, `tok512.bin`): a SentencePiece-style BPE given as a
// scored vocabulary. Reproduces run.c's encode() (space prefix, UTF-8 code points looked up
// whole, byte fallback <0xNN>, then repeated merge of the adjacent pair whose merged piece has
// the highest score, leftmost on ties) and decode()/safe_printf() for streaming text. The
// merges give run.c's ids in O(n log n) rather than its O(n^2) rescans (see encode).
// File: int32 max_token_length, then per token: f32 score, int32 byte length, bytes.
// The vocabulary size is not in the file; it comes from the checkpoint header.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"

namespace kvcache {

// Entries of a tokenizer file's bytes when they parse as whole records up to the end (the
// vocabulary size of a bare tokenizer.bin); 0 when they do not.
int32_t count_llama2c_tokenizer_entries(std::string_view bytes);

class Llama2cTokenizer final : public Tokenizer {
 public:
  // Reads `path` holding `vocab_size` entries. Throws Error(kIo/kFormat) naming the file and
  // the entry that is truncated or malformed.
  Llama2cTokenizer(const std::string& path, int32_t vocab_size);
  // The same from the file's bytes; `name` stands for the path in errors.
  Llama2cTokenizer(const std::string& name, std::string_view bytes, int32_t vocab_size);

  // Text -> ids without BOS/EOS (run.c's encode(text, bos=0, eos=0)).
  std::vector<int32_t> encode(std::string_view text) const override;
  // What one encode did, so that tests can bound its cost without a clock.
  struct EncodeCounts {
    int64_t symbols = 0;  // tokens before merging: the space piece, code points, fallback bytes
    int64_t pair_lookups = 0;  // vocabulary lookups of a merged pair
    int64_t merges = 0;
  };
  std::vector<int32_t> encode(std::string_view text, EncodeCounts* counts) const;
  // The bytes of one token: <0xNN> becomes the byte; BOS/EOS decode to "".
  std::string decode(int32_t id) const override;
  using Tokenizer::decode;
  // run.c's decode(prev, id) + safe_printf: the leading space of the piece after BOS is
  // dropped, and a single-byte piece that is neither printable nor whitespace prints nothing.
  std::string decode_for_print(int32_t prev_id, int32_t id) const;
  const std::string& token_text(int32_t id) const override;
  float score(int32_t id) const;

  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t bos_id() const override { return 1; }  // fixed by llama2.c: 0 <unk>, 1 <s>, 2 </s>
  int32_t eos_id() const override { return 2; }
  const char* kind() const override { return "llama2c"; }
  const std::string& path() const { return path_; }

 private:
  int32_t lookup(std::string_view piece) const;  // -1 when absent
  const std::string& checked(int32_t id) const;

  std::string path_;
  std::vector<std::string> pieces_;  // [vocab] as stored (up to a NUL, as run.c's C strings)
  std::vector<float> scores_;        // [vocab]
  std::unordered_map<std::string_view, int32_t> index_;  // piece -> lowest id with that piece
  int32_t byte_ids_[256];                                // <0xNN> -> id (llama2.c assumes 3 + NN)
  int32_t space_id_ = -1;  // the " " piece prepended to non-empty text
};

}  // namespace kvcache
