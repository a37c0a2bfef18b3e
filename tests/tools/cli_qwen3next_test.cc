// The CLI on Qwen3-Next: `generate --model dummy:qwen3next-tiny --verify` (every decode step
// against the no-cache recompute) with the dynamic and static caches, `kvcache logits` and
// `generate --output ids` on a Hugging Face folder, and the containers without linear-attention
// layers refused with exit code 2 naming the layer type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cli_util.h"
#include "model/dummy.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "scratch_dir.h"

namespace {

namespace fs = std::filesystem;

using kvcache::testing_util::CliResult;
using kvcache::testing_util::read_file;

struct Scratch : kvcache::testing_util::ScratchDir {
  Scratch() : ScratchDir("cliq3n") {}
  CliResult run(const std::string& args) const {
    return kvcache::testing_util::run_cli(args, {.env = {{"KVCACHE_CACHE_DIR", file("cache")}}});
  }
};

TEST(CliQwen3Next, DummyPresetVerifiesWithDynamicAndStaticCaches) {
  Scratch s;
  std::string ids;
  for (const std::string cache : {"dynamic", "static"}) {
    CliResult g = s.run("generate --model dummy:qwen3next-tiny --cache " + cache +
                        " --prompt-ids '2 5 9 14 20 27 35 44 54' -n 12 --temp 0 "
                        "--output ids --verify --kv-dtype f32");
    ASSERT_EQ(g.exit_code, 0) << cache << "\n" << g.err;
    EXPECT_NE(g.err.find("ok"), std::string::npos) << cache << "\n" << g.err;
    if (ids.empty()) ids = g.out;
    EXPECT_EQ(g.out, ids) << "dynamic and static generate the same greedy ids";
  }
}

TEST(CliQwen3Next, LogitsAndGenerateOnAHuggingFaceFolder) {
  Scratch s;
  kvcache::DummyModelOptions o;
  o.preset = "qwen3next-tiny";
  o.weight_dtype = kvcache::DType::kF32;
  o.seed = 5;
  o.cache_dir = s.file("hf");
  const std::string folder = kvcache::build_dummy_model(o);
  const std::vector<int32_t> ids = {2, 17, 301, 44, 5, 99, 123, 7, 250, 8, 61, 3};
  std::string ids_arg;
  for (int32_t id : ids) {
    if (!ids_arg.empty()) ids_arg.push_back(' ');
    ids_arg.append(std::to_string(id));
  }
  const kvcache::Model model(kvcache::open_model_file(folder));
  kvcache::Forward fwd(model, "eager", 16);
  kvcache::ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.logits = kvcache::LogitsMode::kAll;
  const std::span<const float> want = fwd.forward(p);
  float scale = 0;
  for (float v : want) scale = std::max(scale, std::fabs(v));
  for (const std::string extra : {"", " --cache static", " --cache dynamic"}) {
    CliResult r = s.run("logits --model '" + folder + "' --prompt-ids '" + ids_arg + "' -o '" +
                        s.file("l.f32") + "'" + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string got = read_file(s.file("l.f32"));
    ASSERT_EQ(got.size(), want.size() * sizeof(float)) << extra;
    std::vector<float> a(want.size());
    std::memcpy(a.data(), got.data(), got.size());
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

TEST(CliQwen3Next, ContainersWithoutLinearLayersAreRefusedByName) {
  Scratch s;
  // (paged serves linear layers since the hybridpaged merge)
  for (const std::string cache : {"quantized"}) {
    CliResult g = s.run("generate --model dummy:qwen3next-tiny --cache " + cache +
                        " --prompt-ids '2 5 9' -n 3 --temp 0 --output ids");
    EXPECT_EQ(g.exit_code, 2) << cache << "\n" << g.err;
    EXPECT_NE(g.err.find("linear_attention"), std::string::npos) << cache << "\n" << g.err;
  }
}

}  // namespace
