// `--cache quantized` options through the real binary: a bad --kv-quant name, --kv-bits that
// contradicts a per-token format, and a head dim a per-token format cannot hold are each a
// message naming the problem and exit code 2 (dummy:tiny, no shared data needed). Then the
// layer types of issue 43 item 4: an MLA preset and a model with chunked layers generate with
// --verify, and the layer types the container declines say why and what to use.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cli_util.h"
#include "model/dummy.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;

using testing_util::CliResult;
using testing_util::run_cli;

struct Scratch : testing_util::ScratchDir {
  Scratch() : ScratchDir("cliquant") {}
  CliResult run(const std::string& args) const {
    // Dummy presets are generated into the scratch folder, not the user's cache.
    return run_cli(args, {.env = {{"KVCACHE_CACHE_DIR", file("cache")}}});
  }
};

// G 4 and R 4 quantize most of a 30-token run (the defaults, G 64 and R 128, would keep it all
// in the f32 residual). The tolerance is the 8-bit one of tests/runtime/quantized_layers_test.
const std::string kQuant =
    " --cache quantized --kv-bits 8 --kv-group 4 --kv-residual 4 --kv-dtype f32 --verify "
    "--verify-tol 1e-2 -n 20 --temp 0 --output ids --prompt-ids '2 5 9 14 20 27 35 44 54 60'";

TEST(CliQuantized, BadKvQuantOptionsExitWith2AndSayWhy) {
  const std::string base =
      "generate --model dummy:tiny --prompt-ids \"1 2 3\" -n 2 --output ids --cache quantized ";
  auto r = run_cli(base + "--kv-quant q5_1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--kv-quant must be kivi, q8_0 or q4_0, got 'q5_1'"), std::string::npos)
      << r.err;
  r = run_cli(base + "--kv-quant q8_0 --kv-bits 4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--kv-bits 4 contradicts it"), std::string::npos) << r.err;
  r = run_cli(base + "--kv-quant q4_0");  // dummy:tiny's head dim is 16
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("layer 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("multiples of 32"), std::string::npos) << r.err;
  r = run_cli(base +
              "--kv-quant q4_0 --kv-bits 4");  // consistent flags: only the head dim is refused
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.find("contradicts"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("multiples of 32"), std::string::npos) << r.err;
}

TEST(CliQuantized, MlaLatentsGenerateWithVerify) {
  Scratch s;
  for (const char* preset : {"mla-tiny", "deepseek-v2-tiny"}) {
    const CliResult g = s.run(std::string("generate --model dummy:") + preset + kQuant);
    ASSERT_EQ(g.exit_code, 0) << preset << "\n" << g.err;
    EXPECT_NE(g.err.find("cache: quantized"), std::string::npos) << g.err;
    EXPECT_NE(g.err.find("verify: max relative logit difference"), std::string::npos) << g.err;
    EXPECT_NE(g.err.find(" ok"), std::string::npos) << g.err;
  }
}

// No preset has chunked layers: gemma2-tiny's folder with its config.json given Llama-4's
// layer type on two layers (chunks of 6) beside a full and a sliding one.
TEST(CliQuantized, ChunkedLayersGenerateWithVerify) {
  Scratch s;
  DummyModelOptions o;
  o.preset = "gemma2-tiny";
  o.weight_dtype = DType::kF32;
  o.seed = 9;
  o.cache_dir = s.file("hf");
  const fs::path built = build_dummy_model(o), folder = s.file("chunked");
  fs::create_directories(folder);
  fs::copy_file(built / "model.safetensors", folder / "model.safetensors");
  std::stringstream text;
  text << std::ifstream(built / "config.json").rdbuf();
  std::string config = text.str();
  const size_t brace = config.find('{');
  ASSERT_NE(brace, std::string::npos);
  config.insert(brace + 1,
                R"("layer_types": ["chunked_attention", "full_attention", "sliding_attention",
                "chunked_attention"], "attention_chunk_size": 6, )");
  std::ofstream(folder / "config.json") << config;
  const CliResult g = s.run("generate --model '" + folder.string() + "'" + kQuant);
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_NE(g.err.find("chunk=6"), std::string::npos) << g.err;  // the model summary
  EXPECT_NE(g.err.find(" ok"), std::string::npos) << g.err;
}

TEST(CliQuantized, RefusedLayerTypesSayWhyAndWhatToUse) {
  Scratch s;
  const std::string gen = " --prompt-ids '2 5 9' -n 2 --output ids --cache quantized";
  CliResult r = s.run("generate --model dummy:qwen3next-tiny" + gen);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("(quantized/linear_attention)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("recurrent state"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("use --cache dynamic, static, paged or offloaded"), std::string::npos)
      << r.err;
  r = s.run("generate --model dummy:deepseekv4-tiny" + gen);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("K == V"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("use --cache dynamic or paged"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace kvcache
