// The quantized (KIVI) container on the layer types of issue 43 item 4, through real models
// (dummy presets written as Hugging Face folders, f32 weights):
//   - Llama-4-style chunked layers: gemma2-tiny with its layers set to chunked (chunks of 12),
//     full, sliding (window 8) and chunked, as families_test's MixedWindows; groups of 4 (they
//     divide the chunk: groups start at chunk starts) and 8 (a block straddles chunk starts);
//   - DeepSeek MLA latents: mla-tiny (V3, q_lora) and deepseek-v2-tiny.
// Small groups and residuals (G 4 or 8, R 4) so that most of a 40-token sequence is packed.
// (Not G 2: two tokens per key channel and two channels per value group are the group's min
// and max, exact but for the f16 rounding of scale and zero — nothing would be measured.)
// Each run prefills in chunks and decodes token by token; its logits are compared with the same
// steps on the f32 dynamic cache. Quantization error is the only difference (the residual is
// f32 and the kernel equals the reference on dequantized values within 1e-5), so the measured
// difference must shrink as the bits grow and stay within a tolerance stated per bit width:
// the largest normwise relative difference max|a - b| / max|b| over every step's logits
// (runtime/generate.h max_rel_diff, what --verify reports), measured here and given 2-5x room.
// Measured (8 / 4 / 2 bits): mla-tiny 2.1e-4 / 2.9e-3 / 1.6e-2, deepseek-v2-tiny 1.8e-4 /
// 2.8e-3 / 1.5e-2; chunked gemma2-tiny G 4 3.0e-3 / 6.2e-2 / 0.32, G 8 5.7e-3 / 0.12 / 0.50
// (its softcapped logits saturate, so a small max|logit| makes the ratio large; greedy tokens
// agree at every step in every case, 32 of 32).
// The MLA tolerances are the ones to quote for a latent cache: 1e-3 at 8 bits, 1e-2 at 4,
// 5e-2 at 2 (the element bound itself is tested in tests/cache/quantized_layer_test.cc).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cache/quantized_layer.h"
#include "model/dummy.h"
#include "model/model_file.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

std::string temp_dir() {
  static const std::string d = testing_util::process_scratch().file("quantized_layers");
  return d;
}

std::unique_ptr<Model> load(const std::string& preset, bool chunked) {
  DummyModelOptions o;
  o.preset = preset;
  o.weight_dtype = DType::kF32;
  o.seed = 7;
  o.cache_dir = temp_dir();
  std::unique_ptr<ModelFile> file = open_model_file(build_dummy_model(o));
  if (chunked) {
    file->mutable_config().layer_types = {"chunked_attention", "full_attention",
                                          "sliding_attention", "chunked_attention"};
    file->mutable_config().attention_chunk_size = 12;
  }
  return std::make_unique<Model>(std::move(file));
}

std::vector<int32_t> prompt(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return ids;
}

struct Trace {
  std::vector<std::vector<float>> logits;  // per step: the prefill's last row, then each decode
  std::vector<int32_t> greedy;             // argmax of each step
};

// Prefill `n_prompt` tokens (chunks of 7) then decode the rest of `ids` one at a time.
Trace run(const Model& model, const CacheOptions& cache, const std::vector<int32_t>& ids,
          size_t n_prompt) {
  SessionConfig sc;
  sc.cache = cache;
  sc.cache.kv_dtype = DType::kF32;
  sc.prefill_chunk = 7;
  Session s(model, sc);
  Trace r;
  auto keep = [&](std::span<const float> l) {
    r.logits.emplace_back(l.begin(), l.end());
    r.greedy.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
  };
  keep(s.prefill({ids.data(), n_prompt}));
  for (size_t i = n_prompt; i < ids.size(); ++i) keep(s.decode(ids[i]));
  if (cache.implementation == "quantized") {
    // Full layers packed all but the residual; chunked layers hold the last chunk (from the
    // block straddling its start, if any); sliding layers dropped their old blocks.
    const ModelConfig& c = model.config();
    const auto last = static_cast<int64_t>(ids.size()) - 1;
    for (int l = 0; l < s.cache().num_layers(); ++l) {
      const auto& q = dynamic_cast<const QuantizedLayer&>(s.cache().layer(l));
      const std::string& type = c.layer_types[static_cast<size_t>(l)];
      if (type == "full_attention") {
        EXPECT_GE(q.packed_length(), last + 1 - 2 * cache.quantized.group) << "layer " << l;
      } else if (type == "chunked_attention") {
        const int64_t chunk0 = last / c.attention_chunk_size * c.attention_chunk_size;
        EXPECT_LE(q.first_position(), chunk0) << "layer " << l;
        EXPECT_GT(q.first_position() + cache.quantized.group, chunk0) << "layer " << l;
      } else {
        EXPECT_GT(q.first_position(), 0) << "layer " << l;
      }
    }
  }
  return r;
}

CacheOptions quantized(int bits, int64_t group) {
  CacheOptions c;
  c.implementation = "quantized";
  c.quantized.bits = bits;
  c.quantized.group = group;
  c.quantized.residual = 4;
  return c;
}

struct Case {
  const char* preset;
  bool chunked;
  int64_t group;
  double tol[3];  // 8, 4, 2 bits
};

class QuantizedLayers : public ::testing::TestWithParam<Case> {};

TEST_P(QuantizedLayers, LogitsCloseToTheF32CachePerBitWidth) {
  const Case& c = GetParam();
  const auto model = load(c.preset, c.chunked);
  const std::vector<int32_t> ids = prompt(40, model->config().vocab_size);
  CacheOptions dense;
  dense.implementation = "dynamic";
  const Trace want = run(*model, dense, ids, 9);
  double prev = 0.0;
  const int bits[] = {8, 4, 2};
  for (int i = 0; i < 3; ++i) {
    const Trace got = run(*model, quantized(bits[i], c.group), ids, 9);
    ASSERT_EQ(got.logits.size(), want.logits.size());
    double worst = 0.0;
    int agree = 0;
    for (size_t t = 0; t < want.logits.size(); ++t) {
      worst = std::max(worst, max_rel_diff(got.logits[t], want.logits[t]));
      agree += got.greedy[t] == want.greedy[t];
    }
    std::printf("[%s%s G %lld] %d bits: max rel logit diff %.3g, greedy agreement %d / %zu\n",
                c.preset, c.chunked ? " chunked" : "", static_cast<long long>(c.group), bits[i],
                worst, agree, want.logits.size());
    EXPECT_LE(worst, c.tol[i]) << bits[i] << " bits";
    EXPECT_GT(worst, 0.0) << bits[i] << " bits: nothing was quantized";
    EXPECT_GT(worst, prev) << bits[i] << " bits: fewer bits must cost more";
    prev = worst;
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, QuantizedLayers,
                         ::testing::Values(Case{"gemma2-tiny", true, 4, {1.5e-2, 0.3, 1.0}},
                                           Case{"gemma2-tiny", true, 8, {1.5e-2, 0.3, 1.0}},
                                           Case{"mla-tiny", false, 4, {1e-3, 1e-2, 5e-2}},
                                           Case{"deepseek-v2-tiny", false, 4, {1e-3, 1e-2, 5e-2}}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = std::string(info.param.preset) +
                                           (info.param.chunked ? "_chunked" : "") + "_g" +
                                           std::to_string(info.param.group);
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace kvcache
