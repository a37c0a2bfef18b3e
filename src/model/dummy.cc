#include "model/dummy.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "kernels/quant_types.h"
#include "model/gguf.h"
#include "model/hf_config.h"
#include "model/safetensors.h"
#include "model/weight_spec.h"

namespace kvcache {

namespace {

namespace fs = std::filesystem;

// splitmix64 (Steele et al. 2014): counter-based, so every row can be filled independently
// (in parallel) and the weights depend only on (seed, tensor, row, column).
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A [rows, cols] matrix of uniform values with standard deviation `stddev`, in `dtype`.
Tensor random_matrix(int64_t rows, int64_t cols, DType dtype, uint64_t seed, float stddev) {
  Tensor t = Tensor::empty(dtype, {rows, cols});
  const float a = stddev * std::sqrt(3.0f);  // U(-a, a) has std a / sqrt(3)
  const size_t rb = dtype_bytes(dtype, cols);
  default_pool().parallel_for(rows, [&](int64_t r) {
    std::vector<float> row(static_cast<size_t>(cols));  // per row: setup cost, not a hot loop
    const uint64_t base = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(r)));
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t x = splitmix64(base + static_cast<uint64_t>(c));
      row[static_cast<size_t>(c)] =
          (static_cast<float>(x >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * a;
    }
    void* dst = static_cast<std::byte*>(t.data()) + static_cast<size_t>(r) * rb;
    if (dtype == DType::kQ8_0) {
      quantize_row_q8_0(row.data(), static_cast<BlockQ8_0*>(dst), cols);
    } else if (!dtype_is_float(dtype)) {
      quant_kernels(dtype)->quantize_ref(row.data(), dst, cols / dtype_info(dtype).block_elems);
    } else {
      convert_n(row.data(), DType::kF32, dst, dtype, static_cast<size_t>(cols));
    }
  });
  return t;
}

}  // namespace

std::string default_model_cache_dir() {
  if (const char* d = std::getenv("KVCACHE_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/kvcache";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kvcache";
  return (fs::temp_directory_path() / "kvcache").string();
}

namespace {

// Presets of the other families are config.json texts (real transformers field names), parsed
// by the same parse_hf_config a downloaded model goes through. Small windows and strong
// softcaps so that every structure changes the logits at test lengths.
const char* hf_preset_json(const std::string& name) {
  if (name == "gemma2-tiny") {
    // Gemma2ForCausalLM: alternating sliding (even layers) / full, both softcaps, tied.
    return R"({"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2",
      "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 256,
      "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "query_pre_attn_scalar": 24,
      "attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0, "sliding_window": 8,
      "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true,
      "bos_token_id": 2, "eos_token_id": 1})";
  }
  if (name == "gptoss-tiny") {
    // GptOssForCausalLM: sinks, q/k/v/o biases, sliding window 8 on even layers, MoE 2 of 4
    // experts, yarn RoPE.
    return R"({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
      "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "intermediate_size": 32, "num_local_experts": 4, "num_experts_per_tok": 2,
      "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "sliding_window": 8,
      "rope_parameters": {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                          "beta_slow": 1.0, "truncate": false, "original_max_position_embeddings": 64},
      "tie_word_embeddings": false, "bos_token_id": 2, "eos_token_id": 1})";
  }
  if (name == "gemma3n-tiny") {
    // Gemma3nForCausalLM (text): 6 layers, the last 2 KV-shared (layer 4 reads 3, 5 reads 2),
    // full attention every third layer, AltUp x4, Laurel, per-layer inputs, activation
    // sparsity on the first two layers, per-layer FFN sizes, dual RoPE theta.
    return R"({"architectures": ["Gemma3nForCausalLM"], "model_type": "gemma3n_text",
      "hidden_size": 64, "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "intermediate_size": [96, 96, 128, 128, 96, 96], "vocab_size": 512,
      "vocab_size_per_layer_input": 384, "hidden_size_per_layer_input": 8, "laurel_rank": 8,
      "altup_num_inputs": 4, "altup_active_idx": 0, "altup_coef_clip": 120.0, "altup_correct_scale": true,
      "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0], "num_kv_shared_layers": 2,
      "layer_types": ["sliding_attention", "sliding_attention", "full_attention",
                      "sliding_attention", "sliding_attention", "full_attention"],
      "sliding_window": 8, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
      "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "final_logit_softcapping": 3.0,
      "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": true,
      "bos_token_id": 2, "eos_token_id": 1})";
  }
  if (name == "deepseek-v2-tiny") {
    // DeepseekV2ForCausalLM: MLA without q_lora (q_proj), interleaved RoPE, softmax greedy
    // routing without renormalisation (scaled), two shared experts.
    return R"({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
      "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
      "intermediate_size": 96, "moe_intermediate_size": 16, "n_routed_experts": 6, "n_shared_experts": 2,
      "num_experts_per_tok": 2, "first_k_dense_replace": 1, "norm_topk_prob": false,
      "routed_scaling_factor": 2.0, "topk_method": "greedy", "scoring_func": "softmax", "q_lora_rank": null,
      "kv_lora_rank": 24, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 16,
      "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "tie_word_embeddings": false, "bos_token_id": 2, "eos_token_id": 1})";
  }
  if (name == "mla-tiny") {
    // DeepseekV3ForCausalLM: MLA with q_lora, D_k = 16 + 8 = 24 != D_v = 12, one dense layer
    // then MoE (8 experts in 2 groups, top-2 of the best group, one shared expert), yarn.
    return R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
      "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4,
      "intermediate_size": 96, "moe_intermediate_size": 16, "n_routed_experts": 8, "n_shared_experts": 1,
      "num_experts_per_tok": 2, "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1,
      "norm_topk_prob": true, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
      "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 12,
      "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                       "mscale_all_dim": 1.0, "original_max_position_embeddings": 64},
      "tie_word_embeddings": false, "bos_token_id": 2, "eos_token_id": 1})";
  }
  if (name == "qwen3next-tiny") {
    // Qwen3NextForCausalLM: Gated DeltaNet layers 0, 1, 3, 4 and gated attention on layer 2
    // (full_attention_interval 3); H_v = 2 H_k, d_k != d_v; partial RoPE on 6 of 24 dims; layer
    // 0 dense (mlp_only_layers), the others MoE 2 of 5 with a gated shared expert.
    return R"({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
      "hidden_size": 40, "num_hidden_layers": 5, "num_attention_heads": 3, "num_key_value_heads": 1,
      "head_dim": 24, "partial_rotary_factor": 0.25, "intermediate_size": 36,
      "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 12,
      "linear_value_head_dim": 10, "linear_conv_kernel_dim": 4, "full_attention_interval": 3,
      "num_experts": 5, "num_experts_per_tok": 2, "moe_intermediate_size": 14,
      "shared_expert_intermediate_size": 18, "norm_topk_prob": true, "decoder_sparse_step": 1,
      "mlp_only_layers": [0], "hidden_act": "silu", "vocab_size": 512,
      "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "tie_word_embeddings": false, "bos_token_id": 2, "eos_token_id": 1})";
  }
  if (name == "qwen3next-125m") {
    // Qwen3NextForCausalLM at ~125M parameters for decode benchmarks: 12 layers, every fourth
    // gated attention, dense MLPs (no experts).
    return R"({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
      "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 8, "num_key_value_heads": 2,
      "head_dim": 64, "partial_rotary_factor": 0.25, "intermediate_size": 2048,
      "linear_num_key_heads": 6, "linear_num_value_heads": 12, "linear_key_head_dim": 64,
      "linear_value_head_dim": 64, "linear_conv_kernel_dim": 4, "full_attention_interval": 4,
      "num_experts": 0, "hidden_act": "silu", "vocab_size": 32000,
      "max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "rope_theta": 10000000.0,
      "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2})";
  }
  if (name == "deepseekv4-tiny") {
    // DeepseekV4ForCausalLM: layers sliding, CSA, HCA, CSA, HCA (rates 4 and 8, window 8, so
    // short prompts emit and evict); one K==V head of 32 with RoPE on its last 8 dims, 4 query
    // heads through q_lora 32, output in 2 groups of rank 16, sinks; the indexer 8 heads x 16
    // keeping the top 3 entries (fewer than a 24-token prompt's 6 CSA entries); default RoPE
    // on both thetas (the independent reference restates only that; YaRN on the compress rope
    // is a config test); 2 hyper-connection streams; MoE 2 of 4 experts,
    // hash-routed on layer 0, sqrtsoftplus scores, swiglu_limit 0.3 (reached by these weights).
    return R"({"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
      "hidden_size": 64, "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 1,
      "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 16,
      "layer_types": ["sliding_attention", "compressed_sparse_attention",
                      "heavily_compressed_attention", "compressed_sparse_attention",
                      "heavily_compressed_attention"],
      "compress_rates": {"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
      "sliding_window": 8, "index_n_heads": 8, "index_head_dim": 16, "index_topk": 3,
      "hc_mult": 2, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
      "mlp_layer_types": ["hash_moe", "moe", "moe", "moe", "moe"],
      "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "n_shared_experts": 1, "scoring_func": "sqrtsoftplus", "routed_scaling_factor": 1.5,
      "swiglu_limit": 0.3, "hidden_act": "silu", "vocab_size": 512,
      "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
      "compress_rope_theta": 160000.0, "tie_word_embeddings": false, "bos_token_id": 2, "eos_token_id": 1})";
  }
  if (name == "qwen3-tiny") {
    // Qwen3ForCausalLM: q/k norms, head_dim 24 != hidden / heads (64 / 4), GQA 4 over 2, the
    // last two of four layers sliding (use_sliding_window, max_window_layers 2, window 8), tied.
    return R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
      "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 24, "intermediate_size": 96, "vocab_size": 512, "max_position_embeddings": 256,
      "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "attention_bias": false,
      "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 2,
      "hidden_act": "silu", "tie_word_embeddings": true, "bos_token_id": 2, "eos_token_id": 1})";
  }
  if (name == "phi3-tiny") {
    // Phi3ForCausalLM: fused qkv_proj (4 query heads over 2 KV heads) and gate_up_proj, RoPE on
    // half of each head (partial_rotary_factor 0.5, as Phi-4-mini), every layer sliding
    // (window 8, Phi3Attention passes config.sliding_window to all layers), untied.
    return R"({"architectures": ["Phi3ForCausalLM"], "model_type": "phi3",
      "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
      "intermediate_size": 96, "vocab_size": 512, "max_position_embeddings": 256,
      "original_max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
      "partial_rotary_factor": 0.5, "rope_scaling": null, "sliding_window": 8,
      "hidden_act": "silu", "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2})";
  }
  if (name == "gemma3-tiny") {
    // Gemma3ForCausalLM: layers 0-2 and 4 sliding (window 8, rope_local_base_freq 10000), layer
    // 3 full (sliding_window_pattern 4; rope_theta 1e6 with linear scaling 8), q/k norms,
    // sandwich norms, query_pre_attn_scalar 24, no softcaps, tied.
    return R"({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
      "hidden_size": 64, "num_hidden_layers": 5, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 256,
      "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
      "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "query_pre_attn_scalar": 24,
      "attn_logit_softcapping": null, "final_logit_softcapping": null, "sliding_window": 8,
      "sliding_window_pattern": 4, "hidden_activation": "gelu_pytorch_tanh",
      "tie_word_embeddings": true, "bos_token_id": 2, "eos_token_id": 1})";
  }
  return nullptr;
}

}  // namespace

std::vector<std::string> dummy_preset_names() {
  return {"tiny",           "llama-125m",       "gemma2-tiny",  "gptoss-tiny",
          "mla-tiny",       "deepseek-v2-tiny", "gemma3n-tiny", "qwen3next-tiny",
          "qwen3next-125m", "deepseekv4-tiny",  "qwen3-tiny",   "phi3-tiny",
          "gemma3-tiny"};
}

bool dummy_preset_is_hf(const std::string& name) {
  return hf_preset_json(name) != nullptr;
}

std::string dummy_preset_config_json(const std::string& name) {
  const char* j = hf_preset_json(name);
  if (j == nullptr)
    throw Error(ErrorKind::kInvalidArgument,
                "dummy preset '" + name + "' is not a config.json preset");
  return j;
}

ModelConfig dummy_preset(const std::string& name) {
  if (const char* j = hf_preset_json(name)) return parse_hf_config(j, "dummy:" + name);
  ModelConfig c;
  c.architecture = "llama";
  if (name == "tiny") {
    c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 160;
    c.vocab_size = 32000, c.max_seq_len = 2048;
  } else if (name == "llama-125m") {
    c.dim = 768, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 4, c.hidden_dim = 2048;
    c.vocab_size = 32000, c.max_seq_len = 32768;
  } else {
    std::string known;
    for (const auto& n : dummy_preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw Error(ErrorKind::kInvalidArgument,
                "unknown dummy model preset '" + name + "'; known: " + known);
  }
  c.rope_theta = 10000.0f;
  c.rope_interleaved = true;
  c.rms_eps = 1e-5f;
  c.tie_word_embeddings = false;
  c.bos_id = 1;
  c.eos_id = 2;
  c.fill_defaults();
  return c;
}

std::string build_dummy_hf(const DummyModelOptions& o) {
  const ModelConfig c = dummy_preset(o.preset);
  const DType wt = o.weight_dtype;
  if (wt != DType::kF32 && wt != DType::kF16 && wt != DType::kBF16) {
    throw Error(ErrorKind::kUnsupported,
                "dummy:" + o.preset + ": safetensors weights are f32, f16 or bf16");
  }
  const std::string dir = o.cache_dir.empty() ? default_model_cache_dir() : o.cache_dir;
  const std::string path =
      dir + "/dummy-" + o.preset + "-" + dtype_name(wt) + "-s" + std::to_string(o.seed);
  std::error_code ec;
  const std::string config_json = std::string(hf_preset_json(o.preset)) + "\n";
  bool stale = false;
  if (fs::exists(fs::path(path) / "model.safetensors", ec)) {
    // Deterministic content: reuse, unless the folder was built from an older definition of the
    // preset (its config.json differs), which is rebuilt rather than served.
    std::ifstream in(path + "/config.json", std::ios::binary);
    std::stringstream held;
    held << in.rdbuf();
    if (held.str() == config_json) return path;
    stale = true;
  }
  fs::create_directories(dir, ec);
  std::vector<Tensor> owned;
  std::vector<std::pair<std::string, TensorView>> views;
  std::set<std::string> int64_tensors;
  uint64_t tensor_id = 0;
  for (const WeightSpec& w : hf_weight_specs(c)) {
    const int64_t cols = w.shape.dims[w.shape.ndim - 1];
    const int64_t rows = w.shape.numel() / cols;
    const uint64_t seed = splitmix64(o.seed * 1000003ull + ++tensor_id);
    Tensor t;
    if (w.name.ends_with("mlp.gate.tid2eid")) {
      // DeepSeek-V4's hash routing table [vocab, top_k]: distinct expert ids per token, I64.
      t = Tensor::empty(DType::kF32, {rows, cols});
      const int64_t E = c.moe.n_experts;
      for (int64_t r = 0; r < rows; ++r) {
        const uint64_t h = splitmix64(seed + static_cast<uint64_t>(r));
        for (int64_t k = 0; k < cols; ++k)
          t.data_as<float>()[r * cols + k] =
              static_cast<float>((static_cast<int64_t>(h % static_cast<uint64_t>(E)) + k) % E);
      }
      int64_tensors.insert(w.name);
    } else if (w.role == WeightRole::kMatrix) {
      // Embeddings O(1); projections small enough that the residual stream stays O(1).
      const bool embed = w.name == "model.embed_tokens.weight";
      const bool qk = w.name.find("q_proj") != std::string::npos ||
                      w.name.find("k_proj") != std::string::npos ||
                      w.name.find("q_b_proj") != std::string::npos ||
                      w.name.find("kv_") != std::string::npos;
      t = random_matrix(rows, cols, wt, seed, embed ? 1.0f : qk ? 0.08f : 0.05f);
    } else {
      // Norm weights near their identity (Gemma stores w with (1 + w): near 0), biases and
      // sinks of moderate size so they matter.
      // Qwen3-Next's gated norm in its linear layers uses w as is.
      const bool gemma_norm = w.role == WeightRole::kNorm && c.norm_add_one &&
                              !w.name.ends_with("linear_attn.norm.weight");
      // The Gated DeltaNet's conv taps large enough that the conv matters.
      const float stddev = w.role == WeightRole::kNorm         ? 0.1f
                           : w.name.ends_with("sinks")         ? 1.0f
                           : w.name.ends_with("conv1d.weight") ? 0.4f
                                                               : 0.05f;
      t = random_matrix(rows, cols, DType::kF32, seed, stddev);
      // DeepSeek-V4's hyper-connection scales start at 1 (DeepseekV4PreTrainedModel).
      const bool hc_scale = w.name.ends_with("hc.scale") || w.name.ends_with("hc_scale");
      if ((w.role == WeightRole::kNorm && !gemma_norm) || hc_scale) {
        for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] += 1.0f;
      }
    }
    Tensor shaped = Tensor::empty(t.dtype(), w.shape);
    std::memcpy(shaped.data(), t.data(), t.size_bytes());
    owned.push_back(std::move(shaped));
    views.emplace_back(w.name, owned.back().view());
  }
  // Write into a private folder, then rename: concurrent builders never see a partial model.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  fs::create_directories(tmp, ec);
  write_safetensors(tmp + "/model.safetensors", views, {}, int64_tensors);
  {
    std::ofstream f(tmp + "/config.json", std::ios::binary | std::ios::trunc);
    f << config_json;
    if (!f) throw Error(ErrorKind::kIo, tmp + "/config.json: write failed");
  }
  if (stale) fs::remove_all(path, ec);
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    if (!fs::exists(fs::path(path) / "model.safetensors", ec)) {
      throw Error(ErrorKind::kIo, path + ": cannot move the dummy model into place");
    }
  }
  return path;
}

std::string build_dummy_model(const DummyModelOptions& o) {
  return dummy_preset_is_hf(o.preset) ? build_dummy_hf(o) : build_dummy_gguf(o);
}

std::string build_dummy_gguf(const DummyModelOptions& o) {
  const ModelConfig c = dummy_preset(o.preset);
  const DType wt = o.weight_dtype;
  if (const int64_t be = dtype_info(wt).block_elems;
      be > 1 && (c.dim % be != 0 || c.hidden_dim % be != 0)) {
    throw Error(ErrorKind::kUnsupported, "dummy:" + o.preset + ": " + dtype_name(wt) +
                                             " needs dims that are multiples of " +
                                             std::to_string(be));
  }
  if (!dtype_is_float(wt) && wt != DType::kQ8_0 &&
      (quant_kernels(wt) == nullptr || quant_kernels(wt)->quantize_ref == nullptr)) {
    throw Error(ErrorKind::kUnsupported,
                "dummy:" + o.preset + ": no quantizer for " + dtype_name(wt) + " weights");
  }
  const std::string dir = o.cache_dir.empty() ? default_model_cache_dir() : o.cache_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const bool with_vocab = !o.vocab_gguf.empty();
  const std::string path = dir + "/dummy-" + o.preset + "-" + dtype_name(wt) + "-s" +
                           std::to_string(o.seed) + (with_vocab ? "-spm" : "") + ".gguf";
  if (fs::exists(path, ec)) return path;  // deterministic content: reuse

  GgufWriter w;
  gguf_write_llama_config(w, c);
  w.set("general.name",
        GgufValue::str("kvcache dummy " + o.preset + " (seeded random weights, seed " +
                       std::to_string(o.seed) + ")"));
  if (with_vocab) {
    auto vocab = GgufFile::open(o.vocab_gguf);
    for (const auto& [key, value] : vocab->metadata()) {
      if (key.starts_with("tokenizer.")) w.set(key, value);
    }
    const GgufValue* toks = vocab->find("tokenizer.ggml.tokens");
    if (toks == nullptr || static_cast<int64_t>(toks->array_size()) != c.vocab_size) {
      throw Error(ErrorKind::kFormat, o.vocab_gguf + ": expected a " +
                                          std::to_string(c.vocab_size) +
                                          "-token vocabulary for dummy:" + o.preset);
    }
  }
  std::vector<Tensor> owned;
  owned.reserve(static_cast<size_t>(4 + 9 * c.n_layers));
  uint64_t tensor_id = 0;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, float stddev) {
    owned.push_back(
        random_matrix(rows, cols, wt, splitmix64(o.seed * 1000003ull + ++tensor_id), stddev));
    w.add_tensor(name, owned.back().view());
  };
  auto ones = [&](const std::string& name, int64_t n) {
    Tensor t = Tensor::empty(DType::kF32, {n});
    for (int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = 1.0f;
    owned.push_back(std::move(t));
    w.add_tensor(name, owned.back().view());
  };
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  const float s = 0.02f;  // GPT-2's init scale; activations stay O(1) through the norms
  matrix("token_embd.weight", c.vocab_size, c.dim, 1.0f);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    ones(layer_tensor(l, "attn_norm.weight"), c.dim);
    matrix(layer_tensor(l, "attn_q.weight"), q, c.dim, s * 4);
    matrix(layer_tensor(l, "attn_k.weight"), kv, c.dim, s * 4);
    matrix(layer_tensor(l, "attn_v.weight"), kv, c.dim, s);
    matrix(layer_tensor(l, "attn_output.weight"), c.dim, q, s);
    ones(layer_tensor(l, "ffn_norm.weight"), c.dim);
    matrix(layer_tensor(l, "ffn_gate.weight"), c.hidden_dim, c.dim, s);
    matrix(layer_tensor(l, "ffn_up.weight"), c.hidden_dim, c.dim, s);
    matrix(layer_tensor(l, "ffn_down.weight"), c.dim, c.hidden_dim, s);
  }
  ones("output_norm.weight", c.dim);
  matrix("output.weight", c.vocab_size, c.dim, s);
  // Write under a unique name, then rename: concurrent builders never see a partial file.
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  w.write(tmp);
  fs::rename(tmp, path, ec);
  if (ec)
    throw Error(ErrorKind::kIo, path + ": cannot move the dummy model into place: " + ec.message());
  return path;
}

}  // namespace kvcache
