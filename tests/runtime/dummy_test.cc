// dummy:NAME models: a seeded random-weight GGUF written and loaded through the real loader.
#include "model/dummy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "cache/cache.h"
#include "core/error.h"
#include "model/forward.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "scratch_dir.h"
#include "shared_data.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;

using testing_util::read_file;

TEST(DummyModel, TinyLoadsThroughGgufAndIsDeterministic) {
  const testing_util::ScratchDir a("dummy_a"), b("dummy_b");
  LoadOptions lo;
  lo.dummy_cache_dir = a.str();
  LoadedModel m = load_model("dummy:tiny", lo);
  const ModelConfig& c = m.model->config();
  EXPECT_EQ(m.model->file().format(), "gguf");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(m.model->file().tensor("blk.1.ffn_up.weight").dtype(), DType::kF16);
  EXPECT_EQ(m.tokenizer, nullptr);  // no vocabulary given
  // Same preset and seed in another folder: the same bytes.
  DummyModelOptions d;
  d.cache_dir = b.str();
  const std::string again = build_dummy_gguf(d);
  EXPECT_EQ(read_file(again), read_file(m.model->file().path()));
  d.seed = 1;
  EXPECT_NE(read_file(build_dummy_gguf(d)), read_file(again));
}

TEST(DummyModel, CacheMatchesNoCacheRecomputeForEveryWeightType) {
  const testing_util::ScratchDir dir("dummy_w");
  LoadOptions lo;
  lo.dummy_cache_dir = dir.str();
  for (const char* spec : {"dummy:tiny:f32", "dummy:tiny:bf16", "dummy:tiny:q8_0"}) {
    LoadedModel m = load_model(spec, lo);
    for (const char* cache : {"dynamic", "static"}) {
      SessionConfig sc;
      sc.cache.implementation = cache;
      Session s(*m.model, sc);
      GenerateParams gp;
      gp.max_new_tokens = 24;
      gp.sampler.temperature = 0.8f;
      gp.sampler.seed = 11;
      gp.verify = true;
      std::vector<int32_t> prompt = {1, 15043, 3186, 29892, 920, 526, 366};
      const GenerateStats st = generate(s, prompt, gp, nullptr);
      EXPECT_EQ(st.new_tokens, 24);
      EXPECT_EQ(st.verify_failures, 0) << spec << " " << cache << ": " << st.verify_max_rel_diff;
      EXPECT_LE(st.verify_max_rel_diff, 1e-4) << spec << " " << cache;
    }
  }
}

// The last layer runs on the rows whose logits are wanted only: the next-token logits of a
// prefill (each batch row's last position) equal, bit for bit, that position's row of a forward
// that computes every position. GQA (attention for the last rows only), MLA (FFN only), MoE with
// and without a shared expert, Gemma-2's post norms; both attention kernels; no cache, a dense
// cache and a quantized one (whose kernel attends every row, then the last ones are kept); 4
// batch rows of 9 and 2 tokens, so both output heads take the GEMM (with fewer rows the
// next-token head takes the GEMV, whose bits differ from the GEMM's by design).
TEST(DummyModel, LastLogitsEqualTheAllLogitsRowBitForBit) {
  const testing_util::ScratchDir dir("dummy_last");
  LoadOptions lo;
  lo.dummy_cache_dir = dir.str();
  for (const char* spec : {"dummy:tiny", "dummy:tiny:f32", "dummy:mla-tiny", "dummy:gptoss-tiny",
                           "dummy:deepseek-v2-tiny", "dummy:gemma2-tiny"}) {
    LoadedModel m = load_model(spec, lo);
    const int64_t vocab = m.model->config().vocab_size;
    for (const char* kernel : {"fused", "eager"}) {
      for (const char* cache : {"none", "dynamic", "quantized"}) {
        for (const int64_t S : {9, 2}) {
          const int64_t B = 4;
          std::vector<int32_t> ids(static_cast<size_t>(B * S));
          for (size_t i = 0; i < ids.size(); ++i)
            ids[i] = static_cast<int32_t>((i * 7919 + 3) % static_cast<size_t>(vocab));
          SessionConfig sc;
          sc.cache.implementation = cache;
          sc.cache.quantized.bits = 8;
          std::vector<float> all, last;
          for (const LogitsMode mode : {LogitsMode::kAll, LogitsMode::kLast, LogitsMode::kNone}) {
            std::unique_ptr<Cache> kv;
            if (sc.cache.implementation != "none") {
              CacheConfig cc = make_cache_config(m.model->config(), sc);
              cc.options.max_batch_size = B;
              kv = std::make_unique<Cache>(cc);
            }
            Forward fw(*m.model, kernel, B * S);
            ForwardParams p;
            p.tokens = ids.data();
            p.batch = B;
            p.n_tokens = S;
            p.cache = kv.get();
            p.logits = mode;
            const std::span<const float> out = fw.forward(p);
            if (mode == LogitsMode::kAll) all.assign(out.begin(), out.end());
            if (mode == LogitsMode::kLast) last.assign(out.begin(), out.end());
            if (mode == LogitsMode::kNone) {
              EXPECT_TRUE(out.empty()) << spec;
            }
          }
          ASSERT_EQ(all.size(), static_cast<size_t>(B * S * vocab));
          ASSERT_EQ(last.size(), static_cast<size_t>(B * vocab));
          for (int64_t b = 0; b < B; ++b)
            for (int64_t v = 0; v < vocab; ++v)
              ASSERT_EQ(last[static_cast<size_t>(b * vocab + v)],
                        all[static_cast<size_t>((b * S + S - 1) * vocab + v)])
                  << spec << " " << kernel << " " << cache << " S " << S << " row " << b
                  << " token " << v;
        }
      }
    }
  }
}

// A cached Hugging Face folder built from an older definition of its preset (another
// config.json) is rebuilt, not loaded: a changed preset never serves stale weights.
TEST(DummyModel, FolderOfAnOlderPresetDefinitionIsRebuilt) {
  DummyModelOptions o;
  o.preset = "deepseekv4-tiny";
  o.weight_dtype = DType::kF32;
  o.cache_dir = testing_util::process_scratch().file("dummy-stale");
  const std::string folder = build_dummy_model(o);
  const std::string config = folder + "/config.json";
  std::string fresh;
  {
    std::ifstream in(config, std::ios::binary);
    fresh.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  {
    std::ofstream out(config, std::ios::binary | std::ios::trunc);
    out << "{\"model_type\": \"deepseek_v4\", \"index_n_heads\": 2}\n";
  }
  EXPECT_EQ(build_dummy_model(o), folder);
  std::ifstream in(config, std::ios::binary);
  const std::string now((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(now, fresh);
}

TEST(DummyModel, UnknownPresetIsAnError) {
  EXPECT_THROW(load_model("dummy:nope"), Error);
  EXPECT_THROW(load_model("dummy:tiny:q4_k"), Error);
}

}  // namespace
}  // namespace kvcache
