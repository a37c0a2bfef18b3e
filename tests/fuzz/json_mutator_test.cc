// The JSON mutation of the libFuzzer build, checked in the normal build: what it writes is JSON
// again (and what follows a NUL is kept), it changes the document, and input that does not
// parse goes to the byte mutator.
#include "json_mutator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvcache::fuzz {
namespace {

int g_byte_mutations = 0;
size_t count_byte_mutation(uint8_t*, size_t size, size_t) {
  ++g_byte_mutations;
  return size;
}

TEST(JsonMutator, WritesJsonKeepsTheTailAndChangesTheDocument) {
  const std::string json = R"({"a":[1,{"b":"c"}],"d":null,"e":{"type":"text"}})";
  const std::string input = json + std::string(1, '\0') + "tail";
  int changed = 0, structural = 0;
  for (unsigned seed = 0; seed < 300; ++seed) {
    std::vector<uint8_t> buf(input.begin(), input.end());
    buf.resize(4096);
    g_byte_mutations = 0;
    const size_t n = mutate_json(buf.data(), input.size(), buf.size(), seed, count_byte_mutation);
    ASSERT_LE(n, buf.size());
    if (g_byte_mutations > 0) continue;
    ++structural;
    const std::string out(reinterpret_cast<const char*>(buf.data()), n);
    const size_t nul = out.find('\0');
    ASSERT_NE(nul, std::string::npos) << out;
    EXPECT_EQ(out.substr(nul), std::string(1, '\0') + "tail");
    const nlohmann::json j = nlohmann::json::parse(out.substr(0, nul), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << out;
    changed += j != nlohmann::json::parse(json);
  }
  EXPECT_GT(structural, 100);
  EXPECT_GT(changed, structural / 2);
  std::vector<uint8_t> bad = {'{', '"', 'x'};
  g_byte_mutations = 0;
  for (unsigned seed = 0; seed < 20; ++seed)
    mutate_json(bad.data(), bad.size(), bad.size(), seed, count_byte_mutation);
  EXPECT_EQ(g_byte_mutations, 20);
}

}  // namespace
}  // namespace kvcache::fuzz
