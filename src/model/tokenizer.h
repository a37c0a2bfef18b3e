// Tokenizer: text <-> token ids, the interface every vocabulary implements (GGUF `llama`
// SentencePiece BPE, GGUF `gpt2` byte-level BPE, HF tokenizer.json BPE, llama2.c tokenizer.bin).
// encode() never adds BOS/EOS and treats special-token text ("<s>", "<|endoftext|>") as plain
// text — the caller adds BOS itself — matching llama.cpp's test vectors (add_special=false,
// parse_special=false). Tokenizers are immutable after construction and thread-safe to use.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // UTF-8 text -> ids. Invalid UTF-8 bytes are encoded as themselves (byte fallback / byte-level).
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The bytes of one token as it appears in text: SentencePiece's U+2581 becomes ' ', byte
  // tokens <0xNN> become the raw byte, GPT-2 byte-level characters map back to their bytes.
  // Control tokens (BOS/EOS, ...) decode to "". A piece may be an incomplete UTF-8 sequence;
  // concatenating pieces restores the text. Throws Error(kInvalidArgument) for an id out of range.
  virtual std::string decode(int32_t id) const = 0;
  // The vocabulary entry as stored (no byte mapping), for debugging and tests.
  virtual const std::string& token_text(int32_t id) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1 when the vocabulary has none
  virtual int32_t eos_id() const = 0;
  virtual const char* kind() const = 0;  // "llama", "gpt2", "hf-bpe", "hf-bpe-spm", "llama2c"

  // Concatenated decode() of ids.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The text token `id` adds after token `prev` (-1: none): decode(id), except that
  // SentencePiece vocabularies (GGUF "llama", llama2.c, a tokenizer.json whose decoder strips
  // it) drop the leading space of the piece right after BOS (the space encode() prefixes), as
  // llama.cpp and run.c print it.
  std::string piece_after(int32_t prev, int32_t id) const;
  // The most input bytes one token can stand for: the longest decode() (at least 4, a UTF-8
  // character an unknown token replaces). A text of B bytes encodes to at least
  // B / max_text_bytes_per_token() tokens, so a server can refuse a prompt that cannot fit its
  // context before paying for encode(). Computed once, on first use.
  size_t max_text_bytes_per_token() const;

 protected:
  // True when piece_after() drops the leading space of the piece after BOS for a tokenizer
  // other than SentencePiece and llama2.c (a tokenizer.json whose decoder strips it).
  virtual bool drops_space_after_bos() const { return false; }

 private:
  mutable std::once_flag max_bytes_once_;
  mutable size_t max_bytes_ = 0;
};

// Loads a tokenizer from `path`, whatever its format:
//  - a GGUF (its tokenizer.ggml.* metadata; vocabulary-only files included);
//  - a Hugging Face tokenizer.json, or a folder holding one;
//  - a llama2.c checkpoint: the tokenizer.bin or tok512.bin beside it, sized by its header;
//  - a llama2.c tokenizer file (tokenizer.bin): `llama2c_vocab_size` entries, or when 0 as many
//    as the file holds (the format does not store the count).
// Throws Error(kIo/kFormat/kUnsupported) naming the file and what is missing or unsupported.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, int32_t llama2c_vocab_size = 0);

// The tokenizer file that goes with a model path, or "" when there is none: the GGUF itself when
// it carries tokenizer.ggml.model, tokenizer.json in a HF folder (or beside a .safetensors file),
// tokenizer.bin / tok512.bin beside a llama2.c checkpoint. Pass the result to load_tokenizer.
std::string find_tokenizer_for_model(const std::string& model_path);

class GgufFile;
// The tokenizer stored in a GGUF's tokenizer.ggml.* metadata: model "llama" (SentencePiece BPE)
// or "gpt2" (byte-level BPE with any pre-tokenizer llama.cpp names in tokenizer.ggml.pre, see
// model/pretokenizer.h; a missing name is llama.cpp's "default").
std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufFile& gguf);
// A Hugging Face tokenizer.json with model type BPE, byte-level or SentencePiece-style, and the
// normalizers, pre-tokenizers and decoders tokenizer_hf.cc implements (others are refused by
// name). BOS/EOS come from tokenizer_config.json beside it when present.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& tokenizer_json_path);
// The same from the texts of tokenizer.json and of tokenizer_config.json ("" when there is
// none); `source` names the file in errors.
std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string& tokenizer_json,
                                              const std::string& tokenizer_config_json,
                                              const std::string& source);

}  // namespace kvcache
