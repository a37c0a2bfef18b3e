// The CLI on the non-llama families: `kvcache logits` and `generate --prompt-ids ... --output
// ids --verify` on a Hugging Face folder written by the test (config.json + model.safetensors
// with transformers names), and `generate --model dummy:<family>-tiny --verify`.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_util.h"
#include "family_presets.h"
#include "model/dummy.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "scratch_dir.h"

namespace {

namespace fs = std::filesystem;

using kvcache::testing_util::CliResult;
using kvcache::testing_util::read_file;

struct Scratch : kvcache::testing_util::ScratchDir {
  Scratch() : ScratchDir("clifam") {}
  CliResult run(const std::string& args) const {
    // Dummy presets are generated into the scratch folder, not the user's cache.
    return kvcache::testing_util::run_cli(args, {.env = {{"KVCACHE_CACHE_DIR", file("cache")}}});
  }
};

class CliFamilies : public ::testing::TestWithParam<std::string> {};

TEST_P(CliFamilies, LogitsAndGenerateOnAHuggingFaceFolder) {
  Scratch s;
  kvcache::DummyModelOptions o;
  o.preset = GetParam();
  o.weight_dtype = kvcache::DType::kF32;
  o.seed = 5;
  o.cache_dir = s.file("hf");
  const std::string folder = kvcache::build_dummy_model(o);
  ASSERT_TRUE(fs::exists(fs::path(folder) / "config.json"));
  ASSERT_TRUE(fs::exists(fs::path(folder) / "model.safetensors"));

  const std::vector<int32_t> ids = {2, 17, 301, 44, 5, 99, 123, 7, 250, 8, 61, 3};
  std::string ids_arg;
  for (int32_t id : ids) {
    if (!ids_arg.empty()) ids_arg.push_back(' ');
    ids_arg.append(std::to_string(id));
  }
  // In-process no-cache forward of the same folder: what the CLI must write.
  const kvcache::Model model(kvcache::open_model_file(folder));
  kvcache::Forward fwd(model, "eager", 16);
  kvcache::ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.logits = kvcache::LogitsMode::kAll;
  const std::span<const float> want = fwd.forward(p);
  for (const std::string extra : {"", " --cache static", " --cache dynamic"}) {
    CliResult r = s.run("logits --model '" + folder + "' --prompt-ids '" + ids_arg + "' -o '" +
                        s.file("l.f32") + "'" + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string got = read_file(s.file("l.f32"));
    ASSERT_EQ(got.size(), want.size() * sizeof(float)) << extra;
    std::vector<float> a(want.size());
    std::memcpy(a.data(), got.data(), got.size());
    float scale = 0;
    for (float v : want) scale = std::max(scale, std::fabs(v));
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], want[i], 1e-5f * scale) << i << extra;
  }
  CliResult g = s.run("generate --model '" + folder + "' --prompt-ids '" + ids_arg +
                      "' -n 12 --temp 0 --output ids --verify --kv-dtype f32");
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_NE(g.err.find("ok"), std::string::npos) << g.err;
  int count = 0;
  for (char ch : g.out) count += ch == ' ' || ch == '\n';
  EXPECT_GE(count, static_cast<int>(ids.size())) << g.out;
}

TEST_P(CliFamilies, DummyPresetVerifies) {
  Scratch s;
  std::string ids;
  for (const std::string extra : {"", " --cache paged --block-tokens 4"}) {
    CliResult g = s.run("generate --model dummy:" + GetParam() +
                        " --prompt-ids '2 5 9 14 20 27 35 44 54' -n 10 --temp 0 "
                        "--output ids --verify --kv-dtype f32" +
                        extra);
    ASSERT_EQ(g.exit_code, 0) << extra << "\n" << g.err;
    EXPECT_NE(g.err.find("ok"), std::string::npos) << extra << "\n" << g.err;
    if (ids.empty()) ids = g.out;
    EXPECT_EQ(g.out, ids) << "paged and dense generate the same greedy ids" << extra;
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, CliFamilies,
                         ::testing::ValuesIn(kvcache::testing_util::family_presets()),
                         kvcache::testing_util::preset_test_name);
// The hybrid family: the same folder and --verify checks (dense and paged); its reference
// comparison is tests/runtime/qwen3_next_reference_test.cc, not FamilyReference.
INSTANTIATE_TEST_SUITE_P(Hybrid, CliFamilies, ::testing::Values(std::string("qwen3next-tiny")),
                         kvcache::testing_util::preset_test_name);

}  // namespace
