// Hugging Face tokenizer.json (the `tokenizers` library's serialisation) -> BpeTokenizer.
// Supported: model.type "BPE" (byte_fallback, unk_token, fuse_unk, ignore_merges), either
// byte-level — a ByteLevel pre-tokenizer step (add_prefix_space, use_regex: GPT-2's regex) — or
// SentencePiece-style (no ByteLevel step: Metaspace, or no pre-tokenizer at all as Llama 2's
// tokenizer.json); the pre-tokenizers Split (any regex or string, any behavior, invert), Digits,
// Punctuation, Whitespace, WhitespaceSplit, Metaspace and ByteLevel, alone or in a Sequence, run
// by model/pretokenizer.h; the normalizers Sequence, Replace, Prepend, NFC, NFD, NFKC, NFKD,
// Lowercase, Strip and StripAccents (Unicode through ICU, model/unicode_text.h); and the decoders
// ByteLevel, Metaspace, Replace, ByteFallback, Fuse and Strip, applied per token (see
// parse_decoder). Everything else is refused with an Error naming the field, so a tokenizer we
// cannot reproduce never silently produces other ids.
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
#include "model/tokenizer_spm.h"
#include "model/unicode.h"
#include "model/unicode_text.h"

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

// Refuses a field the loader would otherwise ignore: `what` names the object ("pre_tokenizer
// Metaspace"), `known` lists the fields it reads or that change nothing for encoding.
void check_keys(const json& obj, const std::string& path, const std::string& what,
                std::initializer_list<const char*> known) {
  for (const auto& [key, value] : obj.items()) {
    if (key == "type") continue;
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    if (!ok) unsupported(path, what + " field '" + key + "' is not supported");
  }
}

// A JSON string holding exactly one character (a Rust `char` field of the tokenizers library).
std::string one_char(const json& obj, const char* key, const std::string& path,
                     const std::string& what) {
  if (!obj.contains(key) || !obj[key].is_string())
    bad(path, what + " needs a one-character string \"" + key + "\"");
  const std::string c = obj[key].get<std::string>();
  if (utf8_to_codepoints(c).size() != 1)
    bad(path, what + " " + key + " '" + c + "' must be exactly one character");
  return c;
}

// Metaspace's prepend scheme (pre_tokenizers/metaspace.rs): "prepend_scheme" (default always);
// the older "add_prefix_space": false means never, and contradicts any other declared scheme.
enum class Prepend { kAlways, kFirst, kNever };
Prepend metaspace_prepend(const json& m, const std::string& path, const std::string& what) {
  Prepend p = Prepend::kAlways;
  if (m.contains("prepend_scheme")) {
    const std::string s = m["prepend_scheme"].get<std::string>();
    if (s == "always")
      p = Prepend::kAlways;
    else if (s == "first")
      p = Prepend::kFirst;
    else if (s == "never")
      p = Prepend::kNever;
    else
      unsupported(path, what + " prepend_scheme '" + s + "' is not one of first, always, never");
  }
  if (m.contains("add_prefix_space") && !m["add_prefix_space"].get<bool>()) {
    if (m.contains("prepend_scheme") && p != Prepend::kNever)
      bad(path, what + " add_prefix_space=false contradicts prepend_scheme");
    p = Prepend::kNever;
  }
  return p;
}

// What the pre-tokenizer steps met so far imply for the rest of the file.
struct PreState {
  bool byte_level = false;  // a ByteLevel step: byte-level BPE, GPT-2 alphabet
  bool metaspace = false;   // a Metaspace step
};

// Appends the split rules of one pre-tokenizer of the tokenizers library
// (tokenizers/src/pre_tokenizers/*.rs); sets byte_level when a ByteLevel step is met.
void add_pre_tokenizer(const json& pre, const std::string& path, std::vector<SplitRule>& rules,
                       PreState& st) {
  if (!pre.is_object()) unsupported(path, "pre_tokenizer must be an object with a \"type\"");
  const std::string type = pre.value("type", std::string());
  const bool& byte_level = st.byte_level;
  if (type == "Sequence") {
    if (!pre.contains("pretokenizers") || !pre["pretokenizers"].is_array())
      bad(path, "pre_tokenizer Sequence needs a \"pretokenizers\" list");
    for (const json& p : pre["pretokenizers"]) add_pre_tokenizer(p, path, rules, st);
  } else if (type == "ByteLevel") {
    // byte_level.rs: each piece not starting with ' ' gains one (add_prefix_space), then GPT-2's
    // regex splits it (use_regex). trim_offsets only moves offsets.
    check_keys(pre, path, "pre_tokenizer ByteLevel",
               {"add_prefix_space", "trim_offsets", "use_regex"});
    if (byte_level) unsupported(path, "a second ByteLevel pre-tokenizer is not supported");
    if (st.metaspace) unsupported(path, "ByteLevel together with Metaspace is not supported");
    st.byte_level = true;
    if (pre.value("add_prefix_space", false)) {
      SplitRule r;
      r.edit = PieceEdit{"", " ", false};
      rules.push_back(std::move(r));
    }
    if (pre.value("use_regex", true)) rules.push_back(SplitRule{std::string(kGpt2Regex)});
  } else if (type == "Metaspace") {
    // metaspace.rs: in each piece every ' ' becomes the replacement, the replacement is
    // prepended per prepend_scheme (first: only at offset 0 of the input) unless the piece starts
    // with it, and with split (default true) the piece is cut before each replacement
    // (MergedWithNext).
    check_keys(pre, path, "pre_tokenizer Metaspace",
               {"replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
    if (byte_level) unsupported(path, "Metaspace after ByteLevel is not supported");
    if (st.metaspace) unsupported(path, "a second Metaspace pre-tokenizer is not supported");
    st.metaspace = true;
    const std::string rep = one_char(pre, "replacement", path, "pre_tokenizer Metaspace");
    const Prepend scheme = metaspace_prepend(pre, path, "pre_tokenizer Metaspace");
    SplitRule edit;
    edit.edit = PieceEdit{rep, scheme == Prepend::kNever ? "" : rep, scheme == Prepend::kFirst};
    rules.push_back(std::move(edit));
    if (pre.value("split", true)) {
      SplitRule r{rep, true, SplitBehavior::kMergedWithNext};
      rules.push_back(std::move(r));
    }
  } else if (type == "Whitespace") {
    // whitespace.rs: the matches of \w+|[^\w\s]+ (Rust regex, Unicode: \w is Alphabetic, Mark,
    // Decimal_Number, Connector_Punctuation, Join_Control; \s is White_Space), the rest removed.
    check_keys(pre, path, "pre_tokenizer Whitespace", {});
    if (byte_level) unsupported(path, "Whitespace after ByteLevel is not supported");
    const std::string w = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}";
    SplitRule r{"[" + w + "]+|[^" + w + "\\s]+"};
    r.behavior = SplitBehavior::kRemoved;
    r.invert = true;
    rules.push_back(std::move(r));
  } else if (type == "WhitespaceSplit") {
    // whitespace.rs: cut at each char::is_whitespace (White_Space) character, which is removed.
    check_keys(pre, path, "pre_tokenizer WhitespaceSplit", {});
    if (byte_level) unsupported(path, "WhitespaceSplit after ByteLevel is not supported");
    SplitRule r{"\\s"};
    r.behavior = SplitBehavior::kRemoved;
    rules.push_back(std::move(r));
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
                          "' is not supported (ByteLevel, Metaspace, Split, Digits, Punctuation, "
                          "Whitespace, WhitespaceSplit, Sequence)");
  }
}

// A null or absent pre_tokenizer keeps each stretch of text whole (Llama 2's tokenizer.json).
std::shared_ptr<const PreTokenizer> parse_pre_tokenizer(const json& pre, const std::string& path,
                                                        PreState& st) {
  std::vector<SplitRule> rules;
  if (!pre.is_null()) add_pre_tokenizer(pre, path, rules, st);
  return std::make_shared<const PreTokenizer>(path + " pre_tokenizer", std::move(rules),
                                              RegexDialect::kHuggingFace);
}

// The pattern of a Replace step (normalizer or decoder, tokenizers' replace.rs): a literal
// "String" or a "Regex".
SplitRule replace_pattern(const json& pat, const std::string& path, const char* step) {
  SplitRule r;
  if (pat.contains("String")) {
    r.pattern = pat["String"].get<std::string>();
    r.literal = true;
  } else if (pat.contains("Regex")) {
    r.pattern = pat["Regex"].get<std::string>();
  } else {
    bad(path, std::string(step) + " Replace pattern needs \"Regex\" or \"String\"");
  }
  return r;
}

// Appends the text edits of one normalizer (tokenizers/src/normalizers/*.rs) that this loader
// implements: Sequence, Replace, Prepend, NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents.
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
    SplitRule r = replace_pattern(n.at("pattern"), path, "normalizer");
    const std::string content = n.at("content").get<std::string>();
    // The matches are what the split removes; the pieces between them are rejoined with the
    // replacement wherever a match stood.
    r.behavior = SplitBehavior::kContiguous;
    auto finder = std::make_shared<const PreTokenizer>(
        path + " normalizer Replace", std::vector<SplitRule>{r}, RegexDialect::kHuggingFace);
    out.emplace_back(
        [finder, content](std::string_view t) { return finder->replace_matches(t, content); });
  } else if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    // unicode.rs: the whole text in that form (UAX #15).
    check_keys(n, path, "normalizer " + type, {});
    const UnicodeForm form = type == "NFC"    ? UnicodeForm::kNfc
                             : type == "NFD"  ? UnicodeForm::kNfd
                             : type == "NFKC" ? UnicodeForm::kNfkc
                                              : UnicodeForm::kNfkd;
    out.emplace_back([form](std::string_view t) { return unicode_normalize(t, form); });
  } else if (type == "Lowercase") {
    // utils.rs -> NormalizedString::lowercase: char::to_lowercase of each character alone.
    check_keys(n, path, "normalizer Lowercase", {});
    out.emplace_back(unicode_lowercase_chars);
  } else if (type == "StripAccents") {
    // strip.rs: drops every character is_combining_mark accepts (General_Category Mark).
    check_keys(n, path, "normalizer StripAccents", {});
    out.emplace_back(unicode_strip_marks);
  } else if (type == "Strip") {
    // strip.rs: trims char::is_whitespace characters at the left and/or right end.
    check_keys(n, path, "normalizer Strip", {"strip_left", "strip_right"});
    const bool left = n.at("strip_left").get<bool>(), right = n.at("strip_right").get<bool>();
    out.emplace_back(
        [left, right](std::string_view t) { return unicode_strip_whitespace(t, left, right); });
  } else {
    unsupported(path, "normalizer '" + type +
                          "' is not supported (Sequence, Replace, Prepend, NFC, NFD, NFKC, NFKD, "
                          "Lowercase, Strip, StripAccents)");
  }
}

// The tokenizer.json decoder (tokenizers/src/decoders/*.rs) as this loader applies it: to one
// token at a time, since Tokenizer::decode(id) is per token and concatenated pieces must be the
// text. Fuse (joining the tokens) is then implicit. What acts on the whole text — Strip of one
// leading ' ' after Fuse (Llama 2), Metaspace's dropping of the first token's replacement with a
// prepend scheme — is done as SentencePiece's is here: piece_after() drops the leading space of
// the piece after BOS (drop_first_space). Two documented differences from the library: ByteFallback
// turns each <0xNN> token into its byte (the library writes U+FFFD per byte of a run that is not
// valid UTF-8), and the Metaspace decoder's first token loses one leading space, not every
// replacement in it.
struct DecoderPlan {
  bool byte_level = false;        // the ByteLevel decoder: GPT-2's alphabet back to bytes
  bool drop_first_space = false;  // see above
  bool fused = false;             // a Fuse was met: later steps see the whole text
  std::vector<std::function<std::string(const std::string&)>> steps;  // per token, in order
};

void add_decoder(const json& d, const std::string& path, DecoderPlan& plan) {
  if (!d.is_object()) unsupported(path, "decoder must be an object with a \"type\"");
  const std::string type = d.value("type", std::string());
  if (type == "Sequence") {
    if (!d.contains("decoders") || !d["decoders"].is_array())
      bad(path, "decoder Sequence needs a \"decoders\" list");
    for (const json& e : d["decoders"]) add_decoder(e, path, plan);
  } else if (type == "ByteLevel") {
    check_keys(d, path, "decoder ByteLevel", {"add_prefix_space", "trim_offsets", "use_regex"});
    plan.byte_level = true;
  } else if (type == "ByteFallback") {
    // byte_fallback.rs: a token "<0xNN>" stands for the byte NN.
    check_keys(d, path, "decoder ByteFallback", {});
    if (plan.fused) unsupported(path, "decoder ByteFallback after Fuse is not supported");
    plan.steps.emplace_back([](const std::string& t) {
      const int b = spm_byte_token_value(t);
      return b < 0 ? t : std::string(1, static_cast<char>(b));
    });
  } else if (type == "Fuse") {
    check_keys(d, path, "decoder Fuse", {});
    plan.fused = true;
  } else if (type == "Replace") {
    // replace.rs (Decoder): every match of the pattern in a token becomes `content`. Per token
    // equals on the fused text only when no match can span two tokens: one character.
    check_keys(d, path, "decoder Replace", {"pattern", "content"});
    SplitRule r = replace_pattern(d.at("pattern"), path, "decoder");
    if (plan.fused && !(r.literal && utf8_to_codepoints(r.pattern).size() == 1))
      unsupported(path, "decoder Replace after Fuse is supported only for a one-character String");
    r.behavior = SplitBehavior::kContiguous;
    const std::string content = d.at("content").get<std::string>();
    auto finder = std::make_shared<const PreTokenizer>(
        path + " decoder Replace", std::vector<SplitRule>{r}, RegexDialect::kHuggingFace);
    plan.steps.emplace_back(
        [finder, content](const std::string& t) { return finder->replace_matches(t, content); });
  } else if (type == "Strip") {
    // strip.rs: up to `start` leading and `stop` trailing `content` characters removed.
    check_keys(d, path, "decoder Strip", {"content", "start", "stop"});
    const std::string c = one_char(d, "content", path, "decoder Strip");
    const int64_t start = d.at("start").get<int64_t>(), stop = d.at("stop").get<int64_t>();
    if (start < 0 || stop < 0) bad(path, "decoder Strip start and stop must be >= 0");
    if (plan.fused) {
      // On the fused text: only its beginning can be honoured (after BOS, see above).
      if (stop != 0 || start > 1 || (start == 1 && c != " "))
        unsupported(path,
                    "decoder Strip after Fuse is supported only as content ' ', start 1, stop 0");
      if (start == 1) plan.drop_first_space = true;
      return;
    }
    plan.steps.emplace_back([c, start, stop](const std::string& t) {
      std::string_view v = t;
      for (int64_t i = 0; i < start && v.starts_with(c); ++i) v.remove_prefix(c.size());
      for (int64_t i = 0; i < stop && v.ends_with(c); ++i) v.remove_suffix(c.size());
      return std::string(v);
    });
  } else if (type == "Metaspace") {
    // metaspace.rs (Decoder): the replacement becomes ' '.
    check_keys(d, path, "decoder Metaspace",
               {"replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
    if (plan.fused) unsupported(path, "decoder Metaspace after Fuse is not supported");
    const std::string rep = one_char(d, "replacement", path, "decoder Metaspace");
    if (metaspace_prepend(d, path, "decoder Metaspace") != Prepend::kNever)
      plan.drop_first_space = true;
    plan.steps.emplace_back([rep](const std::string& t) {
      std::string out;
      for (size_t i = 0; i < t.size();) {
        if (t.compare(i, rep.size(), rep) == 0) {
          out += ' ';
          i += rep.size();
        } else {
          out += t[i++];
        }
      }
      return out;
    });
  } else {
    unsupported(path, "decoder '" + type +
                          "' is not supported (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, "
                          "Strip, Sequence)");
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
  if (model.value("end_of_word_suffix", json()).is_string() &&
      !model["end_of_word_suffix"].get<std::string>().empty()) {
    unsupported(path, "end_of_word_suffix is not supported");
  }
  // models/bpe/model.rs: a dropout of None or 0 is deterministic; any other samples merges.
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      model["dropout"].get<double>() != 0.0) {
    unsupported(path, "BPE dropout is not supported (it makes encoding random)");
  }
  BpeParams p;
  p.kind = "hf-bpe";
  PreState pre_state;
  p.pre = parse_pre_tokenizer(j.value("pre_tokenizer", json()), path, pre_state);
  p.byte_level = pre_state.byte_level;
  if (j.contains("normalizer") && !j["normalizer"].is_null())
    add_normalizer(j["normalizer"], path, p.normalizers);
  p.ignore_merges = model.value("ignore_merges", false);
  p.byte_fallback = model.value("byte_fallback", false);
  p.fuse_unk = model.value("fuse_unk", false);

  DecoderPlan dec;
  if (j.contains("decoder") && !j["decoder"].is_null()) {
    add_decoder(j["decoder"], path, dec);
  } else if (p.byte_level) {
    dec.byte_level = true;  // the only decoding a byte-level vocabulary has
  } else {
    unsupported(path,
                "no decoder: a tokenizer.json without a ByteLevel pre-tokenizer needs one "
                "(Metaspace, or Replace/ByteFallback/Fuse/Strip)");
  }
  if (dec.byte_level != p.byte_level) {
    unsupported(path, p.byte_level ? "a ByteLevel pre-tokenizer needs the ByteLevel decoder"
                                   : "the ByteLevel decoder needs a ByteLevel pre-tokenizer");
  }
  if (dec.byte_level && !dec.steps.empty())
    unsupported(path, "the ByteLevel decoder together with other decoders is not supported");
  if (!p.byte_level) {
    p.kind = "hf-bpe-spm";
    p.decode_text = [steps = dec.steps](const std::string& t) {
      std::string s = t;
      for (const auto& f : steps) s = f(s);
      return s;
    };
  }
  p.drop_space_after_bos = dec.drop_first_space;

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
  if (model.contains("unk_token") && !model["unk_token"].is_null()) {
    const std::string unk = model["unk_token"].get<std::string>();
    p.unk = v.find(unk);
    if (p.unk < 0) bad(path, "model.unk_token '" + unk + "' is not in the vocabulary");
    v.unk = p.unk;
  }
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
