// Byte-level BPE pre-tokenizers: an ordered list of regex splits run through PCRE2 (8-bit, UTF +
// UCP, JIT-compiled), each splitting the pieces the previous one produced — llama.cpp's
// unicode_regex_split (src/unicode.cpp) and the `tokenizers` library's Sequence of Split
// pre-tokenizers are both this shape. Every pre-tokenizer llama.cpp names in a GGUF's
// tokenizer.ggml.pre is a row of one table (pretokenizer.cc), not a code path of its own.
// A PreTokenizer is immutable once built and safe to use from many threads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvcache {

// What a split does with the matches and the text between them (the `tokenizers` library's
// SplitDelimiterBehavior; llama.cpp always isolates).
enum class SplitBehavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };

// Whose regex rules a pattern follows where PCRE2 differs from them:
//  - kLlamaCpp: llama.cpp's std::regex (ECMAScript): \d is [0-9] and $ only matches at the end.
//  - kHuggingFace: Oniguruma, as the `tokenizers` library builds it: \d is Unicode \p{Nd}.
// In both \s is Unicode White_Space (llama.cpp maps every White_Space codepoint to \v before
// matching; Oniguruma's \s is White_Space), which includes U+0085 where PCRE2's UCP \s does not.
enum class RegexDialect { kLlamaCpp, kHuggingFace };

// A step that edits each piece instead of splitting it: the `tokenizers` library's Metaspace
// (every ' ' becomes the replacement, then the replacement is prepended; pre_tokenizers/
// metaspace.rs) and ByteLevel add_prefix_space (a ' ' prepended; pre_tokenizers/byte_level.rs).
struct PieceEdit {
  std::string space_to;  // non-empty: every ' ' of the piece becomes this text
  std::string prefix;    // non-empty: prepended to a piece that does not already start with it
  // Metaspace's prepend_scheme "first": only a piece that begins where the text split() was
  // given begins, and only when that text is the start of the input (split's `at_start`).
  bool prefix_at_start_only = false;
};

struct SplitRule {
  std::string pattern;
  bool literal = false;  // pattern is a plain string (tokenizers' Split {"String": ...})
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;  // the text between matches is what the behavior applies to
  std::optional<PieceEdit> edit =
      std::nullopt;  // set: this step edits pieces (pattern and the rest unused)
};

class PreTokenizer {
 public:
  // Compiles every rule; throws Error(kInvalidArgument) naming `name` and the pattern when one
  // does not compile.
  PreTokenizer(std::string name, std::vector<SplitRule> rules, RegexDialect dialect);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Splits UTF-8 text into pre-tokens; empty pieces are dropped. Invalid UTF-8 is decoded as
  // llama.cpp does (each bad byte becomes U+FFFD, decoding resumes at the next byte), and the
  // pieces are the re-encoded text, so their concatenation is that re-encoded text (unless a
  // PieceEdit step added to it). `at_start`: the text begins the input (what a PieceEdit with
  // prefix_at_start_only asks; the tokenizer passes false for text after an added token).
  std::vector<std::string> split(std::string_view text, bool at_start = true) const;

  // The text with every match of the first rule replaced by `with` (a tokenizer.json Replace
  // normalizer); invalid UTF-8 is decoded as split() decodes it.
  std::string replace_matches(std::string_view text, const std::string& with) const;

  const std::string& name() const { return name_; }
  // False when PCRE2 could not JIT-compile a pattern on this machine (then matching runs in the
  // interpreter, slower but identical); the constructor has said so on stderr.
  bool jit() const { return jit_; }

 private:
  struct Compiled;
  std::string name_;
  std::vector<std::unique_ptr<Compiled>> rules_;
  bool jit_ = true;
};

// The regex list and flags of a llama.cpp `tokenizer.ggml.pre` name.
struct GgufPreTokenizer {
  std::shared_ptr<const PreTokenizer> pre;
  // A pre-token that is already a vocabulary token is emitted whole (llama.cpp's ignore_merges).
  bool ignore_merges = false;
};
// Throws Error(kUnsupported) naming `name` and the known names when llama.cpp's table has no
// such byte-level pre-tokenizer. Compiled once per name and shared.
GgufPreTokenizer gguf_pretokenizer(const std::string& name);
// Every name gguf_pretokenizer() accepts, sorted.
std::vector<std::string> gguf_pretokenizer_names();

// GPT-2's regex as the `tokenizers` library writes it for ByteLevel(use_regex = true).
inline constexpr std::string_view kGpt2Regex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

}  // namespace kvcache
