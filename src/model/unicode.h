// Unicode helpers for the tokenizers: lenient UTF-8 decoding (llama.cpp's rules: an invalid
// byte becomes U+FFFD and decoding resumes at the next byte), general-category classes from a
// table generated from the Unicode Character Database (scripts/gen_unicode_table.py), the
// White_Space property, and the pre-tokenizer splitters of GPT-2 and Llama 3.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache {

// Top-level general category (UnicodeData.txt field 2, first letter); kUndefined = Cn.
enum class UnicodeClass : uint8_t {
  kUndefined,
  kNumber,       // \p{N}
  kLetter,       // \p{L}
  kSeparator,    // \p{Z}
  kMark,         // \p{M}
  kPunctuation,  // \p{P}
  kSymbol,       // \p{S}
  kControl,      // \p{C} other than Cn
};

UnicodeClass unicode_class(uint32_t cp);  // codepoints > 0x10FFFF are kUndefined
// PropList.txt White_Space (what regex \s means in llama.cpp's splitters).
bool unicode_is_whitespace(uint32_t cp);

// Length of the UTF-8 sequence a lead byte announces, from its top 4 bits (1 for continuation
// and invalid bytes) — SentencePiece-style character splitting, without validation.
size_t utf8_sequence_length(unsigned char lead);
// Decodes leniently: each invalid or truncated sequence yields U+FFFD and skips one byte.
std::vector<uint32_t> utf8_to_codepoints(std::string_view text);
void append_utf8(std::string& out, uint32_t cp);

// Splits text into pre-tokens with GPT-2's regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// returning the pieces as UTF-8 re-encoded from the decoded codepoints (so invalid bytes come
// back as U+FFFD, as in llama.cpp). Concatenating the pieces gives that re-encoded text.
std::vector<std::string> pretokenize_gpt2(std::string_view text);
// Llama 3's regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// (ASCII case folding for the contractions).
std::vector<std::string> pretokenize_llama3(std::string_view text);

// GPT-2's byte-level alphabet: each byte maps to one printable codepoint (bytes_to_unicode in
// OpenAI's encoder.py): '!'..'~', 0xA1..0xAC, 0xAE..0xFF map to themselves; the other 68 bytes
// map to 256, 257, ... in byte order.
uint32_t byte_to_unicode(uint8_t b);
// Inverse; returns -1 for codepoints outside the alphabet.
int unicode_to_byte(uint32_t cp);

}  // namespace kvcache
