// The CLI on Qwen3-Next beyond what every family gets (cli_families_test.cc runs its folder
// and --verify tests on dummy:qwen3next-tiny too): `generate --verify` (every decode step
// against the no-cache recompute) with the dynamic and static caches, and the containers
// without linear-attention layers refused with exit code 2 naming the layer type.
#include <gtest/gtest.h>

#include <string>

#include "cli_util.h"
#include "scratch_dir.h"

namespace {

using kvcache::testing_util::CliResult;

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
