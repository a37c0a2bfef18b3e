// Session files: a restored session continues exactly as the saved one (restore ≡ recompute,
// logits bit for bit) for the dense containers, and a file from another model, dtype, layer
// plan or version, or a damaged one, is refused with a message naming what differs, before the
// session is touched.
#include "runtime/session_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/llama2c.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "scratch_dir.h"
#include "shared_data.h"

namespace kvcache {
namespace {

std::vector<int32_t> test_ids(size_t n, int32_t vocab) {
  std::vector<int32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>((7 + 31 * i) % (vocab - 2)) + 1;
  return ids;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

LoadedModel dummy(const std::string& name) {
  LoadOptions lo;
  lo.dummy_cache_dir = testing_util::process_scratch().file("dummy-session");
  return load_model("dummy:" + name, lo);
}

// Saves `a` after `split` tokens, restores into a fresh session, then feeds both the rest one
// token at a time: every logit equal (the same K/V, the same kernels).
void expect_restore_equals_uninterrupted(const Model& model, const SessionConfig& sc, size_t split,
                                         size_t total, const std::string& what) {
  SCOPED_TRACE(what);
  const testing_util::ScratchDir dir("session_file");
  const std::string path = dir.str() + "/s.kvs";
  const std::vector<int32_t> ids = test_ids(total, static_cast<int32_t>(model.config().vocab_size));
  Session a(model, sc);
  a.prefill({ids.data(), split});
  const uint64_t bytes = save_session(a, {ids.data(), split}, path);
  EXPECT_EQ(bytes, std::filesystem::file_size(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  Session b(model, sc);
  b.prefill({ids.data(), 3});  // not fresh: load resets it
  const SessionFileInfo info = load_session(b, path);
  EXPECT_EQ(info.tokens, std::vector<int32_t>(ids.begin(), ids.begin() + split));
  EXPECT_EQ(info.implementation, sc.cache.implementation);
  ASSERT_EQ(b.position(), static_cast<int64_t>(split));
  for (size_t i = split; i < total; ++i) {
    auto la = a.decode(ids[i]);
    const std::vector<float> va(la.begin(), la.end());
    auto lb = b.decode(ids[i]);
    ASSERT_EQ(va, std::vector<float>(lb.begin(), lb.end())) << "at position " << i;
  }
}

TEST(SessionFile, RestoreEqualsUninterruptedDenseContainers) {
  KVCACHE_REQUIRE_STORIES();
  const Model model(load_llama2c(testing_util::stories_dir() + "/stories260K.bin"));
  for (const char* cache : {"dynamic", "static"}) {
    for (int64_t window : {0, 8}) {  // 8: every layer a sliding window, long evicted
      SessionConfig sc;
      sc.cache.implementation = cache;
      sc.prefill_chunk = 16;
      sc.sliding_window_override = window;
      expect_restore_equals_uninterrupted(model, sc, 37, 52,
                                          std::string(cache) + " window " + std::to_string(window));
      expect_restore_equals_uninterrupted(model, sc, 5, 12, std::string(cache) + " short");
    }
  }
  SessionConfig f16;
  f16.cache.kv_dtype = DType::kF16;
  expect_restore_equals_uninterrupted(model, f16, 20, 30, "dynamic f16");
  SessionConfig quantized;  // packed blocks and a residual both hold tokens at the save
  quantized.cache.implementation = "quantized";
  quantized.cache.quantized.group = 4;
  quantized.cache.quantized.residual = 8;
  expect_restore_equals_uninterrupted(model, quantized, 23, 40, "quantized");
  quantized.sliding_window_override = 8;
  expect_restore_equals_uninterrupted(model, quantized, 23, 40, "quantized sliding");
}

TEST(SessionFile, RestoreEqualsUninterruptedMixedAndLinearLayers) {
  for (const char* preset : {"gemma2-tiny", "qwen3next-tiny"}) {
    const LoadedModel m = dummy(preset);
    for (const char* cache : {"dynamic", "static"}) {
      SessionConfig sc;
      sc.cache.implementation = cache;
      sc.cache.max_cache_len = 64;
      sc.prefill_chunk = 8;
      expect_restore_equals_uninterrupted(*m.model, sc, 21, 30, std::string(preset) + "/" + cache);
    }
  }
}

class SessionFileRefusal : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing_util::have_stories()) GTEST_SKIP() << "stories260K not available";
    model_ =
        std::make_unique<Model>(load_llama2c(testing_util::stories_dir() + "/stories260K.bin"));
    ids_ = test_ids(20, static_cast<int32_t>(model_->config().vocab_size));
    Session s(*model_, sc_);
    s.prefill(ids_);
    save_session(s, ids_, path());
  }
  std::string path() const { return dir_.str() + "/s.kvs"; }
  // Loads `file` into a session of `sc` at position 4; expects it refused and untouched (or
  // reset, when a layer refused its state: the payload was being applied).
  std::string refusal(const SessionConfig& sc, const std::string& file, const Model* m = nullptr,
                      int64_t position_after = 4) {
    Session s(m ? *m : *model_, sc);
    s.prefill({ids_.data(), 4});
    const std::string msg = error_of([&] { load_session(s, file); });
    EXPECT_EQ(s.position(), position_after) << "a refused load left the session changed";
    EXPECT_EQ(s.cache().seq_length(), position_after);
    return msg;
  }

  testing_util::ScratchDir dir_{"session_refusal"};
  std::unique_ptr<Model> model_;
  std::vector<int32_t> ids_;
  SessionConfig sc_;
};

TEST_F(SessionFileRefusal, AnotherModel) {
  const LoadedModel other = dummy("tiny");
  const std::string msg = refusal(sc_, path(), other.model.get());
  EXPECT_NE(msg.find("was saved from another model (fingerprint"), std::string::npos) << msg;
}

TEST_F(SessionFileRefusal, AnotherDtypeLayerPlanOrContainer) {
  SessionConfig f16 = sc_;
  f16.cache.kv_dtype = DType::kF16;
  std::string msg = refusal(f16, path());
  EXPECT_NE(msg.find("kv dtype f32 in the file vs f16 here"), std::string::npos) << msg;
  SessionConfig sliding = sc_;
  sliding.sliding_window_override = 8;
  msg = refusal(sliding, path());
  EXPECT_NE(msg.find("layer types differ at layer 0 (full_attention in the file vs "
                     "sliding_attention here)"),
            std::string::npos)
      << msg;
  SessionConfig stat = sc_;
  stat.cache.implementation = "static";
  msg = refusal(stat, path());
  EXPECT_NE(msg.find("saved from a 'dynamic' cache; this one is 'static'"), std::string::npos)
      << msg;
}

TEST_F(SessionFileRefusal, StaticCapacityTooSmall) {
  SessionConfig big = sc_;
  big.cache.implementation = "static";
  big.cache.max_cache_len = 64;
  {
    Session s(*model_, big);
    s.prefill(ids_);
    save_session(s, ids_, path());
  }
  SessionConfig small = big;
  small.cache.max_cache_len = 16;
  const std::string msg = refusal(small, path(), nullptr, /*position_after=*/0);
  EXPECT_NE(msg.find("(static/full_attention): cannot restore: the file holds 20 tokens but this "
                     "static cache holds 16 (max_cache_len)"),
            std::string::npos)
      << msg;
}

TEST_F(SessionFileRefusal, NewerVersionDamagedOrTruncated) {
  const std::string good = testing_util::read_file(path());
  std::string b = good;
  b[8] = 2;  // u32 version after the 8-byte magic
  testing_util::write_file(path(), b);
  std::string msg = refusal(sc_, path());
  EXPECT_NE(msg.find("has version 2, newer than this build's 1"), std::string::npos) << msg;

  b = good;
  b[b.size() / 2] ^= 0x10;  // a byte of the payload
  testing_util::write_file(path(), b);
  msg = refusal(sc_, path());
  EXPECT_NE(msg.find("checksum mismatch: the file is damaged"), std::string::npos) << msg;

  for (size_t keep : {good.size() - 1, good.size() / 2, size_t{30}, size_t{5}}) {
    testing_util::write_file(path(), good.substr(0, keep));
    msg = refusal(sc_, path());
    EXPECT_TRUE(msg.find("checksum mismatch") != std::string::npos ||
                msg.find("truncated") != std::string::npos ||
                msg.find("not a kvcache session file") != std::string::npos)
        << keep << ": " << msg;
  }
  msg = refusal(sc_, dir_.str() + "/missing.kvs");
  EXPECT_NE(msg.find("cannot open session file"), std::string::npos) << msg;

  testing_util::write_file(path(), good);
  const SessionFileInfo info = read_session_info(path(), /*verify=*/true);
  EXPECT_EQ(info.tokens, ids_);
  EXPECT_EQ(info.layer_types.size(), static_cast<size_t>(model_->config().n_layers));
  EXPECT_EQ(info.kv_dtype, "f32");
}

TEST_F(SessionFileRefusal, PagedSessionRefused) {
  SessionConfig paged = sc_;
  paged.cache.implementation = "paged";
  Session s(*model_, paged);
  s.prefill(ids_);
  const std::string msg = error_of([&] { save_session(s, ids_, path() + ".p"); });
  EXPECT_NE(msg.find("a paged session (--cache paged) cannot be saved"), std::string::npos) << msg;
}

}  // namespace
}  // namespace kvcache
