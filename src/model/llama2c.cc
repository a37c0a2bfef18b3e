#include "model/llama2c.h"

#include <array>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "model/mapped_file.h"

namespace kvcache {

namespace {

constexpr size_t kHeaderBytes = 7 * sizeof(int32_t);
constexpr int64_t kMaxDim = 1 << 20;  // sanity bound: keeps every product below 2^63

struct Header {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ": " + what);
}

// One stacked llama2.c array: its canonical per-layer name (or a whole-model name), its
// per-layer shape, and how many layers it stacks (0: not per layer).
struct Segment {
  const char* name;  // per-layer suffix ("attn_q.weight") or full name ("token_embd.weight")
  Shape shape;       // one layer's (or the whole) shape
  int64_t layers;    // > 0: stacked over layers; 0: single tensor; -1: skipped (freq_cis)
};

std::vector<Segment> layout(const Header& h, bool shared) {
  const int64_t dim = h.dim, hd = h.dim / h.n_heads, kv = h.n_kv_heads * hd, q = h.n_heads * hd;
  const int64_t L = h.n_layers, vocab = h.vocab_size < 0 ? -int64_t{h.vocab_size} : h.vocab_size;
  std::vector<Segment> s = {
      {"token_embd.weight", {vocab, dim}, 0},
      {"attn_norm.weight", {dim}, L},
      {"attn_q.weight", {q, dim}, L},
      {"attn_k.weight", {kv, dim}, L},
      {"attn_v.weight", {kv, dim}, L},
      {"attn_output.weight", {dim, q}, L},
      {"ffn_norm.weight", {dim}, L},
      {"ffn_gate.weight", {h.hidden_dim, dim}, L},  // w1
      {"ffn_down.weight", {dim, h.hidden_dim}, L},  // w2
      {"ffn_up.weight", {h.hidden_dim, dim}, L},    // w3
      {"output_norm.weight", {dim}, 0},
      {"freq_cis_real", {int64_t{h.seq_len} * hd / 2}, -1},
      {"freq_cis_imag", {int64_t{h.seq_len} * hd / 2}, -1},
  };
  if (!shared) s.push_back({"output.weight", {vocab, dim}, 0});
  return s;
}

int64_t segment_floats(const Segment& s) {
  return s.shape.numel() * (s.layers > 0 ? s.layers : 1);
}

Header read_header(const MappedFile& f) {
  Header h;
  std::memcpy(&h, f.at(0, kHeaderBytes, "the 28-byte llama2.c header"), kHeaderBytes);
  return h;
}

// Returns an empty string when the header is plausible, else what is wrong.
std::string header_problem(const Header& h) {
  const std::array<std::pair<const char*, int32_t>, 6> positive = {{{"dim", h.dim},
                                                                    {"hidden_dim", h.hidden_dim},
                                                                    {"n_layers", h.n_layers},
                                                                    {"n_heads", h.n_heads},
                                                                    {"n_kv_heads", h.n_kv_heads},
                                                                    {"seq_len", h.seq_len}}};
  for (const auto& [name, v] : positive) {
    if (v <= 0 || v > kMaxDim) {
      return std::string("header field ") + name + " = " + std::to_string(v) +
             " is out of range [1, " + std::to_string(kMaxDim) + "]";
    }
  }
  if (h.vocab_size == 0 || h.vocab_size > kMaxDim || h.vocab_size < -kMaxDim) {
    return "header field vocab_size = " + std::to_string(h.vocab_size) + " is out of range";
  }
  if (h.n_layers > 4096)
    return "header field n_layers = " + std::to_string(h.n_layers) + " is implausible";
  if (h.dim % h.n_heads != 0) {
    return "dim " + std::to_string(h.dim) + " is not a multiple of n_heads " +
           std::to_string(h.n_heads);
  }
  if (h.n_heads % h.n_kv_heads != 0) {
    return "n_heads " + std::to_string(h.n_heads) + " is not a multiple of n_kv_heads " +
           std::to_string(h.n_kv_heads);
  }
  if ((h.dim / h.n_heads) % 2 != 0)
    return "head size " + std::to_string(h.dim / h.n_heads) + " is odd";
  return "";
}

uint64_t expected_bytes(const Header& h) {
  uint64_t floats = 0;
  for (const Segment& s : layout(h, h.vocab_size > 0))
    floats += static_cast<uint64_t>(segment_floats(s));
  return kHeaderBytes + floats * sizeof(float);
}

}  // namespace

bool is_llama2c_checkpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return false;
  const auto size = static_cast<uint64_t>(in.tellg());
  if (size < kHeaderBytes) return false;
  in.seekg(0);
  Header h;
  in.read(reinterpret_cast<char*>(&h), kHeaderBytes);
  return in && header_problem(h).empty() && expected_bytes(h) == size;
}

std::unique_ptr<ModelFile> load_llama2c(const std::string& path, MapMode mode) {
  return load_llama2c(MappedFile(path, mode));
}

std::unique_ptr<ModelFile> load_llama2c(MappedFile mapped) {
  auto file = std::make_shared<MappedFile>(std::move(mapped));
  const std::string& path = file->path();
  if (file->size() < kHeaderBytes) {
    bad(path, "truncated llama2.c checkpoint: " + std::to_string(file->size()) +
                  " bytes, smaller than its 28-byte header");
  }
  const Header h = read_header(*file);
  if (const std::string p = header_problem(h); !p.empty())
    bad(path, "not a valid llama2.c checkpoint: " + p);
  const bool shared = h.vocab_size > 0;
  const uint64_t want = expected_bytes(h);
  const std::vector<Segment> segs = layout(h, shared);
  if (file->size() != want) {
    // Name the first tensor that does not fit: the most useful hint for a truncated download.
    std::string where;
    uint64_t off = kHeaderBytes;
    for (const Segment& s : segs) {
      const uint64_t end = off + static_cast<uint64_t>(segment_floats(s)) * sizeof(float);
      if (end > file->size()) {
        where = "; tensor '" + std::string(s.name) + "' needs bytes [" + std::to_string(off) +
                ", " + std::to_string(end) + ")";
        break;
      }
      off = end;
    }
    bad(path, std::string(file->size() < want ? "truncated" : "oversized") +
                  " llama2.c checkpoint: the header (dim " + std::to_string(h.dim) +
                  ", hidden_dim " + std::to_string(h.hidden_dim) + ", " +
                  std::to_string(h.n_layers) + " layers, " + std::to_string(h.n_heads) + "/" +
                  std::to_string(h.n_kv_heads) + " heads, vocab " + std::to_string(h.vocab_size) +
                  ", seq_len " + std::to_string(h.seq_len) + ") implies " + std::to_string(want) +
                  " bytes but the file has " + std::to_string(file->size()) + where);
  }

  auto model = std::make_unique<ModelFile>(path, "llama2c");
  ModelConfig& c = model->mutable_config();
  c.architecture = "llama";
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  c.head_dim = h.dim / h.n_heads;
  c.vocab_size = shared ? h.vocab_size : -int64_t{h.vocab_size};
  c.max_seq_len = h.seq_len;
  c.rope_theta = 10000.0f;    // run.c hard-codes 10000
  c.rope_interleaved = true;  // run.c rotates pairs (2i, 2i+1)
  c.rms_eps = 1e-5f;          // run.c hard-codes 1e-5
  c.tie_word_embeddings = shared;
  c.bos_id = 1;
  c.eos_id = 2;
  c.fill_defaults();

  // Views into the mapping; TensorView wants a mutable pointer, but the pages are PROT_READ and
  // nothing in the runtime writes weights.
  auto* base = const_cast<std::byte*>(file->data());
  uint64_t off = kHeaderBytes;
  for (const Segment& s : segs) {
    const int64_t per = s.shape.numel();
    if (s.layers > 0) {
      for (int64_t l = 0; l < s.layers; ++l) {
        model->add_tensor(layer_tensor(l, s.name),
                          TensorView(base + off + static_cast<uint64_t>(l * per) * sizeof(float),
                                     DType::kF32, s.shape));
      }
    } else if (s.layers == 0) {
      model->add_tensor(s.name, TensorView(base + off, DType::kF32, s.shape));
    }
    off += static_cast<uint64_t>(segment_floats(s)) * sizeof(float);
  }
  model->keep_alive(std::move(file));
  model->validate_llama_weights();
  return model;
}

}  // namespace kvcache
