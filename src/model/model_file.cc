#include "model/model_file.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/config_limits.h"
#include "model/decoder_layout.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/safetensors.h"
#include "model/weight_spec.h"

namespace kvcache {

const char* rope_scaling_name(RopeScalingType t) {
  switch (t) {
    case RopeScalingType::kNone:
      return "none";
    case RopeScalingType::kLinear:
      return "linear";
    case RopeScalingType::kLlama3:
      return "llama3";
    case RopeScalingType::kYarn:
      return "yarn";
  }
  return "?";
}

namespace {
[[noreturn]] void bad(const std::string& source, const std::string& what) {
  throw Error(ErrorKind::kFormat, source + ": " + what);
}
}  // namespace

void ModelConfig::fill_defaults() {
  if (head_dim == 0 && n_heads > 0 && dim % n_heads == 0) head_dim = dim / n_heads;
  if (n_kv_heads == 0) n_kv_heads = n_heads;
  if (layer_types.empty() && n_layers > 0)
    layer_types = generic_layer_types(n_layers, sliding_window, attention_chunk_size);
}

void ModelConfig::validate(const std::string& source) const {
  check_config_limits(*this, source);
  auto positive = [&](int64_t v, const char* name) {
    if (v <= 0)
      bad(source,
          std::string("model config: ") + name + " must be positive, got " + std::to_string(v));
  };
  positive(dim, "dim (hidden size)");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_kv_heads, "n_kv_heads");
  positive(head_dim, "head_dim");
  positive(hidden_dim, "hidden_dim (FFN size)");
  positive(vocab_size, "vocab_size");
  positive(max_seq_len, "max_seq_len (context length)");
  if (n_heads % n_kv_heads != 0) {
    bad(source, "model config: n_heads " + std::to_string(n_heads) +
                    " is not a multiple of n_kv_heads " + std::to_string(n_kv_heads));
  }
  if (head_dim % 2 != 0)
    bad(source, "model config: head_dim " + std::to_string(head_dim) + " is odd; RoPE needs pairs");
  if (!(rope_theta > 0.0f)) bad(source, "model config: rope_theta must be positive");
  if (!(rms_eps > 0.0f)) bad(source, "model config: rms_eps must be positive");
  if (sliding_window < 0) bad(source, "model config: sliding_window must be >= 0");
  if (static_cast<int64_t>(layer_types.size()) != n_layers) {
    bad(source, "model config: layer_types has " + std::to_string(layer_types.size()) +
                    " entries for " + std::to_string(n_layers) + " layers");
  }
  for (size_t i = 0; i < layer_types.size(); ++i) {
    const std::string& t = layer_types[i];
    const bool linear = t == "linear_attention" && linear_attn.enabled();
    const bool compressed = deepseek_v4.enabled() && deepseek_v4.rate_of(t) > 0;
    if (t != "full_attention" && t != "sliding_attention" && t != "chunked_attention" && !linear &&
        !compressed) {
      bad(source,
          "model config: layer_types[" + std::to_string(i) + "] is '" + t +
              "', a layer type this engine does not run (full_attention, sliding_attention, "
              "chunked_attention; linear_attention with the linear_* keys of Qwen3-Next; "
              "compressed_sparse_attention and heavily_compressed_attention in DeepSeek-V4)");
    }
    if (deepseek_v4.enabled() && t != "sliding_attention" && !compressed) {
      bad(source, "model config: layer_types[" + std::to_string(i) + "] is '" + t +
                      "'; DeepSeek-V4 layers are sliding_attention, compressed_sparse_attention "
                      "or heavily_compressed_attention");
    }
    if (t == "sliding_attention" && sliding_window <= 0) {
      bad(source, "model config: sliding_attention layers need a positive sliding_window");
    }
    if (t == "chunked_attention" && attention_chunk_size <= 0) {
      bad(source, "model config: chunked_attention layers need a positive attention_chunk_size");
    }
    if (mla.enabled() && t != "full_attention") {
      bad(source, "model config: layer_types[" + std::to_string(i) + "] is '" + t +
                      "'; MLA (kv_lora_rank) layers run only full_attention here");
    }
  }
  if (num_kv_shared_layers < 0 || num_kv_shared_layers >= n_layers) {
    bad(source, "model config: num_kv_shared_layers " + std::to_string(num_kv_shared_layers) +
                    " must be in [0, num_hidden_layers)");
  }
  if (!rope_freq_factors.empty() &&
      static_cast<int64_t>(rope_freq_factors.size()) != rope_dim() / 2) {
    bad(source, "model config: rope_freq_factors has " + std::to_string(rope_freq_factors.size()) +
                    " entries, expected rope_dim/2 = " + std::to_string(rope_dim() / 2));
  }
  if (!(embed_scale > 0.0f) || query_scale < 0.0f || attn_softcap < 0.0f || final_softcap < 0.0f) {
    bad(source, "model config: embedding scale must be positive and query scale / softcaps >= 0");
  }
  if (moe.n_experts > 0) {
    positive(moe.n_experts_used, "num_experts_per_tok");
    positive(moe.expert_hidden_dim, "moe intermediate size");
    if (moe.n_experts_used > moe.n_experts)
      bad(source, "model config: num_experts_per_tok exceeds the number of experts");
    if (moe.n_group <= 0 || moe.n_experts % moe.n_group != 0 || moe.topk_group <= 0 ||
        moe.topk_group > moe.n_group) {
      bad(source,
          "model config: n_group must divide the routed experts and 0 < topk_group <= n_group");
    }
  }
  if (linear_attn.enabled()) {
    const LinearAttentionConfig& a = linear_attn;
    positive(a.num_key_heads, "linear_num_key_heads");
    positive(a.key_head_dim, "linear_key_head_dim");
    positive(a.value_head_dim, "linear_value_head_dim");
    positive(a.conv_kernel, "linear_conv_kernel_dim");
    if (a.num_value_heads % a.num_key_heads != 0) {
      bad(source, "model config: linear_num_value_heads " + std::to_string(a.num_value_heads) +
                      " is not a multiple of linear_num_key_heads " +
                      std::to_string(a.num_key_heads));
    }
    if (a.conv_kernel > 16) {
      bad(source, "model config: linear_conv_kernel_dim " + std::to_string(a.conv_kernel) +
                      " is larger than the 16 taps the causal conv kernel runs");
    }
  }
  if (!(partial_rotary_factor > 0.0f && partial_rotary_factor <= 1.0f) || rope_dim() < 2 ||
      rope_dim() % 2 != 0) {
    bad(source, "model config: partial_rotary_factor " + std::to_string(partial_rotary_factor) +
                    " must be in (0, 1] and leave an even number (>= 2) of rotated dims of " +
                    "head_dim " + std::to_string(head_dim));
  }
  if (deepseek_v4.enabled()) {
    const DeepseekV4Config& v = deepseek_v4;
    positive(v.o_groups, "o_groups");
    positive(v.o_lora_rank, "o_lora_rank");
    positive(v.hc_mult, "hc_mult");
    positive(v.hc_sinkhorn_iters, "hc_sinkhorn_iters");
    positive(v.csa_rate, "compress_rates.compressed_sparse_attention");
    positive(v.hca_rate, "compress_rates.heavily_compressed_attention");
    positive(sliding_window, "sliding_window");
    if (n_kv_heads != 1)
      bad(source,
          "model config: DeepSeek-V4 attention has one shared K==V head, "
          "num_key_value_heads is " +
              std::to_string(n_kv_heads));
    if ((n_heads * head_dim) % v.o_groups != 0)
      bad(source, "model config: o_groups " + std::to_string(v.o_groups) +
                      " does not divide num_attention_heads * head_dim " +
                      std::to_string(n_heads * head_dim));
    if (static_cast<int64_t>(v.hash_layers.size()) != n_layers)
      bad(source, "model config: mlp_layer_types has " + std::to_string(v.hash_layers.size()) +
                      " entries for " + std::to_string(n_layers) + " layers");
    if (moe.n_experts <= 0) bad(source, "model config: DeepSeek-V4 needs n_routed_experts > 0");
    bool csa = false;
    for (const std::string& t : layer_types) csa |= t == "compressed_sparse_attention";
    if (csa) {
      positive(v.index_n_heads, "index_n_heads");
      positive(v.index_head_dim, "index_head_dim");
      positive(v.index_topk, "index_topk");
      if (v.index_head_dim < rope_dim())
        bad(source, "model config: index_head_dim " + std::to_string(v.index_head_dim) +
                        " is smaller than the " + std::to_string(rope_dim()) +
                        " rotated dims (qk_rope_head_dim)");
    }
    if (!v.compress_freq_factors.empty() &&
        static_cast<int64_t>(v.compress_freq_factors.size()) != rope_dim() / 2)
      bad(source, "model config: the compress rope's YaRN factors do not match rope_dim / 2");
  }
  if (mla.enabled()) {
    positive(mla.qk_nope_head_dim, "qk_nope_head_dim");
    positive(mla.qk_rope_head_dim, "qk_rope_head_dim");
    positive(mla.v_head_dim, "v_head_dim");
    if (mla.qk_rope_head_dim % 2 != 0)
      bad(source, "model config: qk_rope_head_dim must be even (RoPE pairs)");
    if (head_dim != qk_head_dim())
      bad(source, "model config: MLA head_dim must equal qk_nope_head_dim + qk_rope_head_dim");
  }
}

std::string ModelConfig::summary() const {
  std::string s = architecture + " dim=" + std::to_string(dim) +
                  " layers=" + std::to_string(n_layers) + " heads=" + std::to_string(n_heads) +
                  "/" + std::to_string(n_kv_heads) + " head_dim=" + std::to_string(head_dim) +
                  " ffn=" + std::to_string(hidden_dim) + " vocab=" + std::to_string(vocab_size) +
                  " ctx=" + std::to_string(max_seq_len) +
                  " rope_theta=" + std::to_string(rope_theta) +
                  (rope_interleaved ? " rope=interleaved" : " rope=half-split");
  if (rope_scaling.type != RopeScalingType::kNone) {
    s += std::string(" rope_scaling=") + rope_scaling_name(rope_scaling.type) + "x" +
         std::to_string(rope_scaling.factor);
  }
  if (sliding_window > 0) s += " sliding_window=" + std::to_string(sliding_window);
  if (qkv_bias) s += " qkv_bias";
  if (attention_chunk_size > 0) s += " chunk=" + std::to_string(attention_chunk_size);
  if (attn_softcap > 0) s += " attn_softcap=" + std::to_string(attn_softcap);
  if (final_softcap > 0) s += " final_softcap=" + std::to_string(final_softcap);
  if (attn_sinks) s += " sinks";
  if (num_kv_shared_layers > 0) s += " kv_shared=" + std::to_string(num_kv_shared_layers);
  if (moe.n_experts > 0)
    s += " experts=" + std::to_string(moe.n_experts_used) + "/" + std::to_string(moe.n_experts);
  if (linear_attn.enabled()) {
    s += " gated_deltanet(h_k=" + std::to_string(linear_attn.num_key_heads) +
         " h_v=" + std::to_string(linear_attn.num_value_heads) +
         " d_k=" + std::to_string(linear_attn.key_head_dim) +
         " d_v=" + std::to_string(linear_attn.value_head_dim) +
         " conv=" + std::to_string(linear_attn.conv_kernel) + ")";
  }
  if (deepseek_v4.enabled()) {
    const DeepseekV4Config& v = deepseek_v4;
    s += " v4(q_lora=" + std::to_string(v.q_lora_rank) + " rope=" + std::to_string(rope_dim()) +
         " o=" + std::to_string(v.o_groups) + "x" + std::to_string(v.o_lora_rank) +
         " rates=" + std::to_string(v.csa_rate) + "/" + std::to_string(v.hca_rate) +
         " index=" + std::to_string(v.index_n_heads) + "x" + std::to_string(v.index_head_dim) +
         " top" + std::to_string(v.index_topk) + " hc=" + std::to_string(v.hc_mult) + ")";
  }
  if (mla.enabled()) {
    s += " mla(d_c=" + std::to_string(mla.kv_lora_rank) +
         " d_r=" + std::to_string(mla.qk_rope_head_dim) +
         " d_kn=" + std::to_string(mla.qk_nope_head_dim) +
         " d_v=" + std::to_string(mla.v_head_dim) + ")";
  }
  if (tie_word_embeddings) s += " tied";
  return s;
}

std::string layer_tensor(int64_t layer, const char* suffix) {
  return "blk." + std::to_string(layer) + "." + suffix;
}

const TensorView* ModelFile::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& ModelFile::tensor(const std::string& name) const {
  const TensorView* t = find(name);
  if (!t) bad(path_, "missing tensor '" + name + "'");
  return *t;
}

const TensorView& ModelFile::tensor(const std::string& name, const Shape& expected) const {
  const TensorView& t = tensor(name);
  if (!(t.shape() == expected)) {
    bad(path_, "tensor '" + name + "' has shape " + t.shape().str() + " but the config implies " +
                   expected.str());
  }
  return t;
}

size_t ModelFile::weight_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : tensors_) n += dtype_bytes(t.dtype(), t.numel());
  return n;
}

void ModelFile::add_tensor(const std::string& name, const TensorView& view) {
  if (!tensors_.emplace(name, view).second) bad(path_, "tensor '" + name + "' appears twice");
}

void ModelFile::validate_weights() const {
  if (config_.is_llama_family()) {
    validate_llama_weights();
    return;
  }
  config_.validate(path_);
  for (const WeightSpec& w : hf_weight_specs(config_)) {
    const TensorView& t = tensor(w.name, w.shape);
    if (!w.matrix && !dtype_is_float(t.dtype())) {
      bad(path_, "tensor '" + w.name + "' has type " + dtype_name(t.dtype()) +
                     "; norms, biases and sinks must be f32/f16/bf16");
    }
    if (const int64_t be = dtype_info(t.dtype()).block_elems;
        w.matrix && be > 1 && t.shape().dims[t.ndim() - 1] % be != 0) {
      bad(path_, "tensor '" + w.name + "' is " + dtype_name(t.dtype()) +
                     " with a row length not a multiple of its block (" + std::to_string(be) + ")");
    }
    if (!t.is_contiguous()) bad(path_, "tensor '" + w.name + "' is not contiguous");
  }
}

void ModelFile::validate_llama_weights() const {
  const ModelConfig& c = config_;
  c.validate(path_);
  if (!c.is_llama_family()) {
    bad(path_,
        "architecture '" + c.architecture + "' is not a llama-family block (use validate_weights)");
  }
  auto check = [&](const std::string& name, const Shape& shape, bool matrix) {
    const TensorView& t = tensor(name, shape);
    if (!matrix && !dtype_is_float(t.dtype())) {
      bad(path_, "tensor '" + name + "' has type " + dtype_name(t.dtype()) +
                     "; norms and biases must be f32/f16/bf16");
    }
    if (!t.is_contiguous()) bad(path_, "tensor '" + name + "' is not contiguous");
  };
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  check("token_embd.weight", {c.vocab_size, c.dim}, true);
  check("output_norm.weight", {c.dim}, false);
  if (!c.tie_word_embeddings) check("output.weight", {c.vocab_size, c.dim}, true);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    check(layer_tensor(l, "attn_norm.weight"), {c.dim}, false);
    check(layer_tensor(l, "attn_q.weight"), {q, c.dim}, true);
    check(layer_tensor(l, "attn_k.weight"), {kv, c.dim}, true);
    check(layer_tensor(l, "attn_v.weight"), {kv, c.dim}, true);
    check(layer_tensor(l, "attn_output.weight"), {c.dim, q}, true);
    if (c.qkv_bias) {
      check(layer_tensor(l, "attn_q.bias"), {q}, false);
      check(layer_tensor(l, "attn_k.bias"), {kv}, false);
      check(layer_tensor(l, "attn_v.bias"), {kv}, false);
    }
    check(layer_tensor(l, "ffn_norm.weight"), {c.dim}, false);
    check(layer_tensor(l, "ffn_gate.weight"), {c.hidden_dim, c.dim}, true);
    check(layer_tensor(l, "ffn_up.weight"), {c.hidden_dim, c.dim}, true);
    check(layer_tensor(l, "ffn_down.weight"), {c.dim, c.hidden_dim}, true);
  }
}

std::unique_ptr<ModelFile> open_model_file(const std::string& path, MapMode mode) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) return load_hf_model(path, mode);
  if (!fs::exists(path, ec)) throw Error(ErrorKind::kIo, path + ": no such file or directory");
  char magic[4] = {};
  {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(ErrorKind::kIo, path + ": cannot open");
    f.read(magic, 4);
  }
  if (std::string_view(magic, 4) == "GGUF") return load_gguf_model(path, mode);
  if (path.size() > 12 && path.ends_with(".safetensors")) return load_hf_model(path, mode);
  if (is_llama2c_checkpoint(path)) return load_llama2c(path, mode);
  throw Error(
      ErrorKind::kFormat,
      path +
          ": unrecognised model file: expected a GGUF file, a llama2.c checkpoint, a Hugging "
          "Face folder (config.json + *.safetensors) or a .safetensors file with config.json "
          "beside it");
}

}  // namespace kvcache
