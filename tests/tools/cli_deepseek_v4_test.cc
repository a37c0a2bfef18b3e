// The CLI on DeepSeek-V4 (dummy:deepseekv4-tiny: CSA rate 4, HCA rate 8, window 8, indexer
// top-3): `generate --verify` (every decode step against the no-cache recompute) with the
// dynamic cache, for prompts whose lengths are and are not multiples of the rates, prefilled in
// one chunk or in chunks of 3; greedy ids equal across the chunkings; logits of a folder written
// by the dummy writer equal the in-process no-cache forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cli_util.h"
#include "model/dummy.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "scratch_dir.h"

namespace {

using kvcache::testing_util::CliResult;
using kvcache::testing_util::read_file;

struct Scratch : kvcache::testing_util::ScratchDir {
  Scratch() : ScratchDir("cliv4") {}
  CliResult run(const std::string& args) const {
    return kvcache::testing_util::run_cli(args, {.env = {{"KVCACHE_CACHE_DIR", file("cache")}}});
  }
};

std::string ids_text(int n) {
  // (appends, not "literal" + string: GCC 12 -O3 flags that with a false -Wrestrict)
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i > 0) s.push_back(' ');
    s.append(std::to_string((i * 37 + 11) % 512));
  }
  return s;
}

TEST(CliDeepseekV4, DummyPresetVerifiesAcrossWindowEmissions) {
  Scratch s;
  for (int n : {3, 4, 7, 8, 9, 16, 21}) {
    std::string ids;
    // Paged with blocks of 4 tokens: entry pages of 4 entries (16 CSA tokens, 32 HCA tokens).
    for (const std::string cache : {"dynamic", "paged --block-tokens 4"}) {
      for (const std::string chunk : {"", " --chunk 3"}) {
        const std::string what = "prompt " + std::to_string(n) + ", " + cache + chunk;
        CliResult g =
            s.run("generate --model dummy:deepseekv4-tiny --cache " + cache + " --prompt-ids '" +
                  ids_text(n) + "' -n 12 --temp 0 --output ids --verify --kv-dtype f32" + chunk);
        ASSERT_EQ(g.exit_code, 0) << what << "\n" << g.err;
        EXPECT_NE(g.err.find("ok"), std::string::npos) << what << "\n" << g.err;
        if (ids.empty()) ids = g.out;
        EXPECT_EQ(g.out, ids) << what << ": greedy ids equal whatever the cache and the chunk";
      }
    }
  }
}

TEST(CliDeepseekV4, LogitsOfAFolderEqualTheNoCacheForward) {
  Scratch s;
  kvcache::DummyModelOptions o;
  o.preset = "deepseekv4-tiny";
  o.weight_dtype = kvcache::DType::kF32;
  o.seed = 5;
  o.cache_dir = s.file("hf");
  const std::string folder = kvcache::build_dummy_model(o);
  const std::vector<int32_t> ids = {2, 17, 301, 44, 5,  99, 123, 7, 250,
                                    8, 61, 3,   90, 91, 92, 93,  94};
  std::string arg;
  for (int32_t id : ids) {
    if (!arg.empty()) arg.push_back(' ');
    arg.append(std::to_string(id));
  }
  const kvcache::Model model(kvcache::open_model_file(folder));
  kvcache::Forward fwd(model, "eager", 32);
  kvcache::ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.logits = kvcache::LogitsMode::kAll;
  const std::span<const float> want = fwd.forward(p);
  CliResult r = s.run("logits --model '" + folder + "' --prompt-ids '" + arg + "' -o '" +
                      s.file("l.f32") + "' --cache dynamic --kv-dtype f32");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string got = read_file(s.file("l.f32"));
  ASSERT_EQ(got.size(), want.size() * sizeof(float));
  std::vector<float> a(want.size());
  std::memcpy(a.data(), got.data(), got.size());
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], want[i], 1e-5f * scale) << i;
}

}  // namespace
