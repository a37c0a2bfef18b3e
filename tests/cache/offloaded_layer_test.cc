// The offloaded containers (cache/offloaded_layer.h) against the resident ones: the same K/V
// stream through a Cache of each gives bit-identical spans at every update, with at most two
// offloaded layers resident at any time, exact bytes(), the files' bytes in offloaded_bytes(),
// the lifecycle ops, and I/O failures as Errors.
#include "cache/offloaded_layer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/layer_state.h"
#include "cache_test_util.h"
#include "core/error.h"
#include "core/fault.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

using testing_util::random_tensor;
using testing_util::views_equal;
namespace fs = std::filesystem;

struct Geometry {
  int64_t batch = 2, heads = 2, dk = 8, dv = 8;
  CacheConfig::KVContent content = CacheConfig::KVContent::kPerHead;
};

std::string offload_dir() {
  static const std::string d = [] {
    const std::string p = testing_util::process_scratch().file("offload");
    fs::create_directories(p);
    return p;
  }();
  return d;
}

CacheConfig config(const std::string& impl, std::vector<std::string> types, int64_t max_len = 64) {
  CacheConfig c;
  c.options.implementation = impl;
  c.options.max_cache_len = max_len;
  c.options.kv_dtype = DType::kF16;
  c.options.offload.dir = offload_dir();
  c.layer_types = std::move(types);
  c.sliding_window = 6;
  return c;
}

// The offloaded layers resident now, checked against the pool's two slots.
int resident_layers(const Cache& cache) {
  int n = 0;
  for (int i = 0; i < cache.num_layers(); ++i) {
    if (cache.is_shared(i)) continue;
    const auto* l = dynamic_cast<const OffloadedLayer*>(&cache.layer(i));
    if (l != nullptr && l->resident()) ++n;
  }
  return n;
}

const OffloadPool& pool_of(const Cache& cache) {
  const OffloadPool* p = find_offload_pool(cache);
  EXPECT_NE(p, nullptr);
  return *p;
}

// Feeds the same random stream to both caches, layer by layer, step by step, and compares every
// span bit for bit; the offloaded cache never has more than two offloaded layers resident.
void feed(Cache& want, Cache& got, const std::vector<int64_t>& steps, const Geometry& g,
          std::mt19937& rng) {
  for (int64_t n : steps) {
    for (int l = 0; l < want.num_layers(); ++l) {
      Tensor k = random_tensor(DType::kF32, {g.batch, g.heads, n, g.dk}, rng);
      Tensor v = g.content == CacheConfig::KVContent::kSharedKV
                     ? Tensor()
                     : random_tensor(DType::kF32, {g.batch, g.heads, n, g.dv}, rng);
      const TensorView vv = g.content == CacheConfig::KVContent::kSharedKV ? k.view() : v.view();
      const KVSpan a = want.update_or_share(l, k.view(), vv);
      const KVSpan b = got.update_or_share(l, k.view(), vv);
      ASSERT_TRUE(views_equal(a.k, b.k)) << "layer " << l << " k";
      ASSERT_TRUE(views_equal(a.v, b.v)) << "layer " << l << " v";
      EXPECT_EQ(a.kv_offset, b.kv_offset);
      EXPECT_EQ(want.mask_sizes(l, 1).kv_length, got.mask_sizes(l, 1).kv_length);
      EXPECT_LE(resident_layers(got), 2);
      EXPECT_EQ(resident_layers(got), pool_of(got).resident());
    }
  }
}

class Offloaded : public ::testing::TestWithParam<bool> {  // static storage?
 protected:
  std::string impl() const { return GetParam() ? "offloaded_static" : "offloaded"; }
  std::string resident() const { return GetParam() ? "static" : "dynamic"; }
};

TEST_P(Offloaded, SpansEqualTheResidentCacheAndTwoLayersAtMostAreResident) {
  const std::vector<std::string> types(5, "full_attention");
  Cache want(config(resident(), types)), got(config(impl(), types));
  std::mt19937 rng(1);
  const Geometry g;
  std::vector<int64_t> steps = {7};
  steps.insert(steps.end(), 40, 1);  // decode past the dynamic capacities 16 and 32
  feed(want, got, steps, g, rng);
  EXPECT_EQ(got.layer(0).name(), impl() + "/full_attention");
  EXPECT_TRUE(got.layer(0).offloadable());
  EXPECT_EQ(pool_of(got).resident(), 2);

  // bytes(): the two slots, each an image of one layer's file layout; nothing else.
  const int64_t cap = GetParam() ? 64 : 64;  // static: max_cache_len; dynamic: 16 -> 32 -> 64
  const size_t slot = static_cast<size_t>(g.batch * g.heads * cap * (g.dk + g.dv)) * 2;
  EXPECT_EQ(pool_of(got).bytes(), 2 * slot);
  EXPECT_EQ(got.bytes(), 2 * slot);
  size_t sum = 0;
  for (int l = 0; l < got.num_layers(); ++l) sum += got.layer(l).bytes();
  EXPECT_EQ(sum, 2 * slot);
  // offloaded_bytes(): every layer's live K/V in its file.
  const int64_t S = 47;
  EXPECT_EQ(got.offloaded_bytes(),
            static_cast<size_t>(5 * g.batch * g.heads * S * (g.dk + g.dv) * 2));
  EXPECT_EQ(want.offloaded_bytes(), 0u);
  // The files are unlinked: nothing is left in the directory.
  EXPECT_TRUE(fs::is_empty(offload_dir()));
}

TEST_P(Offloaded, LifecycleOpsEqualTheResidentCache) {
  const std::vector<std::string> types(3, "full_attention");
  Cache want(config(resident(), types)), got(config(impl(), types));
  std::mt19937 rng(2);
  Geometry g;
  g.batch = 3;
  feed(want, got, {5, 1, 1, 1}, g, rng);
  want.crop(-2);
  got.crop(-2);
  EXPECT_EQ(got.seq_length(), 6);
  feed(want, got, {2, 1}, g, rng);
  const std::vector<int64_t> order = {2, 0, 1};
  want.reorder(order);
  got.reorder(order);
  feed(want, got, {1}, g, rng);
  const std::vector<int64_t> keep = {1, 2};
  want.select(keep);
  got.select(keep);
  g.batch = 2;
  feed(want, got, {1, 3}, g, rng);
  want.repeat_interleave(1);
  got.repeat_interleave(1);
  want.crop(4);
  got.crop(4);
  feed(want, got, {1}, g, rng);
  want.reset();
  got.reset();
  EXPECT_EQ(got.offloaded_bytes(), 0u);
  feed(want, got, {4, 1, 1}, g, rng);
}

TEST_P(Offloaded, RowsGrowWithRepeatInterleaveAndReserveKeepsContent) {
  const std::vector<std::string> types(3, "full_attention");
  CacheConfig wc = config(resident(), types), gc = config(impl(), types);
  wc.options.max_batch_size = gc.options.max_batch_size = 4;
  Cache want(wc), got(gc);
  std::mt19937 rng(3);
  Geometry g;
  feed(want, got, {3, 1}, g, rng);
  want.repeat_interleave(2);
  got.repeat_interleave(2);
  g.batch = 4;
  feed(want, got, {1, 1}, g, rng);
  want.reserve(40);
  got.reserve(40);
  feed(want, got, {2, 1}, g, rng);
}

TEST_P(Offloaded, ReadFailureIsAnErrorAndTheCacheStaysUsable) {
  const std::vector<std::string> types(4, "full_attention");
  Cache want(config(resident(), types)), got(config(impl(), types));
  std::mt19937 rng(4);
  const Geometry g;
  feed(want, got, {6, 1}, g, rng);
  // After the step, layers 3 and 0 (prefetched for the next step) hold the slots; layer 1 is
  // offloaded and its slot was taken: its next update reads its file.
  ASSERT_FALSE(dynamic_cast<OffloadedLayer&>(got.layer(1)).resident());
  Tensor k = random_tensor(DType::kF32, {g.batch, g.heads, 1, g.dk}, rng);
  Tensor v = random_tensor(DType::kF32, {g.batch, g.heads, 1, g.dv}, rng);
  {
    fault::Scoped fail(
        "offload.read", [] { throw Error(ErrorKind::kIo, "injected read failure"); }, 0, -1);
    try {
      got.update(1, k.view(), v.view());
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo);
      EXPECT_NE(std::string(e.what()).find("injected read failure"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
    }
    EXPECT_EQ(got.seq_length(1), 7);  // unchanged
  }
  // The same update again, without the fault: the layer goes on exactly as the resident one.
  const KVSpan a = want.update(1, k.view(), v.view());
  const KVSpan b = got.update(1, k.view(), v.view());
  EXPECT_TRUE(views_equal(a.k, b.k));
  EXPECT_TRUE(views_equal(a.v, b.v));
}

TEST_P(Offloaded, ALostFileIsAnErrorNotWrongOutput) {
  const std::vector<std::string> types(3, "full_attention");
  Cache want(config(resident(), types)), got(config(impl(), types));
  std::mt19937 rng(5);
  const Geometry g;
  feed(want, got, {4, 1}, g, rng);
  // Layers 2 and 0 hold the slots; layer 1's next update reads its (now lost) file.
  dynamic_cast<OffloadedLayer&>(got.layer(1)).close_file_for_testing();
  Tensor k = random_tensor(DType::kF32, {g.batch, g.heads, 1, g.dk}, rng);
  Tensor v = random_tensor(DType::kF32, {g.batch, g.heads, 1, g.dv}, rng);
  try {
    got.update(1, k.view(), v.view());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
  }
  // A failed write-behind: the resident layer still answers from its slot, but once its content
  // has to come back from the file, that is an Error (the file misses tokens) until reset().
  auto& l2 = dynamic_cast<OffloadedLayer&>(got.layer(2));
  ASSERT_TRUE(l2.resident());
  l2.close_file_for_testing();
  l2.update(k.view(), v.view());  // its write-behind fails on the copier
  l2.offload();
  try {
    l2.update(k.view(), v.view());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("write"), std::string::npos) << e.what();
  }
  l2.reset();
  EXPECT_EQ(l2.seq_length(), 0);
}

TEST_P(Offloaded, MixedLayersKeepWindowsAndSharedSourcesResident) {
  // Gemma-3n-like: sliding and full layers, the last two KV-shared (they read layers 2 and 3).
  std::vector<std::string> types = {"sliding_attention", "full_attention", "full_attention",
                                    "sliding_attention", "full_attention", "sliding_attention",
                                    "full_attention"};
  CacheConfig wc = config(resident(), types), gc = config(impl(), types);
  wc.num_kv_shared_layers = gc.num_kv_shared_layers = 2;
  Cache want(wc), got(gc);
  EXPECT_EQ(got.layer(0).name(), resident() + "/sliding_attention");
  EXPECT_EQ(got.layer(1).name(), impl() + "/full_attention");
  EXPECT_EQ(got.layer(4).name(), resident() + "/full_attention");  // read by layer 6
  EXPECT_EQ(got.layer(3).name(), resident() + "/sliding_attention");
  std::mt19937 rng(6);
  feed(want, got, {9, 1, 1, 1, 1, 1, 1, 1, 1, 1}, Geometry{}, rng);

  gc.options.offload.only_non_sliding = false;
  try {
    Cache refused(gc);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("only_non_sliding"), std::string::npos) << e.what();
  }
}

TEST_P(Offloaded, MlaLatentsAndSharedKV) {
  const std::vector<std::string> types(3, "full_attention");
  {
    // MLA: one "head", latent c_kv as K and the rope key as V (different widths).
    CacheConfig wc = config(resident(), types), gc = config(impl(), types);
    wc.kv_content = gc.kv_content = CacheConfig::KVContent::kMlaLatent;
    Cache want(wc), got(gc);
    std::mt19937 rng(7);
    Geometry g;
    g.heads = 1;
    g.dk = 16;
    g.dv = 4;
    g.content = CacheConfig::KVContent::kMlaLatent;
    feed(want, got, {5, 1, 1, 1}, g, rng);
  }
  {
    CacheConfig wc = config(resident(), types), gc = config(impl(), types);
    wc.kv_content = gc.kv_content = CacheConfig::KVContent::kSharedKV;
    Cache want(wc), got(gc);
    std::mt19937 rng(8);
    Geometry g;
    g.content = CacheConfig::KVContent::kSharedKV;
    feed(want, got, {5, 1, 1, 1}, g, rng);
    // K only: half the bytes.
    EXPECT_EQ(got.offloaded_bytes(), static_cast<size_t>(3 * g.batch * g.heads * 8 * g.dk * 2));
  }
}

struct Bytes : StateWriter, StateReader {
  std::vector<uint8_t> data;
  size_t at = 0;
  void write(const void* p, size_t n) override {
    data.insert(data.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  }
  void read(void* p, size_t n) override {
    if (at + n > data.size()) throw Error(ErrorKind::kFormat, "session file ends early");
    std::memcpy(p, data.data() + at, n);
    at += n;
  }
};

TEST_P(Offloaded, SaveThenLoadContinuesAsTheSavedCache) {
  const std::vector<std::string> types(3, "full_attention");
  Cache want(config(resident(), types)), got(config(impl(), types));
  std::mt19937 rng(11);
  const Geometry g;
  feed(want, got, {6, 1, 1}, g, rng);
  Bytes file;
  got.save(file);
  Cache restored(config(impl(), types));
  restored.load(file);
  EXPECT_EQ(file.at, file.data.size());
  EXPECT_EQ(restored.seq_length(), 8);
  EXPECT_EQ(restored.offloaded_bytes(), got.offloaded_bytes());
  feed(want, restored, {1, 2, 1}, g, rng);
  // A layer holding tokens refuses, and so does a cache of another dtype, before any change.
  file.at = 0;
  EXPECT_THROW(restored.load(file), Error);
  CacheConfig f32 = config(impl(), types);
  f32.options.kv_dtype = DType::kF32;
  Cache other(f32);
  file.at = 0;
  EXPECT_THROW(other.load(file), Error);
  EXPECT_EQ(other.seq_length(), 0);
}

INSTANTIATE_TEST_SUITE_P(Storage, Offloaded, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return std::string(i.param ? "Static" : "Dynamic");
                         });

TEST(Offloaded, StaticOverflowIsRefusedBeforeAnyChange) {
  const std::vector<std::string> types(2, "full_attention");
  Cache got(config("offloaded_static", types, 8));
  std::mt19937 rng(9);
  Tensor k = random_tensor(DType::kF32, {1, 2, 6, 8}, rng);
  got.update(0, k.view(), k.view());
  EXPECT_THROW(got.update(0, k.view(), k.view()), Error);
  EXPECT_EQ(got.seq_length(0), 6);
}

TEST(Offloaded, TwoOffloadedLayersStayResidentWithoutRereading) {
  const std::vector<std::string> types(2, "full_attention");
  Cache want(config("dynamic", types)), got(config("offloaded", types));
  std::mt19937 rng(10);
  feed(want, got, {4, 1, 1, 1, 1}, Geometry{}, rng);
  // Each layer re-takes the slot it gave up: after the first reads, nothing is read again.
  EXPECT_EQ(pool_of(got).copier().stats().from_disk.jobs, 0u);
}

}  // namespace
}  // namespace kvcache
