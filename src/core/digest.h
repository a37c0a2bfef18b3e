// BLAKE2b digests (libb2) for everything that must be recognised across processes: checksums
// of stored KV (disk tier blocks, session files) and fingerprints (models, layouts). The
// prefix index's block keys (cache/block_pool.h) use the same hash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvcache {

// A 128-bit digest, little-endian halves.
struct Digest128 {
  uint64_t hi = 0, lo = 0;
  friend bool operator==(const Digest128&, const Digest128&) = default;
  std::string hex() const;  // 32 lowercase hex digits, hi first
  // Parses hex() back; false when `s` is not 32 hex digits.
  static bool from_hex(std::string_view s, Digest128& out);
};

// Incremental BLAKE2b-128. Integers are hashed little-endian at fixed width, strings with their
// length first, so that sequences of fields cannot collide by shifting bytes between them.
class Hasher {
 public:
  Hasher();
  Hasher& bytes(const void* data, size_t n);
  Hasher& u32(uint32_t v);
  Hasher& u64(uint64_t v);
  Hasher& i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  Hasher& str(std::string_view s);  // length, then bytes
  Hasher& digest(const Digest128& d) { return u64(d.hi).u64(d.lo); }
  // The digest of everything added so far (the hasher may go on).
  Digest128 finish() const;

 private:
  alignas(64) unsigned char state_[512];  // blake2b_state (checked against sizeof at compile)
};

// One-shot BLAKE2b-128 of a buffer.
Digest128 digest128(const void* data, size_t n);

}  // namespace kvcache
