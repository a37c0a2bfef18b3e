#include "model/unicode_text.h"

#include <unicode/locid.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/ustring.h>

#include <string>

#include "core/error.h"
#include "model/unicode.h"

namespace kvcache {

namespace {

// What ICU cannot hold (surrogates, codepoints beyond U+10FFFF from lenient decoding) reads as
// U+FFFD, like an invalid byte.
UChar32 valid_or_replacement(uint32_t cp) {
  return (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF ? 0xFFFD : static_cast<UChar32>(cp);
}

icu::UnicodeString to_icu(std::string_view text) {
  icu::UnicodeString s;
  for (uint32_t cp : utf8_to_codepoints(text)) s.append(valid_or_replacement(cp));
  return s;
}

std::string to_utf8(const icu::UnicodeString& s) {
  std::string out;
  s.toUTF8String(out);
  return out;
}

bool all_ascii(std::string_view text) {
  for (char c : text)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

}  // namespace

std::string unicode_normalize(std::string_view text, UnicodeForm form) {
  // ASCII is invariant under all four forms (no ASCII character decomposes or composes).
  if (all_ascii(text)) return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case UnicodeForm::kNfc:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case UnicodeForm::kNfd:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case UnicodeForm::kNfkc:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case UnicodeForm::kNfkd:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
  }
  if (U_FAILURE(status) || n == nullptr) {
    throw Error(ErrorKind::kUnsupported, std::string("ICU cannot load its normalization data (") +
                                             u_errorName(status) + ")");
  }
  icu::UnicodeString out = n->normalize(to_icu(text), status);
  if (U_FAILURE(status)) {
    throw Error(ErrorKind::kInvalidArgument,
                std::string("ICU normalization failed: ") + u_errorName(status));
  }
  return to_utf8(out);
}

std::string unicode_lowercase_chars(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (uint32_t raw : utf8_to_codepoints(text)) {
    const UChar32 cp = valid_or_replacement(raw);
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp));
      continue;
    }
    // One character alone: the root locale's full mapping without neighbours, so no
    // context-dependent rule (final sigma, Lithuanian dots) can apply.
    icu::UnicodeString one(cp);
    one.toLower(icu::Locale::getRoot());
    one.toUTF8String(out);
  }
  return out;
}

std::string unicode_strip_marks(std::string_view text) {
  if (all_ascii(text)) return std::string(text);
  std::string out;
  out.reserve(text.size());
  for (uint32_t raw : utf8_to_codepoints(text)) {
    const UChar32 cp = valid_or_replacement(raw);
    if ((U_GET_GC_MASK(cp) & U_GC_M_MASK) == 0) append_utf8(out, static_cast<uint32_t>(cp));
  }
  return out;
}

std::string unicode_strip_whitespace(std::string_view text, bool left, bool right) {
  std::u32string cps;
  for (uint32_t raw : utf8_to_codepoints(text)) cps.push_back(valid_or_replacement(raw));
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && u_isUWhiteSpace(static_cast<UChar32>(cps[b]))) ++b;
  if (right)
    while (e > b && u_isUWhiteSpace(static_cast<UChar32>(cps[e - 1]))) --e;
  std::string out;
  out.reserve(text.size());
  for (size_t i = b; i < e; ++i) append_utf8(out, cps[i]);
  return out;
}

}  // namespace kvcache
