// Model load progress: page_in_weights touches every weight page once and reports monotonic
// progress ending at done == total; load_model reports only above kProgressMinBytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "runtime/model_loader.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;

TEST(LoadProgress, PageInReportsMonotonicProgressUpToTheWeightBytes) {
  const testing_util::ScratchDir dir("progress");
  LoadOptions lo;
  lo.dummy_cache_dir = dir.str();
  LoadedModel m = load_model("dummy:tiny", lo);
  const ModelFile& f = m.model->file();
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  const uint64_t total =
      page_in_weights(f, [&](uint64_t done, uint64_t all) { calls.emplace_back(done, all); });
  // dummy:tiny is untied: every tensor is distinct, so the total is the file's weight bytes.
  EXPECT_EQ(total, f.weight_bytes());
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back(), std::make_pair(total, total));
  for (size_t i = 1; i < calls.size(); ++i) {
    EXPECT_GE(calls[i].first, calls[i - 1].first);
    EXPECT_EQ(calls[i].second, total);
  }
  // About one report per kProgressChunkBytes, plus the final one.
  EXPECT_GE(calls.size(), static_cast<size_t>(total / kProgressChunkBytes));
  EXPECT_LE(calls.size(), static_cast<size_t>(total / kProgressChunkBytes) + 2);
  EXPECT_EQ(page_in_weights(f, nullptr), total);  // no callback: still pages in, no crash
}

TEST(LoadProgress, SmallModelsLoadSilently) {
  const testing_util::ScratchDir dir("progress");
  LoadOptions lo;
  lo.dummy_cache_dir = dir.str();
  int calls = 0;
  lo.on_progress = [&](uint64_t, uint64_t) { ++calls; };
  LoadedModel m = load_model("dummy:tiny", lo);
  ASSERT_LT(m.model->weight_bytes(), kProgressMinBytes);
  EXPECT_EQ(calls, 0);
}

}  // namespace
}  // namespace kvcache
