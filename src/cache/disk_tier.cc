#include "cache/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <list>
#include <mutex>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cache/block_record.h"
#include "core/error.h"
#include "core/tier.h"

namespace kvcache {

namespace {

// The file is a block record (cache/block_record.h), byte for byte.
using block_record::head_bytes;
using block_record::kChecksumBytes;
using block_record::kFixedHeaderBytes;
constexpr std::string_view kSuffix = ".kvb";
constexpr std::string_view kTempSuffix = ".tmp";

using block_record::BlockId;
using block_record::BlockIdHash;

// "<key hex>-g<group>.kvb": the key as Digest128::hex() spells a digest.
std::string file_name(const BlockId& id) {
  return Digest128{id.key.hi, id.key.lo}.hex() + "-g" + std::to_string(id.group) +
         std::string(kSuffix);
}

bool parse_file_name(std::string_view name, BlockId& id) {
  if (name.size() <= kSuffix.size() || !name.ends_with(kSuffix)) return false;
  name.remove_suffix(kSuffix.size());
  if (name.size() < 32 + 3 || name.substr(32, 2) != "-g") return false;
  Digest128 d;
  if (!Digest128::from_hex(name.substr(0, 32), d)) return false;
  const std::string_view g = name.substr(34);
  if (g.empty() || g.size() > 10) return false;
  int64_t group = 0;
  for (char c : g) {
    if (c < '0' || c > '9') return false;
    group = group * 10 + (c - '0');
  }
  if (group > INT32_MAX) return false;
  id.key = BlockKey{d.hi, d.lo};
  id.group = static_cast<int32_t>(group);
  return true;
}

// Unlinks a file; a file already gone is fine (the tier only wants it not there).
void remove_file(const std::string& path) {
  ::unlink(path.c_str());
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  // close() reports write-back errors of some file systems (NFS): checked on the write path.
  int release_close() {
    const int r = ::close(fd_);
    fd_ = -1;
    return r;
  }

 private:
  int fd_;
};

}  // namespace

struct DiskTier::Impl {
  struct Entry {
    uint64_t bytes = 0;                    // the file's size
    std::list<BlockId>::iterator lru_pos;  // in lru (front: most recently used)
  };
  // A block copied by store() and not yet renamed into place: the whole file image (the
  // checksum is filled in on the copier thread). load() serves a hit from it meanwhile, once
  // `ready` (set under mu after the copy, so that a reader on another thread sees it whole).
  struct Pending {
    std::vector<std::byte> image;
    bool ready = false;
  };

  std::string dir;  // options.dir/<fingerprint hex>
  mutable std::mutex mu;
  std::unordered_map<BlockId, Entry, BlockIdHash> index;
  std::list<BlockId> lru;
  std::unordered_map<BlockId, std::shared_ptr<Pending>, BlockIdHash> pending;
  uint64_t pending_bytes = 0;
  DiskTierStats stats;
  // Last member: destroyed first, so that its jobs (which touch the members above) end before.
  TierCopier copier{"disk-tier"};

  std::string path_of(const BlockId& id) const { return dir + "/" + file_name(id); }

  // Moves an indexed block to the most recent end. Under mu.
  void touch(const Entry& e) { lru.splice(lru.begin(), lru, e.lru_pos); }

  void add(const BlockId& id, uint64_t bytes) {  // under mu
    KV_CHECK(index.count(id) == 0, "DiskTier: a block indexed twice");
    lru.push_front(id);
    index.emplace(id, Entry{bytes, lru.begin()});
    stats.blocks += 1;
    stats.bytes += bytes;
  }

  void drop(const BlockId& id) {  // under mu; the file is left to the caller
    const auto it = index.find(id);
    if (it == index.end()) return;
    stats.blocks -= 1;
    stats.bytes -= it->second.bytes;
    lru.erase(it->second.lru_pos);
    index.erase(it);
  }

  // Removes a file on the copier thread, in order with the writes queued before and after it
  // (a block stored again after its eviction is written after the old file is gone).
  void remove_behind(const BlockId& id) {
    std::string path = path_of(id);
    copier.submit(
        Tier::kDisk, Tier::kDisk, 0, [path] { remove_file(path); }, [](const std::string&) {});
  }

  // Sets a file's mtime to now, so that the LRU order rebuilt after a restart follows use.
  void touch_behind(const BlockId& id) {
    std::string path = path_of(id);
    copier.submit(
        Tier::kHost, Tier::kDisk, 0, [path] { ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0); },
        [](const std::string&) {});
  }

  // Writes a pending image to a temporary name and renames it into place (a crash never
  // leaves a half-written file under a block's name). On the copier thread.
  void write_file(const BlockId& id, std::vector<std::byte>& image) {
    block_record::seal(image);
    const std::string path = path_of(id);
    const std::string tmp = path + kTempSuffix.data();
    Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.get() < 0) {
      throw Error(ErrorKind::kIo, "disk tier: cannot create " + tmp + ": " + std::strerror(errno));
    }
    try {
      write_exact(fd.get(), 0, image.data(), image.size(), tmp);
      if (fd.release_close() != 0) {
        throw Error(ErrorKind::kIo,
                    "disk tier: closing " + tmp + " failed: " + std::strerror(errno));
      }
      if (::rename(tmp.c_str(), path.c_str()) != 0) {
        throw Error(ErrorKind::kIo, "disk tier: cannot rename " + tmp + " to " + path + ": " +
                                        std::strerror(errno));
      }
    } catch (...) {
      remove_file(tmp);
      throw;
    }
  }

  // The copier's report on a write: the file joins the index, or the write counts as dropped.
  void write_done(const BlockId& id, uint64_t bytes, const std::string& error) {
    std::lock_guard<std::mutex> lock(mu);
    pending.erase(id);
    pending_bytes -= bytes;
    if (!error.empty()) {
      stats.dropped += 1;
      return;
    }
    add(id, bytes);
    stats.stored += 1;
    stats.bytes_written += bytes;
  }

  // Indexes the files of a previous run, oldest mtime least recently used; removes temporary
  // files a crash left behind, and least recently used files past the budget.
  void scan(uint64_t budget_bytes) {
    namespace fs = std::filesystem;
    struct Found {
      BlockId id;
      uint64_t bytes;
      int64_t mtime_ns;
    };
    std::vector<Found> found;
    std::error_code ec;
    fs::directory_iterator it(dir, ec), end;
    if (ec) {
      throw Error(ErrorKind::kIo, "disk tier: cannot read directory " + dir + ": " + ec.message() +
                                      " (check its permissions)");
    }
    for (; it != end; it.increment(ec)) {
      if (ec) {
        throw Error(ErrorKind::kIo, "disk tier: cannot read directory " + dir + ": " +
                                        ec.message() + " (check its permissions)");
      }
      const std::string name = it->path().filename().string();
      struct stat st;
      if (::stat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      BlockId id;
      if (name.ends_with(kTempSuffix)) {
        // A write a crash interrupted (only our own names: other files are not ours to touch).
        if (parse_file_name(std::string_view(name).substr(0, name.size() - kTempSuffix.size()), id))
          remove_file(it->path().string());
        continue;
      }
      if (!parse_file_name(name, id)) continue;  // not a block file: not ours to touch
      found.push_back({id, static_cast<uint64_t>(st.st_size),
                       static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec});
    }
    // Newest last, so that after push_front the newest is at the front.
    std::sort(found.begin(), found.end(),
              [](const Found& a, const Found& b) { return a.mtime_ns < b.mtime_ns; });
    for (const Found& f : found) add(f.id, f.bytes);
    while (stats.bytes > budget_bytes && !lru.empty()) {
      const BlockId victim = lru.back();
      drop(victim);
      remove_file(path_of(victim));
      stats.evicted += 1;
    }
  }
};

DiskTier::DiskTier(const DiskTierOptions& options) : options_(options) {
  if (options_.budget_bytes == 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "disk tier: the budget is 0 bytes; give --kv-disk-budget a size such as 20GiB");
  }
  if (options_.block_tokens <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "disk tier: block_tokens is " +
                                                 std::to_string(options_.block_tokens) +
                                                 "; it must be at least 1");
  }
  if (options_.dir.empty()) {
    throw Error(ErrorKind::kInvalidArgument, "disk tier: no directory given (--kv-disk DIR)");
  }
  auto impl = std::make_unique<Impl>();
  impl->dir = (std::filesystem::path(options_.dir) / options_.fingerprint.hex()).string();
  std::error_code ec;
  std::filesystem::create_directories(impl->dir, ec);
  if (ec) {
    throw Error(ErrorKind::kIo, "disk tier: cannot create directory " + impl->dir + ": " +
                                    ec.message() + " (check --kv-disk and its permissions)");
  }
  impl->scan(options_.budget_bytes);
  impl_ = std::move(impl);
}

DiskTier::~DiskTier() {
  if (impl_) impl_->copier.drain();
}

bool DiskTier::store(const BlockKey& key, const BlockKey& parent, int32_t group,
                     std::span<const int32_t> tokens, std::span<const std::byte> payload) {
  const std::span<const std::byte> one[1] = {payload};
  return store(key, parent, group, tokens, std::span<const std::span<const std::byte>>(one));
}

bool DiskTier::store(const BlockKey& key, const BlockKey& parent, int32_t group,
                     std::span<const int32_t> tokens,
                     std::span<const std::span<const std::byte>> parts) {
  size_t payload_bytes = 0;
  for (const auto& part : parts) payload_bytes += part.size();
  KV_CHECK(static_cast<int64_t>(tokens.size()) == options_.block_tokens,
           "DiskTier::store: " + std::to_string(tokens.size()) + " tokens for blocks of " +
               std::to_string(options_.block_tokens));
  KV_CHECK(group >= 0, "DiskTier::store: negative group " + std::to_string(group));
  Impl& m = *impl_;
  const BlockId id{key, group};
  const uint64_t file_bytes = head_bytes(options_.block_tokens) + payload_bytes + kChecksumBytes;
  std::shared_ptr<Impl::Pending> job;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (const auto it = m.index.find(id); it != m.index.end()) {
      m.touch(it->second);
      m.touch_behind(id);
      return true;
    }
    if (m.pending.count(id) != 0) return true;
    if (file_bytes > options_.budget_bytes ||
        m.pending_bytes + file_bytes > options_.max_pending_bytes) {
      m.stats.dropped += 1;
      return false;
    }
    // Room for it now, counting the writes in flight, so that the files never exceed the budget
    // when they land.
    while (m.stats.bytes + m.pending_bytes + file_bytes > options_.budget_bytes && !m.lru.empty()) {
      const BlockId victim = m.lru.back();
      m.drop(victim);
      m.remove_behind(victim);
      m.stats.evicted += 1;
    }
    if (m.stats.bytes + m.pending_bytes + file_bytes > options_.budget_bytes) {
      m.stats.dropped += 1;  // the writes in flight alone fill the budget
      return false;
    }
    m.pending_bytes += file_bytes;
    job = std::make_shared<Impl::Pending>();
    m.pending.emplace(id, job);  // claims the block: a second store() of it returns above
  }

  // The image is built on the caller's thread without the lock (one copy of the payload, which
  // the caller may reuse as soon as store() returns); the checksum and the write run behind.
  job->image.resize(file_bytes);
  block_record::write_unsealed({options_.fingerprint, key, parent, group, tokens}, parts,
                               job->image);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    job->ready = true;
  }
  // The job owns the image through its shared_ptr; load() may read it concurrently, which is
  // safe: the copier writes only the checksum bytes, which load() does not read.
  m.copier.submit(
      Tier::kHost, Tier::kDisk, file_bytes, [&m, id, job] { m.write_file(id, job->image); },
      [&m, id, file_bytes](const std::string& error) { m.write_done(id, file_bytes, error); });
  return true;
}

bool DiskTier::contains(const BlockKey& key, int32_t group) const {
  const BlockId id{key, group};
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->index.count(id) != 0 || impl_->pending.count(id) != 0;
}

bool DiskTier::load(const BlockKey& key, int32_t group, std::span<const int32_t> tokens,
                    std::span<std::byte> payload) {
  Impl& m = *impl_;
  const BlockId id{key, group};
  const size_t head = head_bytes(options_.block_tokens);
  const uint64_t file_bytes = head + payload.size() + kChecksumBytes;
  const auto t0 = std::chrono::steady_clock::now();
  const bool tokens_fit = static_cast<int64_t>(tokens.size()) == options_.block_tokens;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (const auto pit = m.pending.find(id); pit != m.pending.end()) {
      // Still being written: the bytes in memory are the ones store() was given.
      const std::vector<std::byte>& image = pit->second->image;
      const std::byte* stored_tokens = image.data() + kFixedHeaderBytes;
      if (!pit->second->ready || !tokens_fit || image.size() != file_bytes ||
          std::memcmp(stored_tokens, tokens.data(), tokens.size_bytes()) != 0) {
        m.stats.misses += 1;
        return false;
      }
      if (!payload.empty()) std::memcpy(payload.data(), image.data() + head, payload.size());
      m.stats.hits += 1;
      return true;
    }
    const auto it = m.index.find(id);
    if (it == m.index.end() || !tokens_fit) {
      m.stats.misses += 1;
      return false;
    }
    m.touch(it->second);
    path = m.path_of(id);
  }

  // Read and verify without the lock (the copier's completions go on meanwhile). The payload
  // is read straight into the caller's buffer and verified there: on a false return it holds
  // unverified bytes, which the caller must not use (the header's contract).
  enum class Outcome { kHit, kAbsent, kCorrupt, kOtherTokens };
  Outcome outcome = Outcome::kCorrupt;
  uint64_t read_bytes = 0;
  {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st;
    if (fd.get() < 0) {
      outcome = errno == ENOENT ? Outcome::kAbsent : Outcome::kCorrupt;
    } else if (::fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != file_bytes) {
      outcome = Outcome::kCorrupt;  // truncated, or another layout's size
    } else {
      try {
        std::vector<std::byte> head_buf(head);
        std::byte stored_sum[kChecksumBytes];
        read_exact(fd.get(), 0, head_buf.data(), head, path);
        if (!payload.empty()) read_exact(fd.get(), head, payload.data(), payload.size(), path);
        read_exact(fd.get(), head + payload.size(), stored_sum, kChecksumBytes, path);
        read_bytes = file_bytes;
        const block_record::Verdict v = block_record::verify(
            {options_.fingerprint, key, group, tokens, payload.size()}, head_buf, payload,
            std::span<const std::byte>(stored_sum, kChecksumBytes));
        // kOtherTokens: an intact file for this key holding other tokens (the caller's tokens
        // do not hash to the key): a miss, and the file stays.
        outcome = v == block_record::Verdict::kOk            ? Outcome::kHit
                  : v == block_record::Verdict::kOtherTokens ? Outcome::kOtherTokens
                                                             : Outcome::kCorrupt;
      } catch (const Error&) {
        outcome = Outcome::kCorrupt;  // shrank while read, or an I/O error
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::lock_guard<std::mutex> lock(m.mu);
  m.stats.bytes_read += read_bytes;
  m.stats.read_seconds += seconds;
  switch (outcome) {
    case Outcome::kHit:
      m.stats.hits += 1;
      m.touch_behind(id);
      return true;
    case Outcome::kOtherTokens:
      m.stats.misses += 1;
      return false;
    case Outcome::kAbsent:  // removed behind the tier's back
      m.stats.misses += 1;
      m.drop(id);
      return false;
    case Outcome::kCorrupt:
      m.stats.misses += 1;
      m.stats.corrupt += 1;
      m.drop(id);
      m.remove_behind(id);
      return false;
  }
  return false;
}

void DiskTier::prefetch(const BlockKey& key, int32_t group) {
  std::string path;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    const BlockId id{key, group};
    if (impl_->index.count(id) == 0) return;  // absent, or still in memory (pending)
    path = impl_->path_of(id);
  }
  // Readahead is asynchronous: fadvise queues the file's pages and returns; the fd may close.
  const Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() >= 0) ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_WILLNEED);
}

void DiskTier::flush() {
  impl_->copier.drain();
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

}  // namespace kvcache
