// GGUF architectures beyond llama (model/gguf_arch.h): a dummy Hugging Face folder of each
// family is converted by convert_to_gguf to llama.cpp's architecture, key and tensor names,
// loaded back, and must generate the same tokens with the same logits as the folder; `kvcache
// plan` bills the GGUF like the folder; an architecture we do not run is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "family_test_util.h"
#include "model/convert.h"
#include "model/gguf.h"
#include "model/kv_plan.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;
using testing_util::error_message;
using testing_util::family_folder;
using testing_util::family_scratch;
using testing_util::max_abs_diff;

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Replaces `from` by `to` in the folder's config.json (once; the test fails if absent).
void edit_config(const std::string& dir, const std::string& from, const std::string& to) {
  std::string text = read_text(dir + "/config.json");
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  std::ofstream(dir + "/config.json") << text;
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

// HF folder -> GGUF -> same tokens and logits (both paths compute in f32 from the same f32
// weights; the converter's fix-ups are exact, so only summation order may differ).
void expect_same_model(const std::string& dir, const std::string& gguf, const std::string& arch) {
  LoadedModel hf = load_model(dir);
  convert_to_gguf(hf.model->file(), GgufConvertOptions{}, gguf);
  auto g = GgufFile::open(gguf);
  EXPECT_EQ(g->get_string("general.architecture"), arch);
  LoadedModel gg = load_model(gguf);
  ASSERT_EQ(gg.model->file().format(), "gguf");
  EXPECT_EQ(gg.model->config().architecture, hf.model->config().architecture);
  EXPECT_EQ(gg.model->config().layer_types, hf.model->config().layer_types);

  const std::vector<int32_t> prompt =
      testing_util::ramp_prompt(12, static_cast<int32_t>(hf.model->config().vocab_size));
  const std::vector<int32_t> a = greedy(*hf.model, prompt, 16);
  EXPECT_EQ(a, greedy(*gg.model, prompt, 16));
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), a.begin(), a.end());
  const std::vector<float> la = logits_token_by_token(*hf.model, seq);
  EXPECT_LE(max_abs_diff(la, logits_token_by_token(*gg.model, seq)), 1e-4);

  // `kvcache plan` bills the GGUF as the folder: same layers, kinds, heads, dims, windows.
  const PlanModel ph = plan_model_from_path(dir), pg = plan_model_from_gguf(gguf);
  ASSERT_EQ(ph.layers.size(), pg.layers.size());
  for (size_t l = 0; l < ph.layers.size(); ++l) {
    EXPECT_EQ(ph.layers[l].type, pg.layers[l].type) << l;
    EXPECT_EQ(ph.layers[l].kind, pg.layers[l].kind) << l;
    EXPECT_EQ(ph.layers[l].kv_heads, pg.layers[l].kv_heads) << l;
    EXPECT_EQ(ph.layers[l].k_dim, pg.layers[l].k_dim) << l;
    EXPECT_EQ(ph.layers[l].v_dim, pg.layers[l].v_dim) << l;
    EXPECT_EQ(ph.layers[l].window, pg.layers[l].window) << l;
  }
}

TEST(GgufFamilies, Gemma2RoundTrip) {
  const std::string dir = family_folder("gemma2-tiny", "gguf-gemma2");
  // llama.cpp's gemma2 scales queries by key_length^-0.5 (query_pre_attn_scalar is not in the
  // file), so the round trip uses a model whose scalar is its head dim.
  edit_config(dir, "\"query_pre_attn_scalar\": 24", "\"query_pre_attn_scalar\": 16");
  const std::string gguf = family_scratch("gemma2.gguf");
  expect_same_model(dir, gguf, "gemma2");
  // llama.cpp's converter stores Gemma norms as 1 + w.
  auto g = GgufFile::open(gguf);
  EXPECT_NE(g->find_tensor("blk.0.post_ffw_norm.weight"), nullptr);
  EXPECT_EQ(g->find_tensor("output.weight"), nullptr);
  LoadedModel hf = load_model(dir);
  LoadedModel gg = load_model(gguf);
  const TensorView& wh = hf.model->file().tensor("model.layers.0.input_layernorm.weight");
  const TensorView& wg = gg.model->file().tensor("model.layers.0.input_layernorm.weight");
  EXPECT_FLOAT_EQ(wg.data_as<const float>()[3], 1.0f + wh.data_as<const float>()[3]);
  EXPECT_FALSE(gg.model->config().norm_add_one);
  EXPECT_TRUE(hf.model->config().norm_add_one);
}

TEST(GgufFamilies, Gemma2WithOtherQueryScalarIsRefused) {
  const std::string dir = family_folder("gemma2-tiny", "gguf-gemma2-24");
  LoadedModel hf = load_model(dir);
  const std::string msg = error_message([&] {
    convert_to_gguf(hf.model->file(), GgufConvertOptions{}, family_scratch("gemma2-24.gguf"));
  });
  EXPECT_NE(msg.find("query_pre_attn_scalar"), std::string::npos) << msg;
}

TEST(GgufFamilies, Qwen3RoundTrip) {
  const std::string dir = family_folder("qwen3-tiny", "gguf-qwen3");
  // llama.cpp's qwen3 has no sliding-window key: the round trip uses all-full layers.
  edit_config(dir, "\"use_sliding_window\": true", "\"use_sliding_window\": false");
  const std::string gguf = family_scratch("qwen3.gguf");
  expect_same_model(dir, gguf, "qwen3");
  auto g = GgufFile::open(gguf);
  EXPECT_EQ(g->get_int("qwen3.attention.key_length"), 24);  // head_dim != hidden / heads
  const GgufTensorInfo* qn = g->find_tensor("blk.1.attn_q_norm.weight");
  ASSERT_NE(qn, nullptr);
  EXPECT_EQ(qn->ne, (std::vector<uint64_t>{24}));
  EXPECT_NE(g->find_tensor("blk.1.attn_k_norm.weight"), nullptr);
  EXPECT_EQ(g->find_tensor("output.weight"), nullptr);  // tied
}

TEST(GgufFamilies, Qwen3WithSlidingLayersIsRefused) {
  const std::string dir = family_folder("qwen3-tiny", "gguf-qwen3-swa");
  LoadedModel hf = load_model(dir);
  const std::string msg = error_message([&] {
    convert_to_gguf(hf.model->file(), GgufConvertOptions{}, family_scratch("qwen3-swa.gguf"));
  });
  EXPECT_NE(msg.find("layer 2 is 'sliding_attention'"), std::string::npos) << msg;
}

TEST(GgufFamilies, Gemma3RoundTrip) {
  const std::string dir = family_folder("gemma3-tiny", "gguf-gemma3");
  // llama.cpp's gemma3 scales queries by key_length^-0.5 and fixes the sliding pattern at 6
  // (set_swa_pattern(6)); neither query_pre_attn_scalar nor the pattern is in the file, so the
  // round trip uses a model with scalar = head dim and pattern 6 (all five layers sliding).
  edit_config(dir, "\"query_pre_attn_scalar\": 24", "\"query_pre_attn_scalar\": 16");
  edit_config(dir, "\"sliding_window_pattern\": 4", "\"sliding_window_pattern\": 6");
  const std::string gguf = family_scratch("gemma3.gguf");
  expect_same_model(dir, gguf, "gemma3");
  auto g = GgufFile::open(gguf);
  EXPECT_EQ(g->get_int("gemma3.attention.sliding_window"), 8);
  EXPECT_EQ(g->get_string("gemma3.rope.scaling.type"), "linear");
  EXPECT_FLOAT_EQ(static_cast<float>(g->get_float_or("gemma3.rope.scaling.factor", 0.0)), 8.0f);
  EXPECT_NE(g->find_tensor("blk.0.attn_q_norm.weight"), nullptr);
  EXPECT_EQ(g->find_tensor("output.weight"), nullptr);
  // llama.cpp's converter stores every Gemma-3 norm, q/k norms included, as 1 + w.
  LoadedModel hf = load_model(dir);
  LoadedModel gg = load_model(gguf);
  const std::string qn = "model.layers.1.self_attn.q_norm.weight";
  EXPECT_FLOAT_EQ(gg.model->file().tensor(qn).data_as<const float>()[5],
                  1.0f + hf.model->file().tensor(qn).data_as<const float>()[5]);
  EXPECT_FALSE(gg.model->config().norm_add_one);
  EXPECT_FLOAT_EQ(gg.model->config().rope_local_theta, 10000.0f);
  // The full layers' table (linear factor 8): no layer of this model uses it, so it is
  // compared here rather than through the logits.
  EXPECT_EQ(gg.model->config().rope_freq_factors, hf.model->config().rope_freq_factors);
  EXPECT_EQ(gg.model->config().rope_freq_factors.size(), 8u);
  EXPECT_FLOAT_EQ(gg.model->config().rope_theta, hf.model->config().rope_theta);
  EXPECT_EQ(g->find("gemma3.final_logit_softcapping"), nullptr);  // none in this model
}

TEST(GgufFamilies, Gemma3WithOtherSlidingPatternIsRefused) {
  const std::string dir = family_folder("gemma3-tiny", "gguf-gemma3-p4");
  edit_config(dir, "\"query_pre_attn_scalar\": 24", "\"query_pre_attn_scalar\": 16");
  LoadedModel hf = load_model(dir);
  const std::string msg = error_message([&] {
    convert_to_gguf(hf.model->file(), GgufConvertOptions{}, family_scratch("gemma3-p4.gguf"));
  });
  EXPECT_NE(msg.find("layer 3 is 'full_attention'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sliding_window_pattern at 6"), std::string::npos) << msg;
}

TEST(GgufFamilies, Phi3RoundTrip) {
  const std::string dir = family_folder("phi3-tiny", "gguf-phi3");
  const std::string gguf = family_scratch("phi3.gguf");
  expect_same_model(dir, gguf, "phi3");
  auto g = GgufFile::open(gguf);
  EXPECT_EQ(g->get_int("phi3.rope.dimension_count"), 8);  // partial_rotary_factor 0.5 of 16
  EXPECT_EQ(g->get_int("phi3.attention.sliding_window"), 8);
  const GgufTensorInfo* qkv = g->find_tensor("blk.0.attn_qkv.weight");
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->ne, (std::vector<uint64_t>{64, 128}));  // ggml: [dim, (4 + 2 * 2) * 16]
  const GgufTensorInfo* up = g->find_tensor("blk.2.ffn_up.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->ne, (std::vector<uint64_t>{64, 192}));  // [gate; up], 2 * 96 rows
  EXPECT_EQ(g->find_tensor("blk.2.ffn_gate.weight"), nullptr);
  EXPECT_NE(g->find_tensor("output.weight"), nullptr);  // untied
  LoadedModel gg = load_model(gguf);
  EXPECT_EQ(gg.model->config().rope_dim(), 8);
}

TEST(GgufFamilies, GptOssRoundTrip) {
  const std::string dir = family_folder("gptoss-tiny", "gguf-gptoss");
  // ggml's YaRN rounds the correction range outward (transformers' truncate = true).
  edit_config(dir, "\"truncate\": false", "\"truncate\": true");
  const std::string gguf = family_scratch("gptoss.gguf");
  expect_same_model(dir, gguf, "gpt-oss");
  auto g = GgufFile::open(gguf);
  const GgufTensorInfo* gate = g->find_tensor("blk.1.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->ne, (std::vector<uint64_t>{64, 32, 4}));  // ggml: [dim, I, E]
  EXPECT_NE(g->find_tensor("blk.1.ffn_up_exps.bias"), nullptr);
  EXPECT_NE(g->find_tensor("blk.0.attn_sinks.weight"), nullptr);
  EXPECT_EQ(g->get_string("gpt-oss.rope.scaling.type"), "yarn");
}

TEST(GgufFamilies, GptOssUntruncatedYarnIsRefused) {
  const std::string dir = family_folder("gptoss-tiny", "gguf-gptoss-untruncated");
  LoadedModel hf = load_model(dir);
  const std::string msg = error_message([&] {
    convert_to_gguf(hf.model->file(), GgufConvertOptions{}, family_scratch("gptoss-u.gguf"));
  });
  EXPECT_NE(msg.find("truncate"), std::string::npos) << msg;
}

// deepseek2 metadata as llama.cpp's converter writes it today (MQA form of the latent:
// key_length = kv_lora_rank + qk_rope, head_count_kv 1, the per-head widths under *_mla),
// without tensors: billed like the deepseek-v2-tiny folder, by its latent; loading it fails
// naming a missing tensor.
TEST(GgufFamilies, Deepseek2PlannedByItsLatent) {
  GgufWriter w;
  const std::string p = "deepseek2.";
  w.set("general.architecture", GgufValue::str("deepseek2"));
  w.set(p + "block_count", GgufValue::u32(3));
  w.set(p + "context_length", GgufValue::u32(256));
  w.set(p + "embedding_length", GgufValue::u32(64));
  w.set(p + "feed_forward_length", GgufValue::u32(96));
  w.set(p + "attention.head_count", GgufValue::u32(4));
  w.set(p + "attention.head_count_kv", GgufValue::u32(1));
  w.set(p + "attention.kv_lora_rank", GgufValue::u32(24));
  w.set(p + "attention.key_length", GgufValue::u32(24 + 8));
  w.set(p + "attention.value_length", GgufValue::u32(24));
  w.set(p + "attention.key_length_mla", GgufValue::u32(16));
  w.set(p + "attention.value_length_mla", GgufValue::u32(16));
  w.set(p + "rope.dimension_count", GgufValue::u32(8));
  w.set(p + "attention.layer_norm_rms_epsilon", GgufValue::f32(1e-6f));
  const std::string path = family_scratch("deepseek2.gguf");
  w.write(path);
  const PlanModel pg = plan_model_from_gguf(path);
  const PlanModel ph = plan_model_from_path(family_folder("deepseek-v2-tiny", "gguf-ds2"));
  ASSERT_EQ(pg.layers.size(), 3u);
  ASSERT_EQ(ph.layers.size(), 3u);
  for (size_t l = 0; l < 3; ++l) {
    EXPECT_EQ(pg.layers[l].kind, PlanLayerKind::kMla) << l;
    EXPECT_EQ(pg.layers[l].k_dim, 24 + 8) << l;
    EXPECT_EQ(pg.layers[l].k_dim, ph.layers[l].k_dim) << l;
    EXPECT_EQ(pg.layers[l].v_dim, ph.layers[l].v_dim) << l;
    EXPECT_EQ(pg.layers[l].kv_heads, ph.layers[l].kv_heads) << l;
  }
  EXPECT_EQ(pg.mha_equivalent_elems_per_token, ph.mha_equivalent_elems_per_token);
  const std::string msg = error_message([&] { load_model(path); });
  EXPECT_NE(msg.find("q_lora_rank"), std::string::npos) << msg;
}

// DeepSeek-V3 (mla-tiny: q_lora, YaRN with mscale_all_dim, sigmoid routing over 2 groups with
// e_score_correction_bias, one shared expert, one leading dense layer) -> deepseek2 as
// llama.cpp's converter writes it today (split attn_k_b / attn_v_b, stacked experts).
TEST(GgufFamilies, Deepseek2V3RoundTrip) {
  const std::string dir = family_folder("mla-tiny", "gguf-ds2-v3");
  const std::string gguf = family_scratch("ds2-v3.gguf");
  expect_same_model(dir, gguf, "deepseek2");
  auto g = GgufFile::open(gguf);
  EXPECT_EQ(g->get_int("deepseek2.attention.head_count_kv"), 1);
  EXPECT_EQ(g->get_int("deepseek2.attention.key_length"), 32 + 8);
  EXPECT_EQ(g->get_int("deepseek2.attention.value_length"), 32);
  EXPECT_EQ(g->get_int("deepseek2.attention.key_length_mla"), 16 + 8);
  EXPECT_EQ(g->get_int("deepseek2.attention.value_length_mla"), 12);
  EXPECT_EQ(g->get_int("deepseek2.attention.q_lora_rank"), 32);
  EXPECT_EQ(g->get_int("deepseek2.leading_dense_block_count"), 1);
  EXPECT_EQ(g->get_int("deepseek2.expert_gating_func"), 2);  // sigmoid
  EXPECT_EQ(g->get_int("deepseek2.expert_group_count"), 2);
  EXPECT_EQ(g->get_int("deepseek2.expert_group_used_count"), 1);
  EXPECT_EQ(g->get_string("deepseek2.rope.scaling.type"), "yarn");
  // The converter stores 0.1 * mscale_all_dim (mscale_all_dim = 1 here).
  EXPECT_NEAR(g->get_float("deepseek2.rope.scaling.yarn_log_multiplier"), 0.1, 1e-6);
  const GgufTensorInfo* kb = g->find_tensor("blk.0.attn_k_b.weight");
  ASSERT_NE(kb, nullptr);
  EXPECT_EQ(kb->ne, (std::vector<uint64_t>{16, 32, 4}));  // ggml: [d_kn, d_c, H]
  const GgufTensorInfo* vb = g->find_tensor("blk.0.attn_v_b.weight");
  ASSERT_NE(vb, nullptr);
  EXPECT_EQ(vb->ne, (std::vector<uint64_t>{32, 12, 4}));  // [d_c, d_v, H]
  EXPECT_EQ(g->find_tensor("blk.0.attn_kv_b.weight"), nullptr);
  EXPECT_NE(g->find_tensor("blk.0.attn_q_a.weight"), nullptr);
  EXPECT_NE(g->find_tensor("blk.0.attn_q_a_norm.weight"), nullptr);
  EXPECT_EQ(g->find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_NE(g->find_tensor("blk.0.ffn_gate.weight"), nullptr);  // the leading dense layer
  const GgufTensorInfo* gate = g->find_tensor("blk.1.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->ne, (std::vector<uint64_t>{64, 16, 8}));  // [dim, I, E]
  const GgufTensorInfo* down = g->find_tensor("blk.2.ffn_down_exps.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->ne, (std::vector<uint64_t>{16, 64, 8}));  // [I, dim, E]
  EXPECT_NE(g->find_tensor("blk.1.exp_probs_b.bias"), nullptr);
  EXPECT_NE(g->find_tensor("blk.1.ffn_up_shexp.weight"), nullptr);
  LoadedModel hf = load_model(dir);
  LoadedModel gg = load_model(gguf);
  const ModelConfig &ch = hf.model->config(), &cg = gg.model->config();
  EXPECT_EQ(cg.mla.q_lora_rank, 32);
  EXPECT_EQ(cg.moe.router, MoeRouter::kDeepseekV3);
  EXPECT_EQ(cg.moe.n_group, 2);
  EXPECT_TRUE(cg.moe.norm_topk_prob);
  EXPECT_FLOAT_EQ(cg.moe.routed_scaling_factor, 2.5f);
  EXPECT_EQ(cg.rope_freq_factors, ch.rope_freq_factors);
  EXPECT_NEAR(cg.query_scale, ch.query_scale, 1e-6 * ch.query_scale);
  EXPECT_GT(cg.query_scale, 1.0f / std::sqrt(24.0f) * 1.1f);  // YaRN's mscale^2 is in it
}

// DeepSeek-V2 (deepseek-v2-tiny: q_proj without q_lora, softmax greedy routing without
// renormalisation, routed_scaling_factor 2, two shared experts).
TEST(GgufFamilies, Deepseek2V2RoundTrip) {
  const std::string dir = family_folder("deepseek-v2-tiny", "gguf-ds2-v2");
  const std::string gguf = family_scratch("ds2-v2.gguf");
  expect_same_model(dir, gguf, "deepseek2");
  auto g = GgufFile::open(gguf);
  EXPECT_EQ(g->get_int("deepseek2.expert_gating_func"), 1);  // softmax
  EXPECT_EQ(g->get_int("deepseek2.attention.q_lora_rank"), 0);
  EXPECT_EQ(g->find("deepseek2.expert_weights_norm"), nullptr);
  EXPECT_EQ(g->find("deepseek2.rope.scaling.type"), nullptr);
  EXPECT_NE(g->find_tensor("blk.0.attn_q.weight"), nullptr);
  EXPECT_EQ(g->find_tensor("blk.0.attn_q_a.weight"), nullptr);
  EXPECT_EQ(g->find_tensor("blk.1.exp_probs_b.bias"), nullptr);
  const GgufTensorInfo* shexp = g->find_tensor("blk.1.ffn_gate_shexp.weight");
  ASSERT_NE(shexp, nullptr);
  EXPECT_EQ(shexp->ne, (std::vector<uint64_t>{64, 2 * 16}));  // two shared experts of 16
  LoadedModel gg = load_model(gguf);
  EXPECT_EQ(gg.model->config().architecture, "deepseek_v2");
  EXPECT_EQ(gg.model->config().mla.q_lora_rank, 0);
  EXPECT_EQ(gg.model->config().moe.router, MoeRouter::kSoftmaxGreedy);
  EXPECT_FALSE(gg.model->config().moe.norm_topk_prob);
}

// The older deepseek2 layout (before llama.cpp's MLA rework): no *_mla keys, the per-head
// widths under key_length / value_length, head_count_kv = head_count, one attn_kv_b. Made here
// from the newer file and the folder's kv_b_proj; runs like the folder.
TEST(GgufFamilies, Deepseek2OlderKvbLayoutLoads) {
  const std::string dir = family_folder("mla-tiny", "gguf-ds2-old");
  const std::string newer = family_scratch("ds2-new.gguf");
  LoadedModel hf = load_model(dir);
  convert_to_gguf(hf.model->file(), GgufConvertOptions{}, newer);
  auto g = GgufFile::open(newer);
  GgufWriter w;
  for (const auto& [key, value] : g->metadata()) {
    if (key.ends_with("_mla")) continue;
    w.set(key, value);
  }
  w.set("deepseek2.attention.head_count_kv", GgufValue::u32(4));
  w.set("deepseek2.attention.key_length", GgufValue::u32(16 + 8));
  w.set("deepseek2.attention.value_length", GgufValue::u32(12));
  int kvb = 0;
  for (const GgufTensorInfo& info : g->tensor_infos()) {
    if (info.name.ends_with(".attn_v_b.weight")) continue;
    if (info.name.ends_with(".attn_k_b.weight")) {
      const std::string l = info.name.substr(4, info.name.find(".attn_k_b") - 4);
      w.add_tensor("blk." + l + ".attn_kv_b.weight",
                   hf.model->file().tensor("model.layers." + l + ".self_attn.kv_b_proj.weight"));
      ++kvb;
      continue;
    }
    w.add_tensor(info.name, g->tensor_view(info));
  }
  EXPECT_EQ(kvb, 3);
  const std::string older = family_scratch("ds2-old.gguf");
  w.write(older);
  LoadedModel gg = load_model(older);
  const std::vector<int32_t> prompt = testing_util::ramp_prompt(12, 512);
  const std::vector<int32_t> a = greedy(*hf.model, prompt, 12);
  EXPECT_EQ(a, greedy(*gg.model, prompt, 12));
  std::vector<int32_t> seq = prompt;
  seq.insert(seq.end(), a.begin(), a.end());
  EXPECT_LE(
      max_abs_diff(logits_token_by_token(*hf.model, seq), logits_token_by_token(*gg.model, seq)),
      1e-4);
  const PlanModel ph = plan_model_from_path(dir), pg = plan_model_from_gguf(older);
  ASSERT_EQ(ph.layers.size(), pg.layers.size());
  for (size_t l = 0; l < ph.layers.size(); ++l) {
    EXPECT_EQ(ph.layers[l].kind, pg.layers[l].kind) << l;
    EXPECT_EQ(ph.layers[l].k_dim, pg.layers[l].k_dim) << l;
    EXPECT_EQ(ph.layers[l].v_dim, pg.layers[l].v_dim) << l;
  }
}

// `kvcache convert --dtype q8_0`: attn_v_b (rows of d_c = 32) becomes q8_0, attn_k_b (rows of
// d_kn = 16) stays f32; the loader dequantises to rebuild kv_b_proj and the model runs (q8_0
// weights: near the folder, not equal).
TEST(GgufFamilies, Deepseek2Q8_0Runs) {
  const std::string dir = family_folder("mla-tiny", "gguf-ds2-q8");
  const std::string gguf = family_scratch("ds2-q8.gguf");
  LoadedModel hf = load_model(dir);
  GgufConvertOptions o;
  o.matrix_dtype = DType::kQ8_0;
  convert_to_gguf(hf.model->file(), o, gguf);
  auto g = GgufFile::open(gguf);
  const GgufTensorInfo* vb = g->find_tensor("blk.0.attn_v_b.weight");
  ASSERT_NE(vb, nullptr);
  EXPECT_EQ(g->tensor_view(*vb).dtype(), DType::kQ8_0);
  LoadedModel gg = load_model(gguf);
  const std::vector<int32_t> seq = testing_util::ramp_prompt(12, 512);
  const std::vector<float> a = logits_token_by_token(*hf.model, seq);
  const std::vector<float> b = logits_token_by_token(*gg.model, seq);
  const double diff = max_abs_diff(a, b);
  EXPECT_GT(diff, 0.0);  // quantised
  EXPECT_LT(diff, 0.05);
}

// transformers' DeepSeek-V3 with rope_interleave = false rotates halves; llama.cpp's deepseek2
// rotates pairs: refused by name.
TEST(GgufFamilies, Deepseek2HalfSplitRopeIsRefused) {
  const std::string dir = family_folder("mla-tiny", "gguf-ds2-halves");
  edit_config(dir, "\"q_lora_rank\": 32", "\"rope_interleave\": false, \"q_lora_rank\": 32");
  LoadedModel hf = load_model(dir);
  const std::string msg = error_message([&] {
    convert_to_gguf(hf.model->file(), GgufConvertOptions{}, family_scratch("ds2-halves.gguf"));
  });
  EXPECT_NE(msg.find("rope_interleave"), std::string::npos) << msg;
}

// What the family cannot run as llama.cpp would is refused by name, on load and on convert.
TEST(GgufFamilies, Deepseek2UnmappableFilesAreRefusedByName) {
  const std::string dir = family_folder("deepseek-v2-tiny", "gguf-ds2-refused");
  const std::string base = family_scratch("ds2-base.gguf");
  LoadedModel hf = load_model(dir);
  convert_to_gguf(hf.model->file(), GgufConvertOptions{}, base);
  auto g = GgufFile::open(base);
  Tensor bias = Tensor::empty(DType::kF32, {6});
  std::memset(bias.data(), 0, 6 * sizeof(float));
  // rewrite(edit): the base file with `edit` applied to a writer holding its metadata and
  // tensors (renamed by `rename`), loaded; the error message.
  auto refused = [&](const std::string& tag, const std::string& rename_from,
                     const std::string& rename_to, auto edit) {
    GgufWriter w;
    for (const auto& [key, value] : g->metadata()) w.set(key, value);
    for (const GgufTensorInfo& info : g->tensor_infos())
      w.add_tensor(info.name == rename_from ? rename_to : info.name, g->tensor_view(info));
    edit(w);
    const std::string path = family_scratch(tag);
    w.write(path);
    return error_message([&] { load_model(path); });
  };
  const auto none = [](GgufWriter&) {};
  std::string msg = refused("ds2-bias.gguf", "", "", [&](GgufWriter& w) {
    w.add_tensor("blk.1.exp_probs_b.bias", bias.view());
  });
  EXPECT_NE(msg.find("'blk.1.exp_probs_b.bias' with softmax routing"), std::string::npos) << msg;
  msg = refused("ds2-fused.gguf", "blk.2.ffn_gate_exps.weight", "blk.2.ffn_gate_up_exps.weight",
                none);
  EXPECT_NE(msg.find("'blk.2.ffn_gate_up_exps.weight'"), std::string::npos) << msg;
  msg = refused("ds2-eps.gguf", "", "", [](GgufWriter& w) {
    w.set("deepseek2.attention.layer_norm_rms_epsilon", GgufValue::f32(1e-5f));
  });
  EXPECT_NE(msg.find("layer_norm_rms_epsilon"), std::string::npos) << msg;
  msg = refused("ds2-gating.gguf", "", "",
                [](GgufWriter& w) { w.set("deepseek2.expert_gating_func", GgufValue::u32(4)); });
  EXPECT_NE(msg.find("expert_gating_func 4"), std::string::npos) << msg;
  msg = refused("ds2-beta.gguf", "", "", [](GgufWriter& w) {
    w.set("deepseek2.rope.scaling.yarn_beta_fast", GgufValue::f32(16.0f));
  });
  EXPECT_NE(msg.find("beta_fast"), std::string::npos) << msg;

  // convert: an rms_norm_eps llama.cpp would also apply to the latent norms.
  const std::string dir5 = family_folder("deepseek-v2-tiny", "gguf-ds2-eps");
  edit_config(dir5, "\"rms_norm_eps\": 1e-6", "\"rms_norm_eps\": 1e-5");
  LoadedModel hf5 = load_model(dir5);
  msg = error_message([&] {
    convert_to_gguf(hf5.model->file(), GgufConvertOptions{}, family_scratch("ds2-eps5.gguf"));
  });
  EXPECT_NE(msg.find("rms_norm_eps 1e-6"), std::string::npos) << msg;
}

// A GGUF of an architecture we do not run: refused by name, with the list, by the loader and
// by `kvcache plan`.
TEST(GgufFamilies, UnknownArchitectureRefusedByName) {
  GgufWriter w;
  w.set("general.architecture", GgufValue::str("mamba"));
  w.set("mamba.block_count", GgufValue::u32(2));
  w.set("mamba.embedding_length", GgufValue::u32(64));
  w.set("mamba.attention.head_count", GgufValue::u32(4));
  const std::string path = family_scratch("mamba.gguf");
  w.write(path);
  for (const std::string& msg : {error_message([&] { load_model(path); }),
                                 error_message([&] { plan_model_from_gguf(path); })}) {
    EXPECT_NE(msg.find("'mamba'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("gemma2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("llama"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace kvcache
