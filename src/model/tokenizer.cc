#include "model/tokenizer.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/tokenizer_bpe.h"
#include "model/tokenizer_llama2c.h"
#include "model/tokenizer_spm.h"

namespace kvcache {

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += decode(id);
  return out;
}

std::string Tokenizer::piece_after(int32_t prev, int32_t id) const {
  std::string piece = decode(id);
  const std::string_view k = kind();
  if (prev >= 0 && prev == bos_id() &&
      (k == "llama" || k == "llama2c" || drops_space_after_bos()) && !piece.empty() &&
      piece[0] == ' ')
    piece.erase(0, 1);
  return piece;
}

size_t Tokenizer::max_text_bytes_per_token() const {
  std::call_once(max_bytes_once_, [this] {
    size_t most = 4;
    for (int32_t id = 0; id < vocab_size(); ++id) most = std::max(most, decode(id).size());
    max_bytes_ = most;
  });
  return max_bytes_;
}

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ": " + what);
}

// A token's text for a message: at most 32 bytes, control bytes as '?'.
std::string printable_prefix(const std::string& t) {
  std::string s = t.substr(0, 32);
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return t.size() > 32 ? s + "..." : s;
}

Vocabulary gguf_vocabulary(const GgufFile& g) {
  Vocabulary v;
  v.tokens = g.get_array("tokenizer.ggml.tokens", GgufType::kString).strs;
  const size_t n = v.tokens.size();
  if (n == 0) bad(g.path(), "tokenizer.ggml.tokens is empty");
  if (const GgufValue* s = g.find("tokenizer.ggml.scores")) {
    const GgufValue& a = g.get_array("tokenizer.ggml.scores", GgufType::kFloat32);
    if (a.floats.size() != n)
      bad(g.path(), "tokenizer.ggml.scores has " + std::to_string(a.floats.size()) +
                        " entries for " + std::to_string(n) + " tokens");
    v.scores.assign(s->floats.begin(), s->floats.end());
  }
  if (g.find("tokenizer.ggml.token_type")) {
    const GgufValue& a = g.get_array("tokenizer.ggml.token_type", GgufType::kInt32);
    if (a.ints.size() != n)
      bad(g.path(), "tokenizer.ggml.token_type has " + std::to_string(a.ints.size()) +
                        " entries for " + std::to_string(n) + " tokens");
    v.types.reserve(n);
    for (int64_t t : a.ints)
      v.types.push_back(t >= 0 && t <= 6 ? static_cast<TokenType>(t) : TokenType::kUndefined);
  }
  auto id = [&](const char* key) {
    const int64_t x = g.get_int_or(key, -1);
    if (x >= static_cast<int64_t>(n))
      bad(g.path(), std::string(key) + " " + std::to_string(x) + " is outside the vocabulary");
    return static_cast<int32_t>(x);
  };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  return v;
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufFile& g) {
  if (!g.find("tokenizer.ggml.model"))
    bad(g.path(), "no tokenizer in this GGUF (tokenizer.ggml.model is missing)");
  const std::string& model = g.get_string("tokenizer.ggml.model");
  if (model == "llama") {
    Vocabulary v = gguf_vocabulary(g);
    for (size_t i = 0; i < v.types.size(); ++i) {
      if (v.types[i] == TokenType::kByte && spm_byte_token_value(v.tokens[i]) < 0) {
        bad(g.path(), "tokenizer.ggml.tokens[" + std::to_string(i) + "] '" +
                          printable_prefix(v.tokens[i]) +
                          "' has token_type byte but is not of the form <0xNN> (two hex digits)");
      }
    }
    return std::make_unique<SpmTokenizer>(std::move(v),
                                          g.get_bool_or("tokenizer.ggml.add_space_prefix", true));
  }
  if (model == "gpt2") {
    // llama.cpp reads a missing tokenizer.ggml.pre as "default" (with a warning that the file
    // should be regenerated); so do we, naming it in kind().
    const std::string pre = g.get_string_or("tokenizer.ggml.pre", "default");
    BpeParams p;
    try {
      GgufPreTokenizer gp = gguf_pretokenizer(pre);
      p.pre = std::move(gp.pre);
      p.ignore_merges = gp.ignore_merges;
    } catch (const Error& e) {
      throw Error(e.kind(), g.path() + ": " + e.what());
    }
    p.kind = pre == "gpt-2"                            ? "gpt2"
             : (pre == "llama-bpe" || pre == "llama3") ? "gpt2/llama3"
                                                       : "gpt2/" + pre;
    for (const std::string& m : g.get_array("tokenizer.ggml.merges", GgufType::kString).strs) {
      // llama.cpp splits at the first space after the first byte.
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos)
        bad(g.path(), "tokenizer.ggml.merges entry '" + m + "' has no space");
      p.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    return std::make_unique<BpeTokenizer>(gguf_vocabulary(g), std::move(p));
  }
  throw Error(ErrorKind::kUnsupported,
              g.path() + ": tokenizer model '" + model + "' is not supported (llama, gpt2)");
}

namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, path + ": cannot open");
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

bool has_gguf_magic(const std::string& path) {
  char magic[4] = {};
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, path + ": cannot open");
  f.read(magic, 4);
  return f && std::string_view(magic, 4) == "GGUF";
}

}  // namespace

std::string find_tokenizer_for_model(const std::string& model_path) {
  std::error_code ec;
  if (fs::is_directory(model_path, ec)) {
    const fs::path json = fs::path(model_path) / "tokenizer.json";
    return fs::exists(json, ec) ? json.string() : "";
  }
  if (!fs::exists(model_path, ec)) return "";
  const fs::path dir = fs::path(model_path).parent_path();
  if (has_gguf_magic(model_path)) {
    return GgufFile::open(model_path)->find("tokenizer.ggml.model") ? model_path : "";
  }
  if (model_path.ends_with(".safetensors")) {
    return fs::exists(dir / "tokenizer.json", ec) ? (dir / "tokenizer.json").string() : "";
  }
  if (is_llama2c_checkpoint(model_path)) {
    for (const char* name : {"tokenizer.bin", "tok512.bin"}) {
      if (fs::exists(dir / name, ec)) return (dir / name).string();
    }
  }
  return "";
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, int32_t llama2c_vocab_size) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path json = fs::path(path) / "tokenizer.json";
    if (fs::exists(json, ec)) return load_hf_tokenizer(json.string());
    throw Error(ErrorKind::kIo, path + ": no tokenizer.json in this folder");
  }
  if (path.starts_with("dummy:") && !fs::exists(path, ec))
    throw Error(
        ErrorKind::kInvalidArgument,
        path +
            ": the built-in dummy models have no tokenizer of their own (generate borrows "
            "llama.cpp's "
            "SentencePiece test vocabulary, vocab/ggml-vocab-llama-spm.gguf in the shared folder); "
            "pass a tokenizer file instead");
  if (!fs::exists(path, ec)) throw Error(ErrorKind::kIo, path + ": no such file");
  if (has_gguf_magic(path)) return tokenizer_from_gguf(*GgufFile::open(path));
  if (path.ends_with(".json")) return load_hf_tokenizer(path);
  if (is_llama2c_checkpoint(path)) {
    const std::string tok = find_tokenizer_for_model(path);
    if (tok.empty()) {
      throw Error(ErrorKind::kIo,
                  path + ": a llama2.c checkpoint without tokenizer.bin or tok512.bin beside it");
    }
    return std::make_unique<Llama2cTokenizer>(
        tok, static_cast<int32_t>(load_llama2c(path)->config().vocab_size));
  }
  const int32_t n = llama2c_vocab_size > 0 ? llama2c_vocab_size
                                           : count_llama2c_tokenizer_entries(read_bytes(path));
  if (n <= 0) {
    throw Error(ErrorKind::kFormat,
                path +
                    ": not a tokenizer this loader knows (GGUF, tokenizer.json, a folder "
                    "with tokenizer.json, a llama2.c checkpoint or tokenizer.bin)");
  }
  return std::make_unique<Llama2cTokenizer>(path, n);
}

}  // namespace kvcache
