// Hybrid models (dummy:qwen3next-tiny) on the paged cache through the CLI: `generate --cache
// paged --verify` (every decode step against the no-cache recompute), `batch` serving several
// hybrid requests with continuous batching (a prompt sharing a prefix reports the
// snapshot-aligned hit and the tokens of a run alone), and the snapshot options refused for a
// model without linear-attention layers.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "scratch_dir.h"

namespace {

using json = nlohmann::json;
using kvcache::testing_util::CliResult;
using kvcache::testing_util::run_cli;

TEST(CliHybridPaged, GenerateVerifiesOnThePagedCache) {
  for (const std::string extra : {"", " --block-tokens 4", " --block-tokens 4 --chunk 5"}) {
    const CliResult g = run_cli(
        "generate --model dummy:qwen3next-tiny --cache paged --prompt-ids "
        "'2 5 9 14 20 27 35 44 54 65 77 90 104' -n 12 --temp 0 --output ids --verify "
        "--kv-dtype f32" +
        extra);
    ASSERT_EQ(g.exit_code, 0) << extra << "\n" << g.err;
    EXPECT_NE(g.err.find("ok"), std::string::npos) << g.err;
    // The same ids as the dynamic cache.
    const CliResult d = run_cli(
        "generate --model dummy:qwen3next-tiny --cache dynamic --prompt-ids "
        "'2 5 9 14 20 27 35 44 54 65 77 90 104' -n 12 --temp 0 --output ids --kv-dtype "
        "f32" +
        std::string(extra.find("--chunk") != std::string::npos ? " --chunk 5" : ""));
    ASSERT_EQ(d.exit_code, 0) << d.err;
    EXPECT_EQ(g.out, d.out) << extra;
  }
}

std::string ids_json(const std::vector<int>& ids) {
  json j = ids;
  return j.dump();
}

TEST(CliHybridPaged, BatchServesHybridRequestsWithPrefixHits) {
  const kvcache::testing_util::ScratchDir scratch("cli_hybrid_batch");
  std::vector<int> a;
  for (int i = 0; i < 70; ++i) a.push_back(3 + (i * 37) % 500);
  std::vector<int> b(a.begin(), a.begin() + 66);
  for (int i = 0; i < 6; ++i) b.push_back(400 + i);
  std::vector<int> c = {7, 8, 9, 10, 11};
  const auto write = [&](const std::string& path, const std::vector<std::vector<int>>& ps) {
    std::ofstream out(path);
    for (const auto& p : ps)
      out << R"({"prompt": )" << ids_json(p) << R"(, "max_tokens": 5, "temperature": 0})"
          << "\n";
  };
  const std::string all = scratch.file("all.jsonl"), alone_b = scratch.file("b.jsonl");
  write(all, {a, c, c, b});
  write(alone_b, {b});
  // Continuous batching: the four requests together, each equal to its run alone.
  const std::string cmd = "batch --model dummy:qwen3next-tiny --block-tokens 8 ";
  const CliResult r = run_cli(cmd + "--max-running 4 --input '" + all + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<json> lines;
  std::istringstream ss(r.out);
  for (std::string l; std::getline(ss, l);) lines.push_back(json::parse(l));
  ASSERT_EQ(lines.size(), 4u) << r.out;
  for (const json& l : lines) ASSERT_FALSE(l.contains("error")) << l;
  EXPECT_EQ(lines[1]["choices"][0]["tokens"], lines[2]["choices"][0]["tokens"]);
  const CliResult rb = run_cli(cmd + "--input '" + alone_b + "'");
  ASSERT_EQ(rb.exit_code, 0) << rb.err;
  const json lb = json::parse(rb.out.substr(0, rb.out.find('\n')));
  EXPECT_EQ(lines[3]["choices"][0]["tokens"], lb["choices"][0]["tokens"]);
  const auto cached = [](const json& line) {
    return line["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  };
  EXPECT_EQ(cached(lb), 0);
  // One at a time: b is admitted after a finished. b shares 66 tokens with a: 8 full blocks of
  // 8 (64 tokens), snapshots every 4 blocks (32 tokens): the hit is 64, the tokens unchanged.
  const CliResult one = run_cli(cmd + "--max-running 1 --input '" + all + "'");
  ASSERT_EQ(one.exit_code, 0) << one.err;
  std::vector<json> seq;
  std::istringstream s1(one.out);
  for (std::string l; std::getline(s1, l);) seq.push_back(json::parse(l));
  ASSERT_EQ(seq.size(), 4u) << one.out;
  EXPECT_EQ(cached(seq[0]), 0);
  EXPECT_EQ(cached(seq[3]), 64) << seq[3];
  EXPECT_EQ(seq[3]["choices"][0]["tokens"], lb["choices"][0]["tokens"]);
  EXPECT_EQ(seq[0]["choices"][0]["tokens"], lines[0]["choices"][0]["tokens"]);
}

TEST(CliHybridPaged, SnapshotOptionsAreRefusedWithoutLinearLayers) {
  const kvcache::testing_util::ScratchDir scratch("cli_hybrid_refuse");
  const std::string in = scratch.file("in.jsonl");
  std::ofstream(in) << R"({"prompt": [1, 450], "max_tokens": 1})"
                    << "\n";
  for (const std::string opt : {"--max-snapshots 4", "--snapshot-every-blocks 2"}) {
    const CliResult r = run_cli("batch --model dummy:tiny " + opt + " --input '" + in + "'");
    EXPECT_EQ(r.exit_code, 2) << opt << "\n" << r.err;
    EXPECT_NE(r.err.find(opt.substr(0, opt.find(' '))), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("linear_attention"), std::string::npos) << r.err;
  }
  const CliResult ok = run_cli(
      "batch --model dummy:qwen3next-tiny --max-snapshots 0 --snapshot-every-blocks 2 --input '" +
      in + "'");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  const CliResult bad =
      run_cli("batch --model dummy:qwen3next-tiny --snapshot-every-blocks 0 --input '" + in + "'");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--snapshot-every-blocks must be >= 1"), std::string::npos) << bad.err;
}

}  // namespace
