#include "model/pretokenizer.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "model/gguf.h"
#include "model/tokenizer.h"
#include "model_test_util.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;

const std::string kDataDir = std::string(KVCACHE_TEST_DATA_DIR) + "/vocab";

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f) << path;
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The vocabularies are stored gzip-compressed (tests/data/vocab/README.md); this writes one out
// to a temporary .gguf and returns its path.
std::string unpacked_vocab(const std::string& name) {
  const std::string gz = kDataDir + "/ggml-vocab-" + name + ".gguf.gz";
  const std::string out = testing_util::temp_path("ggml-vocab-" + name + ".gguf");
  gzFile in = gzopen(gz.c_str(), "rb");
  if (!in) throw Error(ErrorKind::kIo, gz + ": cannot open");
  std::ofstream o(out, std::ios::binary);
  char buf[1 << 16];
  for (int n; (n = gzread(in, buf, sizeof buf)) > 0;) o.write(buf, n);
  gzclose(in);
  return out;
}

struct Case {
  std::string text;
  std::string ids;
};

// llama.cpp's test-tokenizer-0 files: .inp cases separated by "\n__ggml_vocab_test__\n", .out
// one line of ids per case.
std::vector<Case> read_cases(const std::string& name) {
  const std::string base = kDataDir + "/ggml-vocab-" + name + ".gguf";
  const std::string inp = slurp(base + ".inp"), outp = slurp(base + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  size_t begin = 0;
  for (size_t hit; (hit = inp.find(sep, begin)) != std::string::npos; begin = hit + sep.size())
    texts.push_back(inp.substr(begin, hit - begin));
  if (begin < inp.size()) texts.push_back(inp.substr(begin));
  std::vector<Case> cases;
  std::istringstream lines(outp);
  std::string line;
  for (size_t i = 0; std::getline(lines, line); ++i) {
    std::istringstream ids(line);
    std::string joined;
    for (int32_t id; ids >> id;) {
      if (!joined.empty()) joined += ' ';
      joined += std::to_string(id);
    }
    cases.push_back({i < texts.size() ? texts[i] : "<missing>", joined});
  }
  EXPECT_EQ(texts.size(), cases.size()) << name;
  return cases;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

class VocabVectors : public testing::TestWithParam<const char*> {};

// Every vector llama.cpp publishes for the vocabulary, exactly, and decoding restores the text.
TEST_P(VocabVectors, MatchLlamaCpp) {
  const std::string name = GetParam();
  const std::string path = unpacked_vocab(name);
  auto tok = load_tokenizer(path);
  EXPECT_EQ(std::string(tok->kind()), "gpt2/" + name);
  const auto cases = read_cases(name);
  ASSERT_GT(cases.size(), 30u);
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto got = tok->encode(cases[i].text);
    EXPECT_EQ(ids_str(got), cases[i].ids)
        << name << " case " << i << ": \"" << cases[i].text << "\"";
    EXPECT_EQ(tok->decode(got), cases[i].text) << name << " case " << i;
  }
  fs::remove(path);
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, VocabVectors,
                         testing::Values("deepseek-coder", "deepseek-llm", "falcon", "mpt",
                                         "refact", "starcoder"));

std::vector<std::string> split(const std::string& pre, std::string_view text) {
  return gguf_pretokenizer(pre).pre->split(text);
}
using Pieces = std::vector<std::string>;

TEST(PreTokenizer, HandCheckedSplits) {
  EXPECT_EQ(split("gpt-2", "Hello world's  3.14!!\n\n x"),
            (Pieces{"Hello", " world", "'s", " ", " 3", ".", "14", "!!", "\n\n", " x"}));
  EXPECT_EQ(split("llama-bpe", "I'M 12345 hi!\r\n  x"),
            (Pieces{"I", "'M", " ", "123", "45", " hi", "!\r\n", " ", " x"}));
  // Each regex splits the pieces of the one before: falcon isolates punctuation runs first,
  // then GPT-2's regex, then cuts three-digit groups out of the digit runs.
  EXPECT_EQ(split("falcon", "a,b 12345"), (Pieces{"a", ",", "b", " ", "123", "45"}));
  // starcoder: every digit alone, before GPT-2's regex sees them.
  EXPECT_EQ(split("starcoder", "x 2024"), (Pieces{"x", " ", "2", "0", "2", "4"}));
  // Empty matches are split points: superbpe's lookahead groups digits from the right.
  EXPECT_EQ(split("superbpe", "1234567"), (Pieces{"1", "234", "567"}));
  EXPECT_EQ(split("afmoe", "12345"), (Pieces{"12", "345"}));
  // deepseek-llm's literal non-ASCII classes, and \s+$ ends only at the end of the piece.
  EXPECT_EQ(split("deepseek-llm", "中文 ab  "), (Pieces{"中文", " ab", "  "}));
  // U+0085 (NEL) is whitespace, as in llama.cpp and Oniguruma (PCRE2's own \s lacks it).
  EXPECT_EQ(split("gpt-2",
                  "a\xC2\x85\xC2\x85"
                  "b"),
            (Pieces{"a", "\xC2\x85", "\xC2\x85", "b"}));
  // kimi-k2: Han runs apart from other letters.
  EXPECT_EQ(split("kimi-k2", "abc中文def"), (Pieces{"abc", "中文", "def"}));
  // tekken/gpt-4o: CamelCase splits at the capital.
  EXPECT_EQ(split("gpt-4o", "HelloWorld"), (Pieces{"Hello", "World"}));
}

TEST(PreTokenizer, EveryLlamaCppNameCompilesWithJitAndKeepsTheText) {
  const std::string text =
      "Hello, World! It's 2024 -- déjà vu: 中文 日本語 한국어 🦙 \t\n\n  x1234567 "
      "CamelCase ΑΒΓ αβγ \xC2\x85 end  ";
  const auto names = gguf_pretokenizer_names();
  EXPECT_GE(names.size(), 80u);
  for (const std::string& n : names) {
    SCOPED_TRACE(n);
    const GgufPreTokenizer g = gguf_pretokenizer(n);
    ASSERT_TRUE(g.pre);
    EXPECT_TRUE(g.pre->jit());
    std::string joined;
    for (const std::string& p : g.pre->split(text)) {
      EXPECT_FALSE(p.empty());
      joined += p;
    }
    EXPECT_EQ(joined, text);
  }
}

// Invalid UTF-8 never reaches PCRE2: each bad byte becomes U+FFFD (llama.cpp's
// unicode_cpts_from_utf8), a surrogate is kept bit for bit and splits like an unassigned
// character.
TEST(PreTokenizer, InvalidUtf8IsDecodedAsLlamaCppDoes) {
  const std::string bad = "a\xFF\xC3 b\xED\xA0\x80 c\xF4\x90\x80\x80";
  std::string joined;
  for (const std::string& p : split("llama-bpe", bad)) joined += p;
  EXPECT_EQ(joined, "a\xEF\xBF\xBD\xEF\xBF\xBD b\xED\xA0\x80 c\xF4\x90\x80\x80");
  EXPECT_EQ(split("gpt-2", "\xFF\xFF"), (Pieces{"\xEF\xBF\xBD\xEF\xBF\xBD"}));
  EXPECT_EQ(split("gpt-2", "x\xED\xA0\x80"), (Pieces{"x", "\xED\xA0\x80"}));
  EXPECT_TRUE(split("gpt-2", "").empty());
}

TEST(PreTokenizer, UnknownGgufNameIsAnErrorNamingIt) {
  testing_util::expect_error([] { gguf_pretokenizer("no-such-pre"); },
                             {"'no-such-pre'", "not supported", "llama-bpe", "deepseek-coder"});
  GgufWriter w;
  w.set("tokenizer.ggml.model", GgufValue::str("gpt2"));
  w.set("tokenizer.ggml.pre", GgufValue::str("no-such-pre"));
  w.set("tokenizer.ggml.tokens", GgufValue::str_array({"a", "b"}));
  w.set("tokenizer.ggml.merges", GgufValue::str_array({"a b"}));
  const std::string p = testing_util::temp_path("unknown_pre.gguf");
  w.write(p);
  testing_util::expect_error([&] { load_tokenizer(p); }, {p, "'no-such-pre'", "gpt-2"});
  fs::remove(p);
}

TEST(PreTokenizer, SplitBehaviors) {
  // The tokenizers library's documented example (SplitDelimiterBehavior).
  auto run = [](SplitBehavior b, bool invert = false) {
    PreTokenizer p("t", {SplitRule{"-", true, b, invert}}, RegexDialect::kHuggingFace);
    return p.split("the-final--countdown");
  };
  EXPECT_EQ(run(SplitBehavior::kRemoved), (Pieces{"the", "final", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::kIsolated), (Pieces{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::kMergedWithPrevious), (Pieces{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::kMergedWithNext), (Pieces{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(run(SplitBehavior::kContiguous), (Pieces{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(run(SplitBehavior::kRemoved, true), (Pieces{"-", "-", "-"}));
  // A pattern that does not compile is an error naming it.
  testing_util::expect_error(
      [] { PreTokenizer("bad", {SplitRule{"(unclosed"}}, RegexDialect::kHuggingFace); },
      {"'bad'", "(unclosed", "does not compile"});
}

// deepseek-coder's tokenizer.json pre-tokenizer (a Sequence of Splits, Digits and ByteLevel
// without its regex; huggingface deepseek-ai/deepseek-coder-6.7b-base, as llama.cpp's
// convert_hf_to_gguf_update.py lists it), over the GGUF vocabulary's data: the same vectors.
TEST(PreTokenizer, TokenizerJsonSequenceOfSplitsReproducesTheGgufVectors) {
  const std::string path = unpacked_vocab("deepseek-coder");
  auto g = GgufFile::open(path);
  const auto& tokens = g->get_array("tokenizer.ggml.tokens", GgufType::kString).strs;
  const auto& types = g->get_array("tokenizer.ggml.token_type", GgufType::kInt32).ints;
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] == 3 || types[i] == 4)
      added.push_back({{"id", i}, {"content", tokens[i]}, {"special", types[i] == 3}});
    else
      vocab[tokens[i]] = i;
  }
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& m : g->get_array("tokenizer.ggml.merges", GgufType::kString).strs)
    merges.push_back(m);
  auto split_rule = [](const char* re) {
    return nlohmann::json{{"type", "Split"},
                          {"pattern", {{"Regex", re}}},
                          {"behavior", "Isolated"},
                          {"invert", false}};
  };
  const nlohmann::json tj = {
      {"added_tokens", added},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", nlohmann::json::array()}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {split_rule("[\r\n]"),
          split_rule("\\s?\\p{L}+"),
          split_rule("\\s?\\p{P}+"),
          split_rule("[一-龥ࠀ-一가-퟿]+"),
          {{"type", "Digits"}, {"individual_digits", true}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
  };
  auto hf = parse_hf_tokenizer(tj.dump(), "", "deepseek-coder/tokenizer.json");
  EXPECT_STREQ(hf->kind(), "hf-bpe");
  for (const Case& c : read_cases("deepseek-coder"))
    EXPECT_EQ(ids_str(hf->encode(c.text)), c.ids) << c.text;
  fs::remove(path);
}

TEST(PreTokenizer, TokenizerJsonNormalizers) {
  // Byte-level symbols: 'a' 'b' and GPT-2's 'Ġ' for the space.
  const std::string base =
      R"("model":{"type":"BPE","vocab":{"a":0,"b":1,"\u0120":2,"\u0120a":3},"merges":["\u0120 a"]},)"
      R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true})";
  auto with = [&](const std::string& normalizer) {
    return parse_hf_tokenizer("{" + base + R"(,"normalizer":)" + normalizer + "}", "", "tok.json");
  };
  // Replace then Prepend, in order.
  auto t = with(R"({"type":"Sequence","normalizers":[)"
                R"({"type":"Replace","pattern":{"String":"x"},"content":"a"},)"
                R"({"type":"Prepend","prepend":" "}]})");
  EXPECT_EQ(t->encode("xb"), (std::vector<int32_t>{3, 1}));
  EXPECT_TRUE(t->encode("").empty());
  auto r = with(R"({"type":"Replace","pattern":{"Regex":"[0-9]+"},"content":"b"})");
  EXPECT_EQ(r->encode("a123a"), (std::vector<int32_t>{0, 1, 0}));
  // NFC composes through ICU: "e" + U+0301 is U+00E9, byte-level C3 A9 = "Ã©", here no token
  // (dropped, as tokenizers drops a character with no token and no unk).
  auto n = with(R"({"type":"NFC"})");
  EXPECT_EQ(n->encode("ab"), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(n->encode("a e\xCC\x81"), (std::vector<int32_t>{0, 2}));
  testing_util::expect_error([&] { with(R"({"type":"Precompiled"})"); },
                             {"tok.json", "'Precompiled'", "not supported"});
  // A pre-tokenizer the loader does not know is refused, naming it.
  testing_util::expect_error(
      [&] {
        parse_hf_tokenizer(
            R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"pre_tokenizer":{"type":"UnicodeScripts"}})",
            "", "tok.json");
      },
      {"tok.json", "'UnicodeScripts'"});
}

}  // namespace
}  // namespace kvcache
