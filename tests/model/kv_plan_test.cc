// `kvcache plan`: the KV cache notes' figures, reproduced from the embedded presets.
#include "model/kv_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kvcache {
namespace {

PlanResult plan(const std::string& preset, int64_t context, const std::string& dtype = "f16",
                int64_t batch = 1) {
  PlanOptions o;
  o.context = context;
  o.batch = batch;
  o.format = parse_kv_format(dtype);
  return compute_plan(plan_preset(preset), o);
}

double row_total(const PlanResult& r, PlanLayerKind kind) {
  double t = 0;
  for (const auto& row : r.rows)
    if (row.kind == kind) t += row.total_bytes;
  return t;
}

TEST(KvPlan, Llama2_7B) {
  const PlanResult r = plan("llama2-7b", 4096);
  EXPECT_EQ(r.kv_bytes_per_token, 512.0 * 1024);          // 512 KiB/token
  EXPECT_EQ(r.kv_bytes_total, 2.0 * 1024 * 1024 * 1024);  // 2.0 GiB at 4,096
  ASSERT_EQ(r.rows.size(), 1u);
  EXPECT_EQ(r.rows[0].count, 32);
  ASSERT_TRUE(r.weight_bytes.has_value());
  EXPECT_EQ(*r.weight_bytes, 6738415616.0 * 2);  // the published 6.74B parameters in bf16
}

TEST(KvPlan, Llama2_70B) {
  EXPECT_EQ(plan("llama2-70b", 4096).kv_bytes_per_token, 320.0 * 1024);
}

TEST(KvPlan, DeepSeekV3MlaHasNoFactorTwo) {
  const PlanResult r = plan("deepseek-v3", 4096);
  EXPECT_EQ(r.kv_bytes_per_token, (512.0 + 64) * 61 * 2);             // 70,272 B ~ 70 KB
  EXPECT_EQ(r.mha_equivalent_bytes_per_token, 128.0 * 320 * 61 * 2);  // 4,997,120 B ~ 4.9 MB
}

TEST(KvPlan, Qwen35MoeAttentionLayersAndStateApart) {
  const PlanResult r = plan("qwen3.5-moe", 262144);
  EXPECT_EQ(r.kv_bytes_per_token, 20.0 * 1024);  // 10 layers x 2 heads x 256 x 2 x 2 B
  const double attention = row_total(r, PlanLayerKind::kAttention);
  EXPECT_EQ(attention, 5.0 * 1024 * 1024 * 1024);  // 5.0 GiB (5.4 GB) at 256K
  // 30 Gated DeltaNet layers: 32*128*128 + (4-1)*(2*16*128 + 32*128) elements of 4 B each
  // (kvcache keeps linear state in f32 whatever the KV dtype), plus the conv window's copy.
  EXPECT_EQ(r.state_bytes_per_request,
            30.0 * (32 * 128 * 128 + 2 * 3 * (2 * 16 * 128 + 32 * 128)) * 4);
  EXPECT_EQ(r.kv_bytes_total, attention + r.state_bytes_per_request);
}

TEST(KvPlan, Qwen3NextStateIsF32AndConstantInContext) {
  const PlanResult a = plan("qwen3-next-80b-a3b", 4096);
  const PlanResult b = plan("qwen3-next-80b-a3b", 262144);
  // 12 full-attention layers x 2 KV heads x 256 x (K, V) x 2 B.
  EXPECT_EQ(a.kv_bytes_per_token, 12.0 * 2 * 256 * 2 * 2);
  // 36 linear layers x (32*128*128 + 2*3*(2*16*128 + 32*128)) f32 = 82,575,360 B (78.8 MiB):
  // recurrent state, conv window and the window's copy for the conv kernel.
  EXPECT_EQ(a.state_bytes_per_request, 36.0 * (524288 + 2 * 3 * 8192) * 4);
  EXPECT_EQ(b.state_bytes_per_request, a.state_bytes_per_request);
  PlanOptions q;
  q.context = 4096;
  q.format = parse_kv_format("q4");
  EXPECT_EQ(compute_plan(plan_preset("qwen3-next-80b-a3b"), q).state_bytes_per_request,
            a.state_bytes_per_request);
  const std::string table = plan_table(plan_preset("qwen3-next-80b-a3b"), PlanOptions{}, a);
  EXPECT_NE(table.find("32*128*128 = 524,288"), std::string::npos) << table;
  EXPECT_NE(table.find("x 36 layers"), std::string::npos) << table;
}

TEST(KvPlan, DeepSeekV4FlashCompressedExact) {
  const PlanResult r = plan("deepseek-v4-flash", 4096);
  // 1024 * (2 + 21/4 + 20/128) = 7,584 B exactly (the notes round the sum and print 7.5 KB).
  EXPECT_EQ(r.kv_bytes_per_token, 7584.0);
  EXPECT_EQ(r.uncompressed_bytes_per_token, 44032.0);  // 43 x 1024
}

// The full bill, as DeepSeek-V4's containers keep it (f16 rows of 512, one K==V head, window
// 128, index_head_dim 128; buffers and overlaps f32), against the formulas by hand.
double v4_flash_bytes(int64_t S) {
  const double row = 512 * 2, key = 128 * 2, f32 = 4;
  const double window = static_cast<double>(std::min<int64_t>(S, 127)) * row;
  const double csa = window + static_cast<double>(S / 4) * (row + key) +
                     static_cast<double>(S % 4) * 2 * (1024 + 256) * f32 +
                     (S >= 4 ? 4 * 2 * (512 + 128) * f32 : 0.0);
  const double hca =
      window + static_cast<double>(S / 128) * row + static_cast<double>(S % 128) * 2 * 512 * f32;
  return 2 * window + 21 * csa + 20 * hca;
}

TEST(KvPlan, DeepSeekV4FlashFullBillAsTheContainersKeepIt) {
  for (int64_t S : {0, 1, 3, 4, 5, 127, 128, 129, 4096, 4099, 65536 + 131}) {
    const PlanResult r = plan("deepseek-v4-flash", S);
    EXPECT_EQ(r.kv_bytes_total, v4_flash_bytes(S)) << "S = " << S;
    EXPECT_EQ(r.kv_bytes_per_token, 7584.0) << "the notes' headline stays";
    PlanOptions o;
    o.context = S;
    EXPECT_EQ(plan_request_bytes(plan_preset("deepseek-v4-flash"), o, S), v4_flash_bytes(S));
  }
  const PlanResult r = plan("deepseek-v4-flash", 4099);  // S % 4 = S % 128 = 3
  EXPECT_EQ(r.compressed.entries_bytes, 21.0 * 1024 * 1024 + 20.0 * 32 * 1024);
  EXPECT_EQ(r.compressed.index_keys, 21.0 * 1024 * 256);
  EXPECT_EQ(r.compressed.window, 41.0 * 127 * 1024);
  EXPECT_EQ(r.compressed.buffers, 21.0 * 3 * 2 * 1280 * 4 + 20.0 * 3 * 2 * 512 * 4);
  EXPECT_EQ(r.compressed.overlaps, 21.0 * 4 * 2 * 640 * 4);
  // Past the windows each token adds its share of an entry and an indexer key.
  EXPECT_EQ(r.growth_bytes_per_token, 21.0 * (1024 + 256) / 4 + 20.0 * 1024 / 128);  // 6,880
  EXPECT_EQ(plan("deepseek-v4-flash", 8195).kv_bytes_total - r.kv_bytes_total,
            4096 * r.growth_bytes_per_token);
  PlanOptions o;
  o.context = 4099;
  const std::string table = plan_table(plan_preset("deepseek-v4-flash"), o, r);
  for (const char* want : {"KV per token:   7,584 B", "indexer keys  1,024 x 128 f16 (256 B)",
                           "buffers       S%4 = 3 rows", "overlap       4 x (kv + gate)",
                           "full bill:      35,093,504 B", "each further token adds 6,880 B"})
    EXPECT_NE(table.find(want), std::string::npos) << want << "\n" << table;
  const nlohmann::json j = nlohmann::json::parse(plan_json(plan_preset("deepseek-v4-flash"), o, r));
  EXPECT_EQ(j["compressed_bill"]["indexer_keys"], 21 * 1024 * 256);
  EXPECT_EQ(j["growth_bytes_per_token"], 6880);
}

TEST(KvPlan, DeepSeekV4IndexHeadDimFromTheConfig) {
  const std::string base = R"({"model_type":"deepseek_v4","num_hidden_layers":2,
      "num_attention_heads":4,"num_key_value_heads":1,"head_dim":64,"sliding_window":8,
      "compress_rates":{"compressed_sparse_attention":4,"heavily_compressed_attention":16},
      "layer_types":["compressed_sparse_attention","heavily_compressed_attention"])";
  const PlanModel def = plan_model_from_hf_json(base + "}", "v4.json");
  EXPECT_EQ(def.layers[0].index_dim, 128);  // configuration_deepseek_v4.py's default
  EXPECT_EQ(def.layers[1].index_dim, 0);    // HCA: no indexer
  const PlanModel m = plan_model_from_hf_json(base + R"(,"index_head_dim":32})", "v4.json");
  ASSERT_EQ(m.layers.size(), 2u);
  EXPECT_EQ(m.layers[0].index_dim, 32);
  EXPECT_TRUE(m.layers[0].overlap);
  EXPECT_EQ(m.layers[0].stream_width, 128);
  EXPECT_EQ(m.layers[1].stream_width, 64);
  EXPECT_EQ(m.layers[0].compressed_window, 8);
  PlanOptions o;
  o.context = 21;  // 5 CSA entries + 1 buffered; 1 HCA entry + 5 buffered; windows of 7
  o.format = parse_kv_format("f32");
  const CompressedBill csa = compressed_layer_bill(m.layers[0], o, 21);
  EXPECT_EQ(csa.window, 7.0 * 64 * 4);
  EXPECT_EQ(csa.entries_bytes, 5.0 * 64 * 4);
  EXPECT_EQ(csa.index_keys, 5.0 * 32 * 4);
  EXPECT_EQ(csa.buffers, 1.0 * 2 * (128 + 64) * 4);
  EXPECT_EQ(csa.overlaps, 4.0 * 2 * (64 + 32) * 4);
  const CompressedBill hca = compressed_layer_bill(m.layers[1], o, 21);
  EXPECT_EQ(hca.total(), 7.0 * 64 * 4 + 1.0 * 64 * 4 + 5.0 * 2 * 64 * 4);
  EXPECT_EQ(compute_plan(m, o).kv_bytes_total, csa.total() + hca.total());
  EXPECT_THROW(plan_model_from_hf_json(base + R"(,"index_head_dim":0})", "v4.json"), Error);
}

TEST(KvPlan, BudgetConcurrencyExampleFromTheNotes) {
  PlanOptions o;
  o.context = 4096;
  o.format = parse_kv_format("f16");
  o.budget_bytes = parse_byte_size("24GiB");
  const PlanResult r = compute_plan(plan_preset("llama2-7b"), o);
  EXPECT_EQ(*r.max_requests, 5);  // 24 GB card, 13.4 GB of weights, 2 GiB per request
  // Longest single request: (24 GiB - weights) / 512 KiB.
  EXPECT_EQ(*r.max_context, static_cast<int64_t>((24.0 * 1073741824 - 6738415616.0 * 2) / 524288));
}

TEST(KvPlan, SlidingWindowsCapAndSharedLayersStoreNothing) {
  const PlanResult mistral = plan("mistral-7b", 32768);
  EXPECT_EQ(mistral.kv_bytes_per_token, 2.0 * 32 * 8 * 128 * 2);     // counted like full
  EXPECT_EQ(mistral.kv_bytes_total, 2.0 * 32 * 8 * 128 * 2 * 4095);  // capped at W-1
  const PlanResult g = plan("gemma3n", 8192);
  int64_t shared = 0;
  for (const auto& row : g.rows)
    if (row.kind == PlanLayerKind::kShared) shared += row.count;
  EXPECT_EQ(shared, 15);
  EXPECT_EQ(g.kv_bytes_per_token, 20.0 * 2 * 2 * 256 * 2);  // 20 layers own a cache
  // 16 sliding layers keep 511 tokens, 4 full layers keep 8192.
  EXPECT_EQ(g.kv_bytes_total, 2.0 * 2 * 256 * 2 * (16 * 511 + 4 * 8192));
  const PlanResult oss = plan("gpt-oss-120b", 131072);
  EXPECT_EQ(oss.kv_bytes_total, 2.0 * 8 * 64 * 2 * (18 * 127 + 18 * 131072));
}

TEST(KvPlan, QuantizedFormatsAndBlocks) {
  // q4 with groups of 64: 0.5 B/elem + 4 B per group -> 64 + 8 = 72 B per 128-element row.
  const PlanResult q4 = plan("llama2-7b", 4096, "q4");
  EXPECT_EQ(q4.kv_bytes_per_token, 32.0 * 2 * 32 * 72);
  EXPECT_LE(q4.kv_bytes_per_token / plan("llama2-7b", 4096).kv_bytes_per_token, 0.30);
  const PlanResult q2 = plan("llama2-7b", 4096, "q2");
  EXPECT_LE(q2.kv_bytes_per_token / plan("llama2-7b", 4096).kv_bytes_per_token, 0.20);
  PlanOptions o;
  o.context = 1000;
  o.block_tokens = 16;
  const PlanResult paged = compute_plan(plan_preset("llama2-7b"), o);
  EXPECT_EQ(paged.kv_bytes_total, 512.0 * 1024 * 1008);  // 1000 rounded up to 63 blocks
  EXPECT_THROW(parse_kv_format("q3"), Error);
}

TEST(KvPlan, ConfigJsonUnknownFieldsAndTypes) {
  const std::string cfg = R"({"model_type":"newthing","num_hidden_layers":4,
    "num_attention_heads":8,"num_key_value_heads":2,"hidden_size":512,"some_new_field":[1,2],
    "layer_types":["full_attention","moe","mlp","full_attention"]})";
  const PlanModel m = plan_model_from_hf_json(cfg, "config.json");
  ASSERT_EQ(m.layers.size(), 4u);
  EXPECT_EQ(m.layers[1].kind, PlanLayerKind::kEmpty);
  EXPECT_EQ(m.layers[2].kind, PlanLayerKind::kEmpty);
  PlanOptions o;
  o.context = 10;
  EXPECT_EQ(compute_plan(m, o).kv_bytes_per_token, 2.0 * 2 * 2 * 64 * 2);
  // A layer type nobody defines is not billed as 0 bytes: it is refused, by name.
  try {
    plan_model_from_hf_json(
        R"({"model_type":"newthing","num_hidden_layers":2,"num_attention_heads":8,
      "hidden_size":512,"layer_types":["full_attention","mystery_attention"]})",
        "config.json");
    FAIL() << "an unknown layer type must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer_types[1] is 'mystery_attention'"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(plan_model_from_hf_json("{not json", "bad.json"), Error);
  EXPECT_THROW(plan_model_from_hf_json(R"({"num_attention_heads":8})", "c.json"), Error);
  try {
    plan_model_from_hf_json(R"({"num_hidden_layers":2,"num_attention_heads":8,"hidden_size":64,
      "layer_types":["full_attention"]})",
                            "c.json");
    FAIL() << "a layer_types list of the wrong length must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("c.json"), std::string::npos);
  }
}

// `kvcache plan --config` on num_hidden_layers 1e12 built a trillion layer records (minutes,
// past 8 GB). Counts are checked against config_limits.h, the same maxima parse_hf_config uses,
// before any loop or product; a float beyond int64 is too large, not undefined behaviour.
TEST(KvPlan, CountsAreBoundedBeforeTheLayersAreBuilt) {
  auto refused = [](const std::string& fields, std::initializer_list<std::string> needles) {
    const std::string cfg =
        R"({"model_type":"llama","num_hidden_layers":2,"num_attention_heads":8,"hidden_size":64)" +
        fields + "}";
    try {
      plan_model_from_hf_json(cfg, "c.json");
      ADD_FAILURE() << "planned: " << cfg;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kFormat);
      for (const std::string& n : needles)
        EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  refused(R"(,"num_hidden_layers":1e12)", {"c.json", "num_hidden_layers", "1000000000000", "4096"});
  refused(R"(,"num_hidden_layers":1099511627776)", {"num_hidden_layers", "1099511627776"});
  refused(R"(,"num_hidden_layers":1e300)", {"num_hidden_layers", "maximum"});
  refused(R"(,"num_hidden_layers":18446744073709551615)", {"num_hidden_layers", "maximum"});
  refused(R"(,"num_attention_heads":100000)", {"num_attention_heads", "4096"});
  refused(R"(,"num_key_value_heads":-2)", {"num_key_value_heads", "negative"});
  refused(R"(,"head_dim":1e9)", {"head_dim", "65536"});
  refused(R"(,"max_position_embeddings":1e15)", {"max_position_embeddings"});
  refused(R"(,"compress_rates":{"csa":1e30})", {"compress_rates.csa"});
  refused(R"(,"kv_lora_rank":1e10)", {"kv_lora_rank"});
  refused(R"(,"linear_num_value_heads":1e12,"linear_num_key_heads":1,"linear_key_head_dim":1,)"
          R"("linear_value_head_dim":1,"linear_conv_kernel_dim":1)",
          {"linear_num_value_heads"});
  refused(R"(,"intermediate_size":1e12,"vocab_size":100)", {"intermediate_size"});
  // A Gemma-3 pattern of 0 divided by zero; it now means no full layer.
  const PlanModel m = plan_model_from_hf_json(R"({"model_type":"gemma3","num_hidden_layers":3,
    "num_attention_heads":2,"head_dim":8,"sliding_window":4,"sliding_window_pattern":0})",
                                              "c.json");
  for (const PlanLayer& l : m.layers) EXPECT_EQ(l.type, "sliding_attention");
}

TEST(KvPlan, JsonCarriesTheInterfaceFields) {
  PlanOptions o;
  o.context = 4096;
  const PlanModel m = plan_preset("llama2-7b");
  const auto j = nlohmann::json::parse(plan_json(m, o, compute_plan(m, o)));
  EXPECT_EQ(j["kv_bytes_per_token"].get<int64_t>(), 524288);
  EXPECT_EQ(j["kv_bytes_total"].get<int64_t>(), 2147483648);
  ASSERT_EQ(j["layers"].size(), 1u);
  EXPECT_EQ(j["layers"][0]["type"], "full_attention");
  EXPECT_EQ(j["layers"][0]["count"], 32);
  EXPECT_EQ(j["layers"][0]["bytes_per_token"].get<int64_t>(), 524288);
}

TEST(KvPlan, SvgIsAPlot) {
  PlanOptions o;
  o.format = parse_kv_format("q4");
  o.budget_bytes = parse_byte_size("24GiB");
  const std::string svg = plan_svg(plan_preset("llama2-7b"), o);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("polyline"), std::string::npos);
  EXPECT_NE(svg.find("f16 (reference)"), std::string::npos);
  EXPECT_NE(svg.find("budget after weights"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(KvPlan, ByteSizes) {
  EXPECT_EQ(parse_byte_size("24GiB"), 24ull << 30);
  EXPECT_EQ(parse_byte_size("13.4GB"), 13400000000ull);
  EXPECT_EQ(parse_byte_size("512 MiB"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("100"), 100ull);
  EXPECT_THROW(parse_byte_size("lots"), Error);
  EXPECT_THROW(parse_byte_size("5 parsecs"), Error);
  EXPECT_THROW(parse_byte_size("inf"), Error);
  EXPECT_THROW(parse_byte_size("1e30"), Error);
  EXPECT_THROW(parse_byte_size("8EiB"), Error);        // no such unit
  EXPECT_THROW(parse_byte_size("8388608TiB"), Error);  // 2^63 bytes
  EXPECT_EQ(parse_byte_size("8388607TiB"), uint64_t{8388607} << 40);

  EXPECT_EQ(format_bytes(2147483648.0), "2 GiB");
  EXPECT_EQ(format_bytes(7584), "7.41 KiB");
}

TEST(KvPlan, EveryPresetPlans) {
  for (const std::string& name : plan_preset_names()) {
    const PlanResult r = plan(name, 8192);
    EXPECT_GT(r.kv_bytes_per_token, 0) << name;
    EXPECT_GT(r.kv_bytes_total, 0) << name;
  }
  EXPECT_THROW(plan_preset("llama9-1t"), Error);
}

}  // namespace
}  // namespace kvcache
