// The disk tier under the prefix cache (issue 40, cache/disk_tier.h) through the engine: a
// prefix evicted from a tiny RAM pool is served again from disk with the tokens a run without
// the tier gives; a second engine on the same directory hits on its first request; a corrupt
// file is a counted miss; the budget holds; another model never matches. dummy:tiny, blocks of
// 16 tokens, a pool of 8 blocks.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/model_loader.h"
#include "scratch_dir.h"
#include "tiny_model.h"

namespace kvcache {
namespace {

using testing_util::ScratchDir;
using testing_util::tiny_model;

std::vector<int32_t> random_prompt(size_t n, uint32_t seed, uint32_t vocab = 31000) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p = {1};
  while (p.size() < n) p.push_back(static_cast<int32_t>(rng() % (vocab - 3)) + 3);
  return p;
}

RequestOutput run_one(Engine& e, const std::vector<int32_t>& prompt, int64_t max_tokens = 3) {
  RequestParams rp;
  rp.prompt = prompt;
  rp.max_tokens = max_tokens;
  RequestOutput out;
  EXPECT_NE(e.submit(rp,
                     [&out](const StreamEvent& ev) {
                       if (ev.output != nullptr) out = *ev.output;
                     }),
            0u);
  e.run_until_idle();  // check_invariants_every_step (tiny_pool)
  EXPECT_EQ(e.check_invariants(), "");
  return out;
}

EngineConfig tiny_pool(const std::string& disk_dir, uint64_t budget = 64ull << 20) {
  EngineConfig c;
  c.cache.paged.block_tokens = 16;
  c.num_blocks = 8;  // 128 token slots: a 122-token request evicts everything else
  c.max_tokens_per_step = 256;
  c.kv_disk_dir = disk_dir;
  c.kv_disk_budget_bytes = budget;
  c.check_invariants_every_step = true;
  return c;
}

std::vector<int32_t> reference(const Model& model, const std::vector<int32_t>& prompt) {
  Engine e(model, nullptr, tiny_pool(""));
  return run_one(e, prompt).samples.at(0).tokens;
}

const std::vector<int32_t>& prompt_a() {  // 4 full blocks (the last token is computed) + 5
  static const std::vector<int32_t> p = random_prompt(70, 7);
  return p;
}
const std::vector<int32_t>& prompt_b() {  // 8 blocks with its answer: evicts all of A
  static const std::vector<int32_t> p = random_prompt(120, 8);
  return p;
}

std::vector<std::filesystem::path> block_files(const std::string& dir) {
  std::vector<std::filesystem::path> out;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir))
    if (f.is_regular_file() && f.path().extension() == ".kvb") out.push_back(f.path());
  std::sort(out.begin(), out.end());
  return out;
}

// An engine on `dir` runs prompt A and ends (writing its RAM prefix cache to disk); A's tokens.
std::vector<int32_t> prime(const std::string& dir) {
  Engine e(*tiny_model().model, nullptr, tiny_pool(dir));
  return run_one(e, prompt_a()).samples.at(0).tokens;
}

TEST(DiskTierEngine, APrefixEvictedFromRamIsServedFromDiskWithTheSameTokens) {
  const Model& model = *tiny_model().model;
  ScratchDir dir("disk");
  Engine e(model, nullptr, tiny_pool(dir.str()));
  const RequestOutput first = run_one(e, prompt_a());
  ASSERT_EQ(first.samples.at(0).tokens, reference(model, prompt_a()));
  EXPECT_EQ(first.stats.cached_tokens, 0);
  run_one(e, prompt_b());  // evicts A's blocks: written behind
  e.store().disk_tier()->flush();
  EXPECT_GE(e.store().disk_tier()->stats().stored, 4);

  const RequestOutput again = run_one(e, prompt_a());
  EXPECT_EQ(again.samples.at(0).tokens, first.samples.at(0).tokens);
  EXPECT_EQ(again.stats.cached_tokens, 64);
  EXPECT_EQ(again.stats.cached_tokens_disk, 64);
  const EngineMetrics m = e.metrics();
  EXPECT_TRUE(m.disk_tier);
  EXPECT_EQ(m.disk.hits, 4);
  EXPECT_EQ(m.disk.corrupt, 0);
  EXPECT_EQ(m.cached_prompt_tokens_disk, 64);

  // Loaded blocks are RAM-cached again: the next hit on A is from RAM.
  const RequestOutput third = run_one(e, prompt_a());
  EXPECT_EQ(third.samples.at(0).tokens, first.samples.at(0).tokens);
  EXPECT_EQ(third.stats.cached_tokens, 69);  // the tail block copied too
  EXPECT_EQ(third.stats.cached_tokens_disk, 0);
}

TEST(DiskTierEngine, ASecondEngineOnTheSameDirectoryHitsOnItsFirstRequest) {
  const Model& model = *tiny_model().model;
  ScratchDir dir("disk");
  const std::vector<int32_t> want = prime(dir.str());  // nothing evicted: written as it ends
  Engine e(model, nullptr, tiny_pool(dir.str()));
  EXPECT_GE(e.metrics().disk.blocks, 4);
  const RequestOutput again = run_one(e, prompt_a());
  EXPECT_EQ(again.samples.at(0).tokens, want);
  EXPECT_EQ(again.stats.cached_tokens_disk, 64);
}

TEST(DiskTierEngine, ACorruptBlockFileIsACountedMissWithCorrectOutput) {
  const Model& model = *tiny_model().model;
  ScratchDir dir("disk");
  const std::vector<int32_t> want = prime(dir.str());
  const std::vector<std::filesystem::path> files = block_files(dir.str());
  ASSERT_GE(files.size(), 4u);
  for (const auto& f : files) {  // one byte flipped in the middle of every file
    std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
    const auto mid = static_cast<std::streamoff>(std::filesystem::file_size(f) / 2);
    io.seekg(mid);
    char c = 0;
    io.get(c);
    io.seekp(mid);
    io.put(static_cast<char>(c ^ 0x5a));
  }
  Engine e(model, nullptr, tiny_pool(dir.str()));
  const RequestOutput again = run_one(e, prompt_a());
  EXPECT_EQ(again.samples.at(0).tokens, want);
  EXPECT_EQ(again.stats.cached_tokens, 0);
  EXPECT_GE(e.metrics().disk.corrupt, 1);
  EXPECT_EQ(e.metrics().disk.hits, 0);
  EXPECT_GE(e.metrics().disk_loads_failed, 1);
}

TEST(DiskTierEngine, TheBudgetHolds) {
  const Model& model = *tiny_model().model;
  ScratchDir dir("disk");
  uint64_t file_bytes = 0;
  prime(dir.str());
  const std::vector<std::filesystem::path> files = block_files(dir.str());
  ASSERT_FALSE(files.empty());
  file_bytes = std::filesystem::file_size(files[0]);
  const uint64_t budget = file_bytes * 5 + file_bytes / 2;  // room for 5 blocks
  ScratchDir dir2("disk2");
  Engine e(model, nullptr, tiny_pool(dir2.str(), budget));
  for (uint32_t seed = 20; seed < 26; ++seed) run_one(e, random_prompt(100, seed));
  e.store().disk_tier()->flush();
  const DiskTierStats d = e.store().disk_tier()->stats();
  EXPECT_GT(d.stored, 5);
  EXPECT_GT(d.evicted, 0);
  EXPECT_LE(d.bytes, budget);
  EXPECT_LE(d.blocks, 5);
  uint64_t on_disk = 0;
  for (const auto& f : block_files(dir2.str())) on_disk += std::filesystem::file_size(f);
  EXPECT_LE(on_disk, budget);
}

TEST(DiskTierEngine, AnotherModelOrKvDtypeNeverMatchesTheFiles) {
  const Model& model = *tiny_model().model;
  ScratchDir dir("disk");
  prime(dir.str());
  // The same preset with f32 weights: another model fingerprint.
  LoadOptions lo;
  lo.dummy_cache_dir = dir.file("models");
  const LoadedModel other = load_model("dummy:tiny:f32", lo);
  {
    Engine e(*other.model, nullptr, tiny_pool(dir.str()));
    EXPECT_EQ(e.metrics().disk.blocks, 0);
    const RequestOutput out = run_one(e, prompt_a());
    EXPECT_EQ(out.stats.cached_tokens, 0);
    EXPECT_EQ(e.metrics().disk.hits, 0);
  }
  // The same model with f16 pages: another layout.
  EngineConfig c = tiny_pool(dir.str());
  c.cache.kv_dtype = DType::kF16;
  Engine e(model, nullptr, c);
  EXPECT_EQ(e.metrics().disk.blocks, 0);
  EXPECT_EQ(run_one(e, prompt_a()).stats.cached_tokens, 0);
}

// Gemma-2: a full group and a sliding group (window 8); a hit loads the full group's blocks and
// only the sliding blocks its window sees.
TEST(DiskTierEngine, ASlidingWindowModelHitsFromDiskWithTheSameTokens) {
  ScratchDir dir("disk");
  LoadOptions lo;
  lo.dummy_cache_dir = dir.file("models");
  const LoadedModel gemma = load_model("dummy:gemma2-tiny:f32", lo);
  const std::vector<int32_t> a = random_prompt(70, 7, 512), b = random_prompt(120, 8, 512);
  EngineConfig c = tiny_pool(dir.file("kv"));
  c.max_tokens_per_step = 32;  // chunks, so that the sliding group lets go of old blocks
  EngineConfig plain = c;
  plain.kv_disk_dir.clear();
  std::vector<int32_t> want;
  {
    Engine ref(*gemma.model, nullptr, plain);
    want = run_one(ref, a).samples.at(0).tokens;
  }
  Engine e(*gemma.model, nullptr, c);
  EXPECT_EQ(run_one(e, a).samples.at(0).tokens, want);
  run_one(e, b);
  e.store().disk_tier()->flush();
  const RequestOutput again = run_one(e, a);
  EXPECT_EQ(again.samples.at(0).tokens, want);
  EXPECT_EQ(again.stats.cached_tokens, 64);
  EXPECT_EQ(again.stats.cached_tokens_disk, 64);
  EXPECT_EQ(e.metrics().disk.corrupt, 0);
}

TEST(DiskTierEngine, HybridModelsAreRefusedAtStart) {
  ScratchDir dir("disk");
  LoadOptions lo;
  lo.dummy_cache_dir = dir.file("models");
  const LoadedModel hybrid = load_model("dummy:qwen3next-tiny:f32", lo);
  EngineConfig c = tiny_pool(dir.file("kv"));
  c.num_blocks = 0;
  c.cache.max_cache_len = 256;
  try {
    Engine e(*hybrid.model, nullptr, c);
    FAIL() << "a hybrid model was served with a disk tier";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(err.what()).find("linear-attention"), std::string::npos) << err.what();
    EXPECT_NE(std::string(err.what()).find("--kv-disk"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace kvcache
