// The disk tier's read mechanism, chosen by measurement (issue 40: "io_uring or plain
// pread/pwrite on a thread"). The tier's pattern: a prefix hit reads N whole block files of
// ~200 KB each (one per block and layer group), each opened, read and closed. Compared, with
// the files warm in the page cache and cold (posix_fadvise DONTNEED before each pass):
//   - Pread:        open, pread the whole file, close, one file after another on one thread
//                   (what DiskTier::load does on the caller's thread, and TierCopier on its own);
//   - PreadWillNeed: the same after posix_fadvise(WILLNEED) on every file of the batch first (the
//                   kernel's readahead then has all of them in flight, as a queue would);
//   - IoUring/QD:   the files opened first, then their reads through an io_uring with up to QD
//                   in flight (liburing; only built when CMake finds it: bench/CMakeLists.txt);
//   - DiskTierLoad: the product path, DiskTier::load of N stored blocks (open, fstat, three
//                   preads, BLAKE2b-128 of the file, header checks), without or with
//                   DiskTier::prefetch of the batch first;
//   - Checksum:     what the verification costs per block file: memcpy (the machine's copy
//                   rate, for scale), BLAKE2b-128 as DiskTier uses it (core/digest.h), and
//                   libb2's 4-way parallel BLAKE2bp for comparison (Debian's libb2 runs it on
//                   OpenMP threads: compare its real time, the CPU column is one thread's),
//                   XXH3-128 and CRC32C (SSE4.2) as what a non-cryptographic check costs.
// Each pass reads every file once; bytes/s is the rate of file bytes delivered to memory.
//
//   TIER_IO_DIR=/var/tmp build/bench/bench_tier_io --benchmark_counters_tabular=true
// TIER_IO_DIR: where the files go (default: the system temp dir; must be a real disk, not a
// tmpfs, for the cold case to mean anything).
#include <benchmark/benchmark.h>
#include <blake2.h>
#ifdef __SSE4_2__
#include <nmmintrin.h>
#endif
#ifdef KVCACHE_HAVE_XXHASH
#include <xxhash.h>
#endif
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/disk_tier.h"
#include "core/error.h"
#include "core/tier.h"

#ifdef KVCACHE_HAVE_LIBURING
#include <liburing.h>
#endif

namespace kvcache {
namespace {

constexpr size_t kFileBytes = 200 * 1024;  // a 16-token block of a 32-layer, 8x128 f16 group

// N files of kFileBytes under TIER_IO_DIR, written once per process, synced (so that DONTNEED
// can drop their pages) and removed at exit.
class Files {
 public:
  static const Files& get(int n) {
    static Files files(n_max());
    KV_CHECK(n <= static_cast<int>(files.paths.size()), "bench_tier_io: too many files asked");
    return files;
  }
  static int n_max() { return 256; }
  ~Files() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string dir;
  std::vector<std::string> paths;

 private:
  explicit Files(int n) {
    const char* env = std::getenv("TIER_IO_DIR");
    const std::filesystem::path base =
        env != nullptr ? std::filesystem::path(env) : std::filesystem::temp_directory_path();
    dir = (base / ("kvcache_bench_tier_io_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir);
    std::vector<char> buf(kFileBytes);
    for (int i = 0; i < n; ++i) {
      for (size_t j = 0; j < buf.size(); ++j) buf[j] = static_cast<char>((j * 31 + i) & 0xff);
      paths.push_back(dir + "/block" + std::to_string(i) + ".kvb");
      const int fd = ::open(paths.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      KV_CHECK(fd >= 0, "bench_tier_io: cannot create " + paths.back());
      write_exact(fd, 0, buf.data(), buf.size(), paths.back());
      KV_CHECK(::fsync(fd) == 0, "bench_tier_io: fsync failed");
      ::close(fd);
    }
  }
};

// Drops the files' pages from the page cache (they are clean: synced at creation).
void drop_cache(const Files& files, int n) {
  for (int i = 0; i < n; ++i) {
    const int fd = ::open(files.paths[static_cast<size_t>(i)].c_str(), O_RDONLY | O_CLOEXEC);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

void warm_cache(const Files& files, int n, std::vector<char>& buf) {
  for (int i = 0; i < n; ++i) {
    const int fd = ::open(files.paths[static_cast<size_t>(i)].c_str(), O_RDONLY | O_CLOEXEC);
    read_exact(fd, 0, buf.data() + static_cast<size_t>(i) * kFileBytes, kFileBytes, "warm");
    ::close(fd);
  }
}

// Runs one pass per iteration; `cold` drops the cache before each (untimed).
template <typename Pass>
void run(benchmark::State& state, bool cold, Pass&& pass) {
  const int n = static_cast<int>(state.range(0));
  const Files& files = Files::get(n);
  std::vector<char> buf(static_cast<size_t>(n) * kFileBytes);  // [n, kFileBytes]
  if (!cold) warm_cache(files, n, buf);
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      drop_cache(files, n);
      state.ResumeTiming();
    }
    pass(files, n, buf);
    benchmark::DoNotOptimize(buf.data());
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(kFileBytes));
  state.counters["per_file"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate |
                                                     benchmark::Counter::kInvert);
}

void pread_pass(const Files& files, int n, std::vector<char>& buf) {
  for (int i = 0; i < n; ++i) {
    const std::string& path = files.paths[static_cast<size_t>(i)];
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    KV_CHECK(fd >= 0, "bench_tier_io: cannot open " + path);
    read_exact(fd, 0, buf.data() + static_cast<size_t>(i) * kFileBytes, kFileBytes, path);
    ::close(fd);
  }
}

void pread_willneed_pass(const Files& files, int n, std::vector<char>& buf) {
  std::vector<int> fds(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    fds[static_cast<size_t>(i)] =
        ::open(files.paths[static_cast<size_t>(i)].c_str(), O_RDONLY | O_CLOEXEC);
    ::posix_fadvise(fds[static_cast<size_t>(i)], 0, 0, POSIX_FADV_WILLNEED);
  }
  for (int i = 0; i < n; ++i) {
    read_exact(fds[static_cast<size_t>(i)], 0, buf.data() + static_cast<size_t>(i) * kFileBytes,
               kFileBytes, files.paths[static_cast<size_t>(i)]);
    ::close(fds[static_cast<size_t>(i)]);
  }
}

void BM_Pread(benchmark::State& state) {
  run(state, state.range(1) != 0, pread_pass);
}
void BM_PreadWillNeed(benchmark::State& state) {
  run(state, state.range(1) != 0, pread_willneed_pass);
}

// Args: files per pass, cold (0/1).
BENCHMARK(BM_Pread)->ArgsProduct({{16, 128}, {0, 1}})->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_PreadWillNeed)
    ->ArgsProduct({{16, 128}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// N blocks of a DiskTier with payloads that make files of about kFileBytes, stored once.
struct TierBlocks {
  std::string dir;
  std::unique_ptr<DiskTier> tier;
  std::vector<BlockKey> keys;
  std::vector<std::vector<int32_t>> tokens;
  size_t payload_bytes = kFileBytes - 256;
  ~TierBlocks() {
    tier.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

void BM_DiskTierLoad(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const bool cold = state.range(1) != 0, prefetch = state.range(2) != 0;
  constexpr int32_t kBlockTokens = 16;
  TierBlocks b;
  const char* env = std::getenv("TIER_IO_DIR");
  b.dir = ((env != nullptr ? std::filesystem::path(env) : std::filesystem::temp_directory_path()) /
           ("kvcache_bench_disk_tier_" + std::to_string(::getpid())))
              .string();
  DiskTierOptions o;
  o.dir = b.dir;
  o.budget_bytes = 1ull << 32;
  o.fingerprint = Digest128{1, 2};
  o.block_tokens = kBlockTokens;
  b.tier = std::make_unique<DiskTier>(o);
  std::vector<std::byte> payload(b.payload_bytes);
  BlockKey parent;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> t(kBlockTokens);
    for (int32_t j = 0; j < kBlockTokens; ++j) t[static_cast<size_t>(j)] = i * kBlockTokens + j;
    for (size_t j = 0; j < payload.size(); ++j) payload[j] = static_cast<std::byte>(j * 31 + i);
    const BlockKey key = block_key(parent, 0, {}, t);
    KV_CHECK(b.tier->store(key, parent, 0, t, payload), "bench_tier_io: a store was dropped");
    b.keys.push_back(key);
    b.tokens.push_back(std::move(t));
    parent = key;
  }
  b.tier->flush();
  const std::string sub = b.dir + "/" + o.fingerprint.hex();
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(sub)) paths.push_back(e.path());
  for (const std::string& p : paths) {  // synced, so that DONTNEED drops them
    const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
    ::fsync(fd);
    ::close(fd);
  }
  std::vector<std::byte> out(static_cast<size_t>(n) * b.payload_bytes);  // [n, payload_bytes]
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      for (const std::string& p : paths) {
        const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
        ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        ::close(fd);
      }
      state.ResumeTiming();
    }
    if (prefetch)
      for (int i = 0; i < n; ++i) b.tier->prefetch(b.keys[static_cast<size_t>(i)], 0);
    for (int i = 0; i < n; ++i) {
      const bool hit =
          b.tier->load(b.keys[static_cast<size_t>(i)], 0, b.tokens[static_cast<size_t>(i)],
                       std::span<std::byte>(out.data() + static_cast<size_t>(i) * b.payload_bytes,
                                            b.payload_bytes));
      KV_CHECK(hit, "bench_tier_io: a stored block missed");
    }
  }
  state.SetBytesProcessed(state.iterations() * n * static_cast<int64_t>(b.payload_bytes));
  state.counters["per_block"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate |
                                                     benchmark::Counter::kInvert);
}
// Args: blocks per pass, cold (0/1), prefetch (0/1).
BENCHMARK(BM_DiskTierLoad)
    ->ArgsProduct({{16, 128}, {0, 1}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

#ifdef __SSE4_2__
// CRC32C with the SSE4.2 instruction, one stream (what a non-cryptographic check would cost).
uint32_t crc32c(const std::byte* p, size_t n) {
  uint64_t c = 0xffffffffu;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    c = _mm_crc32_u64(c, w);
  }
  for (; i < n; ++i) c = _mm_crc32_u8(static_cast<uint32_t>(c), static_cast<uint8_t>(p[i]));
  return static_cast<uint32_t>(c) ^ 0xffffffffu;
}
#endif

// Arg: 0 memcpy, 1 BLAKE2b-128 (digest128), 2 BLAKE2bp-128, 3 XXH3-128 (only when libxxhash is
// found), 4 CRC32C (only in SSE4.2 builds).
void BM_Checksum(benchmark::State& state) {
  std::vector<std::byte> in(kFileBytes), out(kFileBytes);
  for (size_t j = 0; j < in.size(); ++j) in[j] = static_cast<std::byte>(j * 31);
  uint8_t sum[16];
  for (auto _ : state) {
    switch (state.range(0)) {
      case 0:
        std::memcpy(out.data(), in.data(), in.size());
        benchmark::DoNotOptimize(out.data());
        break;
      case 1:
        benchmark::DoNotOptimize(digest128(in.data(), in.size()));
        break;
      case 2:
        KV_CHECK(blake2bp(sum, in.data(), nullptr, sizeof sum, in.size(), 0) == 0, "blake2bp");
        benchmark::DoNotOptimize(sum);
        break;
#ifdef KVCACHE_HAVE_XXHASH
      case 3:
        benchmark::DoNotOptimize(XXH3_128bits(in.data(), in.size()));
        break;
#endif
#ifdef __SSE4_2__
      case 4:
        benchmark::DoNotOptimize(crc32c(in.data(), in.size()));
        break;
#endif
      default:
        KV_CHECK(false, "bench_tier_io: no checksum " + std::to_string(state.range(0)));
    }
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(kFileBytes));
}
BENCHMARK(BM_Checksum)
    ->DenseRange(0, 2)
#ifdef KVCACHE_HAVE_XXHASH
    ->Arg(3)
#endif
#ifdef __SSE4_2__
    ->Arg(4)
#endif
    ->Unit(benchmark::kMicrosecond);

#ifdef KVCACHE_HAVE_LIBURING
// Opens the files, then keeps up to `depth` whole-file reads in flight until all are done.
void uring_pass(io_uring& ring, int depth, const Files& files, int n, std::vector<char>& buf) {
  std::vector<int> fds(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    fds[static_cast<size_t>(i)] =
        ::open(files.paths[static_cast<size_t>(i)].c_str(), O_RDONLY | O_CLOEXEC);
    KV_CHECK(fds[static_cast<size_t>(i)] >= 0, "bench_tier_io: cannot open a file");
  }
  int submitted = 0, completed = 0, in_flight = 0;
  while (completed < n) {
    while (submitted < n && in_flight < depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      KV_CHECK(sqe != nullptr, "bench_tier_io: submission queue full");
      io_uring_prep_read(sqe, fds[static_cast<size_t>(submitted)],
                         buf.data() + static_cast<size_t>(submitted) * kFileBytes, kFileBytes, 0);
      io_uring_sqe_set_data64(sqe, static_cast<uint64_t>(submitted));
      ++submitted;
      ++in_flight;
    }
    KV_CHECK(io_uring_submit(&ring) >= 0, "bench_tier_io: io_uring_submit failed");
    io_uring_cqe* cqe = nullptr;
    KV_CHECK(io_uring_wait_cqe(&ring, &cqe) == 0, "bench_tier_io: io_uring_wait_cqe failed");
    // Regular files on ext4 complete whole; a short read would be a bench bug, not a case.
    KV_CHECK(cqe->res == static_cast<int>(kFileBytes),
             "bench_tier_io: short read " + std::to_string(cqe->res));
    io_uring_cqe_seen(&ring, cqe);
    ++completed;
    --in_flight;
  }
  for (int fd : fds) ::close(fd);
}

void BM_IoUring(benchmark::State& state) {
  const int depth = static_cast<int>(state.range(2));
  io_uring ring;
  const int r = io_uring_queue_init(static_cast<unsigned>(depth), &ring, 0);
  if (r < 0) {
    state.SkipWithError(("io_uring_queue_init: " + std::string(std::strerror(-r))).c_str());
    return;
  }
  run(state, state.range(1) != 0, [&](const Files& files, int n, std::vector<char>& buf) {
    uring_pass(ring, depth, files, n, buf);
  });
  io_uring_queue_exit(&ring);
}
// Args: files per pass, cold (0/1), queue depth.
BENCHMARK(BM_IoUring)
    ->ArgsProduct({{16, 128}, {0, 1}, {1, 8, 32}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
#endif

}  // namespace
}  // namespace kvcache

BENCHMARK_MAIN();
