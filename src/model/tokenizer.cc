#include "model/tokenizer.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer_bpe.h"
#include "model/tokenizer_spm.h"

namespace kvcache {

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += decode(id);
  return out;
}

namespace {

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ": " + what);
}

Vocabulary gguf_vocabulary(const GgufFile& g) {
  Vocabulary v;
  v.tokens = g.get_array("tokenizer.ggml.tokens", GgufType::kString).strs;
  const size_t n = v.tokens.size();
  if (n == 0) bad(g.path(), "tokenizer.ggml.tokens is empty");
  if (const GgufValue* s = g.find("tokenizer.ggml.scores")) {
    const GgufValue& a = g.get_array("tokenizer.ggml.scores", GgufType::kFloat32);
    if (a.floats.size() != n) bad(g.path(), "tokenizer.ggml.scores has " + std::to_string(a.floats.size()) + " entries for " + std::to_string(n) + " tokens");
    v.scores.assign(s->floats.begin(), s->floats.end());
  }
  if (g.find("tokenizer.ggml.token_type")) {
    const GgufValue& a = g.get_array("tokenizer.ggml.token_type", GgufType::kInt32);
    if (a.ints.size() != n) bad(g.path(), "tokenizer.ggml.token_type has " + std::to_string(a.ints.size()) + " entries for " + std::to_string(n) + " tokens");
    v.types.reserve(n);
    for (int64_t t : a.ints) v.types.push_back(t >= 0 && t <= 6 ? static_cast<TokenType>(t) : TokenType::kUndefined);
  }
  auto id = [&](const char* key) {
    const int64_t x = g.get_int_or(key, -1);
    if (x >= static_cast<int64_t>(n)) bad(g.path(), std::string(key) + " " + std::to_string(x) + " is outside the vocabulary");
    return static_cast<int32_t>(x);
  };
  v.bos = id("tokenizer.ggml.bos_token_id");
  v.eos = id("tokenizer.ggml.eos_token_id");
  v.unk = id("tokenizer.ggml.unknown_token_id");
  return v;
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_from_gguf(const GgufFile& g) {
  if (!g.find("tokenizer.ggml.model")) bad(g.path(), "no tokenizer in this GGUF (tokenizer.ggml.model is missing)");
  const std::string& model = g.get_string("tokenizer.ggml.model");
  if (model == "llama") {
    return std::make_unique<SpmTokenizer>(gguf_vocabulary(g), g.get_bool_or("tokenizer.ggml.add_space_prefix", true));
  }
  if (model == "gpt2") {
    const std::string pre = g.get_string_or("tokenizer.ggml.pre", "gpt-2");
    BpeParams p;
    if (pre == "gpt-2" || pre == "gpt2") {
      p.pre = BpePreTokenizer::kGpt2;
    } else if (pre == "llama-bpe" || pre == "llama3") {
      p.pre = BpePreTokenizer::kLlama3;
      p.ignore_merges = true;
      p.kind = "gpt2/llama3";
    } else {
      throw Error(ErrorKind::kUnsupported, g.path() + ": BPE pre-tokenizer '" + pre + "' is not supported (gpt-2, llama-bpe)");
    }
    for (const std::string& m : g.get_array("tokenizer.ggml.merges", GgufType::kString).strs) {
      // llama.cpp splits at the first space after the first byte.
      const size_t sp = m.find(' ', 1);
      if (sp == std::string::npos) bad(g.path(), "tokenizer.ggml.merges entry '" + m + "' has no space");
      p.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    return std::make_unique<BpeTokenizer>(gguf_vocabulary(g), std::move(p));
  }
  throw Error(ErrorKind::kUnsupported, g.path() + ": tokenizer model '" + model + "' is not supported (llama, gpt2)");
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    const fs::path json = fs::path(path) / "tokenizer.json";
    if (fs::exists(json, ec)) return load_hf_tokenizer(json.string());
    // A HF folder converted to GGUF is not expected here; say what we looked for.
    throw Error(ErrorKind::kIo, path + ": no tokenizer.json in this folder");
  }
  char magic[4] = {};
  {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw Error(ErrorKind::kIo, path + ": cannot open");
    f.read(magic, 4);
  }
  if (std::string_view(magic, 4) == "GGUF") return tokenizer_from_gguf(*GgufFile::open(path));
  if (path.ends_with(".json")) return load_hf_tokenizer(path);
  throw Error(ErrorKind::kFormat, path + ": not a tokenizer file this loader knows (a GGUF, a tokenizer.json, or a folder with tokenizer.json)");
}

}  // namespace kvcache
