// BlockRecord: the byte format of one stored prefix block, shared by the tiers below RAM — the
// disk tier's files (cache/disk_tier.h) and the shared remote tier's values (cache/
// remote_tier.h) are the same bytes, so a block means the same everywhere it is kept.
//
// Format (little-endian), version 1:
//   magic "KVCBLK01" | u32 version | fingerprint (16 B) | key (16 B) | parent (16 B) |
//   u32 group | u32 block_tokens | i32 tokens[block_tokens] | u64 payload bytes | payload |
//   checksum: BLAKE2b-128 of everything before it (16 B)
// The payload is the block's pages of every page-owning layer of its group, in layer order, K
// then V (K only for K==V layers), each [H_kv, block_tokens, D] in the storage dtype.
//
// Verification checks the checksum and every header field against what the reader expects
// (fingerprint, key, group, block_tokens, payload size), then the tokens: any mismatch is a
// miss, never wrong K/V.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "cache/block_pool.h"
#include "core/digest.h"

namespace kvcache::block_record {

constexpr size_t kFixedHeaderBytes = 8 + 4 + 16 + 16 + 16 + 4 + 4;  // magic .. block_tokens
constexpr size_t kChecksumBytes = 16;

// Bytes before the payload: the fixed header, the tokens and the payload size.
constexpr size_t head_bytes(int32_t block_tokens) {
  return kFixedHeaderBytes + sizeof(int32_t) * static_cast<size_t>(block_tokens) + sizeof(uint64_t);
}
// The whole record's size.
constexpr size_t record_bytes(int32_t block_tokens, size_t payload_bytes) {
  return head_bytes(block_tokens) + payload_bytes + kChecksumBytes;
}

// A block's identity in a tier: its key and layer group (the key already folds the group in;
// the group is kept apart so that a file name or an object key says it without rehashing).
struct BlockId {
  BlockKey key;
  int32_t group = 0;
  friend bool operator==(const BlockId&, const BlockId&) = default;
};
struct BlockIdHash {
  size_t operator()(const BlockId& id) const {
    return static_cast<size_t>(id.key.hi ^ (id.key.lo * 0x9e3779b97f4a7c15ull) ^
                               static_cast<uint64_t>(static_cast<uint32_t>(id.group)));
  }
};

// What a record says about itself (the payload's parts are written in order).
struct Header {
  Digest128 fingerprint;
  BlockKey key, parent;
  int32_t group = 0;
  std::span<const int32_t> tokens;  // [block_tokens]
};

// Writes the head and the payload into out (exactly record_bytes(tokens, sum of parts)); the
// checksum is left for seal() (the disk tier seals on its writer thread).
void write_unsealed(const Header& h, std::span<const std::span<const std::byte>> parts,
                    std::span<std::byte> out);
// Computes and writes the checksum into the last kChecksumBytes of a written record.
void seal(std::span<std::byte> record);
// write_unsealed then seal.
void encode(const Header& h, std::span<const std::span<const std::byte>> parts,
            std::span<std::byte> out);

// The outcome of checking a record against what its reader expects.
enum class Verdict {
  kOk,
  kCorrupt,      // checksum, magic, version, fingerprint, key, group, block_tokens or size
  kOtherTokens,  // intact and for this key, but holding other tokens than the reader's
};
struct Expect {
  Digest128 fingerprint;
  BlockKey key;
  int32_t group = 0;
  std::span<const int32_t> tokens;  // [block_tokens]
  size_t payload_bytes = 0;
};
// A record given as its three parts (head_bytes, the payload, the checksum): the disk tier
// reads the payload straight into its caller's buffer.
Verdict verify(const Expect& e, std::span<const std::byte> head, std::span<const std::byte> payload,
               std::span<const std::byte> checksum);
// A whole record in one buffer; on kOk, *payload (when given) is its payload.
Verdict verify(const Expect& e, std::span<const std::byte> record,
               std::span<const std::byte>* payload = nullptr);

// The key field of a record of at least kFixedHeaderBytes (not verified: call it on records
// verify() accepted).
BlockKey record_key(std::span<const std::byte> record);

}  // namespace kvcache::block_record
