// A Hugging Face folder (model.safetensors with the real HF tensor names + config.json, written
// here from tiny random weights) runs through load_model / Session / generate, is converted to
// GGUF by convert_to_gguf (Q/K rows permuted from HF's half-split RoPE to GGUF's interleaved
// order) and reloaded: the two paths give the same logits at every position and the same
// greedy ids.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "../model/model_test_util.h"
#include "model/convert.h"
#include "model/safetensors.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;

// Canonical (GGUF) name -> the name transformers' LlamaForCausalLM / Qwen2ForCausalLM save.
// Written out here, independently of the loader's own table.
std::string hf_name(const std::string& canon) {
  if (canon == "token_embd.weight") return "model.embed_tokens.weight";
  if (canon == "output_norm.weight") return "model.norm.weight";
  if (canon == "output.weight") return "lm_head.weight";
  const size_t dot = canon.find('.', 4);
  const std::string p = "model.layers." + canon.substr(4, dot - 4) + ".",
                    rest = canon.substr(dot + 1);
  static const std::pair<const char*, const char*> kMap[] = {
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"}};
  for (const auto& [c, h] : kMap)
    if (rest == c) return p + h;
  ADD_FAILURE() << "no HF name for " << canon;
  return canon;
}

struct HfModelDir {
  std::string dir = testing_util::temp_path("hf_rt");
  std::string gguf = testing_util::temp_path("hf_rt.gguf");
  HfModelDir() { fs::create_directories(dir); }
  ~HfModelDir() {
    fs::remove_all(dir);
    fs::remove(gguf);
  }
};

// Weights scaled like a trained model's (std ~ 1/sqrt(fan_in)) so the logits are not
// saturated and greedy choices are not decided by ties.
void write_hf_model(const std::string& dir, const ModelConfig& c, DType dt, const std::string& arch,
                    const std::string& extra) {
  testing_util::TinyWeights w = testing_util::tiny_weights(c, DType::kF32, 11);
  std::vector<Tensor> scaled;
  std::vector<std::pair<std::string, TensorView>> hf;
  scaled.reserve(w.tensors.size());
  for (auto& [name, t] : w.tensors) {
    const bool norm = name.ends_with("norm.weight");
    const float s = norm                   ? 1.0f
                    : t.view().ndim() == 2 ? 1.7f / std::sqrt(static_cast<float>(t.view().dim(1)))
                                           : 0.1f;
    Tensor f = Tensor::empty(DType::kF32, t.view().shape());
    for (int64_t i = 0; i < f.numel(); ++i) {
      const float x = t.data_as<float>()[i];
      f.data_as<float>()[i] = norm ? 1.0f + 0.2f * x : s * x;
    }
    Tensor out = Tensor::empty(norm || t.view().ndim() == 1 ? DType::kF32 : dt, f.view().shape());
    copy_view(f.view(), out.view());
    scaled.push_back(std::move(out));
    hf.emplace_back(hf_name(name), scaled.back().view());
  }
  write_safetensors(dir + "/model.safetensors", hf, {{"format", "pt"}});
  testing_util::write_file(
      dir + "/config.json",
      "{\"architectures\": [\"" + arch + "\"], \"hidden_size\": " + std::to_string(c.dim) +
          ", \"num_hidden_layers\": " + std::to_string(c.n_layers) + ", \"num_attention_heads\": " +
          std::to_string(c.n_heads) + ", \"num_key_value_heads\": " + std::to_string(c.n_kv_heads) +
          ", \"intermediate_size\": " + std::to_string(c.hidden_dim) +
          ", \"vocab_size\": " + std::to_string(c.vocab_size) +
          ", \"max_position_embeddings\": " + std::to_string(c.max_seq_len) +
          ", \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"bos_token_id\": 1, "
          "\"eos_token_id\": 2" +
          extra + "}");
}

std::vector<float> logits_token_by_token(const Model& m, const std::vector<int32_t>& ids) {
  Session s(m, SessionConfig{});
  std::vector<float> out;
  for (int32_t id : ids) {
    auto l = s.decode(id);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

std::vector<int32_t> greedy(const Model& m, const std::vector<int32_t>& prompt, int64_t n) {
  Session s(m, SessionConfig{});
  GenerateParams gp;
  gp.max_new_tokens = n;
  gp.ignore_eos = true;
  std::vector<int32_t> ids;
  generate(s, prompt, gp, nullptr, &ids);
  return ids;
}

struct Case {
  const char* name;
  DType dtype;
  const char* arch;
  bool qkv_bias;
  bool tied;
  double tol;  // max relative logit difference, HF path vs converted GGUF path
  friend void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
};

// f32: the permutation is exact and RoPE rotates the same value pairs, so only the order of
// the head-dim sums in q·k differs (a few ulps). f16/bf16 weights are stored as they are
// (same values on both sides).
class HfRoundTrip : public ::testing::TestWithParam<Case> {};

TEST_P(HfRoundTrip, SameLogitsAndIdsAsTheConvertedGguf) {
  const Case& k = GetParam();
  ModelConfig c = testing_util::tiny_config();
  c.vocab_size = 48;
  c.qkv_bias = k.qkv_bias;
  c.tie_word_embeddings = k.tied;
  HfModelDir d;
  write_hf_model(d.dir, c, k.dtype, k.arch, k.tied ? ", \"tie_word_embeddings\": true" : "");

  LoadedModel hf = load_model(d.dir);
  ASSERT_EQ(hf.model->file().format(), "safetensors");
  EXPECT_FALSE(hf.model->config().rope_interleaved);
  EXPECT_EQ(hf.stop_ids, std::vector<int32_t>{2});
  convert_to_gguf(hf.model->file(), GgufConvertOptions{}, d.gguf);
  LoadedModel gg = load_model(d.gguf);
  ASSERT_EQ(gg.model->file().format(), "gguf");
  EXPECT_TRUE(gg.model->config().rope_interleaved);
  EXPECT_EQ(gg.model->config().qkv_bias, k.qkv_bias);
  EXPECT_EQ(gg.stop_ids, std::vector<int32_t>{2});
  EXPECT_EQ(gg.model->file().tensor("blk.0.attn_q.weight").dtype(), k.dtype);

  const std::vector<int32_t> prompt = {1, 17, 5, 33, 9, 41, 3};
  const std::vector<int32_t> a = greedy(*hf.model, prompt, 24);
  const std::vector<int32_t> b = greedy(*gg.model, prompt, 24);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 24u);

  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), a.begin(), a.end());
  const std::vector<float> la = logits_token_by_token(*hf.model, seq);
  const std::vector<float> lb = logits_token_by_token(*gg.model, seq);
  const double diff = max_rel_diff(la, lb);
  EXPECT_LE(diff, k.tol) << k.name;
  // The permutation matters: loading the GGUF rows with the HF pairing would be wrong.
  double spread = 0;
  for (float x : la) spread = std::max(spread, std::fabs(static_cast<double>(x)));
  EXPECT_GT(spread, 0.1) << "degenerate logits would make the comparison meaningless";
}

INSTANTIATE_TEST_SUITE_P(
    Formats, HfRoundTrip,
    ::testing::Values(Case{"llama_f32", DType::kF32, "LlamaForCausalLM", false, false, 1e-5},
                      Case{"llama_f16", DType::kF16, "LlamaForCausalLM", false, false, 1e-5},
                      Case{"qwen2_bf16_bias_tied", DType::kBF16, "Qwen2ForCausalLM", true, true,
                           1e-5}),
    [](const auto& info) { return std::string(info.param.name); });

// Converting without the permutation would be a different model: a GGUF whose Q/K rows are
// the HF rows as they are gives different logits (guards against the test passing trivially).
TEST(HfRoundTripNegative, UnpermutedRowsDiffer) {
  ModelConfig c = testing_util::tiny_config();
  c.vocab_size = 48;
  HfModelDir d;
  write_hf_model(d.dir, c, DType::kF32, "LlamaForCausalLM", "");
  LoadedModel hf = load_model(d.dir);
  ModelFile& f = const_cast<ModelFile&>(hf.model->file());
  f.mutable_config().rope_interleaved = true;  // pretend the rows were already interleaved
  convert_to_gguf(f, GgufConvertOptions{}, d.gguf);
  f.mutable_config().rope_interleaved = false;
  LoadedModel gg = load_model(d.gguf);
  const std::vector<int32_t> seq = {1, 17, 5, 33, 9, 41, 3, 8};
  EXPECT_GT(
      max_rel_diff(logits_token_by_token(*hf.model, seq), logits_token_by_token(*gg.model, seq)),
      1e-3);
}

}  // namespace
}  // namespace kvcache
