#include "model/unicode.h"

#include <algorithm>
#include <array>

namespace kvcache {

namespace {

struct ClassRange {
  uint32_t first;
  UnicodeClass cls;
};

constexpr ClassRange kRanges[] = {
#include "model/unicode_table.inc"
};

constexpr uint32_t kReplacement = 0xFFFD;
constexpr uint32_t kOutOfRange = 0xFFFFFFFF;  // "no codepoint here" for the splitters

}  // namespace

UnicodeClass unicode_class(uint32_t cp) {
  if (cp > 0x10FFFF) return UnicodeClass::kUndefined;
  // Last range whose first codepoint <= cp.
  const auto* it = std::upper_bound(std::begin(kRanges), std::end(kRanges), cp,
                                    [](uint32_t v, const ClassRange& r) { return v < r.first; });
  return (it - 1)->cls;
}

bool unicode_is_whitespace(uint32_t cp) {
  // PropList.txt White_Space (stable since Unicode 6.3).
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

size_t utf8_sequence_length(unsigned char lead) {
  static constexpr size_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

std::vector<uint32_t> utf8_to_codepoints(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  auto cont = [&](size_t i) {
    return i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80;
  };
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    auto at = [&](size_t k) {
      return static_cast<uint32_t>(static_cast<unsigned char>(s[i + k]) & 0x3F);
    };
    if (b < 0x80) {
      out.push_back(b);
      i += 1;
    } else if ((b & 0xE0) == 0xC0 && cont(i + 1)) {
      out.push_back((static_cast<uint32_t>(b & 0x1F) << 6) | at(1));
      i += 2;
    } else if ((b & 0xF0) == 0xE0 && cont(i + 1) && cont(i + 2)) {
      out.push_back((static_cast<uint32_t>(b & 0x0F) << 12) | (at(1) << 6) | at(2));
      i += 3;
    } else if ((b & 0xF8) == 0xF0 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      out.push_back((static_cast<uint32_t>(b & 0x07) << 18) | (at(1) << 12) | (at(2) << 6) | at(3));
      i += 4;
    } else {
      out.push_back(kReplacement);  // continuation byte, bad lead, or truncated sequence
      i += 1;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    // Up to 21 bits; values above U+10FFFF (from 4-byte sequences) round-trip bit for bit.
    out.push_back(static_cast<char>(0xF0 | ((cp >> 18) & 0x07)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Codepoint view with the out-of-range sentinel the splitters look ahead with.
struct Cpts {
  std::vector<uint32_t> cp;
  uint32_t at(size_t i) const { return i < cp.size() ? cp[i] : kOutOfRange; }
  bool in(size_t i) const { return i < cp.size(); }
  bool letter(size_t i) const { return in(i) && unicode_class(cp[i]) == UnicodeClass::kLetter; }
  bool number(size_t i) const { return in(i) && unicode_class(cp[i]) == UnicodeClass::kNumber; }
  bool space(size_t i) const { return in(i) && unicode_is_whitespace(cp[i]); }
  // [^\s\p{L}\p{N}]: any codepoint (assigned or not) that is none of the three.
  bool other(size_t i) const { return in(i) && !space(i) && !letter(i) && !number(i); }
};

std::vector<std::string> pieces(const Cpts& c, const std::vector<size_t>& ends) {
  std::vector<std::string> out;
  out.reserve(ends.size());
  size_t begin = 0;
  for (size_t e : ends) {
    std::string s;
    for (size_t i = begin; i < e; ++i) append_utf8(s, c.cp[i]);
    out.push_back(std::move(s));
    begin = e;
  }
  return out;
}

uint32_t ascii_lower(uint32_t c) {
  return (c >= 'A' && c <= 'Z') ? c + 32 : c;
}

// Length of a contraction ('s 't 'm 'd 're 've 'll) at pos, 0 if none.
size_t contraction(const Cpts& c, size_t pos, bool fold_case) {
  if (c.at(pos) != '\'') return 0;
  auto f = [&](size_t i) { return fold_case ? ascii_lower(c.at(i)) : c.at(i); };
  const uint32_t a = f(pos + 1);
  if (!c.in(pos + 1)) return 0;
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (!c.in(pos + 2)) return 0;
  const uint32_t b = f(pos + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

std::vector<std::string> pretokenize_gpt2(std::string_view text) {
  Cpts c{utf8_to_codepoints(text)};
  const size_t n = c.cp.size();
  std::vector<size_t> ends;
  size_t pos = 0;
  while (pos < n) {
    if (size_t k = contraction(c, pos, false)) {
      pos += k;
      ends.push_back(pos);
      continue;
    }
    // ' ?' prefix: the alternatives below may start with one literal space.
    const size_t q = c.at(pos) == ' ' ? pos + 1 : pos;
    if (c.letter(q)) {
      pos = q;
      while (c.letter(pos)) ++pos;
      ends.push_back(pos);
      continue;
    }
    if (c.number(q)) {
      pos = q;
      while (c.number(pos)) ++pos;
      ends.push_back(pos);
      continue;
    }
    if (c.other(q)) {
      pos = q;
      while (c.other(pos)) ++pos;
      ends.push_back(pos);
      continue;
    }
    size_t ws = 0;
    while (c.space(pos + ws)) ++ws;
    if (ws > 1 && c.in(pos + ws)) {
      // \s+(?!\S): leave the last whitespace to prefix the next word.
      pos += ws - 1;
      ends.push_back(pos);
      continue;
    }
    pos += ws > 0 ? ws : 1;  // \s+ to the end, or (cannot happen) a lone codepoint
    ends.push_back(pos);
  }
  return pieces(c, ends);
}

std::vector<std::string> pretokenize_llama3(std::string_view text) {
  Cpts c{utf8_to_codepoints(text)};
  const size_t n = c.cp.size();
  std::vector<size_t> ends;
  auto add = [&](size_t e) {
    if (ends.empty() ? e > 0 : e > ends.back()) ends.push_back(e);
  };
  size_t pos = 0;
  while (pos < n) {
    const uint32_t cp = c.at(pos);
    if (size_t k = contraction(c, pos, true)) {
      pos += k;
      add(pos);
      continue;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!(cp == '\r' || cp == '\n' || c.number(pos)) && (c.letter(pos) || c.letter(pos + 1))) {
      ++pos;
      while (c.letter(pos)) ++pos;
      add(pos);
      continue;
    }
    // \p{N}{1,3}
    if (c.number(pos)) {
      size_t start = pos;
      while (c.number(pos)) {
        if (++pos - start >= 3) {
          add(pos);
          start = pos;
        }
      }
      add(pos);
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    const size_t q = cp == ' ' ? pos + 1 : pos;
    if (c.other(q)) {
      pos = q;
      while (c.other(pos)) ++pos;
      while (c.at(pos) == '\r' || c.at(pos) == '\n') ++pos;
      add(pos);
      continue;
    }
    size_t ws = 0, last_newline_end = 0;
    while (c.space(pos + ws)) {
      const uint32_t w = c.at(pos + ws);
      if (w == '\r' || w == '\n') last_newline_end = pos + ws + 1;
      ++ws;
    }
    if (last_newline_end > 0) {  // \s*[\r\n]+
      pos = last_newline_end;
      add(pos);
      continue;
    }
    if (ws > 1 && c.in(pos + ws)) {  // \s+(?!\S)
      pos += ws - 1;
      add(pos);
      continue;
    }
    pos += ws > 0 ? ws : 1;
    add(pos);
  }
  return pieces(c, ends);
}

namespace {
struct ByteMaps {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 512> to_byte{};
  ByteMaps() {
    to_byte.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[static_cast<size_t>(b)] = printable ? static_cast<uint32_t>(b) : next++;
      to_byte[to_cp[static_cast<size_t>(b)]] = static_cast<int16_t>(b);
    }
  }
};
const ByteMaps& byte_maps() {
  static const ByteMaps m;
  return m;
}
}  // namespace

uint32_t byte_to_unicode(uint8_t b) {
  return byte_maps().to_cp[b];
}
int unicode_to_byte(uint32_t cp) {
  return cp < 512 ? byte_maps().to_byte[cp] : -1;
}

}  // namespace kvcache
