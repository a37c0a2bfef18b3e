#include "cache/block_record.h"

#include <bit>
#include <cstring>

#include "core/error.h"

namespace kvcache::block_record {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the block record format is little-endian and written with memcpy");

constexpr char kMagic[8] = {'K', 'V', 'C', 'B', 'L', 'K', '0', '1'};
constexpr uint32_t kVersion = 1;

void put(std::byte*& p, const void* src, size_t n) {
  if (n > 0) std::memcpy(p, src, n);
  p += n;
}
void put_u32(std::byte*& p, uint32_t v) {
  put(p, &v, sizeof v);
}
void put_u64(std::byte*& p, uint64_t v) {
  put(p, &v, sizeof v);
}
void put_128(std::byte*& p, uint64_t hi, uint64_t lo) {
  put_u64(p, hi);
  put_u64(p, lo);
}
uint32_t get_u32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
uint64_t get_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

void write_unsealed(const Header& h, std::span<const std::span<const std::byte>> parts,
                    std::span<std::byte> out) {
  size_t payload_bytes = 0;
  for (const auto& part : parts) payload_bytes += part.size();
  const auto bt = static_cast<int32_t>(h.tokens.size());
  KV_CHECK(out.size() == record_bytes(bt, payload_bytes),
           "block_record: output of " + std::to_string(out.size()) + " bytes for a record of " +
               std::to_string(record_bytes(bt, payload_bytes)));
  std::byte* p = out.data();
  put(p, kMagic, sizeof kMagic);
  put_u32(p, kVersion);
  put_128(p, h.fingerprint.hi, h.fingerprint.lo);
  put_128(p, h.key.hi, h.key.lo);
  put_128(p, h.parent.hi, h.parent.lo);
  put_u32(p, static_cast<uint32_t>(h.group));
  put_u32(p, static_cast<uint32_t>(bt));
  put(p, h.tokens.data(), h.tokens.size_bytes());
  put_u64(p, payload_bytes);
  for (const auto& part : parts) put(p, part.data(), part.size());
}

void seal(std::span<std::byte> record) {
  KV_CHECK(record.size() >= kChecksumBytes, "block_record: a record shorter than its checksum");
  const size_t n = record.size() - kChecksumBytes;
  const Digest128 sum = digest128(record.data(), n);
  std::byte* p = record.data() + n;
  put_128(p, sum.hi, sum.lo);
}

void encode(const Header& h, std::span<const std::span<const std::byte>> parts,
            std::span<std::byte> out) {
  write_unsealed(h, parts, out);
  seal(out);
}

Verdict verify(const Expect& e, std::span<const std::byte> head, std::span<const std::byte> payload,
               std::span<const std::byte> checksum) {
  const auto bt = static_cast<int32_t>(e.tokens.size());
  if (head.size() != head_bytes(bt) || payload.size() != e.payload_bytes ||
      checksum.size() != kChecksumBytes)
    return Verdict::kCorrupt;
  Hasher h;
  h.bytes(head.data(), head.size()).bytes(payload.data(), payload.size());
  const Digest128 sum = h.finish();
  const std::byte* q = head.data();
  const bool sum_ok = get_u64(checksum.data()) == sum.hi && get_u64(checksum.data() + 8) == sum.lo;
  const bool header_ok = std::memcmp(q, kMagic, sizeof kMagic) == 0 && get_u32(q + 8) == kVersion &&
                         get_u64(q + 12) == e.fingerprint.hi &&
                         get_u64(q + 20) == e.fingerprint.lo && get_u64(q + 28) == e.key.hi &&
                         get_u64(q + 36) == e.key.lo &&
                         get_u32(q + 60) == static_cast<uint32_t>(e.group) &&
                         get_u32(q + 64) == static_cast<uint32_t>(bt) &&
                         get_u64(q + head.size() - 8) == payload.size();
  if (!sum_ok || !header_ok) return Verdict::kCorrupt;
  if (std::memcmp(q + kFixedHeaderBytes, e.tokens.data(), e.tokens.size_bytes()) != 0)
    return Verdict::kOtherTokens;
  return Verdict::kOk;
}

Verdict verify(const Expect& e, std::span<const std::byte> record,
               std::span<const std::byte>* payload) {
  const size_t head = head_bytes(static_cast<int32_t>(e.tokens.size()));
  if (record.size() != head + e.payload_bytes + kChecksumBytes) return Verdict::kCorrupt;
  const Verdict v = verify(e, record.subspan(0, head), record.subspan(head, e.payload_bytes),
                           record.subspan(head + e.payload_bytes));
  if (v == Verdict::kOk && payload != nullptr) *payload = record.subspan(head, e.payload_bytes);
  return v;
}

BlockKey record_key(std::span<const std::byte> record) {
  constexpr size_t kKeyAt = 8 + 4 + 16;  // after magic, version and fingerprint
  KV_CHECK(record.size() >= kFixedHeaderBytes, "block record shorter than its header");
  return BlockKey{get_u64(record.data() + kKeyAt), get_u64(record.data() + kKeyAt + 8)};
}

}  // namespace kvcache::block_record
