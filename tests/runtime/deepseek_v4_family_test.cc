// DeepSeek-V4 (sliding / CSA / HCA attention with compressors and the lightning indexer,
// hyper-connections, hash-routed and scored MoE) on the dummy:deepseekv4-tiny folder: the
// config as parsed (transformers' defaults, the legacy keys folded in, bad values refused by
// name), the tensor names and shapes the loader takes, the int64 tid2eid table, and cached
// decode against the no-cache forward across window emissions (prompt lengths that are and are
// not multiples of the rates, one prefill, prefill in chunks, token by token).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cache/compressed_cache_layer.h"
#include "core/error.h"
#include "family_test_util.h"
#include "model/dummy.h"
#include "model/forward.h"
#include "model/hf_config.h"
#include "model/kv_plan.h"
#include "model/model_file.h"
#include "model/safetensors.h"
#include "model/weight_spec.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;

const char* kCsa = "compressed_sparse_attention";
const char* kHca = "heavily_compressed_attention";
const char* kSliding = "sliding_attention";

using testing_util::error_message;
using testing_util::ramp_prompt;

const std::string& temp_dir() {
  static const std::string d = testing_util::family_scratch("deepseekv4");
  return d;
}

std::string tiny_folder() {
  return testing_util::family_folder("deepseekv4-tiny", "deepseekv4");
}

// A small V4 config with `extra` keys (JSON members, with a trailing comma) spliced in.
std::string v4_json(const std::string& extra) {
  return R"({"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", )" + extra +
         R"( "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4,
      "head_dim": 32, "vocab_size": 100, "moe_intermediate_size": 16})";
}

TEST(DeepseekV4Family, PresetConfig) {
  const ModelConfig c = dummy_preset("deepseekv4-tiny");
  EXPECT_EQ(c.architecture, "deepseek_v4");
  const std::vector<std::string> types = {kSliding, kCsa, kHca, kCsa, kHca};
  EXPECT_EQ(c.layer_types, types);
  const DeepseekV4Config& v = c.deepseek_v4;
  EXPECT_TRUE(v.enabled());
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.rope_dim(), 8);
  EXPECT_EQ(v.csa_rate, 4);
  EXPECT_EQ(v.hca_rate, 8);
  EXPECT_EQ(v.rate_of(kSliding), 0);
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_EQ(v.q_lora_rank, 32);
  EXPECT_EQ(v.o_groups, 2);
  EXPECT_EQ(v.o_lora_rank, 16);
  EXPECT_EQ(v.index_n_heads, 8);
  EXPECT_EQ(v.index_head_dim, 16);
  EXPECT_EQ(v.index_topk, 3);
  EXPECT_EQ(v.hc_mult, 2);
  EXPECT_EQ(v.hash_layers, (std::vector<char>{1, 0, 0, 0, 0}));
  EXPECT_EQ(v.scoring, V4Scoring::kSqrtSoftplus);
  EXPECT_FLOAT_EQ(v.swiglu_limit, 0.3f);
  EXPECT_FLOAT_EQ(c.moe.routed_scaling_factor, 1.5f);
  EXPECT_EQ(c.moe.n_experts, 4);
  EXPECT_EQ(c.moe.n_experts_used, 2);
  EXPECT_EQ(c.moe.expert_hidden_dim, 32);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_FLOAT_EQ(v.compress_rope_theta, 160000.0f);
  EXPECT_TRUE(v.compress_freq_factors.empty());
  EXPECT_TRUE(c.rope_freq_factors.empty());
  EXPECT_TRUE(c.attn_sinks);
  EXPECT_FLOAT_EQ(c.query_scale, 1.0f / std::sqrt(32.0f));
  const CacheConfig cc = model_cache_config(c, CacheOptions{});
  EXPECT_EQ(cc.compressed.rates.at(kCsa), 4);
  EXPECT_EQ(cc.compressed.rates.at(kHca), 8);
  EXPECT_EQ(cc.compressed.index_head_dim, 16);
  EXPECT_EQ(cc.sliding_window, 8);
  EXPECT_EQ(cc.kv_content, CacheConfig::KVContent::kSharedKV);
}

TEST(DeepseekV4Family, TransformersDefaults) {
  // DeepseekV4Config: 2 HCA layers then HCA / CSA alternating, rates 4 / 128, 3 hash layers,
  // partial rotary 64 / 512, one KV head, window 128, hc 4 x 20 iterations.
  const ModelConfig c = parse_hf_config(v4_json(""), "c.json");
  const std::vector<std::string> types = {kHca, kHca, kHca, kCsa, kHca, kCsa};
  EXPECT_EQ(c.layer_types, types);
  const DeepseekV4Config& v = c.deepseek_v4;
  EXPECT_EQ(v.csa_rate, 4);
  EXPECT_EQ(v.hca_rate, 128);
  EXPECT_EQ(v.hash_layers, (std::vector<char>{1, 1, 1, 0, 0, 0}));
  EXPECT_EQ(c.rope_dim(), 4);  // int(32 * 64 / 512)
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.sliding_window, 128);
  EXPECT_EQ(v.hc_mult, 4);
  EXPECT_EQ(v.hc_sinkhorn_iters, 20);
  EXPECT_EQ(v.q_lora_rank, 1024);
  EXPECT_EQ(v.o_groups, 8);
  EXPECT_EQ(v.index_topk, 512);
  EXPECT_EQ(c.moe.n_experts, 256);
  EXPECT_EQ(c.moe.n_experts_used, 6);
  EXPECT_FLOAT_EQ(c.moe.routed_scaling_factor, 1.5f);
  EXPECT_FLOAT_EQ(v.swiglu_limit, 10.0f);
  EXPECT_FLOAT_EQ(v.compress_rope_theta, 160000.0f);
  EXPECT_TRUE(v.compress_freq_factors.empty());
  // The default head_dim is 512 (DeepseekV4Config).
  const ModelConfig d = parse_hf_config(
      R"({"architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "vocab_size": 10})",
      "d.json");
  EXPECT_EQ(d.head_dim, 512);
  EXPECT_EQ(d.rope_dim(), 64);
  EXPECT_EQ(d.hidden_dim, 2048);
}

TEST(DeepseekV4Family, LegacyKeysFoldIn) {
  // compress_ratios per layer (one more than the layers: the MTP layer, dropped), the scalar
  // rates, num_hash_layers and qk_rope_head_dim; a nested rope_parameters.
  const ModelConfig c = parse_hf_config(
      v4_json(R"("compress_ratios": [0, 4, 128, 4, 0, 128, 4], "compress_rate_csa": 2,
          "compress_rate_hca": 16, "num_hash_layers": 1, "qk_rope_head_dim": 16,
          "rope_parameters": {"main": {"rope_type": "default", "rope_theta": 5000.0},
                              "compress": {"rope_type": "default", "rope_theta": 7000.0}},)"),
      "c.json");
  const std::vector<std::string> types = {kSliding, kCsa, kHca, kCsa, kSliding, kHca};
  EXPECT_EQ(c.layer_types, types);
  EXPECT_EQ(c.deepseek_v4.csa_rate, 2);
  EXPECT_EQ(c.deepseek_v4.hca_rate, 16);
  EXPECT_EQ(c.deepseek_v4.hash_layers, (std::vector<char>{1, 0, 0, 0, 0, 0}));
  EXPECT_EQ(c.rope_dim(), 16);
  EXPECT_FLOAT_EQ(c.rope_theta, 5000.0f);
  EXPECT_FLOAT_EQ(c.deepseek_v4.compress_rope_theta, 7000.0f);
  // compress_rates as a dict and explicit mlp_layer_types; partial_rotary_factor wins.
  const ModelConfig d =
      parse_hf_config(v4_json(R"("compress_rates": {"compressed_sparse_attention": 3,
          "heavily_compressed_attention": 9}, "partial_rotary_factor": 0.5,
          "mlp_layer_types": ["moe", "hash_moe", "moe", "moe", "moe", "moe"],
          "scoring_func": "sigmoid",)"),
                      "d.json");
  EXPECT_EQ(d.deepseek_v4.csa_rate, 3);
  EXPECT_EQ(d.deepseek_v4.hca_rate, 9);
  EXPECT_EQ(d.rope_dim(), 16);
  EXPECT_EQ(d.deepseek_v4.hash_layers, (std::vector<char>{0, 1, 0, 0, 0, 0}));
  EXPECT_EQ(d.deepseek_v4.scoring, V4Scoring::kSigmoid);
  // A flat rope_parameters scales the compress rope only; YaRN there gets attention_factor 1
  // unless given (DeepseekV4Config.__post_init__); a nested one is taken as given.
  const ModelConfig y =
      parse_hf_config(v4_json(R"("rope_parameters": {"rope_type": "yarn", "factor": 4.0,
          "original_max_position_embeddings": 64},)"),
                      "y.json");
  EXPECT_EQ(y.deepseek_v4.compress_freq_factors.size(), static_cast<size_t>(y.rope_dim() / 2));
  EXPECT_FLOAT_EQ(y.deepseek_v4.compress_attention_factor, 1.0f);
  EXPECT_TRUE(y.rope_freq_factors.empty());
  const ModelConfig n = parse_hf_config(
      v4_json(R"("rope_parameters": {"main": {"rope_type": "default", "rope_theta": 10000.0},
          "compress": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 160000.0,
          "original_max_position_embeddings": 64}},)"),
      "n.json");
  EXPECT_GT(n.deepseek_v4.compress_attention_factor, 1.1f);  // 0.1 ln(4) + 1, derived
}

TEST(DeepseekV4Family, BadValuesAreRefusedByName) {
  const std::map<std::string, std::string> cases = {
      {R"("scoring_func": "relu",)", "scoring_func 'relu'"},
      {R"("compress_ratios": [0, 4, 64, 4, 0, 4],)", "compress_ratios[2]"},
      {R"("mlp_layer_types": ["moe", "dense", "moe", "moe", "moe", "moe"],)", "mlp_layer_types[1]"},
      {R"("mlp_layer_types": ["moe"],)", "mlp_layer_types"},
      {R"("o_groups": 3,)", "o_groups 3"},
      {R"("num_key_value_heads": 2,)", "num_key_value_heads is 2"},
      {R"("compress_rates": {"compressed_sparse_attention": 4, "full_attention": 2},)",
       "compress_rates names 'full_attention'"},
      {R"("layer_types": ["sliding_attention", "full_attention", "sliding_attention",
          "sliding_attention", "sliding_attention", "sliding_attention"],)",
       "layer_types[1] is 'full_attention'"},
      {R"("rope_parameters": {"rope_type": "llama3", "factor": 8.0},)", "rope_type 'llama3'"},
      {R"("index_head_dim": 2,)", "index_head_dim 2"},
      {R"("hc_mult": 0,)", "hc_mult"},
      {R"("hidden_act": "gelu",)", "hidden_act 'gelu'"},
  };
  for (const auto& [extra, want] : cases) {
    const std::string m = error_message([&] { parse_hf_config(v4_json(extra), "c.json"); });
    EXPECT_NE(m.find(want), std::string::npos) << extra << " -> " << m;
    EXPECT_NE(m.find("c.json"), std::string::npos) << m;
  }
}

// The names and shapes of transformers' DeepseekV4ForCausalLM state dict (as the loader checks
// them), for one layer of each kind.
TEST(DeepseekV4Family, TensorNamesAndShapes) {
  const ModelConfig c = dummy_preset("deepseekv4-tiny");
  std::map<std::string, Shape> specs;
  for (const WeightSpec& w : hf_weight_specs(c)) specs[w.name] = w.shape;
  const std::map<std::string, Shape> want = {
      {"model.embed_tokens.weight", Shape{512, 64}},
      {"model.hc_head.hc_fn", Shape{2, 128}},
      {"model.hc_head.hc_base", Shape{2}},
      {"model.hc_head.hc_scale", Shape{1}},
      {"model.norm.weight", Shape{64}},
      {"lm_head.weight", Shape{512, 64}},
      {"model.layers.0.attn_hc.fn", Shape{8, 128}},
      {"model.layers.0.attn_hc.base", Shape{8}},
      {"model.layers.0.ffn_hc.scale", Shape{3}},
      {"model.layers.0.self_attn.q_a_proj.weight", Shape{32, 64}},
      {"model.layers.0.self_attn.q_a_norm.weight", Shape{32}},
      {"model.layers.0.self_attn.q_b_proj.weight", Shape{128, 32}},
      {"model.layers.0.self_attn.kv_proj.weight", Shape{32, 64}},
      {"model.layers.0.self_attn.kv_norm.weight", Shape{32}},
      {"model.layers.0.self_attn.o_a_proj.weight", Shape{32, 64}},
      {"model.layers.0.self_attn.o_b_proj.weight", Shape{64, 32}},
      {"model.layers.0.self_attn.sinks", Shape{4}},
      {"model.layers.0.mlp.gate.weight", Shape{4, 64}},
      {"model.layers.0.mlp.gate.tid2eid", Shape{512, 2}},
      {"model.layers.0.mlp.experts.gate_up_proj", Shape{4, 64, 64}},
      {"model.layers.0.mlp.experts.down_proj", Shape{4, 64, 32}},
      {"model.layers.0.mlp.shared_experts.gate_proj.weight", Shape{32, 64}},
      {"model.layers.0.mlp.shared_experts.down_proj.weight", Shape{64, 32}},
      {"model.layers.1.mlp.gate.e_score_correction_bias", Shape{4}},
      {"model.layers.1.self_attn.compressor.kv_proj.weight", Shape{64, 64}},
      {"model.layers.1.self_attn.compressor.gate_proj.weight", Shape{64, 64}},
      {"model.layers.1.self_attn.compressor.position_bias", Shape{4, 64}},
      {"model.layers.1.self_attn.compressor.kv_norm.weight", Shape{32}},
      {"model.layers.1.self_attn.compressor.indexer.kv_proj.weight", Shape{32, 64}},
      {"model.layers.1.self_attn.compressor.indexer.gate_proj.weight", Shape{32, 64}},
      {"model.layers.1.self_attn.compressor.indexer.position_bias", Shape{4, 32}},
      {"model.layers.1.self_attn.compressor.indexer.kv_norm.weight", Shape{16}},
      {"model.layers.1.self_attn.compressor.indexer.q_b_proj.weight", Shape{128, 32}},
      {"model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight", Shape{8, 64}},
      {"model.layers.2.self_attn.compressor.kv_proj.weight", Shape{32, 64}},
      {"model.layers.2.self_attn.compressor.position_bias", Shape{8, 32}},
  };
  EXPECT_EQ(specs.size(), hf_weight_specs(c).size()) << "every name listed once";
  for (const auto& [name, shape] : want) {
    ASSERT_TRUE(specs.count(name)) << name;
    EXPECT_EQ(specs[name], shape) << name;
  }
  EXPECT_FALSE(specs.count("model.layers.0.self_attn.compressor.kv_proj.weight"));
  EXPECT_FALSE(specs.count("model.layers.0.mlp.gate.e_score_correction_bias"));
  EXPECT_FALSE(specs.count("model.layers.1.mlp.gate.tid2eid"));
  EXPECT_FALSE(specs.count("model.layers.2.self_attn.compressor.indexer.kv_proj.weight"));
}

// tid2eid is int64 in checkpoints: the dummy writes it so, the loader reads it as exact floats,
// and ids outside the experts are refused naming the tensor.
TEST(DeepseekV4Family, Tid2eidIsInt64) {
  const std::string folder = tiny_folder();
  const auto st = SafetensorsFile::open(folder + "/model.safetensors");
  const TensorView& t = st->tensors().at("model.layers.0.mlp.gate.tid2eid");
  EXPECT_EQ(t.dtype(), DType::kF32);
  ASSERT_EQ(t.numel(), 512 * 2);
  for (int64_t i = 0; i < t.numel(); i += 2) {
    const float a = t.data_as<float>()[i], b = t.data_as<float>()[i + 1];
    EXPECT_TRUE(a >= 0 && a < 4 && b >= 0 && b < 4 && a != b) << i;
  }
  std::ifstream f(folder + "/model.safetensors", std::ios::binary);
  std::string head(4096, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  const size_t at = head.find("\"model.layers.0.mlp.gate.tid2eid\"");
  ASSERT_NE(at, std::string::npos);
  EXPECT_NE(head.substr(at, 80).find("\"I64\""), std::string::npos) << head.substr(at, 80);

  // A table naming expert 9 of 4.
  const std::string bad = temp_dir() + "/bad_tid2eid";
  fs::create_directories(bad);
  fs::copy_file(folder + "/config.json", bad + "/config.json",
                fs::copy_options::overwrite_existing);
  std::vector<Tensor> owned;
  std::vector<std::pair<std::string, TensorView>> views;
  owned.reserve(st->tensors().size());
  for (const auto& [name, view] : st->tensors()) {
    Tensor c = Tensor::empty(view.dtype(), view.shape());
    std::memcpy(c.data(), view.data(), c.size_bytes());
    if (name == "model.layers.0.mlp.gate.tid2eid") c.data_as<float>()[5] = 9.0f;
    owned.push_back(std::move(c));
    views.emplace_back(name, owned.back().view());
  }
  write_safetensors(bad + "/model.safetensors", views, {}, {"model.layers.0.mlp.gate.tid2eid"});
  const std::string m = error_message([&] { Model model(open_model_file(bad)); });
  EXPECT_NE(m.find("model.layers.0.mlp.gate.tid2eid"), std::string::npos) << m;
  EXPECT_NE(m.find("not an expert id"), std::string::npos) << m;
}

std::vector<float> all_logits(const Model& model, const std::vector<int32_t>& ids) {
  Forward fwd(model, "eager", static_cast<int64_t>(ids.size()));
  ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.logits = LogitsMode::kAll;
  const auto l = fwd.forward(p);
  return {l.begin(), l.end()};
}

// One prefill, prefill in chunks of 3 and 5, and token-by-token decode, each against the
// no-cache forward of the prefix, for prompt lengths around the rates (4: CSA, 8: HCA and the
// window), then greedy decoding equal to the recompute's greedy choice.
TEST(DeepseekV4Family, CachedDecodeEqualsNoCacheForward) {
  const Model model(open_model_file(tiny_folder()));
  const int32_t vocab = static_cast<int32_t>(model.config().vocab_size);
  Forward oracle(model, "eager", 64);
  for (int64_t n : {1, 3, 4, 7, 8, 9, 16, 23, 24, 27}) {
    const std::vector<int32_t> ids = ramp_prompt(n, vocab);
    const auto want_span = recompute_last_logits(oracle, ids);
    const std::vector<float> want(want_span.begin(), want_span.end());
    for (int64_t chunk : {int64_t{512}, int64_t{3}, int64_t{5}, int64_t{1}}) {
      SessionConfig sc;
      sc.cache.implementation = "dynamic";
      sc.prefill_chunk = chunk;
      Session s(model, sc);
      const auto got = s.prefill(ids);
      EXPECT_LE(max_rel_diff(got, want), 1e-4) << "n " << n << " chunk " << chunk;
      // Greedy continuation: each decoded token's logits = the recompute of the sequence.
      std::vector<int32_t> seq = ids;
      std::vector<float> last(got.begin(), got.end());
      for (int step = 0; step < 6; ++step) {
        const int32_t next =
            static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
        seq.push_back(next);
        const auto a = s.decode(next);
        const auto r = recompute_last_logits(oracle, seq);
        EXPECT_LE(max_rel_diff(a, r), 1e-4) << "n " << n << " chunk " << chunk << " step " << step;
        EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(),
                  std::max_element(r.begin(), r.end()) - r.begin())
            << "greedy ids, n " << n << " chunk " << chunk << " step " << step;
        last.assign(a.begin(), a.end());
      }
    }
  }
}

// The cache holds what the notes' formula and the planner bill: after S tokens, a compressed
// layer of rate r holds S / r entries of head_dim (b·d·Σ1/r over the layers, K == V: no factor
// 2), a CSA layer as many indexer keys of index_head_dim, and kvcache plan's compressed bill
// counts the same bytes part by part.
TEST(DeepseekV4Family, CacheHoldsWhatThePlanBills) {
  const Model model(open_model_file(tiny_folder()));
  const ModelConfig& mc = model.config();
  const int32_t vocab = static_cast<int32_t>(mc.vocab_size);
  const PlanModel plan = plan_model_from_config(mc, "deepseekv4-tiny");
  for (int64_t n : {5, 16, 23, 37}) {
    SessionConfig sc;
    sc.cache.implementation = "dynamic";
    sc.cache.kv_dtype = DType::kF32;
    Session s(model, sc);
    s.prefill(ramp_prompt(n, vocab));
    double entry_bytes = 0, index_bytes = 0, notes = 0;
    int compressed = 0;
    for (int l = 0; l < static_cast<int>(mc.n_layers); ++l) {
      const std::string& t = mc.layer_types[static_cast<size_t>(l)];
      if (t == "sliding_attention") continue;
      ++compressed;
      const bool csa = t == "compressed_sparse_attention";
      const int64_t r = csa ? mc.deepseek_v4.csa_rate : mc.deepseek_v4.hca_rate;
      CompressedCacheLayer& c = s.cache().compressed_layer(l);
      EXPECT_EQ(c.compress_rate(), r) << "layer " << l;
      EXPECT_EQ(c.entry_count(CompressedStream::kCompressor, 0), n / r) << "layer " << l;
      const KVSpan e = c.compressed(CompressedStream::kCompressor);
      if (n / r > 0) {
        EXPECT_EQ(e.k.dim(2), n / r) << "layer " << l;
        EXPECT_EQ(e.k.dim(3), mc.head_dim) << "layer " << l;
      }
      entry_bytes += static_cast<double>((n / r) * mc.head_dim * 4);
      notes +=
          4.0 * static_cast<double>(mc.head_dim) * static_cast<double>(n) / static_cast<double>(r);
      if (csa) {
        EXPECT_EQ(c.entry_count(CompressedStream::kIndexer, 0), n / r) << "layer " << l;
        const KVSpan ik = c.compressed(CompressedStream::kIndexer);
        if (n / r > 0) {
          EXPECT_EQ(ik.k.dim(3), mc.deepseek_v4.index_head_dim) << "layer " << l;
        }
        index_bytes += static_cast<double>((n / r) * mc.deepseek_v4.index_head_dim * 4);
      }
    }
    EXPECT_EQ(compressed, 4);
    // Where n is a multiple of every rate the entries are exactly b·d·Σ n/r (the notes).
    if (n % mc.deepseek_v4.csa_rate == 0 && n % mc.deepseek_v4.hca_rate == 0) {
      EXPECT_EQ(entry_bytes, notes) << n;
    }
    PlanOptions o;
    o.format = parse_kv_format("f32");
    o.context = n;
    const PlanResult pr = compute_plan(plan, o);
    EXPECT_EQ(pr.compressed.entries_bytes, entry_bytes) << "n " << n;
    EXPECT_EQ(pr.compressed.index_keys, index_bytes) << "n " << n;
  }
}

// The structures change the logits: a folder whose config keeps every indexer entry
// (index_topk 64) or turns the compressors off (all layers sliding) gives other logits at a
// length where the CSA layers hold more than 3 entries, so selection and compression are live.
TEST(DeepseekV4Family, IndexerSelectionAndCompressionMatter) {
  const std::string src = tiny_folder();
  const Model base(open_model_file(src));
  const std::vector<int32_t> ids = ramp_prompt(28, static_cast<int32_t>(base.config().vocab_size));
  const std::vector<float> want = all_logits(base, ids);
  auto variant = [&](const std::string& tag, const std::string& from, const std::string& to) {
    const std::string dst = temp_dir() + "/" + tag;
    fs::create_directories(dst);
    fs::copy_file(src + "/model.safetensors", dst + "/model.safetensors",
                  fs::copy_options::overwrite_existing);
    std::ifstream in(src + "/config.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    std::ofstream(dst + "/config.json") << text;
    return dst;
  };
  const Model all_entries(
      open_model_file(variant("topk64", "\"index_topk\": 3", "\"index_topk\": 64")));
  const std::vector<float> a = all_logits(all_entries, ids);
  EXPECT_GT(max_rel_diff(a, want), 1e-4) << "index_topk 3 must drop entries at 28 tokens";
  // The prefix before any CSA layer has 4 entries (position 15) is the same.
  const size_t V = static_cast<size_t>(base.config().vocab_size);
  EXPECT_LE(max_rel_diff(std::span<const float>(a.data(), 15 * V),
                         std::span<const float>(want.data(), 15 * V)),
            1e-6);
}

}  // namespace
}  // namespace kvcache
