// Unicode helpers for the tokenizers: lenient UTF-8 decoding (llama.cpp's rules: an invalid
// byte becomes U+FFFD and decoding resumes at the next byte) and GPT-2's byte alphabet. The
// pre-tokenizers' character classes are PCRE2's (model/pretokenizer.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache {

// Length of the UTF-8 sequence a lead byte announces, from its top 4 bits (1 for continuation
// and invalid bytes) — SentencePiece-style character splitting, without validation.
size_t utf8_sequence_length(unsigned char lead);
// Decodes leniently: each invalid or truncated sequence yields U+FFFD and skips one byte.
std::vector<uint32_t> utf8_to_codepoints(std::string_view text);
void append_utf8(std::string& out, uint32_t cp);

// GPT-2's byte-level alphabet: each byte maps to one printable codepoint (bytes_to_unicode in
// OpenAI's encoder.py): '!'..'~', 0xA1..0xAC, 0xAE..0xFF map to themselves; the other 68 bytes
// map to 256, 257, ... in byte order.
uint32_t byte_to_unicode(uint8_t b);
// Inverse; returns -1 for codepoints outside the alphabet.
int unicode_to_byte(uint32_t cp);

}  // namespace kvcache
