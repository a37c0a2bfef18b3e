// Families beyond plain GQA (Gemma-2 mixed windows + softcaps, GPT-OSS sinks + sliding + MoE,
// DeepSeek-V3 MLA + MoE): each dummy preset is written as a Hugging Face folder (config.json +
// model.safetensors, transformers tensor names), loaded through the real loader, and checked
//   - the engine's no-cache forward against a plain independent reference (family_reference.h),
//   - prefill-then-decode and token-by-token decode against the no-cache forward, for the
//     dynamic, static and paged containers and the eager and fused kernels (fp32, 1e-5
//     relative); paged vs dense bit for bit in families_paged_test.cc,
//   - KV bytes from Cache::bytes() against the notes' formulas.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/window_layer.h"
#include "core/error.h"
#include "family_presets.h"
#include "family_reference.h"
#include "model/dummy.h"
#include "model/hf_config.h"
#include "model/kv_plan.h"
#include "model/model_file.h"
#include "model/safetensors.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;

std::string temp_dir() {
  static const std::string d = testing_util::process_scratch().file("families");
  return d;
}

std::unique_ptr<Model> load_preset(const std::string& preset) {
  DummyModelOptions o;
  o.preset = preset;
  o.weight_dtype = DType::kF32;
  o.seed = 3;
  o.cache_dir = temp_dir();
  return std::make_unique<Model>(open_model_file(build_dummy_model(o)));
}

std::vector<int32_t> prompt(int64_t n, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return ids;
}

class Families : public ::testing::TestWithParam<std::string> {};

TEST_P(Families, ForwardMatchesIndependentReference) {
  const auto model = load_preset(GetParam());
  const ModelConfig& c = model->config();
  const std::vector<int32_t> ids =
      prompt(21, static_cast<int32_t>(c.vocab_size));  // > 2 windows of 8
  const std::vector<float> ref = testing_util::FamilyReference(model->file()).logits(ids);
  for (const char* kernel : {"eager", "fused"}) {
    Forward fwd(*model, kernel, 32);
    ForwardParams p;
    p.tokens = ids.data();
    p.n_tokens = static_cast<int64_t>(ids.size());
    p.logits = LogitsMode::kAll;
    const std::span<const float> got = fwd.forward(p);
    ASSERT_EQ(got.size(), ref.size());
    EXPECT_LE(max_rel_diff(got, ref), 1e-5) << GetParam() << " " << kernel;
  }
}

TEST_P(Families, CachedDecodeEqualsNoCacheForward) {
  const auto model = load_preset(GetParam());
  const ModelConfig& c = model->config();
  const std::vector<int32_t> ids = prompt(26, static_cast<int32_t>(c.vocab_size));
  Forward oracle(*model, "eager", 32);
  for (const char* cache : {"dynamic", "static", "paged"}) {
    for (const char* kernel : {"eager", "fused"}) {
      SessionConfig sc;
      sc.cache.implementation = cache;
      sc.kernel = kernel;
      sc.cache.max_cache_len = 64;
      sc.prefill_chunk = 5;             // chunks straddle the windows
      sc.cache.paged.block_tokens = 3;  // paged: chunks and windows straddle the blocks
      Session prefill_then_decode(*model, sc), token_by_token(*model, sc);
      const size_t split = 13;
      prefill_then_decode.prefill({ids.data(), split});
      for (size_t i = 0; i < ids.size(); ++i) {
        std::vector<float> a;
        if (i >= split) {
          const auto l = prefill_then_decode.decode(ids[i]);
          a.assign(l.begin(), l.end());
        }
        const auto b = token_by_token.decode(ids[i]);
        const std::vector<int32_t> head(ids.begin(), ids.begin() + static_cast<int64_t>(i) + 1);
        const auto want = recompute_last_logits(oracle, head);
        EXPECT_LE(max_rel_diff(b, want), 1e-5)
            << GetParam() << " " << cache << " " << kernel << " token " << i;
        if (!a.empty()) {
          EXPECT_LE(max_rel_diff(a, want), 1e-5)
              << GetParam() << " " << cache << " " << kernel << " token " << i;
        }
      }
    }
  }
}

// Bytes per token from the notes: GQA 2·L·H_kv·d_h·b, shared layers 2·(L−L_s)·H_kv·d_h·b,
// MLA L·(d_c+d_r)·b; a sliding layer holds
// min(S, W−1) tokens. With a static cache of S <= W−1 slots every layer holds exactly S tokens,
// so bytes() = S · (per-token figure) with no rounding; longer runs keep W−1 in sliding layers.
TEST_P(Families, KvBytesEqualTheNotesFormulas) {
  const auto model = load_preset(GetParam());
  const ModelConfig& c = model->config();
  const int64_t L = c.n_layers - c.num_kv_shared_layers, b = 4;  // layers that store; f32 storage
  const double per_token =
      c.mla.enabled() ? static_cast<double>(L * (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim) * b)
                      : static_cast<double>(2 * L * c.n_kv_heads * c.head_dim * b);
  const int64_t S = c.sliding_window > 0 ? c.sliding_window - 1 : 7;
  SessionConfig sc;
  sc.cache.implementation = "static";
  sc.cache.max_cache_len = S;
  Session s(*model, sc);
  s.prefill(prompt(S, static_cast<int32_t>(c.vocab_size)));
  EXPECT_EQ(static_cast<double>(s.kv_bytes()), per_token * static_cast<double>(S)) << GetParam();
  // The planner's per-token figure for the same config agrees, and so does `kvcache plan` on the
  // preset's config.json text for the whole request.
  PlanOptions po;
  po.format = parse_kv_format("f32");
  EXPECT_EQ(compute_plan(plan_model_from_config(c, GetParam()), po).kv_bytes_per_token, per_token)
      << GetParam();
  const PlanModel from_json =
      plan_model_from_hf_json(dummy_preset_config_json(GetParam()), GetParam());
  EXPECT_EQ(compute_plan(from_json, po).kv_bytes_per_token, per_token) << GetParam();
  po.context = S;
  EXPECT_EQ(plan_request_bytes(from_json, po, S), static_cast<double>(s.kv_bytes())) << GetParam();

  // Past the window: sliding layers keep W−1 tokens, full layers everything.
  if (c.sliding_window > 0) {
    SessionConfig dc;
    Session d(*model, dc);
    d.prefill(prompt(30, static_cast<int32_t>(c.vocab_size)));
    for (int64_t l = 0; l < L; ++l) {  // shared layers own no container
      const auto* w = dynamic_cast<const WindowLayer*>(&d.cache().layer(static_cast<int>(l)));
      if (c.layer_types[static_cast<size_t>(l)] == "sliding_attention") {
        ASSERT_NE(w, nullptr);
        EXPECT_EQ(d.cache().layer(static_cast<int>(l)).seq_length() - w->first_stored_position(),
                  c.sliding_window - 1);
      } else {
        EXPECT_EQ(w, nullptr);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Presets, Families, ::testing::ValuesIn(testing_util::family_presets()),
                         testing_util::preset_test_name);

// Cross-layer KV sharing (num_kv_shared_layers, Gemma-3n's rule) on the Gemma-2 block: the
// last two of four layers read layers 0 (sliding) and 1 (full) and store nothing.
TEST(KvSharing, SharedLayersReadTheirSourceAndStoreNothing) {
  DummyModelOptions o;
  o.preset = "gemma2-tiny";
  o.weight_dtype = DType::kF32;
  o.seed = 3;
  o.cache_dir = temp_dir();
  std::unique_ptr<ModelFile> file = open_model_file(build_dummy_model(o));
  file->mutable_config().num_kv_shared_layers = 2;
  const Model model(std::move(file));
  const ModelConfig& c = model.config();
  EXPECT_EQ(model.kv_source(2), 0);
  EXPECT_EQ(model.kv_source(3), 1);
  const std::vector<int32_t> ids = prompt(19, static_cast<int32_t>(c.vocab_size));
  const std::vector<float> ref = testing_util::FamilyReference(model.file()).logits(ids);
  Forward fwd(model, "fused", 32);
  ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.logits = LogitsMode::kAll;
  EXPECT_LE(max_rel_diff(fwd.forward(p), ref), 1e-5);
  const std::vector<float> last(ref.end() - c.vocab_size, ref.end());
  for (const char* cache : {"dynamic", "static", "paged"}) {
    SessionConfig sc;
    sc.cache.implementation = cache;
    sc.cache.max_cache_len = 64;
    sc.prefill_chunk = 4;
    sc.cache.paged.block_tokens = 3;
    Session s(model, sc);
    EXPECT_TRUE(s.cache().is_shared(2) && s.cache().is_shared(3));
    s.prefill({ids.data(), 11});
    std::span<const float> l;
    for (size_t i = 11; i < ids.size(); ++i) l = s.decode(ids[i]);
    EXPECT_LE(max_rel_diff(l, last), 1e-5) << cache;
  }
  // 2·(L − L_s)·H_kv·d_h·b per token.
  const int64_t S = c.sliding_window - 1;
  SessionConfig sc;
  sc.cache.implementation = "static";
  sc.cache.max_cache_len = S;
  Session s(model, sc);
  s.prefill(prompt(S, static_cast<int32_t>(c.vocab_size)));
  EXPECT_EQ(s.kv_bytes(),
            static_cast<size_t>(2 * (c.n_layers - 2) * c.n_kv_heads * c.head_dim * 4 * S));
  PlanOptions po;
  po.format = parse_kv_format("f32");
  EXPECT_EQ(compute_plan(plan_model_from_config(c, "shared"), po).kv_bytes_per_token,
            static_cast<double>(2 * (c.n_layers - 2) * c.n_kv_heads * c.head_dim * 4));
}

// Llama-4's layer type: chunked_attention with attention_chunk_size, mixed with sliding and
// full layers on the Gemma-2 block (set on the config: no transformers family mixes all three).
TEST(MixedWindows, ChunkedSlidingAndFullLayersMatchTheReference) {
  DummyModelOptions o;
  o.preset = "gemma2-tiny";
  o.weight_dtype = DType::kF32;
  o.seed = 4;
  o.cache_dir = temp_dir();
  std::unique_ptr<ModelFile> file = open_model_file(build_dummy_model(o));
  file->mutable_config().layer_types = {"chunked_attention", "full_attention", "sliding_attention",
                                        "chunked_attention"};
  file->mutable_config().attention_chunk_size = 6;
  const Model model(std::move(file));
  const ModelConfig& c = model.config();
  const std::vector<int32_t> ids = prompt(20, static_cast<int32_t>(c.vocab_size));
  const std::vector<float> ref = testing_util::FamilyReference(model.file()).logits(ids);
  for (const char* cache : {"dynamic", "static"}) {
    SessionConfig sc;
    sc.cache.implementation = cache;
    sc.cache.max_cache_len = 32;
    sc.prefill_chunk = 7;
    Session s(model, sc);
    const std::span<const float> all = s.forward_all({ids.data(), 9});
    EXPECT_LE(max_rel_diff(all, {ref.data(), all.size()}), 1e-5) << cache;
    for (size_t i = 9; i < ids.size(); ++i) {
      const auto l = s.decode(ids[i]);
      EXPECT_LE(max_rel_diff(l, {ref.data() + i * static_cast<size_t>(c.vocab_size), l.size()}),
                1e-5)
          << cache << " " << i;
    }
  }
}

TEST(FamilyConfig, TransformersDefaults) {
  // Gemma2Config without layer_types: even layers slide; query_pre_attn_scalar ** -0.5.
  const ModelConfig g =
      parse_hf_config(R"({"architectures": ["Gemma2ForCausalLM"], "hidden_size": 32,
      "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
      "vocab_size": 10, "head_dim": 16})",
                      "g.json");
  EXPECT_EQ(g.layer_types,
            (std::vector<std::string>{"sliding_attention", "full_attention", "sliding_attention"}));
  EXPECT_EQ(g.sliding_window, 4096);
  EXPECT_FLOAT_EQ(g.query_scale, 1.0f / 16.0f);  // 256 ** -0.5
  EXPECT_FLOAT_EQ(g.attn_softcap, 50.0f);
  EXPECT_FLOAT_EQ(g.final_softcap, 30.0f);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_TRUE(g.norm_add_one);
  EXPECT_EQ(g.ffn_act, FfnActivation::kGeluTanh);
  // GptOssConfig: yarn by default, sinks, attention_bias, theta 150000.
  const ModelConfig o =
      parse_hf_config(R"({"architectures": ["GptOssForCausalLM"], "hidden_size": 32,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 16,
      "vocab_size": 10, "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2})",
                      "o.json");
  EXPECT_EQ(o.rope_scaling.type, RopeScalingType::kYarn);
  EXPECT_FLOAT_EQ(o.rope_theta, 150000.0f);
  EXPECT_TRUE(o.attn_sinks && o.qkv_bias && o.attn_out_bias);
  EXPECT_EQ(o.layer_types[0], "sliding_attention");
  EXPECT_EQ(o.sliding_window, 128);
  // truncate=false, factor 32, original 4096: attention factor 0.1 ln 32 + 1.
  EXPECT_NEAR(o.rope_attention_factor, 0.1 * std::log(32.0) + 1.0, 1e-6);
  EXPECT_FLOAT_EQ(o.rope_freq_factors.front(), 1.0f);  // high frequencies extrapolate
  EXPECT_FLOAT_EQ(o.rope_freq_factors.back(), 32.0f);  // low frequencies interpolate
  // DeepSeek-V3 MLA: softmax scale times mscale(factor, mscale_all_dim)^2.
  const ModelConfig d = parse_hf_config(dummy_preset_config_json("mla-tiny"), "mla.json");
  const double m = 0.1 * std::log(4.0) + 1.0;
  EXPECT_NEAR(d.query_scale, m * m / std::sqrt(24.0), 1e-7);
  EXPECT_EQ(d.qk_head_dim(), 24);
  EXPECT_EQ(d.v_head_dim(), 12);
  EXPECT_NEAR(d.rope_attention_factor, 1.0, 1e-9);  // mscale / mscale_all_dim
  // Gemma3nTextConfig (inside a multimodal config): every fifth layer full, sparsity 0.95 on
  // the first 10 of more than 10 layers, dual RoPE theta, KV sharing read.
  const ModelConfig n = parse_hf_config(R"({"architectures": ["Gemma3nForConditionalGeneration"],
      "text_config": {"hidden_size": 32, "num_hidden_layers": 12, "num_attention_heads": 2,
      "num_key_value_heads": 1, "head_dim": 16, "intermediate_size": 64, "vocab_size": 10,
      "num_kv_shared_layers": 4}})",
                                        "n.json");
  EXPECT_EQ(n.architecture, "gemma3n");
  EXPECT_EQ(n.layer_types[4], "full_attention");
  EXPECT_EQ(n.layer_types[5], "sliding_attention");
  EXPECT_EQ(n.sliding_window, 512);
  EXPECT_FLOAT_EQ(n.gemma3n.activation_sparsity[9], 0.95f);
  EXPECT_FLOAT_EQ(n.gemma3n.activation_sparsity[10], 0.0f);
  EXPECT_FLOAT_EQ(n.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(n.rope_local_theta, 1e4f);
  EXPECT_FLOAT_EQ(n.query_scale, 1.0f);
  EXPECT_FALSE(n.norm_add_one);
  EXPECT_EQ(n.num_kv_shared_layers, 4);
}

// Gemma3ForConditionalGeneration: config.json wraps the text decoder's in text_config and the
// Hub checkpoints name its tensors language_model.model.* beside the vision tower's; the text
// part runs exactly as the same weights under Gemma3ForCausalLM's names.
TEST(Gemma3Multimodal, ConditionalGenerationCheckpointRunsItsTextDecoder) {
  DummyModelOptions o;
  o.preset = "gemma3-tiny";
  o.weight_dtype = DType::kF32;
  o.seed = 6;
  o.cache_dir = temp_dir();
  const std::string folder = build_dummy_model(o);
  const Model text(open_model_file(folder));
  const auto st = SafetensorsFile::open(folder + "/model.safetensors");
  std::vector<std::pair<std::string, TensorView>> renamed;
  for (const auto& [name, view] : st->tensors()) {
    ASSERT_TRUE(name.starts_with("model."));
    renamed.push_back({"language_model." + name, view});
  }
  std::vector<float> tower(16, 0.5f);
  renamed.push_back({"vision_tower.vision_model.post_layernorm.weight",
                     TensorView(tower.data(), DType::kF32, {16})});
  const std::string mm = temp_dir() + "/gemma3-multimodal";
  fs::create_directories(mm);
  write_safetensors(mm + "/model.safetensors", renamed, {{"format", "pt"}});
  {
    std::ofstream(mm + "/config.json")
        << R"({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
               "text_config": )"
        << dummy_preset_config_json("gemma3-tiny") << "}";
  }
  const Model wrapped(open_model_file(mm));
  EXPECT_EQ(wrapped.config().architecture, "gemma3");
  const std::vector<int32_t> ids = prompt(12, static_cast<int32_t>(text.config().vocab_size));
  Forward a(text, "eager", 16), b(wrapped, "eager", 16);
  ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.logits = LogitsMode::kAll;
  const std::span<const float> la = a.forward(p);
  const std::vector<float> want(la.begin(), la.end());
  const std::span<const float> lb = b.forward(p);
  EXPECT_EQ(want, std::vector<float>(lb.begin(), lb.end()));
}

// Qwen3Config, Phi3Config and Gemma3TextConfig defaults and the keys each family reads.
TEST(FamilyConfig, Qwen3Phi3Gemma3) {
  // Qwen3Config: head_dim 128 when absent (not hidden / heads), q/k norms without (1 + w),
  // sliding only with use_sliding_window, from max_window_layers on.
  const ModelConfig q = parse_hf_config(R"({"architectures": ["Qwen3ForCausalLM"],
      "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
      "intermediate_size": 96, "vocab_size": 10, "use_sliding_window": true, "sliding_window": 16,
      "max_window_layers": 1})",
                                        "q.json");
  EXPECT_EQ(q.architecture, "qwen3");
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_TRUE(q.qk_norm);
  EXPECT_FALSE(q.norm_add_one || q.qkv_norm || q.qkv_bias);
  EXPECT_EQ(q.layer_types,
            (std::vector<std::string>{"full_attention", "sliding_attention", "sliding_attention"}));
  EXPECT_EQ(q.sliding_window, 16);
  // Phi3Config: partial_rotary_factor (Phi-4-mini's 0.75 of 128 = 96 rotated dims), every layer
  // sliding when sliding_window is set, untied.
  const ModelConfig p = parse_hf_config(R"({"architectures": ["Phi3ForCausalLM"],
      "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
      "vocab_size": 10, "partial_rotary_factor": 0.75, "sliding_window": 2047})",
                                        "p.json");
  EXPECT_EQ(p.architecture, "phi3");
  EXPECT_EQ(p.head_dim, 128);
  EXPECT_EQ(p.rope_dim(), 96);
  EXPECT_EQ(p.layer_types, (std::vector<std::string>{"sliding_attention", "sliding_attention"}));
  EXPECT_FALSE(p.tie_word_embeddings || p.qk_norm);
  // Gemma3TextConfig: every sixth layer full, dual theta, no softcaps, (1 + w) q/k norms,
  // linear scaling on the full layers' table only.
  const ModelConfig g = parse_hf_config(R"({"architectures": ["Gemma3ForCausalLM"],
      "hidden_size": 64, "num_hidden_layers": 7, "num_attention_heads": 2, "num_key_value_heads": 1,
      "intermediate_size": 64, "vocab_size": 10, "rope_scaling": {"rope_type": "linear", "factor": 8.0}})",
                                        "g.json");
  EXPECT_EQ(g.architecture, "gemma3");
  EXPECT_EQ(g.head_dim, 256);
  EXPECT_EQ(g.layer_types[4], "sliding_attention");
  EXPECT_EQ(g.layer_types[5], "full_attention");
  EXPECT_EQ(g.layer_types[6], "sliding_attention");
  EXPECT_EQ(g.sliding_window, 4096);
  EXPECT_FLOAT_EQ(g.rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(g.rope_local_theta, 1e4f);
  EXPECT_EQ(g.rope_freq_factors, std::vector<float>(128, 8.0f));
  EXPECT_FLOAT_EQ(g.query_scale, 1.0f / 16.0f);  // 256 ** -0.5
  EXPECT_EQ(g.attn_softcap, 0.0f);
  EXPECT_EQ(g.final_softcap, 0.0f);
  EXPECT_TRUE(g.qk_norm && g.norm_add_one && g.sandwich_norms && g.tie_word_embeddings);
  EXPECT_FLOAT_EQ(g.embed_scale, 8.0f);
  EXPECT_EQ(g.ffn_act, FfnActivation::kGeluTanh);
  // Gemma3ForConditionalGeneration: the text_config; v5's rope_parameters per layer type.
  const ModelConfig m = parse_hf_config(R"({"architectures": ["Gemma3ForConditionalGeneration"],
      "eos_token_id": 106, "text_config": {"hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "intermediate_size": 64,
      "vocab_size": 10, "rope_parameters": {
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 5000.0}}}})",
                                        "m.json");
  EXPECT_EQ(m.architecture, "gemma3");
  EXPECT_EQ(m.eos_id, 106);
  EXPECT_FLOAT_EQ(m.rope_theta, 5e5f);
  EXPECT_FLOAT_EQ(m.rope_local_theta, 5e3f);
  EXPECT_EQ(m.rope_freq_factors, std::vector<float>(16, 4.0f));
}

TEST(FamilyConfig, RefusesWhatTheEngineDoesNotRun) {
  auto msg = [](const std::string& json) {
    try {
      parse_hf_config(json, "c.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string base = R"("hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
      "intermediate_size": 64, "vocab_size": 10, "head_dim": 16)";
  EXPECT_NE(msg(R"({"architectures": ["Gemma2ForCausalLM"], )" + base +
                R"(, "layer_types": ["full_attention", "linear_attention"]})")
                .find("layer_types[1] is 'linear_attention'"),
            std::string::npos);
  EXPECT_NE(
      msg(R"({"architectures": ["Gemma2ForCausalLM"], )" + base + R"(, "num_kv_shared_layers": 1})")
          .find("num_kv_shared_layers"),
      std::string::npos);
  EXPECT_NE(msg(R"({"architectures": ["LlamaForCausalLM"], )" + base +
                R"(, "layer_types": ["chunked_attention", "full_attention"]})")
                .find("attention_chunk_size"),
            std::string::npos);
  EXPECT_NE(
      msg(R"({"architectures": ["Gemma3nForCausalLM"], )" + base + R"(, "altup_active_idx": 1})")
          .find("altup_active_idx"),
      std::string::npos);
  EXPECT_NE(msg(R"({"architectures": ["Gemma2ForCausalLM"], )" + base +
                R"(, "hidden_activation": "relu"})")
                .find("hidden_act 'relu'"),
            std::string::npos);
  // Phi-3's LongRoPE (short/long factors switched by length) and Gemma-3 scalings with an
  // attention factor are refused by name.
  EXPECT_NE(
      msg(R"({"architectures": ["Phi3ForCausalLM"], )" + base +
          R"(, "rope_scaling": {"type": "longrope", "short_factor": [1.0], "long_factor": [1.0]}})")
          .find("'longrope'"),
      std::string::npos);
  EXPECT_NE(msg(R"({"architectures": ["Gemma3ForCausalLM"], )" + base +
                R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})")
                .find("Gemma-3 rope_scaling type 'yarn'"),
            std::string::npos);
}

}  // namespace
}  // namespace kvcache
