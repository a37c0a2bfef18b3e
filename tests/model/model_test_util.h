// Helpers for model-format tests: temp paths, expected errors and a tiny random llama weight
// set.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "model/model_file.h"
#include "shared_data.h"

namespace kvcache::testing_util {

inline std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kvcache_model_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Expects `fn` to throw Error whose message contains every needle.
template <typename Fn>
void expect_error(Fn&& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << "\n  lacks: " << n;
  }
}

inline ModelConfig tiny_config() {
  ModelConfig c;
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.hidden_dim = 96;
  c.vocab_size = 40;
  c.max_seq_len = 128;
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-5f;
  c.bos_id = 1;
  c.eos_id = 2;
  c.fill_defaults();
  return c;
}

// Random weights with canonical names and shapes for `c`, in dtype `dt` for matrices (norms
// and biases stay f32).
struct TinyWeights {
  std::vector<std::pair<std::string, Tensor>> tensors;
  void add(const std::string& name, DType dt, const Shape& s, std::mt19937& rng) {
    Tensor f = Tensor::empty(DType::kF32, s);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] = u(rng);
    if (dt == DType::kF32) {
      tensors.emplace_back(name, std::move(f));
      return;
    }
    Tensor t = Tensor::empty(dt, s);
    if (dt == DType::kQ8_0) {
      // q8_0 blocks: f16 scale then 32 int8 (llama.cpp's block_q8_0); values need not be
      // meaningful for format tests.
      auto* p = t.data_as<uint8_t>();
      for (size_t i = 0; i < t.size_bytes(); ++i) p[i] = static_cast<uint8_t>(rng());
    } else {
      copy_view(f.view(), t.view());
    }
    tensors.emplace_back(name, std::move(t));
  }
  std::vector<std::pair<std::string, TensorView>> views() const {
    std::vector<std::pair<std::string, TensorView>> v;
    for (const auto& [n, t] : tensors) v.emplace_back(n, t.view());
    return v;
  }
};

inline TinyWeights tiny_weights(const ModelConfig& c, DType dt, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  TinyWeights w;
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  w.add("token_embd.weight", dt, {c.vocab_size, c.dim}, rng);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    w.add(layer_tensor(l, "attn_norm.weight"), DType::kF32, {c.dim}, rng);
    w.add(layer_tensor(l, "attn_q.weight"), dt, {q, c.dim}, rng);
    w.add(layer_tensor(l, "attn_k.weight"), dt, {kv, c.dim}, rng);
    w.add(layer_tensor(l, "attn_v.weight"), dt, {kv, c.dim}, rng);
    if (c.qkv_bias) {
      w.add(layer_tensor(l, "attn_q.bias"), DType::kF32, {q}, rng);
      w.add(layer_tensor(l, "attn_k.bias"), DType::kF32, {kv}, rng);
      w.add(layer_tensor(l, "attn_v.bias"), DType::kF32, {kv}, rng);
    }
    w.add(layer_tensor(l, "attn_output.weight"), dt, {c.dim, q}, rng);
    w.add(layer_tensor(l, "ffn_norm.weight"), DType::kF32, {c.dim}, rng);
    w.add(layer_tensor(l, "ffn_gate.weight"), dt, {c.hidden_dim, c.dim}, rng);
    w.add(layer_tensor(l, "ffn_up.weight"), dt, {c.hidden_dim, c.dim}, rng);
    w.add(layer_tensor(l, "ffn_down.weight"), dt, {c.dim, c.hidden_dim}, rng);
  }
  w.add("output_norm.weight", DType::kF32, {c.dim}, rng);
  if (!c.tie_word_embeddings) w.add("output.weight", dt, {c.vocab_size, c.dim}, rng);
  return w;
}

}  // namespace kvcache::testing_util
