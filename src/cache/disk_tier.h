// DiskTier: the prefix cache's tier below RAM (`serve --kv-disk DIR --kv-disk-budget 20GiB`),
// as LMCache's local-disk backend and SGLang's HiCache keep evicted prefixes one tier down.
//
// What it stores: full prefix blocks that the block pool evicted by LRU (their content is copied
// out before the block is reused, then written behind on a TierCopier thread), one file per
// block and layer group:
//     DIR/<layout fingerprint hex>/<block key hex>-g<group>.kvb
// The layout fingerprint (DiskTierOptions::fingerprint) folds in the model's fingerprint
// (model/fingerprint.h), the KV dtype, the page layout (layers, heads, head dims, groups) and
// block_tokens: a different model, dtype or layout never finds another's blocks. The block key
// is the pool's hash chain (cache/block_pool.h: parent key, group, salt, tokens), so a tenant's
// salt separates its blocks on disk as in RAM.
//
// File format: a block record (cache/block_record.h, shared with the remote tier), version 1:
//   magic "KVCBLK01" | u32 version | fingerprint (16 B) | key (16 B) | parent (16 B) |
//   u32 group | u32 block_tokens | i32 tokens[block_tokens] | u64 payload bytes | payload |
//   checksum: BLAKE2b-128 of everything before it (16 B)
// The payload is the block's pages of every page-owning layer of its group, in layer order, K
// then V (K only for K==V layers), each [H_kv, block_tokens, D] in the storage dtype.
//
// A hit reads the file back and checks magic, version, fingerprint, key, group, tokens, size
// and checksum before load() returns true: a corrupt or truncated file is a miss (counted in
// stats().corrupt, the file removed), never wrong output. The payload is read straight into the
// caller's buffer and verified there (no second copy), so on false that buffer holds unverified
// bytes: load into a block no sequence reads yet (or a staging buffer), and use it only on true.
// The budget is enforced on the sum of file sizes: storing past it removes least recently used
// files first (a hit refreshes a block, and sets its file's mtime). Restarting with the same
// directory rebuilds the index from the files' names, sizes and mtimes (no read: every file is
// verified when it is loaded), so the hits survive; temporary files a crash left are removed, files
// of other fingerprints are left alone. One process uses a directory at a time.
//
// Writes go to "<name>.tmp", then rename(2) into place: a crash of the process never leaves a
// half-written file under a block's name. They are not fsync'ed (a block is a cache entry, not
// data): after a power loss a file may be short or zero-filled, and its checksum makes it a
// counted miss.
//
// I/O: plain open/pread/close on the caller's thread for a hit, pwrite on the copier's thread for
// a store; prefetch() asks the kernel's readahead for a file ahead of its load (WILLNEED), which
// gives a batch of cold reads the queue depth io_uring would (measured against io_uring by
// bench/bench_tier_io.cc; the numbers: docs/architecture.md, "Disk tier storage").
//
// Thread-safety: store() and load() are called by the one runtime thread; the writes run on the
// copier's thread, whose completions update the index under a mutex (every public method takes
// it, so any thread may call them). Writes that cannot be queued (more than max_pending_bytes in
// flight) are dropped and counted: the request path never waits for the disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "cache/block_pool.h"
#include "core/digest.h"

namespace kvcache {

struct DiskTierOptions {
  std::string dir;                            // created if missing
  uint64_t budget_bytes = 0;                  // > 0: the most the tier's files may take
  Digest128 fingerprint;                      // the layout fingerprint (see above)
  int32_t block_tokens = 0;                   // tokens per block
  uint64_t max_pending_bytes = 256ull << 20;  // write-behind in flight before drops
};

struct DiskTierStats {
  int64_t blocks = 0;   // files indexed now
  uint64_t bytes = 0;   // their total size (<= budget)
  int64_t stored = 0;   // blocks written
  int64_t dropped = 0;  // writes dropped (too much in flight, or a write error)
  int64_t hits = 0;     // blocks read back and verified
  int64_t misses = 0;   // lookups that found no file
  int64_t corrupt = 0;  // files refused on read (checksum, size, header): misses too
  int64_t evicted = 0;  // files removed to stay within the budget
  uint64_t bytes_written = 0, bytes_read = 0;
  double read_seconds = 0;  // time spent reading hits (on the caller's thread)
};

class DiskTier {
 public:
  // Scans options.dir/<fingerprint hex>/ and indexes the files found (oldest mtime first in the
  // LRU); Error(kIo) when the directory cannot be created or read, Error(kInvalidArgument) for a
  // zero budget or block size.
  explicit DiskTier(const DiskTierOptions& options);
  ~DiskTier();  // waits for the writes in flight
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Write-behind of one evicted block: copies `payload` (the concatenated pages, see above) and
  // the tokens now, writes on the copier thread. false: dropped (counted). A key already on
  // disk is not written again (its LRU position is refreshed).
  bool store(const BlockKey& key, const BlockKey& parent, int32_t group,
             std::span<const int32_t> tokens, std::span<const std::byte> payload);
  // The same with the payload given as its parts in order (a block's pages, one per layer and
  // K/V): each part is copied once, straight into the file image.
  bool store(const BlockKey& key, const BlockKey& parent, int32_t group,
             std::span<const int32_t> tokens, std::span<const std::span<const std::byte>> parts);
  // Whether a file for (key, group) is indexed (no I/O; the read may still find it corrupt).
  bool contains(const BlockKey& key, int32_t group) const;
  // Reads the block into `payload` (exactly the stored size) after checking everything listed
  // above against `key`, `group` and `tokens`. false: a miss (absent, or corrupt: counted and
  // removed); payload's content is then unspecified and must not be used.
  bool load(const BlockKey& key, int32_t group, std::span<const int32_t> tokens,
            std::span<std::byte> payload);
  // A hint that load(key, group) comes soon: starts the kernel's readahead of its file
  // (posix_fadvise WILLNEED; no wait, no count). Call it for every block of a hit before loading
  // them one by one, so that cold reads overlap. Nothing happens for a block not indexed.
  void prefetch(const BlockKey& key, int32_t group);
  // Waits for every queued write (tests, shutdown).
  void flush();
  DiskTierStats stats() const;
  const DiskTierOptions& options() const { return options_; }

 private:
  struct Impl;
  DiskTierOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache
