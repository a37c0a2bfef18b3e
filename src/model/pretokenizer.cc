#include "model/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>

#include "core/error.h"
#include "model/unicode.h"

namespace kvcache {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  if (pcre2_get_error_message(code, buf, sizeof buf) < 0)
    return "PCRE2 error " + std::to_string(code);
  return std::string(reinterpret_cast<const char*>(buf));
}

// Rewrites what PCRE2 reads differently from the dialect the pattern was written for (see
// RegexDialect). Only escapes are touched; a class is tracked so that \s inside one gains U+0085
// as a member instead of becoming a nested class.
std::string translate(const std::string& p, RegexDialect dialect, const std::string& where) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      const bool ascii_digit = dialect == RegexDialect::kLlamaCpp && (e == 'd' || e == 'D');
      if (e == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (e == 'd' && ascii_digit) {
        out += in_class ? "0-9" : "[0-9]";
      } else if ((e == 'S' || ascii_digit) && in_class) {
        throw Error(ErrorKind::kUnsupported, where + ": \\" + std::string(1, e) +
                                                 " inside a character class is not supported");
      } else if (e == 'S') {
        out += "[^\\s\\x{85}]";
      } else if (e == 'D') {
        out += "[^0-9]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is a member
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t close = p.find(":]", i + 2);
      if (close != std::string::npos) {
        out.append(p, i, close + 2 - i);
        i = close + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

// Per-thread match state: PCRE2's match data and JIT stack must not be shared between threads
// that match at the same time; one set per thread serves every pattern (ovector of one pair: the
// splitter needs only the whole match).
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  // 32 KB grows on demand up to 8 MB: deep backtracking (tekken's repeated lookahead groups on a
  // long word) needs more than the default 32 KB.
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchScratch() {
    if (!data || !context || !stack)
      throw Error(ErrorKind::kInvalidArgument, "pre-tokenizer: cannot allocate PCRE2 match state");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

// Valid UTF-8 in PCRE2's sense: shortest forms, no surrogates, nothing above U+10FFFF.
bool valid_utf8(std::string_view s) {
  size_t i = 0;
  const size_t n = s.size();
  auto u = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  auto cont = [&](size_t k) { return k < n && (u(k) & 0xC0) == 0x80; };
  while (i < n) {
    const unsigned char b = u(i);
    if (b < 0x80) {
      ++i;
    } else if (b >= 0xC2 && b <= 0xDF && cont(i + 1)) {
      i += 2;
    } else if (b >= 0xE0 && b <= 0xEF && cont(i + 1) && cont(i + 2)) {
      const unsigned char b1 = u(i + 1);
      if ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 >= 0xA0)) return false;
      i += 3;
    } else if (b >= 0xF0 && b <= 0xF4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      const unsigned char b1 = u(i + 1);
      if ((b == 0xF0 && b1 < 0x90) || (b == 0xF4 && b1 >= 0x90)) return false;
      i += 4;
    } else {
      return false;
    }
  }
  return true;
}

struct Span {
  size_t begin;
  size_t end;
  bool match;
};

// Matches and the text between them, in order (llama.cpp's unicode_regex_split_stl; the
// tokenizers library's Split). The subject is the piece alone: lookarounds and $ stop at its
// ends, as std::regex_iterator over the piece does. An empty match is a boundary.
void find_spans(const pcre2_code* code, const char* piece, size_t len, MatchScratch& ms,
                std::vector<Span>& spans, const std::string& name) {
  spans.clear();
  const auto* s = reinterpret_cast<PCRE2_SPTR>(piece);
  size_t pos = 0, prev = 0;
  uint32_t opts = 0;
  while (pos <= len) {
    const int rc = pcre2_match(code, s, len, pos, opts | PCRE2_NO_UTF_CHECK, ms.data, ms.context);
    if (rc == PCRE2_ERROR_NOMATCH) {
      if (opts == 0 || pos >= len) break;
      // No non-empty match where the empty one was: step one character and search on.
      ++pos;
      while (pos < len && (static_cast<unsigned char>(s[pos]) & 0xC0) == 0x80) ++pos;
      opts = 0;
      continue;
    }
    if (rc < 0) {
      throw Error(ErrorKind::kInvalidArgument, "pre-tokenizer '" + name +
                                                   "': matching a piece of " + std::to_string(len) +
                                                   " bytes failed: " + pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(ms.data);
    const size_t m0 = ov[0], m1 = ov[1];
    if (m0 > prev) spans.push_back({prev, m0, false});
    spans.push_back({m0, m1, true});
    prev = m1;
    pos = m1;
    // After an empty match, first try a non-empty one at the same place.
    opts = m0 == m1 ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    if (m0 == m1 && m1 == len) break;
  }
  if (prev < len) spans.push_back({prev, len, false});
}

// What split() matches and cuts from (see there).
struct Subject {
  std::string out_buf, subject_buf;
  std::string_view out, subject;
  explicit Subject(std::string_view text) : out(text), subject(text) {
    if (valid_utf8(text)) return;
    for (uint32_t cp : utf8_to_codepoints(text)) {
      append_utf8(out_buf, cp);
      append_utf8(subject_buf, cp >= 0xD800 && cp <= 0xDFFF ? 0xFFFF
                               : cp > 0x10FFFF              ? 0x10FFFF
                                                            : cp);
    }
    out = out_buf;
    subject = subject_buf;
  }
  Subject(const Subject&) = delete;
  Subject& operator=(const Subject&) = delete;
};

}  // namespace

struct PreTokenizer::Compiled {
  pcre2_code* code = nullptr;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  std::optional<PieceEdit> edit;  // set: no code, the step edits pieces
  ~Compiled() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer(std::string name, std::vector<SplitRule> rules, RegexDialect dialect)
    : name_(std::move(name)) {
  for (const SplitRule& r : rules) {
    if (r.edit) {
      auto c = std::make_unique<Compiled>();
      c->edit = r.edit;
      rules_.push_back(std::move(c));
      continue;
    }
    const std::string where = "pre-tokenizer '" + name_ + "' pattern '" + r.pattern + "'";
    // Capturing groups are only grouping here: without captures PCRE2 tracks less per match.
    uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_AUTO_CAPTURE;
    if (dialect == RegexDialect::kLlamaCpp) options |= PCRE2_DOLLAR_ENDONLY;  // ECMAScript $
    if (r.literal) options = PCRE2_UTF | PCRE2_LITERAL;
    const std::string pattern = r.literal ? r.pattern : translate(r.pattern, dialect, where);
    int err = 0;
    PCRE2_SIZE err_at = 0;
    auto c = std::make_unique<Compiled>();
    c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options,
                            &err, &err_at, nullptr);
    if (!c->code) {
      throw Error(ErrorKind::kInvalidArgument, where + " does not compile at offset " +
                                                   std::to_string(err_at) + ": " +
                                                   pcre2_message(err));
    }
    if (const int jit = pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE); jit != 0) {
      if (jit_) {
        std::fprintf(
            stderr, "kvcache: PCRE2 JIT unavailable (%s); %s runs in PCRE2's interpreter, slower\n",
            pcre2_message(jit).c_str(), where.c_str());
      }
      jit_ = false;
    }
    c->behavior = r.behavior;
    c->invert = r.invert;
    rules_.push_back(std::move(c));
  }
}

PreTokenizer::~PreTokenizer() = default;

namespace {

// One PieceEdit on a piece's text (the same edit applies to the text cut from and the text
// matched: both hold ' ' at the same places).
std::string edited(std::string_view piece, const PieceEdit& e, bool at_start) {
  std::string t;
  if (e.space_to.empty()) {
    t = piece;
  } else {
    for (char c : piece) {
      if (c == ' ')
        t += e.space_to;
      else
        t += c;
    }
  }
  // NormalizedString::prepend does nothing to an empty text (tokenizer/normalizer.rs).
  if (!e.prefix.empty() && !t.empty() && !t.starts_with(e.prefix) &&
      (at_start || !e.prefix_at_start_only))
    t.insert(0, e.prefix);
  return t;
}

}  // namespace

std::vector<std::string> PreTokenizer::split(std::string_view text, bool at_start) const {
  // `out` is the text the pieces are cut from; `subject` the text matched. They differ only for
  // invalid UTF-8: `out` re-encodes llama.cpp's lenient decoding (U+FFFD per bad byte; surrogates
  // and codepoints above U+10FFFF kept bit for bit, as llama.cpp's decoder keeps them), while
  // `subject` puts a same-length unassigned codepoint in place of what PCRE2 cannot read.
  const Subject subj(text);
  std::string_view out = subj.out, subject = subj.subject;
  // After a PieceEdit the pieces live in these (out, subject) buffers instead.
  std::string edit_out, edit_subject;
  MatchScratch& ms = scratch();
  std::vector<std::pair<size_t, size_t>> pieces;
  if (!subject.empty()) pieces.emplace_back(0, subject.size());
  // Whether the first piece starts where the input starts (the tokenizers library's
  // `offsets_original().0 == 0`): it stays so while every step keeps the first piece's head.
  bool first_at_start = at_start;
  std::vector<std::pair<size_t, size_t>> next;
  std::vector<Span> spans;
  for (const auto& rule : rules_) {
    next.clear();
    if (rule->edit) {
      std::string new_out, new_subject;
      for (size_t k = 0; k < pieces.size(); ++k) {
        const auto [b, e] = pieces[k];
        const bool starts = k == 0 && first_at_start;
        const size_t begin = new_out.size();
        new_out += edited(out.substr(b, e - b), *rule->edit, starts);
        new_subject += edited(subject.substr(b, e - b), *rule->edit, starts);
        next.emplace_back(begin, new_out.size());
      }
      edit_out.swap(new_out);
      edit_subject.swap(new_subject);
      out = edit_out;
      subject = edit_subject;
      pieces.swap(next);
      continue;
    }
    for (const auto& [b, e] : pieces) {
      // Matches and the text between them, in order (llama.cpp's unicode_regex_split_stl; the
      // tokenizers library's Split). The subject is the piece alone: lookarounds and $ stop at
      // its ends, as std::regex_iterator over the piece does.
      find_spans(rule->code, subject.data() + b, e - b, ms, spans, name_);
      if (rule->invert)
        for (Span& sp : spans) sp.match = !sp.match;
      // The tokenizers library's SplitDelimiterBehavior (tokenizers/src/tokenizer/normalizer.rs,
      // NormalizedString::split).
      std::vector<std::pair<size_t, size_t>> got;
      bool prev_match = false;
      switch (rule->behavior) {
        case SplitBehavior::kIsolated:
          for (const Span& sp : spans) got.emplace_back(sp.begin, sp.end);
          break;
        case SplitBehavior::kRemoved:
          for (const Span& sp : spans)
            if (!sp.match) got.emplace_back(sp.begin, sp.end);
          break;
        case SplitBehavior::kMergedWithPrevious:
          for (const Span& sp : spans) {
            if (sp.match && !prev_match && !got.empty())
              got.back().second = sp.end;
            else
              got.emplace_back(sp.begin, sp.end);
            prev_match = sp.match;
          }
          break;
        case SplitBehavior::kMergedWithNext:
          for (size_t k = spans.size(); k-- > 0;) {
            const Span& sp = spans[k];
            if (sp.match && !prev_match && !got.empty())
              got.back().first = sp.begin;
            else
              got.emplace_back(sp.begin, sp.end);
            prev_match = sp.match;
          }
          std::reverse(got.begin(), got.end());
          break;
        case SplitBehavior::kContiguous:
          for (size_t k = 0; k < spans.size(); ++k) {
            if (k > 0 && spans[k].match == prev_match)
              got.back().second = spans[k].end;
            else
              got.emplace_back(spans[k].begin, spans[k].end);
            prev_match = spans[k].match;
          }
          break;
      }
      for (const auto& [gb, ge] : got)
        if (ge > gb) next.emplace_back(b + gb, b + ge);
    }
    if (!pieces.empty() && (next.empty() || next.front().first != pieces.front().first))
      first_at_start = false;
    pieces.swap(next);
  }
  std::vector<std::string> result;
  result.reserve(pieces.size());
  for (const auto& [b, e] : pieces) result.emplace_back(out.substr(b, e - b));
  return result;
}

std::string PreTokenizer::replace_matches(std::string_view text, const std::string& with) const {
  const Subject subj(text);
  if (rules_.empty()) return std::string(subj.out);
  if (rules_[0]->edit) {
    throw Error(ErrorKind::kInvalidArgument,
                "pre-tokenizer '" + name_ + "': replace_matches needs a pattern, not a piece edit");
  }
  std::vector<Span> spans;
  find_spans(rules_[0]->code, subj.subject.data(), subj.subject.size(), scratch(), spans, name_);
  std::string out;
  out.reserve(subj.out.size());
  for (const Span& sp : spans) {
    if (sp.match)
      out += with;
    else
      out += subj.out.substr(sp.begin, sp.end - sp.begin);
  }
  return out;
}

namespace {

// llama.cpp's pre-tokenizers: src/llama-vocab.cpp, llama_vocab::impl::load (tokenizer.ggml.pre
// name -> LLAMA_VOCAB_PRE_TYPE_*, and which set ignore_merges) and llm_tokenizer_bpe's constructor
// (pre type -> regex list), as of ngxson/llama.cpp 3f545bec. The strings are llama.cpp's, in
// C++ escaping. Types llama.cpp runs through a hand-written splitter (src/unicode.cpp,
// unicode_regex_split_custom) are given here as the regex that splitter implements.
struct PreRow {
  std::vector<const char*> names;
  std::vector<const char*> regexes;
  bool ignore_merges = false;
};

// The table is left as written: clang-format splits its UTF-8 literals differently on every run.
// clang-format off
constexpr const char* kGpt2 =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{"
    "N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{"
    "N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kPoro = " ?[^(\\s|.,!?…。，、।۔،)]+";
constexpr const char* kGpt4o =
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|"
    "'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])(["
    "^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// unicode_regex_split_custom_afmoe: a run of digits splits into groups of three counted from its
// end (1234567 -> 1 234 567); also what llama.cpp runs for tiny_aya's "\d{1,3}(?=(?:\d{3})*\b)".
constexpr const char* kDigitsFromTheRight = "\\p{N}{1,3}(?=(?:\\p{N}{3})*(?!\\p{N}))";
constexpr const char* kNewlines = "[^\\n]+|[\\n]+";

const std::vector<PreRow>& pre_rows() {
  static const std::vector<PreRow> rows = {
      {{"default"}, {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
        "jina-v5-nano"},
       {kLlama3},
       true},
      {{"dbrx", "smaug-bpe", "glm4", "chatglm-bpe"}, {kLlama3}},
      {{"jais-2"},
       {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
        "\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|"
        "\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|"
        "\\s{1,2}(?!\\S)|\\s{1}"}},
      {{"minicpm5"},
       {"\\p{N}{1,3}",
        "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
        "\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       true},
      {{"deepseek-llm"},
       {"[\r\n]",
        // Written with \u escapes: the literal characters include some (U+1FD3, U+2126, ...) that
        // text tools normalize to other codepoints.
        "\\s?[A-Za-z\u00B5\u00C0-\u00D6\u00D8-\u00F6\u00F8-\u01BA\u01BC-\u01BF\u01C4-\u0293\u0295"
        "-\u02AF\u0370-\u0373\u0376\u0377\u037B-\u037D\u037F\u0386\u0388-\u038A\u038C\u038E-"
        "\u03A1\u03A3-\u03F5\u03F7-\u0481\u048A-\u052F\u0531-\u0556\u10A0-\u10C5\u13A0-\u13F5"
        "\u13F8-\u13FD\u1C90-\u1CBA\u1CBD-\u1CBF\u1D00-\u1D2B\u1D6B-\u1D77\u1D79-\u1D9A\u1E00-"
        "\u1F15\u1F18-\u1F1D\u1F20-\u1F45\u1F48-\u1F4D\u1F50-\u1F57\u1F59\u1F5B\u1F5D\u1F5F-"
        "\u1F7D\u1F80-\u1FB4\u1FB6-\u1FBC\u1FBE\u1FC2-\u1FC4\u1FC6-\u1FCC\u1FD0-\u1FD3\u1FD6-"
        "\u1FDB\u1FE0-\u1FEC\u1FF2-\u1FF4\u1FF6-\u1FFC\u2102\u2107\u210A-\u2113\u2115\u2119-"
        "\u211D\u2124\u2126\u2128\u212A-\u212D\u212F-\u2134\u2139\u213C-\u213F\u2145-\u2149\u214E"
        "\u2183\u2184\u2C00-\u2C7B\u2C7E-\u2CE4\u2CEB-\u2CEE\u2CF2\u2CF3\uA640-\uA66D\uA680-"
        "\uA69B\uA722-\uA76F\uA771-\uA787\uA78B-\uA78E\uAB70-\uABBF\uFB00-\uFB06\uFB13-\uFB17"
        "\uFF21-\uFF3A\uFF41-\uFF5A\U00010400-\U0001044F\U000104B0-\U000104D3\U000104D8-"
        "\U000104FB\U00010C80-\U00010CB2\U00010CC0-\U00010CF2\U000118A0-\U000118DF\U0001E900-"
        "\U0001E943]+",
        "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", "[一-龥ࠀ-一가-퟿]+", "\\p{N}+"}},
      {{"deepseek-v3", "hunyuan-dense", "joyai-llm"},
       {"\\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
        "[!\"#$%&'()*+,\\-./"
        ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}"
        "]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}},
      {{"youtu"},
       {"[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-"
        "ヿ]"
        "+",
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+("
        "?:"
        "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{"
        "Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|"
        "'["
        "mM]|'[lL][lL]|'[dD])?|\\p{N}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       true},
      {{"deepseek-coder"},
       {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[一-龥ࠀ-一가-퟿]+", "\\p{N}"}},
      {{"falcon"}, {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
        "mellum2"},
       {"\\p{N}", kGpt2}},
      {{"gpt-2",           "gpt2",    "mpt",     "olmo",        "jais",       "trillion",
        "granite-docling", "phi-2",   "jina-es", "jina-de",     "gigachat",   "jina-v2-es",
        "jina-v2-de",      "a.x-4.0", "mellum",  "modern-bert", "jina-v1-en", "jina-v2-code",
        "roberta-bpe",     "exaone4"},
       {kGpt2}},
      {{"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan",
        "solar-open", "grok-2"},
       {kQwen2}},
      {{"qwen35"},
       {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}"
        "\\p{"
        "M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {kPoro}},
      {{"viking"}, {kPoro, "\\p{N}"}},
      {{"tekken"},
       {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]"
        "?(("
        "?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\"
        "n]+|\\s+(?!\\S)|\\s+"},
       true},
      {{"chameleon"},
       {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
        "[\\p{P}!-/:-@\\[-`{-~]", kGpt2}},
      {{"gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"}, {kGpt4o}},
      {{"granite-embed-multi-97m"},
       {"[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'"
        "["
        "tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])("
        "["
        "^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'["
        "dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
       true},
      {{"tiny_aya", "cohere2moe"},
       {kDigitsFromTheRight,
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+("
        "?:"
        "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{"
        "Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|"
        "'["
        "mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|"
        "\\s+"}},
      // unicode_regex_split_custom_kimi_k2 implements tokenization_kimi.py's pattern (quoted in
      // llama.cpp's src/unicode.cpp); its [X&&[^\p{Han}]] intersections are written here as
      // (?:(?!\p{Han})[X]).
      {{"kimi-k2"},
       {"\\p{Han}+|[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])*(?:(?"
        "!"
        "\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]"
        "|'"
        "[dD])?|[^\\r\\n\\p{L}\\p{N}]?(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])+(?:(?!"
        "\\p{"
        "Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'["
        "dD]"
        ")?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {{"superbpe"}, {"\\p{N}+", "(?=(\\d{3})+(?!\\d))"}},
      {{"bailingmoe", "bailingmoe2", "llada-moe"},
       {"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+"}},
      {{"seed-coder"},
       {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|"
        "\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {{"afmoe"},
       {kDigitsFromTheRight,
        "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-"
        "ᇿ]"
        "+",
        "[!\"#$%&'()*+,\\-./"
        ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{"
        "M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}},
      {{"laguna"}, {kNewlines, kQwen2}},
      {{"exaone-moe"},
       {"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}"
        "\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|"
        "\\s+"}},
  };
  // clang-format on
  return rows;
}

}  // namespace

std::vector<std::string> gguf_pretokenizer_names() {
  std::vector<std::string> names;
  for (const PreRow& r : pre_rows())
    for (const char* n : r.names) names.emplace_back(n);
  std::sort(names.begin(), names.end());
  return names;
}

GgufPreTokenizer gguf_pretokenizer(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, GgufPreTokenizer> cache;
  std::lock_guard lock(mu);
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  for (const PreRow& r : pre_rows()) {
    if (std::find(r.names.begin(), r.names.end(), name) == r.names.end()) continue;
    std::vector<SplitRule> rules;
    for (const char* re : r.regexes) rules.push_back(SplitRule{re});
    GgufPreTokenizer g{
        std::make_shared<const PreTokenizer>(name, std::move(rules), RegexDialect::kLlamaCpp),
        r.ignore_merges};
    cache.emplace(name, g);
    return g;
  }
  std::string known;
  for (const std::string& n : gguf_pretokenizer_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error(
      ErrorKind::kUnsupported,
      "BPE pre-tokenizer '" + name +
          "' is not supported (not a byte-level pre-tokenizer llama.cpp names); known: " + known);
}

}  // namespace kvcache
