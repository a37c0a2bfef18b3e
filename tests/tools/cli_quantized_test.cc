// `--cache quantized` options through the real binary: a bad --kv-quant name, --kv-bits that
// contradicts a per-token format, and a head dim a per-token format cannot hold are each a
// message naming the problem and exit code 2 (dummy:tiny, no shared data needed).
#include <gtest/gtest.h>

#include <string>

#include "cli_util.h"

namespace kvcache {
namespace {

using testing_util::run_cli;

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

}  // namespace
}  // namespace kvcache
