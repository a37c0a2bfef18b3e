#include "model/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <numbers>

#include "core/error.h"
#include "model/hf_config.h"
#include "model_test_util.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;
using namespace testing_util;  // model_test_util.h

// Canonical -> HF name (the inverse map, written out independently of the loader's table).
std::string to_hf(const std::string& canon) {
  if (canon == "token_embd.weight") return "model.embed_tokens.weight";
  if (canon == "output_norm.weight") return "model.norm.weight";
  if (canon == "output.weight") return "lm_head.weight";
  const size_t dot = canon.find('.', 4);
  const std::string layer = canon.substr(4, dot - 4), rest = canon.substr(dot + 1);
  const std::string p = "model.layers." + layer + ".";
  if (rest == "attn_norm.weight") return p + "input_layernorm.weight";
  if (rest == "ffn_norm.weight") return p + "post_attention_layernorm.weight";
  if (rest == "attn_output.weight") return p + "self_attn.o_proj.weight";
  if (rest.starts_with("attn_"))
    return p + "self_attn." + rest.substr(5, 1) + "_proj" + rest.substr(6);
  if (rest == "ffn_gate.weight") return p + "mlp.gate_proj.weight";
  if (rest == "ffn_up.weight") return p + "mlp.up_proj.weight";
  if (rest == "ffn_down.weight") return p + "mlp.down_proj.weight";
  return canon;
}

std::string config_json(const ModelConfig& c, const std::string& arch, const std::string& extra) {
  return "{\"architectures\": [\"" + arch + "\"], \"hidden_size\": " + std::to_string(c.dim) +
         ", \"num_hidden_layers\": " + std::to_string(c.n_layers) +
         ", \"num_attention_heads\": " + std::to_string(c.n_heads) +
         ", \"num_key_value_heads\": " + std::to_string(c.n_kv_heads) +
         ", \"intermediate_size\": " + std::to_string(c.hidden_dim) +
         ", \"vocab_size\": " + std::to_string(c.vocab_size) +
         ", \"max_position_embeddings\": " + std::to_string(c.max_seq_len) +
         ", \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"bos_token_id\": 1, "
         "\"eos_token_id\": [2, 5]" +
         extra + "}";
}

void write_model(const std::string& dir, const testing_util::TinyWeights& w, int n_shards) {
  std::vector<std::pair<std::string, TensorView>> hf;
  for (const auto& [n, v] : w.views()) hf.emplace_back(to_hf(n), v);
  if (n_shards == 1) {
    write_safetensors(dir + "/model.safetensors", hf, {{"format", "pt"}});
    return;
  }
  std::string index = "{\"metadata\": {}, \"weight_map\": {";
  for (int s = 0; s < n_shards; ++s) {
    std::vector<std::pair<std::string, TensorView>> part;
    const std::string file = "model-0000" + std::to_string(s + 1) + "-of-0000" +
                             std::to_string(n_shards) + ".safetensors";
    for (size_t i = static_cast<size_t>(s); i < hf.size(); i += static_cast<size_t>(n_shards)) {
      part.push_back(hf[i]);
      index += (index.back() == '{' ? "\"" : ", \"") + hf[i].first + "\": \"" + file + "\"";
    }
    write_safetensors(dir + "/" + file, part);
  }
  write_file(dir + "/model.safetensors.index.json", index + "}}");
}

void expect_same_weights(const ModelFile& m, const testing_util::TinyWeights& w) {
  for (const auto& [n, t] : w.tensors) {
    const TensorView* v = m.find(n);
    ASSERT_NE(v, nullptr) << n;
    EXPECT_EQ(v->shape(), t.shape()) << n;
    EXPECT_EQ(v->dtype(), t.dtype()) << n;
    EXPECT_EQ(std::memcmp(v->data(), t.data(), t.size_bytes()), 0) << n;
  }
}

TEST(Safetensors, LlamaSingleFileAndShardedGiveTheSameWeights) {
  ModelConfig c = tiny_config();
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int shards : {1, 3}) {
      const testing_util::ScratchDir d("hf");
      auto w = tiny_weights(c, dt);
      write_model(d.str(), w, shards);
      write_file(d.str() + "/config.json", config_json(c, "LlamaForCausalLM", ""));
      auto m = open_model_file(d.str());
      EXPECT_EQ(m->format(), "safetensors");
      const ModelConfig& r = m->config();
      EXPECT_EQ(r.architecture, "llama");
      EXPECT_FALSE(r.rope_interleaved);
      EXPECT_EQ(r.head_dim, 16);
      EXPECT_EQ(r.eos_id, 2);
      EXPECT_EQ(r.bos_id, 1);
      EXPECT_EQ(r.rms_eps, 1e-5f);
      EXPECT_FALSE(r.tie_word_embeddings);
      EXPECT_EQ(r.layer_types, (std::vector<std::string>(2, "full_attention")));
      expect_same_weights(*m, w);
    }
  }
}

TEST(Safetensors, Qwen2TiedWithBiasAndSlidingLayers) {
  ModelConfig c = tiny_config();
  c.qkv_bias = true;
  c.tie_word_embeddings = true;
  const testing_util::ScratchDir d("hf");
  auto w = tiny_weights(c, DType::kBF16);
  write_model(d.str(), w, 1);
  write_file(
      d.str() + "/config.json",
      config_json(
          c, "Qwen2ForCausalLM",
          ", \"tie_word_embeddings\": true, \"use_sliding_window\": true, \"sliding_window\": 32, "
          "\"max_window_layers\": 1"));
  auto m = open_model_file(d.str() + "/model.safetensors");  // a file with config.json beside it
  const ModelConfig& r = m->config();
  EXPECT_EQ(r.architecture, "qwen2");
  EXPECT_TRUE(r.qkv_bias);
  EXPECT_TRUE(r.tie_word_embeddings);
  EXPECT_EQ(r.sliding_window, 32);
  EXPECT_EQ(r.layer_types, (std::vector<std::string>{"full_attention", "sliding_attention"}));
  EXPECT_EQ(m->find("output.weight"), nullptr);
  expect_same_weights(*m, w);
}

TEST(HfConfig, MistralSlidingWindowMakesEverySlidingLayer) {
  ModelConfig c = tiny_config();
  ModelConfig r = parse_hf_config(
      config_json(c, "MistralForCausalLM", ", \"sliding_window\": 4096"), "config.json");
  EXPECT_EQ(r.architecture, "mistral");
  EXPECT_EQ(r.sliding_window, 4096);
  EXPECT_EQ(r.layer_types, (std::vector<std::string>(2, "sliding_attention")));
  ModelConfig r2 = parse_hf_config(
      config_json(c, "MistralForCausalLM", ", \"sliding_window\": null"), "config.json");
  EXPECT_EQ(r2.layer_types, (std::vector<std::string>(2, "full_attention")));
}

TEST(HfConfig, HeadDimFieldAndRopeScaling) {
  ModelConfig c = tiny_config();
  ModelConfig r = parse_hf_config(
      config_json(c, "LlamaForCausalLM",
                  ", \"head_dim\": 32, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}"),
      "x");
  EXPECT_EQ(r.head_dim, 32);
  EXPECT_EQ(r.rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(r.rope_freq_factors, std::vector<float>(16, 2.0f));

  const std::string llama3 =
      ", \"head_dim\": 128, \"rope_theta\": 500000.0, \"rope_scaling\": {\"rope_type\": "
      "\"llama3\", \"factor\": 8.0, "
      "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": "
      "8192}";
  ModelConfig c3 = c;
  c3.n_heads = 4;
  ModelConfig r3 = parse_hf_config(config_json(c3, "LlamaForCausalLM", llama3), "x");
  ASSERT_EQ(r3.rope_freq_factors.size(), 64u);
  // Independent check of the three regimes, from the wavelengths (rope_theta 5e5, D = 128).
  for (size_t i = 0; i < 64; ++i) {
    const double freq = std::pow(500000.0, -2.0 * static_cast<double>(i) / 128.0);
    const double wl = 2 * std::numbers::pi / freq;
    const float f = r3.rope_freq_factors[i];
    if (wl < 8192.0 / 4.0)
      EXPECT_EQ(f, 1.0f) << i;
    else if (wl > 8192.0)
      EXPECT_EQ(f, 8.0f) << i;
    else
      EXPECT_TRUE(f > 1.0f && f < 8.0f) << i;
  }
  EXPECT_EQ(r3.rope_freq_factors.front(), 1.0f);
  EXPECT_EQ(r3.rope_freq_factors.back(), 8.0f);
  // Monotone non-decreasing: longer wavelengths are scaled at least as much.
  for (size_t i = 1; i < 64; ++i) EXPECT_GE(r3.rope_freq_factors[i], r3.rope_freq_factors[i - 1]);
  // The smooth regime's formula at one point, by hand: 1 / ((1 - s)/8 + s).
  for (size_t i = 0; i < 64; ++i) {
    const double wl =
        2 * std::numbers::pi / std::pow(500000.0, -2.0 * static_cast<double>(i) / 128.0);
    if (wl >= 2048.0 && wl <= 8192.0) {
      const double s = (8192.0 / wl - 1.0) / 3.0;
      EXPECT_NEAR(r3.rope_freq_factors[i], 1.0 / ((1 - s) / 8.0 + s), 1e-6);
    }
  }
}

TEST(HfConfig, ErrorsNameTheFileAndField) {
  ModelConfig c = tiny_config();
  expect_error([&] { parse_hf_config("{not json", "cfg.json"); }, {"cfg.json", "invalid JSON"});
  expect_error([&] { parse_hf_config(config_json(c, "GPT2LMHeadModel", ""), "cfg.json"); },
               {"cfg.json", "GPT2LMHeadModel"});
  expect_error([&] { parse_hf_config("{\"architectures\": [\"LlamaForCausalLM\"]}", "cfg.json"); },
               {"cfg.json", "hidden_size"});
  expect_error(
      [&] {
        parse_hf_config(config_json(c, "LlamaForCausalLM",
                                    ", \"rope_scaling\": {\"type\": \"longrope\", \"factor\": 4}"),
                        "cfg.json");
      },
      {"cfg.json", "longrope"});
  ModelConfig bad = c;
  bad.n_kv_heads = 3;
  expect_error([&] { parse_hf_config(config_json(bad, "LlamaForCausalLM", ""), "cfg.json"); },
               {"cfg.json", "n_kv_heads 3"});
}

// Counts are checked against config_limits.h as they are read, before anything is sized from
// them: 2^40 layers, a head_dim whose RoPE factor table would take 8 GiB, a negative layer count
// that Gemma-3n's per-layer lists were sized from (std::length_error before).
TEST(HfConfig, CountsAreBoundedWhereTheyAreRead) {
  const std::string base =
      R"("hidden_size":64,"intermediate_size":96,"num_attention_heads":4,"vocab_size":40)";
  expect_error(
      [&] {
        parse_hf_config(R"({"model_type":"llama","num_hidden_layers":1099511627776,)" + base + "}",
                        "cfg.json");
      },
      {"cfg.json", "num_hidden_layers", "1099511627776", "4096"});
  expect_error(
      [&] {
        parse_hf_config(R"({"model_type":"llama","num_hidden_layers":2,"head_dim":4294967296,)"
                        R"("rope_scaling":{"type":"linear","factor":2},)" +
                            base + "}",
                        "cfg.json");
      },
      {"cfg.json", "head_dim", "65536"});
  expect_error(
      [&] {
        parse_hf_config(R"({"model_type":"gemma3n_text","num_hidden_layers":-1,)" + base + "}",
                        "cfg.json");
      },
      {"cfg.json", "num_hidden_layers", "negative"});
  expect_error(
      [&] {
        parse_hf_config(
            R"({"model_type":"llama","num_hidden_layers":2,"vocab_size":18446744073709551615,)"
            R"("hidden_size":64,"intermediate_size":96,"num_attention_heads":4})",
            "cfg.json");
      },
      {"cfg.json", "vocab_size", "too large"});
  expect_error(
      [&] {
        parse_hf_config(
            R"({"model_type":"deepseek_v3","num_hidden_layers":2,"kv_lora_rank":8,"qk_nope_head_dim":8,)"
            R"("qk_rope_head_dim":8,"v_head_dim":8,"n_routed_experts":1000000,"num_experts_per_tok":2,)"
            R"("moe_intermediate_size":8,)" +
                base + "}",
            "cfg.json");
      },
      {"cfg.json", "n_routed_experts", "65536"});
}

TEST(Safetensors, ParsesFromMemoryAndTheIndexNamesPlainFiles) {
  const std::string hdr = "{\"x\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}";
  const uint64_t hn = hdr.size();
  const std::string bytes =
      std::string(reinterpret_cast<const char*>(&hn), 8) + hdr + std::string(8, '\0');
  const auto f = SafetensorsFile::open(MappedFile::copy_of("mem.safetensors", bytes));
  ASSERT_EQ(f->tensors().size(), 1u);
  EXPECT_EQ(f->tensors().at("x").numel(), 2);
  expect_error(
      [&] { SafetensorsFile::open(MappedFile::copy_of("mem.safetensors", bytes.substr(0, 20))); },
      {"mem.safetensors", "truncated"});
  EXPECT_EQ(
      parse_safetensors_index(
          R"({"weight_map":{"a":"m1.safetensors","b":"m2.safetensors","c":"m1.safetensors"}})",
          "i.json"),
      (std::vector<std::string>{"m1.safetensors", "m2.safetensors"}));
  for (const char* bad : {R"({"weight_map":{"a":"../x"}})", R"({"weight_map":{"a":"d/x"}})",
                          R"({"weight_map":{"a":""}})", R"({"weight_map":{}})",
                          R"({"weight_map":{"a":3}})", "[1]", "{"}) {
    expect_error([&] { parse_safetensors_index(bad, "i.json"); }, {"i.json"});
  }
}

TEST(Safetensors, BadFiles) {
  ModelConfig c = tiny_config();
  const testing_util::ScratchDir d("hf");
  auto w = tiny_weights(c, DType::kF16);
  write_model(d.str(), w, 1);
  write_file(d.str() + "/config.json", config_json(c, "LlamaForCausalLM", ""));
  const std::string st = d.str() + "/model.safetensors";
  const std::string good = read_file(st);

  write_file(st, good.substr(0, good.size() - 10));
  expect_error([&] { open_model_file(d.str()); }, {st, "truncated"});
  write_file(st, good.substr(0, 5));
  expect_error([&] { open_model_file(d.str()); }, {st, "truncated"});
  std::string huge = good;
  const uint64_t n = uint64_t{1} << 40;
  std::memcpy(huge.data(), &n, 8);
  write_file(st, huge);
  expect_error([&] { open_model_file(d.str()); }, {st, "header length"});

  // Unsupported dtype: write an F64 tensor header by hand.
  std::string hdr = "{\"x\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]}}";
  uint64_t hn = hdr.size();
  write_file(st, std::string(reinterpret_cast<const char*>(&hn), 8) + hdr + std::string(8, '\0'));
  expect_error([&] { SafetensorsFile::open(st); }, {st, "'x'", "F64"});
  // I64 (DeepSeek-V4's tid2eid) is read as exact floats; past 2^24 it is refused.
  hdr = "{\"x\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 8]}}";
  hn = hdr.size();
  int64_t big = (int64_t{1} << 24) + 1;
  write_file(st, std::string(reinterpret_cast<const char*>(&hn), 8) + hdr +
                     std::string(reinterpret_cast<const char*>(&big), 8));
  expect_error([&] { SafetensorsFile::open(st); }, {st, "'x'", "2^24"});
  big = -3;
  write_file(st, std::string(reinterpret_cast<const char*>(&hn), 8) + hdr +
                     std::string(reinterpret_cast<const char*>(&big), 8));
  EXPECT_EQ(SafetensorsFile::open(st)->tensors().at("x").data_as<float>()[0], -3.0f);
  // Offsets that disagree with the shape.
  hdr = "{\"x\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}";
  hn = hdr.size();
  write_file(st, std::string(reinterpret_cast<const char*>(&hn), 8) + hdr + std::string(8, '\0'));
  expect_error([&] { SafetensorsFile::open(st); }, {st, "'x'", "need 12"});

  // Shape mismatch with config.json.
  write_file(st, good);
  ModelConfig wrong = c;
  wrong.hidden_dim = 64;
  write_file(d.str() + "/config.json", config_json(wrong, "LlamaForCausalLM", ""));
  expect_error([&] { open_model_file(d.str()); }, {"ffn_gate.weight", "[96, 64]", "[64, 64]"});
  // Untied config without lm_head.
  fs::remove(d.str() + "/config.json");
  expect_error([&] { open_model_file(d.str()); }, {"config.json"});
}

TEST(Safetensors, NameMapping) {
  EXPECT_EQ(hf_to_canonical_name("model.layers.12.self_attn.k_proj.bias"), "blk.12.attn_k.bias");
  EXPECT_EQ(hf_to_canonical_name("model.layers.0.mlp.down_proj.weight"), "blk.0.ffn_down.weight");
  EXPECT_EQ(hf_to_canonical_name("model.layers.0.self_attn.rotary_emb.inv_freq"), "");
  EXPECT_EQ(hf_to_canonical_name("model.layers.x.mlp.down_proj.weight"), "");
}

}  // namespace
}  // namespace kvcache
