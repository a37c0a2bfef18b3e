// Hugging Face tokenizer.json (the `tokenizers` library's serialisation) -> BpeTokenizer.
// Supported: model.type "BPE" with byte-level pre-tokenization — a pre_tokenizer of Split (any
// regex or string, any behavior, invert), Digits, Punctuation and ByteLevel (use_regex: GPT-2's
// regex) steps, alone or in a Sequence, run by model/pretokenizer.h — and the normalizers
// Sequence, Replace, Prepend and NFC (text below U+0300 only). Everything else is refused with an
// Error naming the field, so a tokenizer we cannot reproduce never silently produces other ids.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "model/config_limits.h"
#include "model/tokenizer.h"
#include "model/tokenizer_bpe.h"
#include "model/unicode.h"

namespace kvcache {

namespace {

using nlohmann::json;

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

SplitBehavior split_behavior(const std::string& b, const std::string& path) {
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  unsupported(path, "Split behavior '" + b +
                        "' is not one of Isolated, Removed, MergedWithPrevious, MergedWithNext, "
                        "Contiguous");
}

// Appends the split rules of one pre-tokenizer of the tokenizers library
// (tokenizers/src/pre_tokenizers/*.rs); sets byte_level when a ByteLevel step is met.
void add_pre_tokenizer(const json& pre, const std::string& path, std::vector<SplitRule>& rules,
                       bool& byte_level) {
  if (!pre.is_object()) unsupported(path, "pre_tokenizer must be an object with a \"type\"");
  const std::string type = pre.value("type", std::string());
  if (type == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array())
      bad(path, "pre_tokenizer Sequence needs a \"pretokenizers\" list");
    for (const json& p : pre["pretokenizers"]) add_pre_tokenizer(p, path, rules, byte_level);
  } else if (type == "ByteLevel") {
    if (pre.value("add_prefix_space", false))
      unsupported(path, "ByteLevel add_prefix_space=true is not supported");
    if (byte_level) unsupported(path, "a second ByteLevel pre-tokenizer is not supported");
    byte_level = true;
    if (pre.value("use_regex", true)) rules.push_back(SplitRule{std::string(kGpt2Regex)});
  } else if (type == "Split") {
    if (byte_level) unsupported(path, "a Split after ByteLevel is not supported");
    if (!pre.contains("pattern") || !pre["pattern"].is_object())
      bad(path, "pre_tokenizer Split needs a \"pattern\" object");
    const json& pat = pre["pattern"];
    SplitRule r;
    if (pat.contains("Regex")) {
      r.pattern = pat["Regex"].get<std::string>();
    } else if (pat.contains("String")) {
      r.pattern = pat["String"].get<std::string>();
      r.literal = true;
    } else {
      bad(path, "pre_tokenizer Split pattern needs \"Regex\" or \"String\"");
    }
    r.behavior = split_behavior(pre.value("behavior", std::string()), path);
    r.invert = pre.value("invert", false);
    rules.push_back(std::move(r));
  } else if (type == "Digits") {
    // digits.rs: char::is_numeric (Unicode N), each digit alone or runs merged (Contiguous).
    if (byte_level) unsupported(path, "Digits after ByteLevel is not supported");
    rules.push_back(SplitRule{pre.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+"});
  } else if (type == "Punctuation") {
    // punctuation.rs: char::is_ascii_punctuation or Unicode P, each character alone.
    if (byte_level) unsupported(path, "Punctuation after ByteLevel is not supported");
    SplitRule r{"[\\p{P}!-/:-@\\[-`{-~]"};
    r.behavior = split_behavior(pre.value("behavior", std::string("Isolated")), path);
    rules.push_back(std::move(r));
  } else {
    unsupported(path, "pre_tokenizer '" + type +
                          "' is not supported (ByteLevel, Split, Digits, Punctuation, Sequence)");
  }
}

std::shared_ptr<const PreTokenizer> parse_pre_tokenizer(const json& pre, const std::string& path) {
  std::vector<SplitRule> rules;
  bool byte_level = false;
  add_pre_tokenizer(pre, path, rules, byte_level);
  if (!byte_level) {
    unsupported(path,
                "the pre_tokenizer has no ByteLevel step: only byte-level BPE tokenizer.json is "
                "supported");
  }
  return std::make_shared<const PreTokenizer>(path + " pre_tokenizer", std::move(rules),
                                              RegexDialect::kHuggingFace);
}

// NFC changes nothing in a text whose characters are all below U+0300: composition needs a
// combining character, and no character there has a singleton or excluded decomposition
// (UnicodeData.txt, CompositionExclusions.txt). Beyond that we would need the composition tables,
// which this build does not carry, so such a text is refused rather than tokenized unnormalized.
std::string nfc_checked(std::string_view text) {
  for (uint32_t cp : utf8_to_codepoints(text)) {
    if (cp >= 0x300) {
      throw Error(
          ErrorKind::kUnsupported,
          "this tokenizer.json normalizes to NFC, which is implemented only for text "
          "below U+0300; the text has U+" +
              [&] {
                char buf[16];
                std::snprintf(buf, sizeof buf, "%04X", cp);
                return std::string(buf);
              }() +
              " (use the model's GGUF vocabulary)");
    }
  }
  return std::string(text);
}

// Appends the text edits of one normalizer (tokenizers/src/normalizers/*.rs) that this loader
// implements: Sequence, Replace, Prepend, NFC (see nfc_checked).
void add_normalizer(const json& n, const std::string& path,
                    std::vector<std::function<std::string(std::string_view)>>& out) {
  if (!n.is_object()) unsupported(path, "normalizer must be an object with a \"type\"");
  const std::string type = n.value("type", std::string());
  if (type == "Sequence") {
    if (!n.contains("normalizers") || !n["normalizers"].is_array())
      bad(path, "normalizer Sequence needs a \"normalizers\" list");
    for (const json& m : n["normalizers"]) add_normalizer(m, path, out);
  } else if (type == "Prepend") {
    const std::string pre = n.at("prepend").get<std::string>();
    // prepend.rs: only a non-empty text gains the prefix.
    out.emplace_back(
        [pre](std::string_view t) { return t.empty() ? std::string() : pre + std::string(t); });
  } else if (type == "Replace") {
    const json& pat = n.at("pattern");
    SplitRule r;
    if (pat.contains("String")) {
      r.pattern = pat["String"].get<std::string>();
      r.literal = true;
    } else if (pat.contains("Regex")) {
      r.pattern = pat["Regex"].get<std::string>();
    } else {
      bad(path, "normalizer Replace pattern needs \"Regex\" or \"String\"");
    }
    const std::string content = n.at("content").get<std::string>();
    // The matches are what the split removes; the pieces between them are rejoined with the
    // replacement wherever a match stood.
    r.behavior = SplitBehavior::kContiguous;
    auto finder = std::make_shared<const PreTokenizer>(
        path + " normalizer Replace", std::vector<SplitRule>{r}, RegexDialect::kHuggingFace);
    out.emplace_back(
        [finder, content](std::string_view t) { return finder->replace_matches(t, content); });
  } else if (type == "NFC") {
    out.emplace_back(nfc_checked);
  } else {
    unsupported(path, "normalizer '" + type +
                          "' is not supported (Sequence, Replace, Prepend, NFC for text below "
                          "U+0300)");
  }
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
  if (model.value("continuing_subword_prefix", json()).is_string() &&
      !model["continuing_subword_prefix"].get<std::string>().empty()) {
    unsupported(path, "continuing_subword_prefix is not supported");
  }
  BpeParams p;
  p.kind = "hf-bpe";
  p.pre = parse_pre_tokenizer(j.value("pre_tokenizer", json()), path);
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    add_normalizer(j["normalizer"], path, p.normalizers);
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
