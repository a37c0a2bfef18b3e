// Qwen3-Next (Gated DeltaNet + gated attention + MoE with a gated shared expert) on the
// dummy:qwen3next-tiny folder: the config as parsed, prefill in one call against token-by-token
// decode and the no-cache forward (dynamic and static caches, eager and fused kernels), the
// load-time reorder of in_proj_qkvz / in_proj_ba rows, and the containers that cannot hold
// linear layers refusing them by name. The independent plain reference of the family is
// tests/runtime/qwen3_next_reference*.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/dummy.h"
#include "model/forward.h"
#include "model/gated_deltanet.h"
#include "model/hf_config.h"
#include "model/model_file.h"
#include "model/safetensors.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;

std::string temp_dir() {
  static const std::string d = testing_util::process_scratch().file("qwen3next");
  return d;
}

std::string tiny_folder() {
  DummyModelOptions o;
  o.preset = "qwen3next-tiny";
  o.weight_dtype = DType::kF32;
  o.seed = 7;
  o.cache_dir = temp_dir();
  return build_dummy_model(o);
}

std::vector<int32_t> prompt(int64_t n, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return ids;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Qwen3Next, PresetConfig) {
  const ModelConfig c = dummy_preset("qwen3next-tiny");
  EXPECT_EQ(c.architecture, "qwen3_next");
  const std::vector<std::string> types = {"linear_attention", "linear_attention", "full_attention",
                                          "linear_attention", "linear_attention"};
  EXPECT_EQ(c.layer_types, types);
  EXPECT_TRUE(c.norm_add_one && c.qk_norm && c.attn_output_gate);
  EXPECT_FALSE(c.qkv_norm);
  EXPECT_EQ(c.rope_dim(), 6);
  EXPECT_EQ(c.linear_attn.num_key_heads, 2);
  EXPECT_EQ(c.linear_attn.num_value_heads, 4);
  EXPECT_EQ(c.linear_attn.conv_dim(), 2 * 2 * 12 + 4 * 10);
  EXPECT_FALSE(c.moe.is_moe_layer(0));  // mlp_only_layers
  for (int64_t l = 1; l < 5; ++l) EXPECT_TRUE(c.moe.is_moe_layer(l)) << l;
  EXPECT_EQ(c.moe.router, MoeRouter::kSoftmaxTopK);
  EXPECT_EQ(c.moe.shared_expert_hidden_dim, 18);
  const CacheConfig cc = model_cache_config(c, CacheOptions{});
  EXPECT_EQ(cc.linear.conv_kernel, 4);
  EXPECT_EQ(cc.linear.conv_dim, 88);
  EXPECT_EQ(cc.linear.heads_v, 4);
  EXPECT_EQ(cc.linear.head_dim_k, 12);
  EXPECT_EQ(cc.linear.head_dim_v, 10);

  const ModelConfig big = dummy_preset("qwen3next-125m");
  int full = 0;
  for (const std::string& t : big.layer_types) full += t == "full_attention";
  EXPECT_EQ(full, 3);
  EXPECT_EQ(big.moe.n_experts, 0);
}

TEST(Qwen3Next, TransformersDefaults) {
  // Qwen3NextConfig: head_dim 256, partial_rotary_factor 0.25, full_attention_interval 4,
  // the linear_* dims, 512 experts of 512 with 10 per token and a shared expert of 512,
  // norm_topk_prob.
  const ModelConfig c = parse_hf_config(R"({"architectures": ["Qwen3NextForCausalLM"],
      "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 2,
      "num_key_value_heads": 1, "intermediate_size": 96, "vocab_size": 100})",
                                        "c.json");
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rope_dim(), 64);
  EXPECT_EQ(c.layer_types[3], "full_attention");
  EXPECT_EQ(c.layer_types[2], "linear_attention");
  EXPECT_EQ(c.linear_attn.num_key_heads, 16);
  EXPECT_EQ(c.linear_attn.num_value_heads, 32);
  EXPECT_EQ(c.linear_attn.key_head_dim, 128);
  EXPECT_EQ(c.linear_attn.conv_kernel, 4);
  EXPECT_EQ(c.moe.n_experts, 512);
  EXPECT_EQ(c.moe.n_experts_used, 10);
  EXPECT_EQ(c.moe.shared_expert_hidden_dim, 512);
  EXPECT_TRUE(c.moe.norm_topk_prob);
  EXPECT_TRUE(c.moe.is_moe_layer(0));
}

TEST(Qwen3Next, BadLinearKeysAreRefusedByName) {
  const std::string base = R"({"architectures": ["Qwen3NextForCausalLM"], "hidden_size": 32,
      "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
      "intermediate_size": 64, "vocab_size": 10, "num_experts": 0, "linear_key_head_dim": 8,
      "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, )";
  const std::string m = error_of([&] {
    parse_hf_config(base + R"("linear_num_key_heads": 3, "linear_num_value_heads": 4})", "c.json");
  });
  EXPECT_NE(m.find("linear_num_value_heads 4 is not a multiple of linear_num_key_heads 3"),
            std::string::npos)
      << m;
  const std::string p = error_of([&] {
    parse_hf_config(base + R"("linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "partial_rotary_factor": 0.1})",
                    "c.json");
  });
  EXPECT_NE(p.find("partial_rotary_factor"), std::string::npos) << p;
}

// Prefill of the whole prompt in one call (the chunked delta rule over more than one 64-token
// chunk), prefill in chunks of 5 then decode, and token-by-token decode (the recurrent form)
// against the no-cache forward of each prefix.
TEST(Qwen3Next, PrefillEqualsTokenByTokenDecode) {
  const Model model(open_model_file(tiny_folder()));
  const std::vector<int32_t> ids = prompt(70, static_cast<int32_t>(model.config().vocab_size));
  Forward oracle(model, "eager", 80);
  for (const char* cache : {"dynamic", "static"}) {
    for (const char* kernel : {"eager", "fused"}) {
      SessionConfig sc;
      sc.cache.implementation = cache;
      sc.kernel = kernel;
      sc.cache.max_cache_len = 80;
      Session whole(model, sc), token_by_token(model, sc);
      const auto w = whole.prefill(ids);
      const std::vector<float> one_call(w.begin(), w.end());
      std::vector<float> last;
      for (size_t i = 0; i < ids.size(); ++i) {
        const auto b = token_by_token.decode(ids[i]);
        if (i % 9 == 0 || i + 1 == ids.size()) {
          const std::vector<int32_t> head(ids.begin(), ids.begin() + static_cast<int64_t>(i) + 1);
          const auto want = recompute_last_logits(oracle, head);
          EXPECT_LE(max_rel_diff(b, want), 1e-4) << cache << " " << kernel << " token " << i;
        }
        last.assign(b.begin(), b.end());
      }
      EXPECT_LE(max_rel_diff(one_call, last), 1e-4) << cache << " " << kernel;
      // Continuing after the one-call prefill: decode = the no-cache forward of the sequence.
      std::vector<int32_t> seq = ids;
      for (int32_t next : {5, 77, 300}) {
        seq.push_back(next);
        const auto a = whole.decode(next);
        EXPECT_LE(max_rel_diff(a, recompute_last_logits(oracle, seq)), 1e-4)
            << cache << " " << kernel << " after " << next;
      }
    }
  }
}

// transformers' fix_query_key_value_ordering, as reshapes of a projection's output: the output
// index of each row, viewed [H_k, 2 d_k + 2 r d_v] and split into q, k, v, z (and b, a), then
// q, k, v, z flattened and concatenated. The loader's order must be exactly that.
TEST(Qwen3Next, RowOrderFollowsFixQueryKeyValueOrdering) {
  for (const auto& [hk, hv, dk, dv] : std::vector<std::array<int64_t, 4>>{
           {2, 4, 12, 10}, {1, 1, 3, 5}, {3, 9, 2, 4}, {4, 8, 6, 6}}) {
    const int64_t r = hv / hk, group = 2 * dk + 2 * r * dv;
    std::vector<int64_t> q, k, v, z;
    for (int64_t g = 0; g < hk; ++g) {
      int64_t at = g * group;
      for (int64_t i = 0; i < dk; ++i) q.push_back(at++);
      for (int64_t i = 0; i < dk; ++i) k.push_back(at++);
      for (int64_t i = 0; i < r * dv; ++i) v.push_back(at++);
      for (int64_t i = 0; i < r * dv; ++i) z.push_back(at++);
    }
    std::vector<int64_t> want = q;
    for (const auto* part : {&k, &v, &z}) want.insert(want.end(), part->begin(), part->end());
    EXPECT_EQ(qkvz_row_order(hk, hv, dk, dv), want) << hk << " " << hv;
    std::vector<int64_t> b, a;
    for (int64_t g = 0; g < hk; ++g) {
      for (int64_t j = 0; j < r; ++j) b.push_back(g * 2 * r + j);
      for (int64_t j = 0; j < r; ++j) a.push_back(g * 2 * r + r + j);
    }
    std::vector<int64_t> want_ba = b;
    want_ba.insert(want_ba.end(), a.begin(), a.end());
    EXPECT_EQ(ba_row_order(hk, hv), want_ba) << hk << " " << hv;
  }
}

// With H_v / H_k = 2 the per-key-head layout differs from the contiguous one: a checkpoint whose
// rows are stored in the contiguous order (so that the loader's reorder lands them wrongly)
// must give other logits, i.e. the order is not a no-op that a bug could hide behind.
TEST(Qwen3Next, ReorderChangesTheLogitsWhenHeadsAreGrouped) {
  const std::string src = tiny_folder();
  const std::string dst = temp_dir() + "/reordered";
  fs::create_directories(dst);
  fs::copy_file(src + "/config.json", dst + "/config.json", fs::copy_options::overwrite_existing);
  const auto file = open_model_file(src);
  const ModelConfig& c = file->config();
  const LinearAttentionConfig& la = c.linear_attn;
  ASSERT_EQ(la.num_value_heads, 2 * la.num_key_heads);
  std::vector<Tensor> owned;
  std::vector<std::pair<std::string, TensorView>> views;
  owned.reserve(file->tensors().size());
  for (const auto& [name, view] : file->tensors()) {
    std::vector<int64_t> order;
    if (name.ends_with("in_proj_qkvz.weight")) {
      order =
          qkvz_row_order(la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim);
    } else if (name.ends_with("in_proj_ba.weight")) {
      order = ba_row_order(la.num_key_heads, la.num_value_heads);
    }
    Tensor t = Tensor::empty(view.dtype(), view.shape());
    const size_t rb = view.ndim() >= 2 ? static_cast<size_t>(view.dim(1)) * sizeof(float) : 0;
    if (order.empty()) {
      std::memcpy(t.data(), view.data(), t.size_bytes());
    } else {
      for (size_t i = 0; i < order.size(); ++i)
        std::memcpy(static_cast<std::byte*>(t.data()) + i * rb,
                    static_cast<const std::byte*>(view.data()) + static_cast<size_t>(order[i]) * rb,
                    rb);
    }
    owned.push_back(std::move(t));
    views.emplace_back(name, owned.back().view());
  }
  write_safetensors(dst + "/model.safetensors", views);

  const std::vector<int32_t> ids = prompt(12, static_cast<int32_t>(c.vocab_size));
  auto logits = [&](const std::string& folder) {
    const Model model(open_model_file(folder));
    Forward fwd(model, "eager", 16);
    ForwardParams p;
    p.tokens = ids.data();
    p.n_tokens = static_cast<int64_t>(ids.size());
    p.logits = LogitsMode::kAll;
    const auto l = fwd.forward(p);
    return std::vector<float>(l.begin(), l.end());
  };
  const std::vector<float> right = logits(src), wrong = logits(dst);
  EXPECT_GT(max_rel_diff(wrong, right), 1e-2) << "the row order must matter";
}

TEST(Qwen3Next, ContainersWithoutLinearLayersRefuseThemByName) {
  const Model model(open_model_file(tiny_folder()));
  // (paged serves linear layers since the hybridpaged merge: tests/runtime/hybrid_paged_test.cc)
  for (const char* impl : {"quantized"}) {
    SessionConfig sc;
    sc.cache.implementation = impl;
    sc.cache.max_cache_len = 64;
    const std::string m = error_of([&] {
      Session s(model, sc);
      const std::vector<int32_t> ids = {1, 2, 3};
      s.prefill(ids);
    });
    EXPECT_NE(m.find("linear_attention"), std::string::npos) << impl << ": " << m;
  }
}

}  // namespace
}  // namespace kvcache
