// stories260K converted to GGUF by our writer and loaded back through the GGUF loader and its
// SentencePiece tokenizer: same ids, same logits (f32), bounded drift for f16 / q8_0 weights.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "golden_util.h"
#include "kernels/softmax.h"
#include "model/convert.h"
#include "model/llama2c.h"
#include "model/tokenizer_llama2c.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;
using testing_util::read_golden_ids;
using testing_util::stories_dir;

struct Converted {
  std::string path;
  explicit Converted(std::optional<DType> dtype) {
    path = (fs::temp_directory_path() / ("kvcache_rt_" + std::to_string(::getpid()) + "_" +
                                         (dtype ? dtype_name(*dtype) : "keep") + ".gguf"))
               .string();
    auto src = load_llama2c(stories_dir() + "/stories260K.bin");
    const Llama2cTokenizer tok(stories_dir() + "/tok512.bin", 512);
    GgufConvertOptions o;
    o.matrix_dtype = dtype;
    o.tokenizer = &tok;
    convert_to_gguf(*src, o, path);
  }
  ~Converted() { fs::remove(path); }
};

std::vector<float> logits_by_token(const Model& m, const std::vector<int32_t>& ids, size_t n) {
  Session s(m, SessionConfig{});
  std::vector<float> out;
  for (size_t i = 0; i < n; ++i) {
    auto l = s.decode(ids[i]);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

TEST(GgufRoundTrip, F32SameIdsSameLogitsSameTokens) {
  KVCACHE_REQUIRE_STORIES();
  Converted gguf(std::nullopt);
  LoadedModel g = load_model(gguf.path);
  LoadedModel l = load_model(stories_dir() + "/stories260K.bin");
  EXPECT_EQ(g.model->file().format(), "gguf");
  ASSERT_NE(g.tokenizer, nullptr);
  EXPECT_EQ(std::string(g.tokenizer->kind()), "llama");
  // The GGUF's SentencePiece tokenizer reproduces llama2.c's encode.
  for (const char* text :
       {"Once upon a time", "Lily and Ben went to the park. They saw a big dog!", "x"}) {
    EXPECT_EQ(g.tokenizer->encode(text), l.tokenizer->encode(text)) << text;
  }
  for (const char* name : {"once_upon_a_time", "empty"}) {
    const auto golden = read_golden_ids(name);
    Session s(*g.model, SessionConfig{});
    GenerateParams gp;
    gp.max_new_tokens = 256 - static_cast<int64_t>(golden.prompt.size()) + 1;
    gp.stop_ids = {1};
    std::vector<int32_t> ids;
    generate(s, golden.prompt, gp, nullptr, &ids);
    EXPECT_EQ(ids, golden.generated) << name;
  }
  // Same f32 bytes, same code: bit-identical logits.
  const auto golden = read_golden_ids("once_upon_a_time");
  std::vector<int32_t> seq = golden.prompt;
  seq.insert(seq.end(), golden.generated.begin(), golden.generated.end());
  EXPECT_EQ(logits_by_token(*g.model, seq, 16), logits_by_token(*l.model, seq, 16));
}

TEST(GgufRoundTrip, ReducedPrecisionWeightsStayClose) {
  KVCACHE_REQUIRE_STORIES();
  const auto golden = read_golden_ids("once_upon_a_time");
  std::vector<int32_t> seq = golden.prompt;
  seq.insert(seq.end(), golden.generated.begin(), golden.generated.end());
  LoadedModel ref = load_model(stories_dir() + "/stories260K.bin");
  const std::vector<float> want = logits_by_token(*ref.model, seq, 32);
  // Tolerances: normwise relative logit error over 32 positions. f16 weights round to 11
  // significant bits (~5e-4 relative each); q8_0 to 8 bits per block (~4e-3): measured
  // 5.2e-4 (f16), 4.0e-3 (bf16) and 1.2e-2 (q8_0) on this model; bounds ~10x above.
  const std::pair<DType, double> cases[] = {
      {DType::kF16, 5e-3}, {DType::kBF16, 5e-2}, {DType::kQ8_0, 1e-1}};
  for (const auto& [dtype, tol] : cases) {
    Converted gguf(dtype);
    LoadedModel g = load_model(gguf.path);
    EXPECT_EQ(g.model->file().tensor("blk.0.attn_q.weight").dtype(), dtype);
    const std::vector<float> got = logits_by_token(*g.model, seq, 32);
    const double d = max_rel_diff(got, want);
    EXPECT_LE(d, tol) << dtype_name(dtype);
    std::printf("[%s weights] max relative logit difference vs f32 over 32 positions: %.3g\n",
                dtype_name(dtype), d);
  }
}

// llama2.c's run.c stops on BOS (1), which separates its training stories; a GGUF converted from
// it is a SentencePiece `llama` model like any other and stops on EOS (2), as llama.cpp does.
TEST(GgufRoundTrip, ConvertedModelStopsAtEosNotBos) {
  KVCACHE_REQUIRE_STORIES();
  Converted gguf(std::nullopt);
  LoadedModel g = load_model(gguf.path);
  LoadedModel l = load_model(stories_dir() + "/stories260K.bin");
  EXPECT_EQ(l.stop_ids, std::vector<int32_t>{1});
  EXPECT_EQ(g.stop_ids, std::vector<int32_t>{2});
  EXPECT_EQ(g.model->config().eos_id, 2);
  EXPECT_EQ(g.model->config().bos_id, 1);
  ASSERT_NE(g.tokenizer, nullptr);
  EXPECT_EQ(g.tokenizer->eos_id(), 2);
  EXPECT_EQ(g.tokenizer->bos_id(), 1);

  // The stop rule itself: the sampled stop id ends generation, is reported as the last id and
  // is never fed; any other id (BOS included) is not a stop for this model.
  const auto golden = read_golden_ids("once_upon_a_time");
  const int32_t stop = golden.generated[6];
  const size_t first = static_cast<size_t>(
      std::find(golden.generated.begin(), golden.generated.end(), stop) - golden.generated.begin());
  Session s(*g.model, SessionConfig{});
  GenerateParams gp;
  gp.max_new_tokens = 40;
  gp.stop_ids = {stop};
  std::vector<int32_t> ids;
  const GenerateStats st = generate(s, golden.prompt, gp, nullptr, &ids);
  EXPECT_TRUE(st.stopped);
  EXPECT_EQ(ids,
            std::vector<int32_t>(golden.generated.begin(), golden.generated.begin() + first + 1));
  EXPECT_EQ(s.position(),
            static_cast<int64_t>(golden.prompt.size() + first));  // the stop id was not fed
  // --ignore-eos: all N tokens, the same greedy continuation.
  Session s2(*g.model, SessionConfig{});
  gp.ignore_eos = true;
  ids.clear();
  EXPECT_FALSE(generate(s2, golden.prompt, gp, nullptr, &ids).stopped);
  EXPECT_EQ(ids, std::vector<int32_t>(golden.generated.begin(), golden.generated.begin() + 40));
}

}  // namespace
}  // namespace kvcache
