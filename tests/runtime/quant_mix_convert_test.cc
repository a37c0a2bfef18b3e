// `kvcache convert --dtype q4_K_M` (model/convert.cc): a small llama with rows of 256 (the
// k-quants' super-block) and an FFN of 640 (not whole super-blocks: ffn_down falls back to
// q8_0), converted from f32 to llama.cpp's Q4_K_M mix, loaded back through the GGUF loader and
// decoded beside the f32 model.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/convert.h"
#include "model/gguf.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

ModelConfig small_llama() {
  ModelConfig c;
  c.architecture = "llama";
  c.dim = 256, c.n_layers = 4, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 640;
  c.vocab_size = 512, c.max_seq_len = 256;
  c.rope_theta = 10000.0f;
  c.rope_interleaved = true;
  c.rms_eps = 1e-5f;
  c.tie_word_embeddings = false;
  c.bos_id = 1;
  c.eos_id = 2;
  c.fill_defaults();
  return c;
}

// Seeded N(0, stddev) weights, f32, written with our GGUF writer.
std::string write_f32_model(const std::string& path) {
  const ModelConfig c = small_llama();
  GgufWriter w;
  gguf_write_llama_config(w, c);
  std::vector<Tensor> owned;
  owned.reserve(static_cast<size_t>(3 + 9 * c.n_layers));
  std::mt19937 rng(2024);
  auto add = [&](const std::string& name, const Shape& shape, float stddev, float mean) {
    Tensor t = Tensor::empty(DType::kF32, shape);
    std::normal_distribution<float> d(mean, stddev);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = d(rng);
    owned.push_back(std::move(t));
    w.add_tensor(name, owned.back().view());
  };
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  add("token_embd.weight", {c.vocab_size, c.dim}, 1.0f, 0.0f);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    add(layer_tensor(l, "attn_norm.weight"), {c.dim}, 0.1f, 1.0f);
    add(layer_tensor(l, "attn_q.weight"), {q, c.dim}, 0.08f, 0.0f);
    add(layer_tensor(l, "attn_k.weight"), {kv, c.dim}, 0.08f, 0.0f);
    add(layer_tensor(l, "attn_v.weight"), {kv, c.dim}, 0.05f, 0.0f);
    add(layer_tensor(l, "attn_output.weight"), {c.dim, q}, 0.05f, 0.0f);
    add(layer_tensor(l, "ffn_norm.weight"), {c.dim}, 0.1f, 1.0f);
    add(layer_tensor(l, "ffn_gate.weight"), {c.hidden_dim, c.dim}, 0.05f, 0.0f);
    add(layer_tensor(l, "ffn_up.weight"), {c.hidden_dim, c.dim}, 0.05f, 0.0f);
    add(layer_tensor(l, "ffn_down.weight"), {c.dim, c.hidden_dim}, 0.05f, 0.0f);
  }
  add("output_norm.weight", {c.dim}, 0.1f, 1.0f);
  add("output.weight", {c.vocab_size, c.dim}, 0.05f, 0.0f);
  w.write(path);
  return path;
}

std::vector<std::vector<float>> logits_by_token(const Model& m, const std::vector<int32_t>& ids) {
  Session s(m, SessionConfig{});
  std::vector<std::vector<float>> out;
  for (int32_t id : ids) {
    auto l = s.decode(id);
    out.emplace_back(l.begin(), l.end());
  }
  return out;
}

TEST(QuantMixConvert, Q4KMHoldsQ4KAndQ6KAndStaysCloseToF32) {
  const std::string f32_path =
      write_f32_model(testing_util::process_scratch().file("quant_mix_f32.gguf"));
  const std::string out = testing_util::process_scratch().file("quant_mix_q4_K_M.gguf");
  LoadedModel ref = load_model(f32_path);
  GgufConvertOptions o;
  parse_convert_dtype("q4_K_M", o);
  EXPECT_EQ(o.mix, QuantMix::kQ4_K_M);
  const GgufConvertReport report = convert_to_gguf(ref.model->file(), o, out);
  // ffn_down's rows of 640 are not whole super-blocks: q8_0, one note per layer, naming the
  // dtype the mix wanted (q6_K in the layers of more bits, below).
  ASSERT_EQ(report.fallbacks.size(), 4u);
  const auto noted = [&](const std::string& text) {
    return std::any_of(report.fallbacks.begin(), report.fallbacks.end(),
                       [&](const std::string& f) { return f.starts_with(text); });
  };
  EXPECT_TRUE(noted("blk.1.ffn_down.weight: q8_0 instead of q4_K (rows of 640"));
  EXPECT_TRUE(noted("blk.3.ffn_down.weight: q8_0 instead of q6_K (rows of 640"));

  LoadedModel g = load_model(out);
  const ModelFile& f = g.model->file();
  EXPECT_EQ(f.tensor("output.weight").dtype(), DType::kQ6_K);
  EXPECT_EQ(f.tensor("token_embd.weight").dtype(), DType::kQ4_K);
  EXPECT_EQ(f.tensor("output_norm.weight").dtype(), DType::kF32);
  // llama.cpp's use_more_bits(layer, 4) (n_layers / 8 = 0): layer 2 (every third after the
  // first eighth) and layer 3 (the last eighth) keep attn_v in q6_K.
  const DType attn_v[] = {DType::kQ4_K, DType::kQ4_K, DType::kQ6_K, DType::kQ6_K};
  for (int64_t l = 0; l < 4; ++l) {
    EXPECT_EQ(f.tensor(layer_tensor(l, "attn_v.weight")).dtype(), attn_v[l]) << l;
    EXPECT_EQ(f.tensor(layer_tensor(l, "attn_q.weight")).dtype(), DType::kQ4_K) << l;
    EXPECT_EQ(f.tensor(layer_tensor(l, "ffn_up.weight")).dtype(), DType::kQ4_K) << l;
    EXPECT_EQ(f.tensor(layer_tensor(l, "ffn_down.weight")).dtype(), DType::kQ8_0) << l;
  }

  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(3, 511);
  std::vector<int32_t> ids(32);
  for (int32_t& id : ids) id = tok(rng);
  const auto want = logits_by_token(*ref.model, ids);
  const auto got = logits_by_token(*g.model, ids);
  // Tolerances. This random model amplifies weight error about 2.7x into the logits: measured
  // mean / worst normwise relative logit error over these 32 positions 0.015 / 0.019 with every
  // matrix in q8_0, 0.051 / 0.088 in q6_K, 0.21 / 0.30 in q4_K (our quantizers: ~0.4%, 1.9%,
  // 7.8% RMS per weight), and 0.196 / 0.280 for this q4_K_M; the top-1 token agreed on 30
  // (q8_0), 29 (q6_K) and 25 (q4_K_M) of 32 positions. Bounds ~1.5x above the q4_K_M numbers;
  // top-1 on most (22 of 32) positions.
  double worst = 0.0, mean = 0.0;
  int same_top1 = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    const double d = max_rel_diff(got[i], want[i]);
    worst = std::max(worst, d);
    mean += d / static_cast<double>(ids.size());
    same_top1 += std::max_element(got[i].begin(), got[i].end()) - got[i].begin() ==
                 std::max_element(want[i].begin(), want[i].end()) - want[i].begin();
  }
  std::printf(
      "[q4_K_M] relative logit difference mean %.3g, worst %.3g; top-1 agrees on %d of "
      "%zu\n",
      mean, worst, same_top1, ids.size());
  EXPECT_LE(mean, 0.3);
  EXPECT_LE(worst, 0.45);
  EXPECT_GE(same_top1, 22);
}

// general.file_type names the file's most common tensor dtype with llama.h's llama_ftype ids
// (llama.cpp prints it, e.g. as llama-bench's model type); it read 0, "all F32", for every
// --dtype but q4_K_M before.
TEST(QuantMixConvert, FileTypeNamesTheMostCommonDtype) {
  const std::string f32_path =
      write_f32_model(testing_util::process_scratch().file("file_type_f32.gguf"));
  LoadedModel ref = load_model(f32_path);
  const auto file_type = [&](const std::string& dtype) {
    GgufConvertOptions o;
    if (!dtype.empty()) parse_convert_dtype(dtype, o);
    const std::string out = testing_util::process_scratch().file(
        "file_type_" + (dtype.empty() ? "keep" : dtype) + ".gguf");
    convert_to_gguf(ref.model->file(), o, out);
    return GgufFile::open(out)->get_int("general.file_type");
  };
  EXPECT_EQ(file_type(""), 0);  // kept f32: LLAMA_FTYPE_ALL_F32
  EXPECT_EQ(file_type("f16"), 1);
  EXPECT_EQ(file_type("bf16"), 32);
  EXPECT_EQ(file_type("q8_0"), 7);
  // Rows of 640 fall back to q8_0 (4 ffn_down); 26 matrices are q6_K, 9 norms f32.
  EXPECT_EQ(file_type("q6_K"), 18);
  EXPECT_EQ(file_type("q4_K_M"), 15);
}

TEST(QuantMixConvert, RejectsDtypesWithoutAQuantizer) {
  GgufConvertOptions o;
  parse_convert_dtype("q6_K", o);
  EXPECT_EQ(o.matrix_dtype, DType::kQ6_K);
  EXPECT_EQ(o.mix, QuantMix::kNone);
  EXPECT_THROW(parse_convert_dtype("nonsense", o), Error);
}

}  // namespace
}  // namespace kvcache
