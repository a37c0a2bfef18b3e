// serve's defaults as llama-server and vLLM users expect them: --port 8080 when not given, the
// model id from the --model file or folder name, and the KV pool sized from free memory
// (engine_options.h: size_pool_from_memory) and announced on stderr.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "../server/raw_http.h"
#include "cli_util.h"
#include "core/error.h"
#include "scratch_dir.h"
#include "serve_child.h"
#include "tools/commands.h"
#include "tools/engine_options.h"

namespace kvcache {
namespace {

using nlohmann::json;
using testing_util::ServeChild;
using tools::PoolSize;
using tools::PoolSizeInputs;
using tools::size_pool_from_memory;

constexpr uint64_t kGiB = uint64_t{1} << 30;

PoolSizeInputs machine(uint64_t available) {
  PoolSizeInputs in;
  in.mem_available_bytes = available;
  in.weight_bytes = 2 * kGiB;
  in.fixed_bytes = 100 << 20;
  in.bytes_per_token = 128 * 1024;  // 8 GiB per 65536 tokens
  in.max_context = 32768;
  in.max_sequences = 8;
  in.block_tokens = 16;
  return in;
}

TEST(ServePool, CappedAtTheContextTimesTheSequencesOnABigMachine) {
  const PoolSize p = size_pool_from_memory(machine(512 * kGiB));
  EXPECT_EQ(p.tokens, 32768 * 8);
  EXPECT_NE(p.why.find("capped"), std::string::npos) << p.why;
  EXPECT_EQ(p.bytes, uint64_t{32768} * 8 * 128 * 1024 + (100 << 20));
  EXPECT_EQ(p.margin, static_cast<uint64_t>(51.2 * static_cast<double>(kGiB)));
}

TEST(ServePool, TheMemoryLeftAfterWeightsActivationsAndMarginOnAMidMachine) {
  const PoolSize p = size_pool_from_memory(machine(20 * kGiB));
  // 20 GiB - 2 GiB weights - 100 MiB - 2 GiB margin (10 %), in 128 KiB tokens, to blocks.
  const uint64_t left = 20 * kGiB - 2 * kGiB - (100 << 20) - 2 * kGiB;
  const int64_t tokens = static_cast<int64_t>(left / (128 * 1024)) / 16 * 16;
  EXPECT_EQ(p.tokens, tokens);
  EXPECT_GE(p.tokens, 32768);
  EXPECT_LT(p.tokens, 32768 * 8);
  EXPECT_NE(p.why.find("memory left"), std::string::npos) << p.why;
}

TEST(ServePool, OneFullContextRequestIntoTheMarginWhenThatFits) {
  // 2 GiB weights + 4 GiB for 32768 tokens + 100 MiB: 7 GiB holds it only with the margin.
  const PoolSize p = size_pool_from_memory(machine(7 * kGiB));
  EXPECT_EQ(p.tokens, 32768);
  EXPECT_NE(p.why.find("into the margin"), std::string::npos) << p.why;
  // 5 GiB cannot: the pool is what is left, under one full context.
  const PoolSize small = size_pool_from_memory(machine(5 * kGiB));
  EXPECT_LT(small.tokens, 32768);
  EXPECT_GT(small.tokens, 0);
  EXPECT_EQ(small.tokens % 16, 0);
}

TEST(ServePool, TooLittleMemoryIsAnErrorNamingTheOverrides) {
  try {
    size_pool_from_memory(machine(3 * kGiB));
    FAIL() << "3 GiB with 2 GiB of weights and a 1 GiB margin leaves no pool";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--max-cache-len"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--kv-budget"), std::string::npos) << e.what();
  }
}

TEST(ServeModelId, TheFileOrFolderNameNotThePath) {
  EXPECT_EQ(tools::served_model_id("dummy:tiny"), "dummy:tiny");
  EXPECT_EQ(tools::served_model_id("/models/Qwen3-0.6B-Q8_0.gguf"), "Qwen3-0.6B-Q8_0.gguf");
  EXPECT_EQ(tools::served_model_id("/models/Llama-3.2-1B-Instruct/"), "Llama-3.2-1B-Instruct");
  EXPECT_EQ(tools::served_model_id("./m//"), "m");
  EXPECT_EQ(tools::served_model_id("model.gguf"), "model.gguf");
}

TEST(CliServeDefaults, PoolFromMemoryAnnouncedAndModelIdIsTheFileName) {
  const testing_util::ScratchDir scratch("cli_serve_defaults");
  std::string gguf;
  {
    ServeChild s;
    ASSERT_TRUE(s.start(scratch.str(), {"serve", "--model", "dummy:tiny", "--port", "0"})) << s.err;
    // dummy:tiny has a context of 2048 and tiny KV (40 MiB for 8 contexts): any machine that
    // runs the tests holds 8 of them.
    EXPECT_NE(s.err.find("KV pool sized from free memory: 16384 tokens"), std::string::npos)
        << s.err;
    EXPECT_NE(s.err.find("capped at the context 2048 x 8 sequences"), std::string::npos) << s.err;
    EXPECT_NE(s.err.find("1024 KV blocks of 16 tokens"), std::string::npos) << s.err;
    const auto models = testing_util::http(s.port, "GET", "/v1/models");
    ASSERT_EQ(models.status, 200);
    EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "dummy:tiny");
    EXPECT_EQ(s.stop(), 0);
  }
  for (const auto& e : std::filesystem::recursive_directory_iterator(scratch.str()))
    if (e.path().extension() == ".gguf") gguf = e.path().string();
  ASSERT_FALSE(gguf.empty()) << "dummy:tiny left no GGUF under " << scratch.str();
  ServeChild s;
  ASSERT_TRUE(
      s.start(scratch.str(), {"serve", "--model", gguf, "--port", "0", "--max-cache-len", "512"}))
      << s.err;
  EXPECT_EQ(s.err.find("sized from free memory"), std::string::npos) << s.err;
  const auto models = testing_util::http(s.port, "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  const std::string name = std::filesystem::path(gguf).filename().string();
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], name);
  const auto r =
      testing_util::http(s.port, "POST", "/v1/completions",
                         json{{"model", name}, {"prompt", {1, 2, 3}}, {"max_tokens", 2}}.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(s.stop(), 0);
}

// In-process (a server on 8080 would race other programs of this machine for the port).
TEST(CliServeDefaults, PortIsOptionalAndDefaultsTo8080) {
  CLI::App app;
  tools::register_serve(app);
  const CLI::Option* port = app.get_subcommand("serve")->get_option("--port");
  EXPECT_FALSE(port->get_required());
  EXPECT_EQ(port->get_default_str(), "8080");
}

}  // namespace
}  // namespace kvcache
