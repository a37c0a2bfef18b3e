// `kvcache plan` through the real binary: the JSON interface, the SVG file, and clear errors
// with exit code 2 for bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "model/dummy.h"
#include "model/forward.h"
#include "model/model_file.h"
#include "runtime/session.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

using testing_util::run_cli;

TEST(CliPlan, JsonInterface) {
  const auto r =
      run_cli("plan --preset llama2-70b --context 4096 --batch 2 --kv-dtype f16 -o json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["kv_bytes_per_token"].get<int64_t>(), 327680);
  EXPECT_EQ(j["kv_bytes_total"].get<int64_t>(), int64_t{327680} * 4096 * 2);
  ASSERT_TRUE(j["layers"].is_array());
  EXPECT_EQ(j["layers"][0]["count"], 80);
}

TEST(CliPlan, JsonFlagAndBudget) {
  const auto r = run_cli("plan --preset llama2-7b --context 4096 --budget 24GiB --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["max_requests"].get<int64_t>(), 5);  // the notes' 24 GB card example
}

TEST(CliPlan, HybridSnapshotsBilledOncePerServerAndRefusedForOtherModels) {
  const auto r = run_cli(
      "plan --preset qwen3-next-80b-a3b --block-tokens 16 --snapshot-every-blocks 2 "
      "--max-snapshots 8 --budget 200GiB -o json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  // One snapshot: 36 linear layers x (32*128*128 + 3*(2*16*128 + 32*128)) f32 (no kernel copy).
  const int64_t each = int64_t{36} * (524288 + 3 * 8192) * 4;
  EXPECT_EQ(j["snapshot_bytes_each"].get<int64_t>(), each);
  EXPECT_EQ(j["snapshot_bytes"].get<int64_t>(), 8 * each);
  // The budget left for requests is what the weights and the snapshot arena leave.
  const double per_request = j["kv_bytes_total"].get<double>();
  const double free = 200.0 * 1073741824 - 80e9 * 2 - 8.0 * static_cast<double>(each);
  EXPECT_EQ(j["max_requests"].get<int64_t>(), static_cast<int64_t>(free / per_request));
  const auto t = run_cli("plan --preset qwen3-next-80b-a3b --block-tokens 16");
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("prefix snapshots: 16 x"), std::string::npos) << t.out;
  const auto bad = run_cli("plan --preset llama2-7b --max-snapshots 4");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--max-snapshots"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("no linear_attention layers"), std::string::npos) << bad.err;
}

TEST(CliPlan, ConfigFileAndSvg) {
  const testing_util::ScratchDir scratch("cli_plan");
  const std::string cfg = scratch.file("plan_config.json");
  std::ofstream(cfg) << R"({"model_type":"mistral","num_hidden_layers":2,"num_attention_heads":4,
    "num_key_value_heads":2,"hidden_size":64,"sliding_window":16,"brand_new_field":true})";
  const std::string svg = scratch.file("plan.svg");
  const auto r = run_cli("plan --config " + cfg + " --context 100 --svg " + svg);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("sliding_attention"), std::string::npos);
  std::ifstream in(svg);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text.rfind("<svg", 0), 0u);
}

TEST(CliPlan, BadInputIsAClearErrorWithExitCode2) {
  auto r = run_cli("plan --preset no-such-model");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("known presets are"), std::string::npos) << r.err;
  r = run_cli("plan --preset llama2-7b --kv-dtype q3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("q3"), std::string::npos);
  r = run_cli("plan --config /nonexistent/config.json");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/nonexistent/config.json"), std::string::npos);
  r = run_cli("plan");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--preset"), std::string::npos);
  const testing_util::ScratchDir scratch("cli_plan");
  const std::string bad = scratch.file("bad_config.json");
  std::ofstream(bad) << "{\"num_hidden_layers\": ";
  r = run_cli("plan --config " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos);
  r = run_cli("plan --preset llama2-7b --budget lots");
  EXPECT_EQ(r.exit_code, 2);
}

// num_hidden_layers 1e12 ran for minutes and grew past 8 GB building layer records; now every
// count is checked against its maximum first: exit 2 at once, naming the field and the bound.
TEST(CliPlan, HugeCountsAreRefusedAtOnce) {
  const testing_util::ScratchDir scratch("cli_plan");
  const std::string cfg = scratch.file("huge_config.json");
  std::ofstream(cfg) << R"({"model_type":"llama","num_hidden_layers":1e12,"num_attention_heads":32,
    "num_key_value_heads":8,"hidden_size":4096})";
  const auto r = run_cli("plan --config " + cfg);
  EXPECT_EQ(r.exit_code, 2) << r.err;
  for (const std::string& n :
       {cfg, std::string("num_hidden_layers"), std::string("1000000000000"), std::string("4096")})
    EXPECT_NE(r.err.find(n), std::string::npos) << r.err << "\n  lacks: " << n;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// `kvcache plan --config dummy:<family>-tiny` reads the built-in model's config and agrees with
// Cache::bytes() of that model's static cache holding the same tokens (S <= W - 1, so every
// layer, sliding or not, holds all S), f32 storage.
TEST(CliPlan, DummyFamiliesAgreeWithCacheBytes) {
  const testing_util::ScratchDir scratch("cli_plan");
  for (const std::string preset :
       {"mla-tiny", "deepseek-v2-tiny", "gemma2-tiny", "gptoss-tiny", "gemma3n-tiny"}) {
    DummyModelOptions o;
    o.preset = preset;
    o.weight_dtype = DType::kF32;
    o.cache_dir = scratch.str();
    const Model model(open_model_file(build_dummy_model(o)));
    const ModelConfig& c = model.config();
    const int64_t S = c.sliding_window > 0 ? c.sliding_window - 1 : 7;
    SessionConfig sc;
    sc.cache.implementation = "static";
    sc.cache.max_cache_len = S;
    sc.cache.kv_dtype = DType::kF32;
    Session s(model, sc);
    std::vector<int32_t> ids(static_cast<size_t>(S));
    for (int64_t i = 0; i < S; ++i)
      ids[static_cast<size_t>(i)] = static_cast<int32_t>(1 + i % (c.vocab_size - 1));
    s.prefill(ids);
    const auto r = run_cli("plan --config dummy:" + preset + " --context " + std::to_string(S) +
                           " --kv-dtype f32 -o json");
    ASSERT_EQ(r.exit_code, 0) << preset << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["kv_bytes_total"].get<int64_t>(), static_cast<int64_t>(s.kv_bytes())) << preset;
  }
  const auto bad = run_cli("plan --config dummy:no-such-model");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("no-such-model"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace kvcache
