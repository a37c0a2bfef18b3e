// Unicode text edits of the Hugging Face tokenizer.json normalizers (tokenizers/src/normalizers/
// unicode.rs, utils.rs, strip.rs), computed with ICU (libicu) rather than tables of our own: the
// four normalization forms, lowercasing, accent (combining mark) removal and whitespace
// stripping. Input is UTF-8; invalid bytes read as U+FFFD, as the pre-tokenizers read them.
#pragma once

#include <string>
#include <string_view>

namespace kvcache {

enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd };

// The text in normalization form `form` (ICU's Normalizer2, UAX #15).
std::string unicode_normalize(std::string_view text, UnicodeForm form);

// Each character replaced by its full lowercase mapping taken alone, without context (Rust's
// char::to_lowercase, which tokenizers' NormalizedString::lowercase applies per character): a
// final capital sigma becomes σ, never ς; U+0130 becomes "i\u0307".
std::string unicode_lowercase_chars(std::string_view text);

// The text without its characters of General_Category Mark (Mn, Mc, Me): tokenizers' StripAccents
// keeps what unicode-normalization's is_combining_mark rejects.
std::string unicode_strip_marks(std::string_view text);

// The text without leading (`left`) and/or trailing (`right`) White_Space characters (Rust's
// char::is_whitespace, which tokenizers' Strip normalizer trims).
std::string unicode_strip_whitespace(std::string_view text, bool left, bool right);

}  // namespace kvcache
