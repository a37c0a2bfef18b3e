// DiskTier: block files under DIR/<fingerprint>/, verified on every read (a damaged file is a
// counted miss and is removed), an LRU budget on their sizes, write-behind with bounded bytes in
// flight, and an index that survives a restart.
#include "cache/disk_tier.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <list>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;
using testing_util::ScratchDir;

constexpr int32_t kBlockTokens = 4;
constexpr size_t kPayloadBytes = 1000;
// magic, version, fingerprint, key, parent, group, block_tokens, tokens, payload size, payload,
// checksum.
constexpr uint64_t kFileBytes =
    8 + 4 + 16 + 16 + 16 + 4 + 4 + 4 * kBlockTokens + 8 + kPayloadBytes + 16;

const Digest128 kFingerprint{0x1234, 0x5678};

DiskTierOptions options_for(const ScratchDir& dir, uint64_t budget_bytes = 1ull << 20,
                            Digest128 fingerprint = kFingerprint) {
  DiskTierOptions o;
  o.dir = dir.str();
  o.budget_bytes = budget_bytes;
  o.fingerprint = fingerprint;
  o.block_tokens = kBlockTokens;
  return o;
}

// Block i: tokens 4i..4i+3 chained from block i-1, a payload that differs per block.
struct Block {
  BlockKey key, parent;
  std::vector<int32_t> tokens;
  std::vector<std::byte> payload;
};

Block make_block(int i, int32_t group = 0) {
  Block b;
  for (int32_t t = 0; t < kBlockTokens; ++t) b.tokens.push_back(i * kBlockTokens + t);
  b.parent = i == 0 ? BlockKey{} : BlockKey{0xabc, static_cast<uint64_t>(i - 1)};
  b.key = block_key(b.parent, group, {}, b.tokens);
  b.payload.resize(kPayloadBytes);
  for (size_t j = 0; j < kPayloadBytes; ++j)
    b.payload[j] = static_cast<std::byte>((j * 7 + static_cast<size_t>(i) * 13) & 0xff);
  return b;
}

std::vector<Block> make_blocks(int n) {
  std::vector<Block> blocks;
  for (int i = 0; i < n; ++i) blocks.push_back(make_block(i));
  return blocks;
}

bool store(DiskTier& tier, const Block& b, int32_t group = 0) {
  return tier.store(b.key, b.parent, group, b.tokens, b.payload);
}

// Loads b and checks the payload on a hit.
bool load_ok(DiskTier& tier, const Block& b, int32_t group = 0) {
  std::vector<std::byte> out(b.payload.size());
  if (!tier.load(b.key, group, b.tokens, out)) return false;
  EXPECT_EQ(out, b.payload);
  return out == b.payload;
}

std::vector<fs::path> block_files(const ScratchDir& dir, Digest128 fingerprint = kFingerprint) {
  std::vector<fs::path> files;
  const fs::path sub = dir.path() / fingerprint.hex();
  if (!fs::exists(sub)) return files;
  for (const auto& e : fs::directory_iterator(sub)) files.push_back(e.path());
  return files;
}

fs::path file_of(const ScratchDir& dir, const Block& b, int32_t group = 0) {
  return dir.path() / kFingerprint.hex() /
         (Digest128{b.key.hi, b.key.lo}.hex() + "-g" + std::to_string(group) + ".kvb");
}

void flip_byte(const fs::path& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f.good()) << path;
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x40);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

TEST(DiskTier, RoundTripOfSeveralBlocks) {
  ScratchDir dir("disk_tier");
  DiskTier tier(options_for(dir));
  const std::vector<Block> blocks = make_blocks(5);
  for (const Block& b : blocks) EXPECT_TRUE(store(tier, b));
  tier.flush();
  const DiskTierStats s = tier.stats();
  EXPECT_EQ(s.stored, 5);
  EXPECT_EQ(s.blocks, 5);
  EXPECT_EQ(s.bytes, 5 * kFileBytes);
  EXPECT_EQ(s.bytes_written, 5 * kFileBytes);
  EXPECT_EQ(block_files(dir).size(), 5u);
  for (const Block& b : blocks) {
    EXPECT_TRUE(tier.contains(b.key, 0));
    EXPECT_TRUE(load_ok(tier, b));
  }
  EXPECT_FALSE(tier.contains(blocks[0].key, 1));  // another group
  const Block absent = make_block(9);
  EXPECT_FALSE(tier.contains(absent.key, 0));
  EXPECT_FALSE(load_ok(tier, absent));
  const DiskTierStats after = tier.stats();
  EXPECT_EQ(after.hits, 5);
  EXPECT_EQ(after.misses, 1);
  EXPECT_EQ(after.corrupt, 0);
  EXPECT_EQ(after.bytes_read, 5 * kFileBytes);
  EXPECT_GE(after.read_seconds, 0.0);
}

TEST(DiskTier, GroupsAreApart) {
  ScratchDir dir("disk_tier");
  DiskTier tier(options_for(dir));
  const Block b = make_block(0), other = make_block(1);
  Block g1 = other;
  g1.key = b.key;  // the same key, another group and payload
  EXPECT_TRUE(store(tier, b, 0));
  EXPECT_TRUE(store(tier, g1, 1));
  tier.flush();
  EXPECT_TRUE(load_ok(tier, b, 0));
  std::vector<std::byte> out(kPayloadBytes);
  ASSERT_TRUE(tier.load(b.key, 1, g1.tokens, out));
  EXPECT_EQ(out, g1.payload);
}

TEST(DiskTier, ServesAWriteStillInFlight) {
  ScratchDir dir("disk_tier");
  DiskTier tier(options_for(dir));
  const Block b = make_block(0);
  EXPECT_TRUE(store(tier, b));
  // Whether or not the copier has finished, the block is there and reads back exactly.
  EXPECT_TRUE(tier.contains(b.key, 0));
  EXPECT_TRUE(load_ok(tier, b));
  tier.flush();
  EXPECT_EQ(tier.stats().stored, 1);
}

TEST(DiskTier, RestartKeepsTheBlocks) {
  ScratchDir dir("disk_tier");
  const std::vector<Block> blocks = make_blocks(4);
  {
    DiskTier tier(options_for(dir));
    for (const Block& b : blocks) store(tier, b);
  }  // the destructor waits for the writes
  DiskTier again(options_for(dir));
  EXPECT_EQ(again.stats().blocks, 4);
  EXPECT_EQ(again.stats().bytes, 4 * kFileBytes);
  for (const Block& b : blocks) {
    EXPECT_TRUE(again.contains(b.key, 0));
    EXPECT_TRUE(load_ok(again, b));
  }
  EXPECT_EQ(again.stats().hits, 4);
}

TEST(DiskTier, RestartRemovesLeftoverTempFilesAndLeavesForeignFiles) {
  ScratchDir dir("disk_tier");
  const Block b = make_block(0);
  {
    DiskTier tier(options_for(dir));
    store(tier, b);
  }
  const fs::path sub = dir.path() / kFingerprint.hex();
  std::ofstream(sub / (file_of(dir, make_block(1)).filename().string() + ".tmp")) << "half";
  std::ofstream(sub / "notes.txt") << "not a block";
  std::ofstream(sub / "notes.tmp") << "not a block's temporary file";
  DiskTier again(options_for(dir));
  EXPECT_EQ(again.stats().blocks, 1);
  EXPECT_FALSE(fs::exists(sub / (file_of(dir, make_block(1)).filename().string() + ".tmp")));
  EXPECT_TRUE(fs::exists(sub / "notes.txt"));
  EXPECT_TRUE(fs::exists(sub / "notes.tmp"));
  EXPECT_TRUE(load_ok(again, b));
}

TEST(DiskTier, AnotherFingerprintDoesNotSeeThem) {
  ScratchDir dir("disk_tier");
  const Block b = make_block(0);
  {
    DiskTier tier(options_for(dir));
    store(tier, b);
  }
  const Digest128 other{0x1234, 0x5679};
  {
    // A tiny budget: it must not evict what belongs to the first fingerprint either.
    DiskTier tier(options_for(dir, 1, other));
    EXPECT_EQ(tier.stats().blocks, 0);
    EXPECT_FALSE(tier.contains(b.key, 0));
    EXPECT_FALSE(load_ok(tier, b));
    EXPECT_EQ(tier.stats().corrupt, 0);
  }
  EXPECT_EQ(block_files(dir).size(), 1u);
  DiskTier first(options_for(dir));
  EXPECT_TRUE(load_ok(first, b));
}

TEST(DiskTier, ACorruptPayloadByteIsACountedMissAndTheFileGoes) {
  ScratchDir dir("disk_tier");
  DiskTier tier(options_for(dir));
  const Block b = make_block(0), c = make_block(1);
  store(tier, b);
  store(tier, c);
  tier.flush();
  flip_byte(file_of(dir, b), kFileBytes - 16 - kPayloadBytes / 2);
  std::vector<std::byte> out(kPayloadBytes);
  EXPECT_FALSE(tier.load(b.key, 0, b.tokens, out));
  tier.flush();
  EXPECT_EQ(tier.stats().corrupt, 1);
  EXPECT_EQ(tier.stats().misses, 1);
  EXPECT_EQ(tier.stats().blocks, 1);
  EXPECT_EQ(tier.stats().bytes, kFileBytes);
  EXPECT_FALSE(tier.contains(b.key, 0));
  EXPECT_FALSE(fs::exists(file_of(dir, b)));
  EXPECT_TRUE(load_ok(tier, c));  // the other block is untouched
  // Stored again, it is written anew and hits.
  EXPECT_TRUE(store(tier, b));
  tier.flush();
  EXPECT_TRUE(load_ok(tier, b));
}

TEST(DiskTier, ACorruptHeaderOrChecksumIsACountedMiss) {
  ScratchDir dir("disk_tier");
  DiskTier tier(options_for(dir));
  // Offsets: magic, version, fingerprint, key, group, a token, the checksum.
  const std::vector<uint64_t> offsets = {0, 9, 20, 40, 61, 70, kFileBytes - 1};
  for (size_t i = 0; i < offsets.size(); ++i) {
    const Block b = make_block(static_cast<int>(i));
    store(tier, b);
    tier.flush();
    flip_byte(file_of(dir, b), offsets[i]);
    EXPECT_FALSE(load_ok(tier, b)) << "offset " << offsets[i];
    tier.flush();
    EXPECT_FALSE(fs::exists(file_of(dir, b))) << "offset " << offsets[i];
  }
  EXPECT_EQ(tier.stats().corrupt, static_cast<int64_t>(offsets.size()));
  EXPECT_EQ(tier.stats().blocks, 0);
  EXPECT_EQ(tier.stats().bytes, 0u);
}

TEST(DiskTier, ATruncatedFileIsACountedMissAndTheFileGoes) {
  ScratchDir dir("disk_tier");
  const Block b = make_block(0);
  {
    DiskTier tier(options_for(dir));
    store(tier, b);
  }
  // Truncated between runs (a crash of the machine, a full disk): indexed at its short size.
  ASSERT_EQ(::truncate(file_of(dir, b).c_str(), static_cast<off_t>(kFileBytes - 100)), 0);
  DiskTier tier(options_for(dir));
  EXPECT_TRUE(tier.contains(b.key, 0));
  EXPECT_FALSE(load_ok(tier, b));
  tier.flush();
  EXPECT_EQ(tier.stats().corrupt, 1);
  EXPECT_FALSE(tier.contains(b.key, 0));
  EXPECT_FALSE(fs::exists(file_of(dir, b)));
  // Truncated while indexed.
  const Block c = make_block(1);
  store(tier, c);
  tier.flush();
  ASSERT_EQ(::truncate(file_of(dir, c).c_str(), 10), 0);
  EXPECT_FALSE(load_ok(tier, c));
  tier.flush();
  EXPECT_EQ(tier.stats().corrupt, 2);
  EXPECT_FALSE(fs::exists(file_of(dir, c)));
}

// A tier holding one block, written.
class DiskTierOneBlock : public ::testing::Test {
 protected:
  void SetUp() override {
    store(tier, b);
    tier.flush();
  }
  ScratchDir dir{"disk_tier"};
  DiskTier tier{options_for(dir)};
  const Block b = make_block(0);
};

TEST_F(DiskTierOneBlock, WrongTokensOrSizeIsAMiss) {
  std::vector<int32_t> other = b.tokens;
  other[2] += 1;
  std::vector<std::byte> out(kPayloadBytes);
  EXPECT_FALSE(tier.load(b.key, 0, other, out));
  EXPECT_EQ(tier.stats().misses, 1);
  EXPECT_EQ(tier.stats().corrupt, 0);  // the file is intact: it stays
  EXPECT_TRUE(load_ok(tier, b));
  // Asked for another payload size than stored: refused, never a short or long copy.
  std::vector<std::byte> longer(kPayloadBytes + 8);
  EXPECT_FALSE(tier.load(b.key, 0, b.tokens, longer));
}

TEST(DiskTier, BudgetEvictsTheLeastRecentlyUsed) {
  ScratchDir dir("disk_tier");
  const uint64_t budget = 3 * kFileBytes + kFileBytes / 2;  // room for 3 files
  DiskTier tier(options_for(dir, budget));
  const std::vector<Block> blocks = make_blocks(6);
  for (int i = 0; i < 3; ++i) store(tier, blocks[static_cast<size_t>(i)]);
  tier.flush();
  EXPECT_TRUE(load_ok(tier, blocks[0]));  // refreshed: block 1 is now the oldest
  store(tier, blocks[3]);
  tier.flush();
  EXPECT_FALSE(tier.contains(blocks[1].key, 0));
  EXPECT_TRUE(tier.contains(blocks[0].key, 0));
  EXPECT_TRUE(store(tier, blocks[0]));  // a store refreshes too: block 2 is the oldest
  store(tier, blocks[4]);
  store(tier, blocks[5]);
  tier.flush();
  const DiskTierStats s = tier.stats();
  EXPECT_LE(s.bytes, budget);
  EXPECT_EQ(s.blocks, 3);
  EXPECT_EQ(s.evicted, 3);
  EXPECT_EQ(s.stored, 6);
  for (int i : {1, 2, 3}) EXPECT_FALSE(tier.contains(blocks[static_cast<size_t>(i)].key, 0)) << i;
  for (int i : {0, 4, 5}) EXPECT_TRUE(load_ok(tier, blocks[static_cast<size_t>(i)])) << i;
  EXPECT_EQ(block_files(dir).size(), 3u);
  uint64_t on_disk = 0;
  for (const fs::path& f : block_files(dir)) on_disk += fs::file_size(f);
  EXPECT_LE(on_disk, budget);
}

TEST(DiskTier, ABlockLargerThanTheBudgetIsDropped) {
  ScratchDir dir("disk_tier");
  DiskTier tier(options_for(dir, kFileBytes - 1));
  const Block b = make_block(0);
  EXPECT_FALSE(store(tier, b));
  tier.flush();
  EXPECT_EQ(tier.stats().dropped, 1);
  EXPECT_EQ(tier.stats().blocks, 0);
  EXPECT_FALSE(tier.contains(b.key, 0));
  EXPECT_TRUE(block_files(dir).empty());
}

TEST(DiskTier, ASmallerBudgetAtRestartEvictsTheOldest) {
  ScratchDir dir("disk_tier");
  const std::vector<Block> blocks = make_blocks(4);
  {
    DiskTier tier(options_for(dir));
    for (const Block& b : blocks) {
      store(tier, b);
      tier.flush();
    }
  }
  // mtimes decide the order: make block 0 the newest, whatever the clock's resolution.
  const fs::path f0 = file_of(dir, blocks[0]);
  fs::last_write_time(f0, fs::last_write_time(f0) + std::chrono::hours(1));
  for (int i = 1; i < 4; ++i) {
    const fs::path f = file_of(dir, blocks[static_cast<size_t>(i)]);
    fs::last_write_time(f, fs::last_write_time(f0) - std::chrono::minutes(10 * (4 - i)));
  }
  DiskTier tier(options_for(dir, 2 * kFileBytes));
  EXPECT_EQ(tier.stats().blocks, 2);
  EXPECT_EQ(tier.stats().evicted, 2);
  EXPECT_TRUE(tier.contains(blocks[0].key, 0));
  EXPECT_TRUE(tier.contains(blocks[3].key, 0));
  EXPECT_EQ(block_files(dir).size(), 2u);
}

TEST(DiskTier, AHitBeforeARestartKeepsTheBlockUnderASmallerBudget) {
  ScratchDir dir("disk_tier");
  const std::vector<Block> blocks = make_blocks(3);
  {
    DiskTier tier(options_for(dir));
    for (const Block& b : blocks) store(tier, b);
    tier.flush();
    // Written long ago, block 0 the oldest.
    for (int i = 0; i < 3; ++i) {
      const fs::path f = file_of(dir, blocks[static_cast<size_t>(i)]);
      fs::last_write_time(f, fs::last_write_time(f) - std::chrono::hours(3 - i));
    }
    EXPECT_TRUE(load_ok(tier, blocks[0]));  // its file's mtime becomes now
  }
  DiskTier tier(options_for(dir, kFileBytes));
  EXPECT_EQ(tier.stats().blocks, 1);
  EXPECT_TRUE(load_ok(tier, blocks[0]));
}

TEST(DiskTier, AFailedWriteIsDroppedAndNotIndexed) {
  ScratchDir dir("disk_tier");
  DiskTier tier(options_for(dir));
  fs::remove_all(dir.path() / kFingerprint.hex());  // the write's open() then fails
  const Block b = make_block(0);
  EXPECT_TRUE(store(tier, b));  // queued: the failure is known only behind
  tier.flush();
  const DiskTierStats s = tier.stats();
  EXPECT_EQ(s.dropped, 1);
  EXPECT_EQ(s.stored, 0);
  EXPECT_EQ(s.blocks, 0);
  EXPECT_EQ(s.bytes, 0u);
  EXPECT_FALSE(tier.contains(b.key, 0));
  EXPECT_FALSE(load_ok(tier, b));
}

TEST(DiskTier, PrefetchIsOnlyAHint) {
  ScratchDir dir("disk_tier");
  DiskTier tier(options_for(dir));
  const std::vector<Block> blocks = make_blocks(3);
  for (const Block& b : blocks) store(tier, b);
  tier.flush();
  tier.prefetch(make_block(7).key, 0);  // absent: nothing happens
  for (const Block& b : blocks) tier.prefetch(b.key, 0);
  for (const Block& b : blocks) EXPECT_TRUE(load_ok(tier, b));
  const DiskTierStats s = tier.stats();
  EXPECT_EQ(s.hits, 3);
  EXPECT_EQ(s.misses, 0);
}

TEST(DiskTier, WritesBeyondTheInFlightBoundAreDropped) {
  ScratchDir dir("disk_tier");
  DiskTierOptions o = options_for(dir);
  o.max_pending_bytes = kFileBytes - 1;  // not even one write fits
  DiskTier tier(o);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(store(tier, make_block(i)));
  tier.flush();
  EXPECT_EQ(tier.stats().dropped, 3);
  EXPECT_EQ(tier.stats().stored, 0);
  EXPECT_TRUE(block_files(dir).empty());

  // Room for one in flight: whatever the copier's pace, each store is written or dropped, and
  // the counts add up.
  ScratchDir dir2("disk_tier2");
  DiskTierOptions o2 = options_for(dir2);
  o2.max_pending_bytes = kFileBytes;
  DiskTier one(o2);
  int accepted = 0;
  for (int i = 0; i < 20; ++i) accepted += store(one, make_block(i)) ? 1 : 0;
  one.flush();
  EXPECT_GE(accepted, 1);
  EXPECT_EQ(one.stats().stored, accepted);
  EXPECT_EQ(one.stats().dropped, 20 - accepted);
  EXPECT_EQ(one.stats().blocks, accepted);
}

TEST_F(DiskTierOneBlock, StoringAnExistingKeyDoesNotRewrite) {
  const fs::path f = file_of(dir, b);
  struct stat before;
  ASSERT_EQ(::stat(f.c_str(), &before), 0);
  EXPECT_TRUE(store(tier, b));
  EXPECT_TRUE(store(tier, b));
  tier.flush();
  struct stat after;
  ASSERT_EQ(::stat(f.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);  // a rewrite renames a new inode into place
  const DiskTierStats s = tier.stats();
  EXPECT_EQ(s.stored, 1);
  EXPECT_EQ(s.bytes_written, kFileBytes);
  EXPECT_EQ(s.blocks, 1);
}

// Random stores, loads and damaged files against a model of the tier (an LRU list of blocks and
// their file sizes); after each step the files on disk are exactly the model's.
TEST(DiskTier, RandomizedAgainstAModel) {
  ScratchDir dir("disk_tier");
  const uint64_t budget = 6 * kFileBytes;
  DiskTier tier(options_for(dir, budget));
  std::mt19937 rng(40);
  const std::vector<Block> blocks = make_blocks(12);
  // Block i's payload is kPayloadBytes + 100 * (i % 3) bytes: files of three sizes.
  auto payload_of = [&](size_t i) {
    std::vector<std::byte> p = blocks[i].payload;
    p.resize(kPayloadBytes + 100 * (i % 3), std::byte{7});
    return p;
  };
  std::list<size_t> lru;  // front: most recent
  auto size_of = [](size_t i) { return kFileBytes + 100 * (i % 3); };
  auto model_bytes = [&] {
    uint64_t n = 0;
    for (size_t i : lru) n += size_of(i);
    return n;
  };
  int64_t corrupt = 0, evicted = 0;
  for (int step = 0; step < 400; ++step) {
    const size_t i = rng() % blocks.size();
    const Block& b = blocks[i];
    const auto it = std::find(lru.begin(), lru.end(), i);
    const int op = static_cast<int>(rng() % 4);
    if (op <= 1) {  // store
      EXPECT_TRUE(tier.store(b.key, b.parent, 0, b.tokens, payload_of(i)));
      if (it != lru.end())
        lru.erase(it);
      else
        while (model_bytes() + size_of(i) > budget) {
          lru.pop_back();
          ++evicted;
        }
      lru.push_front(i);
    } else if (op == 2) {  // load
      std::vector<std::byte> out(payload_of(i).size());
      const bool hit = tier.load(b.key, 0, b.tokens, out);
      EXPECT_EQ(hit, it != lru.end()) << "step " << step;
      if (hit) {
        EXPECT_EQ(out, payload_of(i)) << "step " << step;
        lru.erase(it);
        lru.push_front(i);
      }
    } else if (it != lru.end()) {  // damage its file: the next load finds it corrupt
      flip_byte(file_of(dir, b), rng() % size_of(i));
      std::vector<std::byte> out(payload_of(i).size());
      EXPECT_FALSE(tier.load(b.key, 0, b.tokens, out)) << "step " << step;
      lru.erase(it);
      ++corrupt;
    }
    tier.flush();
    const DiskTierStats st = tier.stats();
    ASSERT_EQ(st.blocks, static_cast<int64_t>(lru.size())) << "step " << step;
    ASSERT_EQ(st.bytes, model_bytes()) << "step " << step;
    ASSERT_LE(st.bytes, budget);
    ASSERT_EQ(st.corrupt, corrupt);
    ASSERT_EQ(st.evicted, evicted);
    uint64_t on_disk = 0;
    const std::vector<fs::path> files = block_files(dir);
    for (const fs::path& f : files) on_disk += fs::file_size(f);
    ASSERT_EQ(files.size(), lru.size()) << "step " << step;
    ASSERT_EQ(on_disk, st.bytes) << "step " << step;
  }
  EXPECT_GT(corrupt, 0);
  EXPECT_GT(evicted, 0);
}

TEST(DiskTier, RefusesAZeroBudgetOrBlockSize) {
  ScratchDir dir("disk_tier");
  EXPECT_THROW(DiskTier(options_for(dir, 0)), Error);
  DiskTierOptions o = options_for(dir);
  o.block_tokens = 0;
  EXPECT_THROW(DiskTier{o}, Error);
}

TEST(DiskTier, AnUncreatableDirectoryIsAnIoError) {
  ScratchDir dir("disk_tier");
  std::ofstream(dir.file("plain")) << "a file, not a directory";
  DiskTierOptions o = options_for(dir);
  o.dir = dir.file("plain");
  try {
    DiskTier tier(o);
    FAIL() << "expected Error(kIo)";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("plain"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvcache
