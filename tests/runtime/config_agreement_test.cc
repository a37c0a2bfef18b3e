// One reader of the cache's shape (model/decoder_layout.h): for every preset of `kvcache plan`
// and every config.json the tests carry (the hf_config fuzz seeds), the cache the runtime builds
// from parse_hf_config and the plan `kvcache plan` prints agree on layer types, windows and
// bytes per token. Plus the three configs on which two readers once disagreed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "core/error.h"
#include "model/hf_config.h"
#include "model/kv_plan.h"
#include "runtime/session.h"

namespace kvcache {
namespace {

using nlohmann::json;

struct NamedConfig {
  std::string name, text;
};

std::vector<NamedConfig> known_configs() {
  std::vector<NamedConfig> out;
  for (const std::string& p : plan_preset_names())
    out.push_back({"preset " + p, plan_preset_json(p)});
  const std::filesystem::path dir =
      std::filesystem::path(__FILE__).parent_path().parent_path() / "fuzz" / "corpus" / "hf_config";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path());
    std::stringstream ss;
    ss << f.rdbuf();
    out.push_back({e.path().filename().string(), ss.str()});
  }
  return out;
}

// Presets describe the cache, not the weights: give the fields that only size weights (FFN,
// vocabulary, experts) when a preset leaves them out, so that the runtime's reader accepts it.
std::string with_weight_fields(const std::string& text) {
  json root = json::parse(text);
  json& j = root.contains("text_config") ? root["text_config"] : root;
  for (const auto& [key, value] : {std::pair<const char*, int>{"intermediate_size", 64},
                                   {"vocab_size", 256},
                                   {"moe_intermediate_size", 32},
                                   {"num_experts_per_tok", 2}}) {
    if (!j.contains(key)) j[key] = value;
  }
  return root.dump();
}

// What the runtime's cache holds per layer, measured on the cache itself: static layers report
// their window as max_length() (min(W, capacity)), and a 2-token static cache's bytes() after
// one token per layer are 2 tokens' worth (a static window layer holds min(2W, capacity)).
void expect_agreement(const ModelConfig& mc, const PlanModel& plan, const std::string& name) {
  ASSERT_EQ(static_cast<int64_t>(plan.layers.size()), mc.n_layers) << name;
  constexpr int64_t kHuge = int64_t{1} << 40;
  SessionConfig sc;
  sc.cache.implementation = "static";
  sc.cache.max_cache_len = kHuge;
  sc.cache.kv_dtype = DType::kF16;
  const Cache shape(make_cache_config(mc, sc));
  for (int i = 0; i < static_cast<int>(mc.n_layers); ++i) {
    const PlanLayer& pl = plan.layers[static_cast<size_t>(i)];
    EXPECT_EQ(pl.type, mc.layer_types[static_cast<size_t>(i)]) << name << " layer " << i;
    EXPECT_EQ(shape.is_shared(i), pl.kind == PlanLayerKind::kShared) << name << " layer " << i;
    if (shape.is_shared(i)) continue;
    if (shape.is_linear(i)) {
      // A linear-attention layer (Qwen3-Next): a constant state per sequence, no token axis;
      // its elements are what the plan bills (the runtime keeps them in f32): the recurrent
      // state, the conv window and the window's copy for the conv kernel.
      const LinearStateShape& ls = make_cache_config(mc, sc).linear;
      EXPECT_EQ(pl.kind, PlanLayerKind::kLinear) << name << " layer " << i;
      EXPECT_EQ(pl.state_elems,
                ls.heads_v * ls.head_dim_k * ls.head_dim_v + 2 * (ls.conv_kernel - 1) * ls.conv_dim)
          << name << " layer " << i;
      continue;
    }
    const int64_t window = shape.layer(i).max_length();
    EXPECT_EQ(window == kHuge ? 0 : window, pl.window)
        << name << " layer " << i << " (" << pl.type << ")";
  }
  constexpr int64_t kTokens = 2;
  sc.cache.max_cache_len = kTokens;
  Cache cache(make_cache_config(mc, sc));
  const bool mla = mc.mla.enabled();
  const int64_t heads = mla ? 1 : mc.n_kv_heads;
  const int64_t dk = mla ? mc.mla.kv_lora_rank : mc.head_dim,
                dv = mla ? mc.mla.qk_rope_head_dim : mc.head_dim;
  std::vector<float> kbuf(static_cast<size_t>(heads * dk)), vbuf(static_cast<size_t>(heads * dv));
  const TensorView k(kbuf.data(), DType::kF32, {1, heads, 1, dk});
  const TensorView v(vbuf.data(), DType::kF32, {1, heads, 1, dv});
  // Linear layers hold no tokens: the per-token figure is the attention layers' (their states
  // are compared above).
  for (int i = 0; i < cache.num_layers(); ++i)
    if (!cache.is_shared(i) && !cache.is_linear(i)) cache.update(i, k, v);
  PlanOptions o;
  o.format = parse_kv_format("f16");
  // A linear layer's bytes (allocated for the session's batch at construction): exactly what
  // the plan bills, in f32.
  size_t linear_bytes = 0;
  for (int i = 0; i < cache.num_layers(); ++i) {
    if (!cache.is_linear(i)) continue;
    const size_t state =
        static_cast<size_t>(plan.layers[static_cast<size_t>(i)].state_elems) * sizeof(float);
    if (cache.layer(i).bytes() > 0) {
      EXPECT_EQ(cache.layer(i).bytes(), state) << name << " layer " << i;
    }
    linear_bytes += cache.layer(i).bytes();
  }
  EXPECT_EQ(static_cast<double>(cache.bytes() - linear_bytes),
            kTokens * compute_plan(plan, o).kv_bytes_per_token)
      << name;
}

TEST(ConfigAgreement, RuntimeCacheAndPlanAgreeOnEveryKnownConfig) {
  int compared = 0, plan_only = 0;
  for (const NamedConfig& c : known_configs()) {
    SCOPED_TRACE(c.name);
    const std::string text = with_weight_fields(c.text);
    ModelConfig mc;
    try {
      mc = parse_hf_config(text, c.name);
    } catch (const Error& e) {
      // A family the runtime does not run: the plan must still read it.
      ASSERT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
      EXPECT_NO_THROW(plan_model_from_hf_json(text, c.name));
      ++plan_only;
      continue;
    }
    if (mc.deepseek_v4.enabled()) {
      // DeepSeek-V4 runs (deepseek_v4_family_test.cc), but only on the dynamic / recompute
      // (and paged) compressed containers: there is no static one to measure windows with here,
      // and its bill (window rows + entries + buffers) is checked by the compressed containers'
      // own tests. Its layer types must still agree.
      const PlanModel plan = plan_model_from_hf_json(text, c.name);
      ASSERT_EQ(static_cast<int64_t>(plan.layers.size()), mc.n_layers);
      for (size_t i = 0; i < plan.layers.size(); ++i)
        EXPECT_EQ(plan.layers[i].type, mc.layer_types[i]) << i;
      ++plan_only;
      continue;
    }
    expect_agreement(mc, plan_model_from_hf_json(text, c.name), c.name);
    ++compared;
  }
  // 7 runnable presets and the runnable seeds; the Qwen3.5 and DeepSeek-V4 presets, the
  // plan-only seeds.
  EXPECT_GE(compared, 15);
  EXPECT_GE(plan_only, 2);
}

std::string qwen2(const std::string& extra) {
  return R"({"architectures":["Qwen2ForCausalLM"],"model_type":"qwen2","hidden_size":64,
    "num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":128,
    "vocab_size":256,"max_position_embeddings":4096)" +
         extra + "}";
}

std::vector<std::string> plan_types(const PlanModel& m) {
  std::vector<std::string> t;
  for (const PlanLayer& l : m.layers) t.push_back(l.type);
  return t;
}

TEST(ConfigAgreement, Qwen2MaxWindowLayersSlideOnlyFromThatLayerInBoth) {
  const std::string text =
      qwen2(R"(,"use_sliding_window":true,"sliding_window":256,"max_window_layers":2)");
  const ModelConfig mc = parse_hf_config(text, "qwen2.json");
  const std::vector<std::string> want = {"full_attention", "full_attention", "sliding_attention",
                                         "sliding_attention"};
  EXPECT_EQ(mc.layer_types, want);
  const PlanModel plan = plan_model_from_hf_json(text, "qwen2.json");
  EXPECT_EQ(plan_types(plan), want);
  expect_agreement(mc, plan, "qwen2");
  // Without use_sliding_window the window is ignored, as Qwen2Config does.
  EXPECT_EQ(
      parse_hf_config(qwen2(R"(,"sliding_window":256,"max_window_layers":2)"), "q").layer_types,
      std::vector<std::string>(4, "full_attention"));
}

TEST(ConfigAgreement, GptOssWithoutLayerTypesAlternatesInBoth) {
  const std::string text =
      R"({"architectures":["GptOssForCausalLM"],"model_type":"gpt_oss","hidden_size":64,
    "num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,
    "intermediate_size":32,"vocab_size":256,"num_local_experts":4,"num_experts_per_tok":2,
    "sliding_window":8,"max_position_embeddings":4096})";
  const std::vector<std::string> want = {"sliding_attention", "full_attention", "sliding_attention",
                                         "full_attention"};
  const ModelConfig mc = parse_hf_config(text, "gpt_oss.json");
  EXPECT_EQ(mc.layer_types, want);
  const PlanModel plan = plan_model_from_hf_json(text, "gpt_oss.json");
  EXPECT_EQ(plan_types(plan), want);
  expect_agreement(mc, plan, "gpt_oss");
}

TEST(ConfigAgreement, AttentionChunkSizeWithoutLayerTypesBuildsChunkedLayers) {
  // cache_utils' generic rule: no layer_types, no sliding_window, attention_chunk_size set ->
  // every layer chunked.
  const std::string text =
      R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,
    "num_hidden_layers":3,"num_attention_heads":4,"intermediate_size":128,"vocab_size":256,
    "attention_chunk_size":32,"max_position_embeddings":4096})";
  const ModelConfig mc = parse_hf_config(text, "llama.json");
  EXPECT_EQ(mc.layer_types, std::vector<std::string>(3, "chunked_attention"));
  EXPECT_EQ(mc.attention_chunk_size, 32);
  const PlanModel plan = plan_model_from_hf_json(text, "llama.json");
  expect_agreement(mc, plan, "llama chunked");
  // And the same programmatically (llama2.c, GGUF and test configs go through fill_defaults).
  ModelConfig c;
  c.n_layers = 2;
  c.attention_chunk_size = 16;
  c.fill_defaults();
  EXPECT_EQ(c.layer_types, std::vector<std::string>(2, "chunked_attention"));
}

void expect_format_error_naming(const std::string& text, const std::string& key) {
  for (int reader = 0; reader < 2; ++reader) {
    try {
      if (reader == 0) {
        parse_hf_config(text, "c.json");
      } else {
        plan_model_from_hf_json(text, "c.json");
      }
      ADD_FAILURE() << (reader ? "plan" : "runtime")
                    << " accepted a config it cannot interpret: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
}

TEST(ConfigAgreement, WhatCannotBeInterpretedIsAnErrorNamingTheKey) {
  const std::string base =
      R"({"architectures":["LlamaForCausalLM"],"model_type":"llama","hidden_size":64,
    "num_hidden_layers":2,"num_attention_heads":4,"intermediate_size":128,"vocab_size":256)";
  expect_format_error_naming(base + R"(,"layer_types":["full_attention","sliding_attention"]})",
                             "sliding_window");
  expect_format_error_naming(base + R"(,"layer_types":["chunked_attention","full_attention"]})",
                             "attention_chunk_size");
  expect_format_error_naming(base + R"(,"layer_types":["full_attention","mystery_attention"]})",
                             "layer_types[1]");
  expect_format_error_naming(base + R"(,"sliding_window":"4096"})", "sliding_window");
  // Gemma-2 derives sliding layers; an explicit null window leaves them without one.
  expect_format_error_naming(R"({"model_type":"gemma2","hidden_size":64,"num_hidden_layers":2,
    "num_attention_heads":4,"intermediate_size":128,"vocab_size":256,"sliding_window":null})",
                             "sliding_window");
}

}  // namespace
}  // namespace kvcache
