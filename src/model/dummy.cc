#include "model/dummy.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>

#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/matmul.h"
#include "model/gguf.h"

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
      row[static_cast<size_t>(c)] = (static_cast<float>(x >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * a;
    }
    void* dst = static_cast<std::byte*>(t.data()) + static_cast<size_t>(r) * rb;
    if (dtype == DType::kQ8_0) {
      quantize_row_q8_0(row.data(), static_cast<BlockQ8_0*>(dst), cols);
    } else {
      convert_n(row.data(), DType::kF32, dst, dtype, static_cast<size_t>(cols));
    }
  });
  return t;
}

std::string default_cache_dir() {
  if (const char* d = std::getenv("KVCACHE_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/kvcache";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/kvcache";
  return (fs::temp_directory_path() / "kvcache").string();
}

}  // namespace

std::vector<std::string> dummy_preset_names() { return {"tiny", "llama-125m"}; }

ModelConfig dummy_preset(const std::string& name) {
  ModelConfig c;
  c.architecture = "llama";
  if (name == "tiny") {
    c.dim = 64, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.hidden_dim = 160;
    c.vocab_size = 32000, c.max_seq_len = 2048;
  } else if (name == "llama-125m") {
    c.dim = 768, c.n_layers = 12, c.n_heads = 12, c.n_kv_heads = 4, c.hidden_dim = 2048;
    c.vocab_size = 32000, c.max_seq_len = 32768;
  } else {
    throw Error(ErrorKind::kInvalidArgument, "unknown dummy model preset '" + name + "'; known: tiny, llama-125m");
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

std::string build_dummy_gguf(const DummyModelOptions& o) {
  const ModelConfig c = dummy_preset(o.preset);
  const DType wt = o.weight_dtype;
  if (wt == DType::kQ8_0 && (c.dim % 32 != 0 || c.hidden_dim % 32 != 0)) {
    throw Error(ErrorKind::kUnsupported, "dummy:" + o.preset + ": q8_0 needs dims that are multiples of 32");
  }
  const std::string dir = o.cache_dir.empty() ? default_cache_dir() : o.cache_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const bool with_vocab = !o.vocab_gguf.empty();
  const std::string path = dir + "/dummy-" + o.preset + "-" + dtype_name(wt) + "-s" + std::to_string(o.seed) +
                           (with_vocab ? "-spm" : "") + ".gguf";
  if (fs::exists(path, ec)) return path;  // deterministic content: reuse

  GgufWriter w;
  gguf_write_llama_config(w, c);
  w.set("general.name", GgufValue::str("kvcache dummy " + o.preset + " (seeded random weights, seed " +
                                       std::to_string(o.seed) + ")"));
  if (with_vocab) {
    auto vocab = GgufFile::open(o.vocab_gguf);
    for (const auto& [key, value] : vocab->metadata()) {
      if (key.starts_with("tokenizer.")) w.set(key, value);
    }
    const GgufValue* toks = vocab->find("tokenizer.ggml.tokens");
    if (toks == nullptr || static_cast<int64_t>(toks->array_size()) != c.vocab_size) {
      throw Error(ErrorKind::kFormat, o.vocab_gguf + ": expected a " + std::to_string(c.vocab_size) +
                                          "-token vocabulary for dummy:" + o.preset);
    }
  }
  std::vector<Tensor> owned;
  owned.reserve(static_cast<size_t>(4 + 9 * c.n_layers));
  uint64_t tensor_id = 0;
  auto matrix = [&](const std::string& name, int64_t rows, int64_t cols, float stddev) {
    owned.push_back(random_matrix(rows, cols, wt, splitmix64(o.seed * 1000003ull + ++tensor_id), stddev));
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
  if (ec) throw Error(ErrorKind::kIo, path + ": cannot move the dummy model into place: " + ec.message());
  return path;
}

}  // namespace kvcache
