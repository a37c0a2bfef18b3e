#include "model/unicode.h"

#include <array>

namespace kvcache {

namespace {
constexpr uint32_t kReplacement = 0xFFFD;
}  // namespace

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
