// Hugging Face tokenizer.json (the `tokenizers` library's serialisation) -> BpeTokenizer.
// Supported: model.type "BPE" with byte-level pre-tokenization — pre_tokenizer ByteLevel
// (use_regex: GPT-2's regex) or Sequence[Split(GPT-2 or Llama 3 regex), ByteLevel(use_regex
// false)] — and no normalizer. Everything else is refused with an Error naming the field, so a
// tokenizer we cannot reproduce never silently produces different ids.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "model/config_limits.h"
#include "model/tokenizer.h"
#include "model/tokenizer_bpe.h"

namespace kvcache {

namespace {

using nlohmann::json;

// The two regexes, as the tokenizers library writes them into tokenizer.json.
constexpr std::string_view kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ": " + what);
}
[[noreturn]] void unsupported(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kUnsupported, path + ": " + what);
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::kIo, path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

json parse_json(const std::string& text, const std::string& source) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    bad(source, std::string("invalid JSON: ") + e.what());
  }
}

// Returns the pre-tokenizer regex kind; checks the ByteLevel parts.
BpePreTokenizer parse_pre_tokenizer(const json& pre, const std::string& path) {
  if (!pre.is_object())
    unsupported(path, "pre_tokenizer must be ByteLevel or Sequence[Split, ByteLevel]");
  const std::string type = pre.value("type", std::string());
  auto check_byte_level = [&](const json& bl, bool regex_expected) {
    if (bl.value("add_prefix_space", false))
      unsupported(path, "ByteLevel add_prefix_space=true is not supported");
    if (bl.value("use_regex", true) != regex_expected) {
      unsupported(path, regex_expected ? "ByteLevel without use_regex needs a Split before it"
                                       : "ByteLevel use_regex after a Split is not supported");
    }
  };
  if (type == "ByteLevel") {
    check_byte_level(pre, true);
    return BpePreTokenizer::kGpt2;
  }
  if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
      pre["pretokenizers"].size() == 2) {
    const json& split = pre["pretokenizers"][0];
    const json& bl = pre["pretokenizers"][1];
    if (split.value("type", std::string()) == "Split" &&
        bl.value("type", std::string()) == "ByteLevel" && split.contains("pattern") &&
        split["pattern"].is_object() && split["pattern"].contains("Regex") &&
        split.value("behavior", std::string()) == "Isolated" && !split.value("invert", false)) {
      check_byte_level(bl, false);
      const std::string re = split["pattern"]["Regex"].get<std::string>();
      if (re == kGpt2Regex) return BpePreTokenizer::kGpt2;
      if (re == kLlama3Regex) return BpePreTokenizer::kLlama3;
      unsupported(path,
                  "pre_tokenizer Split regex '" + re + "' is not supported (GPT-2's or Llama 3's)");
    }
  }
  unsupported(path, "pre_tokenizer '" + type +
                        "' is not supported (ByteLevel, or Sequence[Split, ByteLevel])");
}

std::string token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

}  // namespace

namespace {
std::unique_ptr<Tokenizer> parse_hf_tokenizer_unchecked(const std::string& text,
                                                        const std::string& config_text,
                                                        const std::string& path) {
  const json j = parse_json(text, path);
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    bad(path, "no \"model\" object: not a tokenizer.json");
  const json& model = j["model"];
  const std::string type = model.value("type", std::string("BPE"));
  if (type != "BPE") unsupported(path, "model type '" + type + "' is not supported (BPE)");
  if (j.contains("normalizer") && !j["normalizer"].is_null()) {
    unsupported(path,
                "a normalizer is not supported (SentencePiece-style tokenizer.json; use the "
                "model's GGUF vocabulary)");
  }
  if (model.value("continuing_subword_prefix", json()).is_string() &&
      !model["continuing_subword_prefix"].get<std::string>().empty()) {
    unsupported(path, "continuing_subword_prefix is not supported");
  }
  BpeParams p;
  p.kind = "hf-bpe";
  p.pre = parse_pre_tokenizer(j.value("pre_tokenizer", json()), path);
  p.ignore_merges = model.value("ignore_merges", false);

  if (!model.contains("vocab") || !model["vocab"].is_object())
    bad(path, "model.vocab must be an object");
  Vocabulary v;
  // Ids size the vocabulary, so they are checked first: below config_limits' vocabulary bound,
  // and below the file's length in bytes — every token takes bytes of its own, so a larger id
  // leaves a gap the file cannot fill (a 2 KB file with id 16,655,367 sized 16.6M tokens).
  const int64_t max_vocab = std::min<int64_t>(config_count_limit(ConfigCount::kVocab).max,
                                              static_cast<int64_t>(text.size()));
  auto put = [&](const std::string& token, int64_t id, TokenType t) {
    if (id < 0 || id >= max_vocab) {
      bad(path, "token id " + std::to_string(id) + " of '" + token +
                    "' is out of range: ids must be below " + std::to_string(max_vocab) +
                    " (the vocabulary limit, and the file's " + std::to_string(text.size()) +
                    " bytes)");
    }
    if (static_cast<size_t>(id) >= v.tokens.size()) {
      v.tokens.resize(static_cast<size_t>(id) + 1);
      v.types.resize(static_cast<size_t>(id) + 1, TokenType::kUnused);
    }
    v.tokens[static_cast<size_t>(id)] = token;
    v.types[static_cast<size_t>(id)] = t;
  };
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer())
      bad(path, "model.vocab entry '" + text + "' must map to an integer id");
    put(text, id.get<int64_t>(), TokenType::kNormal);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      // An id must be a JSON integer: a number beyond int64 parses as a double, and converting
      // that was undefined behaviour (found by fuzz_hf_tokenizer).
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content")) {
        bad(path, "added_tokens entries need an integer id and a content");
      }
      put(a["content"].get<std::string>(), a["id"].get<int64_t>(),
          a.value("special", false) ? TokenType::kControl : TokenType::kUserDefined);
    }
  }
  if (!model.contains("merges") || !model["merges"].is_array())
    bad(path, "model.merges must be a list");
  for (const json& m : model["merges"]) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ', 1);
      if (sp == std::string::npos) bad(path, "merge '" + s + "' has no space");
      p.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      p.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      bad(path, "model.merges entries must be \"a b\" or [\"a\", \"b\"]");
    }
  }
  // BOS/EOS: tokenizer_config.json beside tokenizer.json names them by text.
  v.build_index();
  if (!config_text.empty()) {
    const json c =
        parse_json(config_text,
                   (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string());
    if (c.contains("bos_token")) v.bos = v.find(token_content(c["bos_token"]));
    if (c.contains("eos_token")) v.eos = v.find(token_content(c["eos_token"]));
  }
  return std::make_unique<BpeTokenizer>(std::move(v), std::move(p));
}
}  // namespace

// A field of the wrong JSON type (a number where a string belongs, ...) is bad input like any
// other: reported as Error(kFormat) naming the file, never as a raw library exception.
std::unique_ptr<Tokenizer> parse_hf_tokenizer(const std::string& text,
                                              const std::string& config_text,
                                              const std::string& source) {
  try {
    return parse_hf_tokenizer_unchecked(text, config_text, source);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kFormat,
                source + ": a field has the wrong JSON type (" + e.what() + ")");
  }
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  const std::filesystem::path cfg =
      std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  const std::string config_text =
      std::filesystem::exists(cfg, ec) ? read_text(cfg.string()) : std::string();
  return parse_hf_tokenizer(read_text(path), config_text, path);
}

}  // namespace kvcache
