// serve --slot-save-path: POST /slots/{id}?action=save writes a finished request's cached
// blocks to a session file; action=restore puts them back into another server's prefix cache,
// so that a prompt starting with those tokens reuses them (usage.cached_tokens) and continues
// exactly as on the server that computed them.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "raw_http.h"
#include "scratch_dir.h"
#include "server_test_util.h"
#include "shared_data.h"

namespace kvcache {
namespace {

using nlohmann::json;
using testing_util::http;
using testing_util::HttpReply;
using testing_util::TestServer;
using testing_util::TestServerOptions;

std::vector<int32_t> ids(int n, int from) {
  std::vector<int32_t> v;
  for (int i = 0; i < n; ++i) v.push_back(from + (i * 7) % 200);
  return v;
}

HttpReply complete(int port, const std::vector<int32_t>& prompt, int max_tokens) {
  const json req{
      {"model", "dummy:tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
  return http(port, "POST", "/v1/completions", req.dump());
}

HttpReply slot(int port, const std::string& id, const std::string& action,
               const std::string& filename) {
  return http(port, "POST", "/slots/" + id + "?action=" + action,
              json{{"filename", filename}}.dump());
}

TEST(ServerSlots, SaveThenRestoreIntoAnotherServerHitsThePrefixCache) {
  const LoadedModel* lm = testing_util::tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf";
  const testing_util::ScratchDir dir("slots");
  TestServerOptions o;
  o.http.slot_save_path = dir.str();
  const std::vector<int32_t> p1 = ids(50, 10);  // fed with its first sampled token: 3 blocks
  std::vector<int32_t> p2 = p1;
  for (int32_t t : ids(6, 300)) p2.push_back(t);
  std::string want;
  {
    TestServer a(*lm, o);
    const HttpReply r1 = complete(a.port, p1, 2);
    ASSERT_EQ(r1.status, 200) << r1.body;
    const std::string id = json::parse(r1.body)["id"];
    const HttpReply saved = slot(a.port, id, "save", "s.bin");
    ASSERT_EQ(saved.status, 200) << saved.body;
    const json s = json::parse(saved.body);
    EXPECT_EQ(s["n_saved"], 48);
    EXPECT_EQ(s["n_written"], std::filesystem::file_size(dir.str() + "/s.bin"));
    EXPECT_TRUE(s["timings"].contains("save_ms"));
    const HttpReply ref = complete(a.port, p2, 8);
    ASSERT_EQ(ref.status, 200) << ref.body;
    want = json::parse(ref.body)["choices"][0]["text"];

    // Refusals: unknown request, bad file names, unknown action.
    EXPECT_EQ(slot(a.port, "cmpl-999", "save", "x.bin").status, 404);
    EXPECT_EQ(slot(a.port, id, "save", "../x.bin").status, 400);
    EXPECT_EQ(slot(a.port, id, "save", "a/x.bin").status, 400);
    EXPECT_EQ(slot(a.port, id, "save", "").status, 400);
    EXPECT_EQ(slot(a.port, id, "erase", "x.bin").status, 400);
    EXPECT_EQ(slot(a.port, id, "restore", "missing.bin").status, 404);

    // A tenant's (cache_salt) request is not saved: a slot file restores unsalted blocks.
    json salted{{"model", "dummy:tiny"}, {"prompt", p1}, {"max_tokens", 1}, {"cache_salt", "t"}};
    const HttpReply rs = http(a.port, "POST", "/v1/completions", salted.dump());
    ASSERT_EQ(rs.status, 200) << rs.body;
    const HttpReply refused = slot(a.port, json::parse(rs.body)["id"], "save", "t.bin");
    EXPECT_EQ(refused.status, 400);
    EXPECT_NE(refused.body.find("cache_salt"), std::string::npos) << refused.body;
    EXPECT_FALSE(std::filesystem::exists(dir.str() + "/t.bin"));
  }
  TestServer b(*lm, o);
  const HttpReply restored = slot(b.port, "0", "restore", "s.bin");
  ASSERT_EQ(restored.status, 200) << restored.body;
  const json r = json::parse(restored.body);
  EXPECT_EQ(r["n_restored"], 48);
  EXPECT_TRUE(r["timings"].contains("restore_ms"));
  const HttpReply got = complete(b.port, p2, 8);
  ASSERT_EQ(got.status, 200) << got.body;
  const json g = json::parse(got.body);
  EXPECT_EQ(g["usage"]["prompt_tokens_details"]["cached_tokens"], 48) << got.body;
  EXPECT_EQ(g["choices"][0]["text"], want);

  // A damaged file is refused whole.
  std::string bytes = testing_util::read_file(dir.str() + "/s.bin");
  bytes[bytes.size() / 2] ^= 1;
  testing_util::write_file(dir.str() + "/bad.bin", bytes);
  const HttpReply bad = slot(b.port, "0", "restore", "bad.bin");
  EXPECT_EQ(bad.status, 400);
  EXPECT_NE(bad.body.find("checksum mismatch"), std::string::npos) << bad.body;
}

TEST(ServerSlots, DisabledWithoutSlotSavePath) {
  const LoadedModel* lm = testing_util::tiny_with_vocab();
  if (lm == nullptr) GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR "/vocab/ggml-vocab-llama-spm.gguf";
  TestServer ts(*lm);
  const HttpReply r = slot(ts.port, "cmpl-1", "save", "x.bin");
  EXPECT_EQ(r.status, 501);
  EXPECT_NE(r.body.find("--slot-save-path"), std::string::npos) << r.body;
}

}  // namespace
}  // namespace kvcache
