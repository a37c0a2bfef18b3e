// The `kvcache` binary on stories260K: stdout byte for byte as llama2.c's run, ids, logits
// files, --verify, and bad inputs ending with exit code 2 and a message naming the problem.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "scratch_dir.h"

namespace {

namespace fs = std::filesystem;

using kvcache::testing_util::CliResult;
using kvcache::testing_util::read_file;
using kvcache::testing_util::run_cli;
using kvcache::testing_util::shell_quote;

const std::string kModel = kvcache::testing_util::stories_model();
const std::string kGolden = kvcache::testing_util::golden_dir();

TEST(CliGenerate, StdoutIsByteIdenticalToLlama2c) {
  KVCACHE_REQUIRE_STORIES();
  // llama2.c's -n 256 counted positions: 256 - 5 + 1 new tokens after a 5-token prompt.
  for (const char* cache : {"dynamic", "static"}) {
    CliResult r = run_cli("generate --model " + shell_quote(kModel) +
                          " --prompt 'Once upon a time' -n 252 --temp 0 --cache " + cache);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, read_file(kGolden + "/once_upon_a_time.txt")) << cache;
    EXPECT_NE(r.err.find("prompt tokens: 5"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("decode:"), std::string::npos);
    EXPECT_NE(r.err.find("KV bytes:"), std::string::npos);
  }
  CliResult e =
      run_cli("generate --model " + shell_quote(kModel) + " -n 256 --temp 0 --kernel eager");
  EXPECT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.out, read_file(kGolden + "/empty.txt"));
}

// --no-mmap reads the checkpoint into huge-page memory: the same golden text as the mapping,
// and a GGUF (dummy:tiny) gives the same ids both ways.
TEST(CliGenerate, NoMmapReadsTheSameModel) {
  KVCACHE_REQUIRE_STORIES();
  CliResult r = run_cli("generate --model " + shell_quote(kModel) +
                        " --prompt 'Once upon a time' -n 252 --temp 0 --no-mmap");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, read_file(kGolden + "/once_upon_a_time.txt"));
  std::string ids[2];
  for (int i = 0; i < 2; ++i) {
    CliResult g =
        run_cli(std::string("generate --model dummy:tiny --prompt-ids '1 5 9 13' -n 12 ") +
                "--temp 0 --ignore-eos --output ids" + (i == 1 ? " --no-mmap" : ""));
    ASSERT_EQ(g.exit_code, 0) << g.err;
    ids[i] = g.out;
  }
  EXPECT_FALSE(ids[0].empty());
  EXPECT_EQ(ids[0], ids[1]);
}

TEST(CliGenerate, IdsOutputAndVerify) {
  KVCACHE_REQUIRE_STORIES();
  CliResult r = run_cli("generate --model " + shell_quote(kModel) +
                        " --prompt-ids '1 403 407 261 378' -n 252 --temp 0 --output ids");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const std::string golden = read_file(kGolden + "/once_upon_a_time.ids");
  const size_t at = golden.find("\ngenerated_ids: ");
  ASSERT_NE(at, std::string::npos);
  std::string want = golden.substr(at + 16);
  want = want.substr(0, want.find('\n')) + "\n";
  EXPECT_EQ(r.out, want);
  CliResult v = run_cli("generate --model " + shell_quote(kModel) +
                        " -n 48 --temp 0 --output ids --verify --cache static");
  EXPECT_EQ(v.exit_code, 0) << v.err;
  EXPECT_NE(v.err.find("verify: max relative logit difference"), std::string::npos) << v.err;
  EXPECT_NE(v.err.find(" ok"), std::string::npos) << v.err;
  // An f16 cache is not bit-exact: a tolerance below its rounding makes --verify fail (exit 3).
  CliResult f = run_cli("generate --model " + shell_quote(kModel) +
                        " -n 8 --temp 0 --output ids --verify --kv-dtype f16 --verify-tol 1e-9");
  EXPECT_EQ(f.exit_code, 3) << f.err;
  EXPECT_NE(f.err.find("FAILED"), std::string::npos) << f.err;
  // Sampling is seeded: the same seed repeats itself, another seed does not.
  const std::string samp = "generate --model " + shell_quote(kModel) +
                           " -n 40 --temp 1 --top-p 0.9 --output ids --seed ";
  CliResult a = run_cli(samp + "7"), b = run_cli(samp + "7"), c = run_cli(samp + "8");
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(CliLogits, WritesEveryPositionAsFloat32) {
  KVCACHE_REQUIRE_STORIES();
  const kvcache::testing_util::ScratchDir s("cli");
  const std::string ids = "'1 403 407 261 378 432 383 286'";  // the golden sequence's first 8
  const std::string want = read_file(kGolden + "/logits_once_upon_a_time.f32");
  for (const std::string extra : {"", " --cache static"}) {
    CliResult r = run_cli("logits --model " + shell_quote(kModel) + " --prompt-ids " + ids +
                          " -o " + s.file("l.f32") + extra);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string got = read_file(s.file("l.f32"));
    ASSERT_EQ(got.size(), want.size());
    std::vector<float> a(got.size() / 4), b(want.size() / 4);
    std::memcpy(a.data(), got.data(), got.size());
    std::memcpy(b.data(), want.data(), want.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4) << i << extra;
  }
}

TEST(CliConvert, GgufCopyGeneratesTheSameText) {
  KVCACHE_REQUIRE_STORIES();
  const kvcache::testing_util::ScratchDir s("cli");
  CliResult c = run_cli("convert --model " + shell_quote(kModel) + " -o " + s.file("st.gguf"));
  ASSERT_EQ(c.exit_code, 0) << c.err;
  CliResult r = run_cli("generate --model " + s.file("st.gguf") +
                        " --prompt 'Once upon a time' -n 252 --temp 0");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, read_file(kGolden + "/once_upon_a_time.txt"));
  // A truncated GGUF is a clean error too.
  const std::string g = read_file(s.file("st.gguf"));
  std::ofstream(s.file("cut.gguf"), std::ios::binary)
      .write(g.data(), static_cast<std::streamsize>(g.size() / 2));
  CliResult bad = run_cli("generate --model " + s.file("cut.gguf") + " -n 4");
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("cut.gguf"), std::string::npos) << bad.err;
}

TEST(CliBench, JsonHasLlamaBenchFields) {
  KVCACHE_REQUIRE_STORIES();
  CliResult r = run_cli("bench --model " + shell_quote(kModel) +
                        " -p 8 -n 4 -d 0,16 -r 2 --cache dynamic,static -o json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 8u);  // 2 caches x 2 depths x (pp, tg)
  for (const auto& t : j) {
    for (const char* key :
         {"n_prompt", "n_gen", "n_depth", "n_threads", "avg_ts", "stddev_ts", "cache", "kv_bytes"})
      EXPECT_TRUE(t.contains(key)) << key;
    EXPECT_GT(t["avg_ts"].get<double>(), 0.0);
    // The machine's limits, probed in the same run, and this test against them.
    for (const char* key :
         {"cpu_model", "read_bandwidth_gbs", "fma_peak_gflops", "decode_bytes_per_token",
          "read_bandwidth_fraction", "prefill_flops", "fma_peak_fraction"})
      EXPECT_TRUE(t.contains(key)) << key;
    EXPECT_GT(t["read_bandwidth_gbs"].get<double>(), 0.0);
    EXPECT_GT(t["fma_peak_gflops"].get<double>(), 0.0);
    // Thread time lost per token (core/thread_pool.h's timing): a fraction, and hand-offs.
    EXPECT_GE(t["idle_fraction"].get<double>(), 0.0);
    EXPECT_LE(t["idle_fraction"].get<double>(), 1.0);
    EXPECT_GE(t["idle_serial_us_per_token"].get<double>(), 0.0);
    EXPECT_GE(t["idle_join_us_per_token"].get<double>(), 0.0);
    if (t["n_threads"].get<int>() > 1) {
      EXPECT_GT(t["loops_per_token"].get<double>(), 0.0);
    }
    if (t["n_gen"].get<int>() > 0) {  // tg: bytes and bandwidth; pp: FLOPs and FMA peak
      EXPECT_GT(t["decode_bytes_per_token"].get<double>(), 0.0);
      EXPECT_GT(t["read_bandwidth_fraction"].get<double>(), 0.0);
      EXPECT_EQ(t["prefill_flops"].get<double>(), 0.0);
    } else {
      EXPECT_GT(t["prefill_flops"].get<double>(), 0.0);
      EXPECT_GT(t["fma_peak_fraction"].get<double>(), 0.0);
      EXPECT_EQ(t["decode_bytes_per_token"].get<double>(), 0.0);
    }
  }
  // The KV a tg token reads grows with the depth: 4 tokens after 16 read 16 more keys each.
  EXPECT_GT(j[3]["decode_kv_bytes_per_token"].get<double>(),
            j[1]["decode_kv_bytes_per_token"].get<double>());
  EXPECT_EQ(j[0]["cache"], "dynamic");
  EXPECT_EQ(j[7]["cache"], "static");
  EXPECT_EQ(j[3]["n_depth"], 16);
  CliResult t = run_cli("bench --model " + shell_quote(kModel) + " -p 8 -n 4 -r 1");
  EXPECT_EQ(t.exit_code, 0) << t.err;
  EXPECT_NE(t.out.find("| pp8 |"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("| tg4 |"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("machine: "), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("of read BW"), std::string::npos) << t.out;
}

TEST(CliBadInput, ExitCode2AndAMessageNamingTheProblem) {
  KVCACHE_REQUIRE_STORIES();
  const kvcache::testing_util::ScratchDir s("cli");
  const std::string raw = read_file(kModel);
  std::ofstream(s.file("cut.bin"), std::ios::binary).write(raw.data(), 5000);
  std::ofstream(s.file("junk.bin"), std::ios::binary) << std::string(300, 'x');
  fs::copy_file(kvcache::testing_util::stories_dir() + "/tok512.bin", s.file("tok512.bin"));
  const std::string tok = read_file(s.file("tok512.bin"));
  std::ofstream(s.file("tok_cut.bin"), std::ios::binary).write(tok.data(), 100);
  struct Case {
    std::string args, needle;
    bool silent = false;  // rejected before anything reaches stdout
  };
  const Case cases[] = {
      {"generate --model " + s.file("cut.bin") + " -n 4", "truncated"},
      {"generate --model " + s.file("junk.bin") + " -n 4", "not a valid llama2.c checkpoint"},
      {"generate --model " + s.file("missing.bin") + " -n 4", "no such file"},
      {"generate --model " + shell_quote(kModel) + " --tokenizer " + s.file("tok_cut.bin") +
           " -n 4",
       "tok_cut.bin"},
      {"generate --model " + shell_quote(kModel) + " --prompt-ids '1 x 3' -n 4 --output ids",
       "--prompt-ids"},
      {"generate --model " + shell_quote(kModel) + " --prompt-ids '1 9999' -n 4 --output ids",
       "outside the vocabulary"},
      {"generate --model " + shell_quote(kModel) + " --cache nosuch -n 4", "nosuch"},
      {"generate --model " + shell_quote(kModel) + " --kernel nosuch -n 4", "nosuch"},
      {"generate --model " + shell_quote(kModel) + " --kv-dtype q8_0 -n 4", "kv-dtype"},
      {"generate --model " + shell_quote(kModel) +
           " --cache static --max-cache-len 4 --prompt 'Once upon a time' -n 8",
       "max_cache_len"},
      {"logits --model " + shell_quote(kModel) + " --prompt-ids '1 2' -o /nonexistent/dir/x.f32",
       "/nonexistent/dir/x.f32"},
      // Sampler values out of range (NaN never in range); nothing reaches stdout before the error.
      {"generate --model " + shell_quote(kModel) + " -n 4 --temp -1", "--temp must be >= 0", true},
      {"generate --model " + shell_quote(kModel) + " -n 4 --temp nan", "--temp must be >= 0", true},
      {"generate --model " + shell_quote(kModel) + " -n 4 --top-p 1.5", "--top-p must be in (0, 1]",
       true},
      {"generate --model " + shell_quote(kModel) + " -n 4 --top-k -3", "--top-k must be >= 0",
       true},
      {"generate --model " + shell_quote(kModel) + " -n 4 --repeat-last-n -2",
       "--repeat-last-n must be >= -1", true},
      {"generate --model " + shell_quote(kModel) + " -n 4 --verify --verify-tol -1", "--verify-tol",
       true},
      {"generate --model " + shell_quote(kModel) + " -n 4 -t 100000", "at most 1024 threads", true},
  };
  for (const Case& c : cases) {
    CliResult r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    if (c.silent) {
      EXPECT_EQ(r.out, "") << c.args;
    }
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.err.find("internal invariant"), std::string::npos) << r.err;
  }
}

}  // namespace
