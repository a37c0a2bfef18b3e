// Issue 36: no option is accepted and ignored. In-process, every option every subcommand
// registers has an entry in the option table (tools/option_rules.cc) and every entry names a
// registered option; through the binary, each combination in which an option would change
// nothing exits with 2 and a message naming the option, before anything is loaded or printed,
// while the combinations that honour the same options still run.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "cli_util.h"
#include "scratch_dir.h"
#include "tools/commands.h"
#include "tools/option_rules.h"

namespace kvcache {
namespace {

using testing_util::run_cli;

TEST(CliOptions, EveryRegisteredOptionHasAnEntryInTheRuleTable) {
  CLI::App app;
  tools::register_commands(app);
  int options = 0;
  for (const CLI::App* sub : app.get_subcommands({})) {
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt == sub->get_help_ptr()) continue;
      ++options;
      EXPECT_TRUE(tools::option_has_rule(sub->get_name(), *opt))
          << sub->get_name() << " " << opt->get_name(false, true)
          << ": add it to kRules in src/tools/option_rules.cc (always used, or when it has no "
             "effect)";
    }
  }
  EXPECT_GT(options, 60);  // the walk saw the real app
  for (const std::string& stale : tools::stale_option_rules(app))
    ADD_FAILURE() << "rule for no option: " << stale;
}

struct Refused {
  std::string args;
  std::string option;  // stderr must name it
};

// Each is refused before the model loads: no dummy model is built, nothing reaches stdout.
TEST(CliOptions, OptionsWithoutEffectExitWith2NamingTheOption) {
  const std::string gen = "generate --model dummy:tiny --prompt-ids '1 2 3' -n 2 --output ids ";
  const std::string logits = "logits --model dummy:tiny --prompt-ids '1 2 3' -o /dev/null ";
  const std::string bench = "bench --model dummy:tiny -r 1 ";
  const std::string serve = "serve --model dummy:tiny --port 0 ";
  const std::string batch = "batch --model dummy:tiny --input /nonexistent.jsonl ";
  const Refused cases[] = {
      // serve and batch: always the paged pool, its pages (in --kv-dtype, or quantized as
      // --kv-bits / --kv-quant say: one group per block, the partial block the residual) and
      // its kernels.
      {serve + "--cache nonsense", "--cache nonsense"},
      {serve + "--cache static", "--cache static"},
      {serve + "--kv-bits 5", "--kv-bits"},
      {serve + "--kv-quant q3_0", "--kv-quant"},
      {serve + "--kv-quant q8_0 --kv-bits 4", "--kv-bits"},
      {serve + "--kv-group 32", "--kv-group"},
      {serve + "--kv-bits 4 --kv-group 32", "--kv-group"},
      {serve + "--kv-residual 64", "--kv-residual"},
      {serve + "--kv-bits 4 --kv-residual 64", "--kv-residual"},
      {serve + "--kv-bits 4 --kernel eager", "--kernel"},
      {serve + "--kernel flex", "--kernel flex"},
      {serve + "--kv-budget 64MiB --max-cache-len 512", "--max-cache-len"},
      {batch + "--cache offloaded", "--cache offloaded"},
      {batch + "--kernel flex", "--kernel flex"},
      {batch + "--max-waiting 10", "--max-waiting"},
      // Cache options without the cache they configure.
      {gen + "--block-tokens 8", "--block-tokens"},
      {gen + "--cache static --kv-budget 64MiB", "--kv-budget"},
      {gen + "--kv-bits 2", "--kv-bits"},
      {gen + "--cache paged --kv-quant q8_0", "--kv-quant"},
      {gen + "--max-cache-len 64", "--max-cache-len"},
      {gen + "--cache quantized --max-cache-len 64", "--max-cache-len"},
      {gen + "--cache paged --kv-budget 64MiB --max-cache-len 64", "--max-cache-len"},
      {gen + "--cache nosuch --block-tokens 8", "--cache nosuch"},
      // The no-cache reference's container is no cache to generate with.
      {gen + "--cache recompute", "--cache recompute"},
      {bench + "--cache dynamic,recompute", "--cache recompute"},
      // Kernels the cache cannot run, or does not use.
      {gen + "--cache paged --kernel flex", "--kernel flex"},
      {gen + "--cache quantized --kernel eager", "--kernel"},
      {gen + "--kernel nosuch", "--kernel nosuch"},
      // Text, sampling and verification options where nothing uses them.
      {gen + "--tokenizer /nonexistent/tokenizer.bin", "--tokenizer"},
      {gen + "--temp 0 --seed 3", "--seed"},
      {gen + "--temp 0 --top-k 5", "--top-k"},
      {gen + "--temp 0 --top-p 0.5", "--top-p"},
      {gen + "--temp 0 --min-p 0.1", "--min-p"},
      {gen + "--repeat-last-n 32", "--repeat-last-n"},
      {gen + "--verify-tol 0.1", "--verify-tol"},
      {logits + "--chunk 4", "--chunk"},
      {logits + "--tokenizer /nonexistent/tokenizer.bin", "--tokenizer"},
      {logits + "--kv-residual 16", "--kv-residual"},
      {bench + "--cache dynamic,static --block-tokens 8", "--block-tokens"},
      {bench + "--cache dynamic,paged --kernel flex", "--kernel flex"},
      {bench + "--cache paged --prefix-reuse 300:0.9 -p 64", "--n-prompt"},
      {bench + "--cache paged --prefix-reuse 300:0.9 -d 16", "--n-depth"},
      {bench + "-p 0 -n 4 --chunk 8", "--chunk"},
      {bench + "--tokenizer /nonexistent/tokenizer.bin", "--tokenizer"},
      {"plan --list-presets --context 100", "--context"},
      {"plan --preset llama2-7b --kv-group 32", "--kv-group"},
  };
  for (const Refused& c : cases) {
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.option), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find("invalid argument"), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
}

TEST(CliOptions, TheMessageSaysWhoHonoursTheOption) {
  auto r = run_cli("serve --model dummy:tiny --port 0 --kernel flex");
  EXPECT_NE(r.err.find("eager, fused"), std::string::npos) << r.err;
  r = run_cli("serve --model dummy:tiny --port 0 --cache static");
  EXPECT_NE(r.err.find("--cache paged"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--cache quantized"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("generate, logits and bench"), std::string::npos) << r.err;
  r = run_cli("serve --model dummy:tiny --port 0 --kv-bits 5");
  EXPECT_NE(r.err.find("2, 4 or 8"), std::string::npos) << r.err;
  r = run_cli("serve --model dummy:tiny --port 0 --kv-residual 16");
  EXPECT_NE(r.err.find("--kv-bits N or --kv-quant SCHEME"), std::string::npos) << r.err;
  r = run_cli("serve --model dummy:tiny --port 0 --kv-bits 4 --kv-group 32");
  EXPECT_NE(r.err.find("--block-tokens"), std::string::npos) << r.err;
  r = run_cli("generate --model dummy:tiny -n 2 --block-tokens 8");
  EXPECT_NE(r.err.find("with --cache dynamic"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--cache paged"), std::string::npos) << r.err;
}

// A renamed option's old spelling is refused, before anything loads, naming the new one with
// the value given; --help shows only the new spelling.
TEST(CliOptions, RenamedOptionsAreRefusedNamingTheNewSpelling) {
  const struct {
    std::string args, old_name, new_name, value;
  } cases[] = {
      {"generate --model dummy:tiny --prompt-ids '1 2 3' -n 2 --output ids --cache paged "
       "--block-size 8",
       "--block-size", "--block-tokens", "8"},
      {"bench --model dummy:tiny -r 1 --cache dynamic --block-size 8", "--block-size",
       "--block-tokens", "8"},  // refused first, though it would have no effect anyway
      {"serve --model dummy:tiny --port 0 --block-size 32", "--block-size", "--block-tokens", "32"},
      {"plan --preset llama2-7b --block 16", "--block", "--block-tokens", "16"},
  };
  for (const auto& c : cases) {
    const auto r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.old_name + " was renamed " + c.new_name + "; use " + c.new_name + " " +
                         c.value),
              std::string::npos)
        << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
  for (const char* cmd : {"generate", "plan"}) {
    const auto r = run_cli(std::string(cmd) + " --help");
    EXPECT_EQ(r.exit_code, 0) << cmd;
    EXPECT_NE(r.out.find("--block-tokens"), std::string::npos) << cmd;
    EXPECT_EQ(r.out.find("--block-size"), std::string::npos) << cmd;
    EXPECT_EQ(r.out.find("--block "), std::string::npos) << cmd;
  }
}

// The same options where they take effect. Dummy models are built in a scratch folder.
class CliOptionsAccepted : public ::testing::Test {
 protected:
  void SetUp() override { ::setenv("XDG_CACHE_HOME", scratch_.str().c_str(), 1); }
  void TearDown() override { ::unsetenv("XDG_CACHE_HOME"); }
  testing_util::ScratchDir scratch_{"cli_options"};
};

// Refused once the file is read: a GGUF without a vocabulary (convert keeps only llama2.c ones)
// has no tokenizer for a chat template, and its weights are priced as stored.
TEST_F(CliOptionsAccepted, OptionsWithoutEffectOnTheLoadedModelExitWith2) {
  const std::string gguf = scratch_.file("novocab.gguf");
  auto r = run_cli("convert --model dummy:tiny -o " + gguf);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string jsonl = scratch_.file("in.jsonl");
  std::ofstream(jsonl) << R"({"prompt": [1, 450], "max_tokens": 1})"
                       << "\n";
  const Refused cases[] = {
      {"serve --model " + gguf + " --port 0 --chat-template chatml", "--chat-template"},
      {"batch --model " + gguf + " --chat-template chatml --input " + jsonl, "--chat-template"},
      {"plan --config " + gguf + " --weight-dtype f32", "--weight-dtype"},
  };
  for (const Refused& c : cases) {
    r = run_cli(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.option), std::string::npos) << c.args << "\nstderr: " << r.err;
    EXPECT_EQ(r.out, "") << c.args;
  }
  // convert embeds llama2.c vocabularies only: another kind given explicitly is refused.
  const std::string spm = std::string(KVCACHE_SHARED_DIR) + "/vocab/ggml-vocab-llama-spm.gguf";
  if (std::ifstream(spm).good()) {
    r = run_cli("convert --model dummy:tiny --tokenizer " + spm + " -o " + scratch_.file("x.gguf"));
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--tokenizer"), std::string::npos) << r.err;
  }
}

TEST_F(CliOptionsAccepted, EachOptionWhereItTakesEffect) {
  const std::string gen = "generate --model dummy:tiny --prompt-ids '1 2 3' -n 2 --output ids ";
  const std::string jsonl = scratch_.file("in.jsonl");
  std::ofstream(jsonl) << R"({"prompt": [1, 450, 4996], "max_tokens": 3, "temperature": 0})"
                       << "\n";
  const std::string accepted[] = {
      gen + "--cache paged --kernel eager --block-tokens 8 --kv-budget 64MiB",
      gen + "--cache paged --max-cache-len 64",
      gen + "--cache static --max-cache-len 64 --kernel flex",
      gen + "--cache quantized --kv-bits 2 --kv-group 32 --kv-residual 32",
      gen + "--cache quantized --kernel eager --verify --verify-tol 10",  // the kernel of the
                                                                          // reference
      gen +
          "--temp 0.7 --top-k 5 --top-p 0.9 --min-p 0.01 --seed 3 --repeat-penalty 1.1 "
          "--repeat-last-n 8",
      "logits --model dummy:tiny --prompt-ids '1 2 3' -o /dev/null --cache static --max-cache-len "
      "16",
      "bench --model dummy:tiny -p 8 -n 2 -r 1 --cache dynamic,quantized --kv-bits 2",
      "bench --model dummy:tiny -p 0 -n 2 -d 8 -r 1 --chunk 4",
      "batch --model dummy:tiny --cache paged --kernel eager --block-tokens 8 --kv-budget 64MiB "
      "--chunk 32 --input " +
          jsonl,
      "plan --preset llama2-7b --kv-dtype q4 --kv-group 32",
  };
  for (const std::string& args : accepted) {
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
  }
}

}  // namespace
}  // namespace kvcache
