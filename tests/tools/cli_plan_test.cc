// `kvcache plan` through the real binary: the JSON interface, the SVG file, and clear errors
// with exit code 2 for bad input.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_util.h"

namespace kvcache {
namespace {

using testing_util::run_cli;

TEST(CliPlan, JsonInterface) {
  const auto r = run_cli("plan --preset llama2-70b --context 4096 --batch 2 --kv-dtype f16 -o json");
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

TEST(CliPlan, ConfigFileAndSvg) {
  const std::string cfg = ::testing::TempDir() + "plan_config.json";
  std::ofstream(cfg) << R"({"model_type":"mistral","num_hidden_layers":2,"num_attention_heads":4,
    "num_key_value_heads":2,"hidden_size":64,"sliding_window":16,"brand_new_field":true})";
  const std::string svg = ::testing::TempDir() + "plan.svg";
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
  const std::string bad = ::testing::TempDir() + "bad_config.json";
  std::ofstream(bad) << "{\"num_hidden_layers\": ";
  r = run_cli("plan --config " + bad);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not valid JSON"), std::string::npos);
  r = run_cli("plan --preset llama2-7b --budget lots");
  EXPECT_EQ(r.exit_code, 2);
}

}  // namespace
}  // namespace kvcache
