#include "core/digest.h"

#include <blake2.h>

#include <cstring>

#include "core/error.h"

namespace kvcache {

namespace {
blake2b_state* st(unsigned char* raw) {
  return reinterpret_cast<blake2b_state*>(raw);
}

Digest128 from_bytes(const uint8_t (&out)[16]) {
  Digest128 d;
  for (int i = 0; i < 8; ++i) {
    d.hi |= static_cast<uint64_t>(out[i]) << (8 * i);
    d.lo |= static_cast<uint64_t>(out[8 + i]) << (8 * i);
  }
  return d;
}
}  // namespace

// The 16 digest bytes in BLAKE2b's output order (as b2sum -l 128 prints them).
std::string Digest128::hex() const {
  static const char* kDigits = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    const uint64_t word = i < 8 ? hi : lo;
    const auto byte = static_cast<unsigned>((word >> (8 * (i % 8))) & 0xff);
    s[static_cast<size_t>(2 * i)] = kDigits[byte >> 4];
    s[static_cast<size_t>(2 * i + 1)] = kDigits[byte & 15];
  }
  return s;
}

bool Digest128::from_hex(std::string_view s, Digest128& out) {
  if (s.size() != 32) return false;
  Digest128 d;
  for (size_t i = 0; i < 32; ++i) {
    const char c = s[i];
    uint64_t v = 0;
    if (c >= '0' && c <= '9') {
      v = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v = static_cast<uint64_t>(c - 'a' + 10);
    } else {
      return false;
    }
    // Byte i / 2 of the digest (hex() prints the bytes in BLAKE2b's output order), high nibble
    // first; bytes 0-7 are hi's little-endian bytes, 8-15 lo's.
    const size_t byte = i / 2;
    uint64_t& word = byte < 8 ? d.hi : d.lo;
    word |= v << (8 * (byte % 8) + (i % 2 == 0 ? 4 : 0));
  }
  out = d;
  return true;
}

Hasher::Hasher() {
  static_assert(sizeof(blake2b_state) <= sizeof(state_), "blake2b_state does not fit");
  KV_CHECK(blake2b_init(st(state_), 16) == 0, "blake2b_init failed");
}

Hasher& Hasher::bytes(const void* data, size_t n) {
  if (n > 0)
    KV_CHECK(blake2b_update(st(state_), static_cast<const uint8_t*>(data), n) == 0,
             "blake2b_update failed");
  return *this;
}

Hasher& Hasher::u32(uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  return bytes(b, sizeof(b));
}

Hasher& Hasher::u64(uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  return bytes(b, sizeof(b));
}

Hasher& Hasher::str(std::string_view s) {
  return u64(s.size()).bytes(s.data(), s.size());
}

Digest128 Hasher::finish() const {
  alignas(64) unsigned char copy[sizeof(state_)];
  std::memcpy(copy, state_, sizeof(state_));
  uint8_t out[16];
  KV_CHECK(blake2b_final(st(copy), out, sizeof(out)) == 0, "blake2b_final failed");
  return from_bytes(out);
}

Digest128 digest128(const void* data, size_t n) {
  return Hasher().bytes(data, n).finish();
}

}  // namespace kvcache
