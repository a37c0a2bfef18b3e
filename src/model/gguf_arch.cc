#include "model/gguf_arch.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "model/config_limits.h"
#include "model/decoder_layout.h"
#include "model/family.h"
#include "model/gguf.h"

namespace kvcache {

namespace {

// Function-local so that registration from any file's static initialiser finds it built.
std::map<std::string, GgufArchitecture>& registry() {
  static std::map<std::string, GgufArchitecture> map;
  return map;
}

// Matches `name` against `pattern` ("{N}" = a decimal layer index) and returns the index in
// `layer` (-1 without "{N}").
bool match(const std::string& pattern, const std::string& name, std::string& layer) {
  const size_t at = pattern.find("{N}");
  if (at == std::string::npos) {
    layer.clear();
    return pattern == name;
  }
  const std::string_view head(pattern.data(), at), tail(pattern.data() + at + 3);
  if (name.size() <= head.size() + tail.size() || !name.starts_with(head) ||
      !name.ends_with(tail)) {
    return false;
  }
  layer = name.substr(head.size(), name.size() - head.size() - tail.size());
  for (char ch : layer)
    if (ch < '0' || ch > '9') return false;
  return true;
}

std::string fill(const std::string& pattern, const std::string& layer) {
  const size_t at = pattern.find("{N}");
  if (at == std::string::npos) return pattern;
  return pattern.substr(0, at) + layer + pattern.substr(at + 3);
}

}  // namespace

void register_gguf_architecture(const GgufArchitecture& arch) {
  const bool inserted = registry().emplace(arch.name, arch).second;
  KV_CHECK(inserted, std::string("GGUF architecture ") + arch.name + " registered twice");
}

std::string gguf_architecture_list() {
  std::string known;
  for (const auto& [name, _] : registry()) known += (known.empty() ? "" : ", ") + name;
  return known;
}

const GgufArchitecture& find_gguf_architecture(const std::string& name, const std::string& path) {
  const auto it = registry().find(name);
  if (it == registry().end()) {
    throw Error(ErrorKind::kUnsupported,
                path + ": GGUF architecture '" + name +
                    "' is not supported; supported: " + gguf_architecture_list());
  }
  return it->second;
}

const GgufArchitecture& gguf_architecture_for_family(const std::string& family) {
  std::string writable;
  for (const auto& [name, a] : registry()) {
    if (a.write_config == nullptr) continue;
    if (family == a.family) return a;
    // One entry may write every architecture of its family (deepseek2: deepseek_v2 and
    // deepseek_v3); the llama family never gets here (convert.cc writes it as `llama`).
    const std::vector<std::string>& served = find_family(a.family).architectures;
    if (std::find(served.begin(), served.end(), family) != served.end()) return a;
    writable += (writable.empty() ? "" : ", ") + std::string(a.family);
  }
  throw Error(ErrorKind::kUnsupported, "no GGUF architecture writes the family '" + family +
                                           "'; families that can be written: " + writable);
}

std::string gguf_to_family_name(const GgufArchitecture& arch, const std::string& gguf_name) {
  std::string layer;
  for (const GgufTensorName& t : arch.tensors)
    if (match(t.gguf, gguf_name, layer)) return fill(t.family, layer);
  return {};
}

std::string family_to_gguf_name(const GgufArchitecture& arch, const std::string& family_name) {
  std::string layer;
  for (const GgufTensorName& t : arch.tensors)
    if (match(t.family, family_name, layer)) return fill(t.gguf, layer);
  return {};
}

void load_gguf_tensors_by_table(const GgufArchitecture& arch, const GgufFile& g, ModelFile& mf) {
  for (const GgufTensorInfo& info : g.tensor_infos()) {
    std::string name = info.name;
    if (!arch.tensors.empty()) {
      name = gguf_to_family_name(arch, info.name);
      if (name.empty()) {
        throw Error(ErrorKind::kFormat, g.path() + ": tensor '" + info.name +
                                            "' is not one of GGUF architecture " + arch.name +
                                            " (llama.cpp's LLM_TENSOR_NAMES)");
      }
    }
    mf.add_tensor(name, g.tensor_view(info));
  }
}

void write_gguf_tensors_by_table(const GgufArchitecture& arch, const ModelFile& model,
                                 GgufTensorList& out) {
  for (const auto& [name, view] : model.tensors()) {
    std::string gguf = name;
    if (!arch.tensors.empty()) {
      gguf = family_to_gguf_name(arch, name);
      if (gguf.empty()) {
        throw Error(ErrorKind::kUnsupported, model.path() + ": tensor '" + name +
                                                 "' has no name in GGUF architecture " + arch.name);
      }
    }
    out.emplace_back(gguf, view);
  }
}

void read_gguf_common_config(const GgufFile& g, const GgufArchitecture& arch, ModelConfig& c) {
  const std::string& path = g.path();
  const std::string p = std::string(arch.name) + ".";
  c.architecture = arch.family;
  // Counts are checked against config_limits.h under their GGUF names as they are read, before
  // anything is sized from them (a fuzzed block_count of 2^32 once asked for 137 GB of
  // layer types).
  auto count = [&](const std::string& key, ConfigCount kind) {
    return check_config_count(path, key, g.get_int(key), kind);
  };
  auto count_or = [&](const std::string& key, int64_t fallback, ConfigCount kind) {
    return check_config_count(path, key, g.get_int_or(key, fallback), kind);
  };
  // The cache's shape (layers, heads, head dim, layer types, window) from the reader `kvcache
  // plan` uses too.
  const DecoderLayout layout = read_decoder_layout(g);
  c.dim = layout.hidden_size;
  c.n_layers = layout.n_layers;
  c.n_heads = layout.n_heads;
  c.n_kv_heads = layout.n_kv_heads;
  c.head_dim = layout.head_dim;
  c.layer_types = layout.layer_types;
  c.sliding_window = layout.sliding_window;
  if (layout.kv_lora_rank > 0) {
    c.mla.kv_lora_rank = layout.kv_lora_rank;
    c.mla.qk_rope_head_dim = layout.qk_rope_head_dim;
    c.mla.qk_nope_head_dim = layout.qk_nope_head_dim;
    c.mla.v_head_dim = layout.v_head_dim;
  }
  c.hidden_dim = count(p + "feed_forward_length", ConfigCount::kFfnSize);
  c.max_seq_len = count(p + "context_length", ConfigCount::kContext);
  c.rope_theta = static_cast<float>(g.get_float_or(p + "rope.freq_base", 10000.0));
  c.rms_eps = static_cast<float>(g.get_float_or(p + "attention.layer_norm_rms_epsilon", 1e-5));

  // Tokenizer-derived values; else the embedding's rows.
  if (const GgufValue* toks = g.find("tokenizer.ggml.tokens"))
    c.vocab_size = static_cast<int64_t>(toks->array_size());
  c.vocab_size = count_or(p + "vocab_size", c.vocab_size, ConfigCount::kVocab);
  if (c.vocab_size == 0) {
    if (const GgufTensorInfo* e = g.find_tensor("token_embd.weight"); e && e->ne.size() == 2)
      c.vocab_size = check_config_count(path, "token_embd.weight rows",
                                        static_cast<int64_t>(e->ne[1]), ConfigCount::kVocab);
  }
  c.bos_id = static_cast<int32_t>(g.get_int_or("tokenizer.ggml.bos_token_id", -1));
  c.eos_id = static_cast<int32_t>(g.get_int_or("tokenizer.ggml.eos_token_id", -1));
  // llama.cpp: no output.weight means the head is token_embd (LLM_TENSOR_OUTPUT optional).
  c.tie_word_embeddings = g.find_tensor("output.weight") == nullptr;
}

void write_gguf_common_config(GgufWriter& w, const std::string& arch_name, const ModelConfig& c) {
  const std::string p = arch_name + ".";
  auto u32 = [](int64_t v) { return GgufValue::u32(static_cast<uint32_t>(v)); };
  w.set("general.architecture", GgufValue::str(arch_name));
  w.set(p + "context_length", u32(c.max_seq_len));
  w.set(p + "embedding_length", u32(c.dim));
  w.set(p + "block_count", u32(c.n_layers));
  w.set(p + "feed_forward_length", u32(c.hidden_dim));
  w.set(p + "attention.head_count", u32(c.n_heads));
  w.set(p + "attention.head_count_kv", u32(c.n_kv_heads));
  w.set(p + "rope.freq_base", GgufValue::f32(c.rope_theta));
  w.set(p + "attention.layer_norm_rms_epsilon", GgufValue::f32(c.rms_eps));
  if (c.vocab_size > 0) w.set(p + "vocab_size", u32(c.vocab_size));
  if (c.bos_id >= 0) w.set("tokenizer.ggml.bos_token_id", u32(c.bos_id));
  if (c.eos_id >= 0) w.set("tokenizer.ggml.eos_token_id", u32(c.eos_id));
}

void add_one_to_gguf_norms(GgufTensorList& out, std::vector<Tensor>& owned) {
  for (auto& [name, view] : out) {
    if (!name.ends_with("norm.weight")) continue;
    Tensor plus = Tensor::empty(DType::kF32, view.shape());
    convert_n(view.data(), view.dtype(), plus.data(), DType::kF32,
              static_cast<size_t>(view.numel()));
    float* f = static_cast<float*>(plus.data());
    for (int64_t i = 0; i < view.numel(); ++i) f[i] += 1.0f;
    owned.push_back(std::move(plus));
    view = owned.back().view();
  }
}

void check_gguf_value_length(const GgufFile& g, const std::string& arch, int64_t head_dim) {
  if (g.get_int_or(arch + ".attention.value_length", head_dim) != head_dim) {
    throw Error(ErrorKind::kUnsupported,
                g.path() + ": " + arch + " with key_length != value_length is not supported");
  }
}

}  // namespace kvcache
