// tokenizer.json normalizers, pre-tokenizers, BPE options and decoders beyond byte-level BPE:
// small tokenizer.json files written here, with ids derived by hand from the `tokenizers`
// library's sources (huggingface/tokenizers, tokenizers/src/...; each test cites its file).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/tokenizer.h"
#include "model_test_util.h"

namespace kvcache {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

const char* const kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// A tokenizer.json of model BPE with `tokens` numbered in order.
json tokenizer_json(const std::vector<std::string>& tokens, json merges = json::array()) {
  json vocab = json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"decoder", {{"type", "Fuse"}}}};
}

std::unique_ptr<Tokenizer> load(const json& j) {
  return parse_hf_tokenizer(j.dump(), "", "t.json");
}

// The ids of `pieces` in `tokens`.
Ids ids_of(const std::vector<std::string>& tokens, const std::vector<std::string>& pieces) {
  Ids out;
  for (const std::string& p : pieces) {
    const auto it = std::find(tokens.begin(), tokens.end(), p);
    EXPECT_NE(it, tokens.end()) << p;
    out.push_back(static_cast<int32_t>(it - tokens.begin()));
  }
  return out;
}

// Without a pre-tokenizer or merges every character is its own token: the ids spell out the
// normalized text character by character.
struct NormCase {
  const char* normalizer;
  const char* text;
  std::vector<std::string> normalized;  // the characters expected after normalization
};

TEST(HfNormalizers, UnicodeFormsLowercaseStripAndAccentsThroughIcu) {
  const std::vector<std::string> chars = {"a",
                                          "b",
                                          "c",
                                          "e",
                                          "f",
                                          "i",
                                          "l",
                                          "m",
                                          "o",
                                          " ",
                                          "\t",
                                          "1",
                                          "s",
                                          "M",
                                          "\xC3\xA9",
                                          "\xCC\x81",
                                          "\xCC\xA3",
                                          "\xCC\x87",
                                          "\xC3\xB3",
                                          "\xCF\x83",
                                          "\xCF\x82",
                                          "\xE1\xB9\xA9",
                                          "\xE1\xBA\x9B",
                                          "\xC5\xBF"};
  const std::vector<NormCase> cases = {
      // UAX #15 (Unicode normalization forms), figure 6's example: U+1E9B U+0323 is NFC as it
      // is; NFD: U+017F U+0323 U+0307; NFKC: U+1E69; NFKD: s U+0323 U+0307.
      {"NFC", "\xE1\xBA\x9B\xCC\xA3", {"\xE1\xBA\x9B", "\xCC\xA3"}},
      {"NFD", "\xE1\xBA\x9B\xCC\xA3", {"\xC5\xBF", "\xCC\xA3", "\xCC\x87"}},
      {"NFKC", "\xE1\xBA\x9B\xCC\xA3", {"\xE1\xB9\xA9"}},
      {"NFKD", "\xE1\xBA\x9B\xCC\xA3", {"s", "\xCC\xA3", "\xCC\x87"}},
      // NFC composes e + U+0301 into U+00E9; NFKC also folds the ligature U+FB01 and the
      // circled digit U+2460 (compatibility decompositions "fi", "1").
      {"NFC", "e\xCC\x81", {"\xC3\xA9"}},
      {"NFKC", "\xEF\xAC\x81\xE2\x91\xA0", {"f", "i", "1"}},
      // normalizers/utils.rs Lowercase -> NormalizedString::lowercase: char::to_lowercase per
      // character, so a final capital sigma is σ (U+03C3), not the contextual ς (U+03C2); and
      // U+0130 is "i" U+0307 (SpecialCasing.txt).
      {"Lowercase", "AB\xCE\xA3", {"a", "b", "\xCF\x83"}},
      {"Lowercase", "\xC4\xB0", {"i", "\xCC\x87"}},
      // normalizers/strip.rs StripAccents after NFKD, its own test: "Me llamó" -> "Me llamo".
      {R"({"type":"Sequence","normalizers":[{"type":"NFKD"},{"type":"StripAccents"}]})",
       "Me llam\xC3\xB3",
       {"M", "e", " ", "l", "l", "a", "m", "o"}},
      // strip.rs Strip: char::is_whitespace at the chosen ends.
      {R"({"type":"Strip","strip_left":true,"strip_right":true})", " \tab \t", {"a", "b"}},
      {R"({"type":"Strip","strip_left":true,"strip_right":false})",
       " \tab \t",
       {"a", "b", " ", "\t"}},
      {R"({"type":"Strip","strip_left":false,"strip_right":true})", " ab\t", {" ", "a", "b"}},
  };
  for (const NormCase& c : cases) {
    json j = tokenizer_json(chars);
    j["normalizer"] =
        c.normalizer[0] == '{' ? json::parse(c.normalizer) : json{{"type", c.normalizer}};
    EXPECT_EQ(load(j)->encode(c.text), ids_of(chars, c.normalized))
        << c.normalizer << " of '" << c.text << "'";
  }
}

TEST(HfNormalizers, RefusedOptionsAreNamed) {
  json j = tokenizer_json({"a"});
  j["normalizer"] = {{"type", "NFKC"}, {"compat", true}};
  testing_util::expect_error([&] { load(j); }, {"t.json", "normalizer NFKC", "'compat'"});
  j["normalizer"] = {{"type", "Strip"}, {"strip_left", true}};  // strip_right is required
  testing_util::expect_error([&] { load(j); }, {"t.json", "strip_right"});
  j["normalizer"] = {{"type", "BertNormalizer"}};
  testing_util::expect_error([&] { load(j); }, {"t.json", "'BertNormalizer'", "not supported"});
}

// pre_tokenizers/metaspace.rs and its tests: "Hey friend!" -> "▁Hey" "▁friend!";
// "Hey   friend!" -> "▁Hey" "▁" "▁" "▁friend!". ignore_merges makes each piece one token.
TEST(HfPreTokenizers, Metaspace) {
  const std::string m = kMeta;
  const std::vector<std::string> tokens = {
      "<x>", m + "Hey", m + "friend!", m, "Hey", "friend!", m + "Hey" + m + "friend!", "<unk>"};
  auto with = [&](json pre) {
    json j = tokenizer_json(tokens);
    j["model"]["ignore_merges"] = true;
    j["model"]["unk_token"] = "<unk>";
    j["pre_tokenizer"] = pre;
    j["decoder"] = {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}};
    j["added_tokens"] = json::array({{{"id", 0}, {"content", "<x>"}, {"special", false}}});
    return load(j);
  };
  auto always = with({{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "always"}});
  EXPECT_EQ(always->encode("Hey friend!"), (Ids{1, 2}));
  EXPECT_EQ(always->encode("Hey   friend!"), (Ids{1, 3, 3, 2}));
  // always: every piece, also the text after an added token, gains the prefix.
  EXPECT_EQ(always->encode("<x>Hey"), (Ids{0, 1}));
  // first: only text at offset 0 of the input (offsets_original().0 == 0).
  auto first = with({{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "first"}});
  EXPECT_EQ(first->encode("Hey friend!"), (Ids{1, 2}));
  EXPECT_EQ(first->encode("<x>Hey"), (Ids{0, 4}));
  // never: no prefix; a piece already starting with the replacement is left alone.
  auto never = with({{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "never"}});
  EXPECT_EQ(never->encode("Hey friend!"), (Ids{4, 2}));
  // The older add_prefix_space=false is never.
  auto legacy = with({{"type", "Metaspace"}, {"replacement", m}, {"add_prefix_space", false}});
  EXPECT_EQ(legacy->encode("Hey friend!"), (Ids{4, 2}));
  // split=false: one piece.
  auto whole = with(
      {{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "first"}, {"split", false}});
  EXPECT_EQ(whole->encode("Hey friend!"), (Ids{6}));
  // Per-token decoding: ▁ is a space; the leading one goes after BOS only (piece_after).
  EXPECT_EQ(always->decode(Ids{1, 2}), " Hey friend!");
  EXPECT_STREQ(always->kind(), "hf-bpe-spm");

  testing_util::expect_error(
      [&] {
        with({{"type", "Metaspace"}, {"replacement", m}, {"prepend_scheme", "sometimes"}});
      },
      {"t.json", "prepend_scheme 'sometimes'"});
  testing_util::expect_error(
      [&] {
        with({{"type", "Metaspace"}, {"replacement", m}, {"frobnicate", 1}});
      },
      {"t.json", "pre_tokenizer Metaspace", "'frobnicate'"});
  testing_util::expect_error(
      [&] {
        with({{"type", "Metaspace"},
              {"replacement", m},
              {"add_prefix_space", false},
              {"prepend_scheme", "always"}});
      },
      {"t.json", "contradicts prepend_scheme"});
  testing_util::expect_error(
      [&] {
        with({{"type", "Metaspace"}, {"replacement", "ab"}});
      },
      {"t.json", "exactly one character"});
}

// pre_tokenizers/whitespace.rs and its tests: Whitespace keeps the matches of \w+|[^\w\s]+
// ("Hey man!" -> "Hey" "man" "!"), WhitespaceSplit cuts at whitespace ("Hey, man, Good?" ->
// "Hey," "man," "Good?"). Rust's \w has no U+00B2 (category No), so "x²" is "x" "²".
TEST(HfPreTokenizers, WhitespaceAndWhitespaceSplit) {
  const std::vector<std::string> tokens = {"Hey",   "man", "!",        "Hey,",        "man,",
                                           "Good?", "x",   "\xC2\xB2", "na\xC3\xAFve"};
  auto with = [&](const char* type) {
    json j = tokenizer_json(tokens);
    j["model"]["ignore_merges"] = true;
    j["pre_tokenizer"] = {{"type", type}};
    return load(j);
  };
  auto ws = with("Whitespace");
  EXPECT_EQ(ws->encode("Hey man!"), (Ids{0, 1, 2}));
  EXPECT_EQ(ws->encode("x\xC2\xB2  na\xC3\xAFve\n"), (Ids{6, 7, 8}));
  EXPECT_TRUE(ws->encode("\n").empty());
  auto split = with("WhitespaceSplit");
  EXPECT_EQ(split->encode("Hey, man, Good?"), (Ids{3, 4, 5}));
  EXPECT_EQ(split->encode("Hey\xC2\x85man"), (Ids{0, 1}));  // U+0085 is White_Space
}

// pre_tokenizers/byte_level.rs: add_prefix_space prepends ' ' to each piece (every stretch
// between added tokens) that does not start with one, before GPT-2's regex.
TEST(HfPreTokenizers, ByteLevelAddPrefixSpace) {
  const std::vector<std::string> tokens = {"a",
                                           "b",
                                           "\xC4\xA0",
                                           "\xC4\xA0"
                                           "a",
                                           "\xC4\xA0"
                                           "b",
                                           "<x>"};
  json j = tokenizer_json(tokens, json::array({"\xC4\xA0 a", "\xC4\xA0 b"}));
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["added_tokens"] = json::array({{{"id", 5}, {"content", "<x>"}, {"special", false}}});
  auto t = load(j);
  EXPECT_STREQ(t->kind(), "hf-bpe");
  EXPECT_EQ(t->encode("a b"), (Ids{3, 4}));
  EXPECT_EQ(t->encode(" a"), (Ids{3}));
  EXPECT_EQ(t->encode("a<x>b"), (Ids{3, 5, 4}));
  EXPECT_TRUE(t->encode("").empty());
  // Without it nothing is prepended.
  j["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_EQ(load(j)->encode("a b"), (Ids{0, 4}));
  j["pre_tokenizer"]["frobnicate"] = true;
  testing_util::expect_error([&] { load(j); }, {"pre_tokenizer ByteLevel", "'frobnicate'"});
}

// Llama 2's tokenizer.json shape (normalizer Prepend ▁ + Replace ' ' -> ▁, no pre-tokenizer,
// BPE with byte_fallback, decoder Replace/ByteFallback/Fuse/Strip). models/bpe/model.rs
// merge_word: a character that is no token becomes its <0xNN> tokens, else unk_token (runs
// fused with fuse_unk), else it is dropped.
TEST(HfBpe, SentencePieceStyleByteFallbackUnkAndDecoders) {
  const std::string m = kMeta;
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>",  "<0xC3>", "<0xA9>", m,
                                           "a",     "b",   m + "a", "ab",     m + "ab"};
  json j = tokenizer_json(tokens, json::array({m + " a", m + "a b", "a b"}));
  j["normalizer"] = json::parse(R"({"type":"Sequence","normalizers":[)"
                                R"({"type":"Prepend","prepend":")" +
                                m +
                                R"("},)"
                                R"({"type":"Replace","pattern":{"String":" "},"content":")" +
                                m + R"("}]})");
  j["decoder"] = json::parse(R"({"type":"Sequence","decoders":[)"
                             R"({"type":"Replace","pattern":{"String":")" +
                             m +
                             R"("},"content":" "},{"type":"ByteFallback"},{"type":"Fuse"},)"
                             R"({"type":"Strip","content":" ","start":1,"stop":0}]})");
  j["added_tokens"] = json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 2}, {"content", "</s>"}, {"special", true}}});
  j["model"]["byte_fallback"] = true;
  j["model"]["unk_token"] = "<unk>";
  const std::string dir = testing_util::temp_path("hf_spm");
  std::filesystem::create_directories(dir);
  {
    std::ofstream(dir + "/tokenizer.json") << j.dump();
    std::ofstream(dir + "/tokenizer_config.json") << R"({"bos_token":"<s>","eos_token":"</s>"})";
  }
  auto t = load_tokenizer(dir);
  // "▁ab▁ab▁é": "▁ a" (rank 0) twice, then "▁a b" (rank 1) twice; é is C3 A9.
  EXPECT_EQ(t->encode("ab ab \xC3\xA9"), (Ids{10, 10, 5, 3, 4}));
  EXPECT_EQ(t->decode(Ids{10, 10, 5, 3, 4}), " ab ab \xC3\xA9");
  EXPECT_EQ(t->piece_after(1, 10), "ab");  // Strip after Fuse: the text's leading space
  EXPECT_EQ(t->piece_after(10, 10), " ab");
  EXPECT_EQ(t->bos_id(), 1);

  // No byte tokens for U+00E8 (C3 A8): unk, one per character, or one per run with fuse_unk.
  EXPECT_EQ(t->encode("\xC3\xA8\xC3\xA8"
                      "a"),
            (Ids{5, 0, 0, 6}));
  j["model"]["fuse_unk"] = true;
  EXPECT_EQ(load(j)->encode("\xC3\xA8\xC3\xA8"
                            "a"),
            (Ids{5, 0, 6}));
  // Neither byte fallback nor unk: the character is dropped.
  j["model"]["byte_fallback"] = false;
  j["model"].erase("unk_token");
  EXPECT_EQ(load(j)->encode("\xC3\xA9"
                            "a"),
            (Ids{5, 6}));
  std::filesystem::remove_all(dir);
}

TEST(HfBpe, RefusedModelAndDecoderOptionsAreNamed) {
  const std::string m = kMeta;
  const json base = tokenizer_json({"<unk>", "a", m});
  auto refuse = [&](const std::function<void(json&)>& edit,
                    std::initializer_list<std::string> needles) {
    json j = base;
    edit(j);
    testing_util::expect_error([&] { load(j); }, needles);
  };
  refuse([](json& j) { j["model"]["dropout"] = 0.1; }, {"t.json", "dropout"});
  refuse([](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; }, {"end_of_word_suffix"});
  refuse([](json& j) { j["model"]["unk_token"] = "<UNK>"; }, {"unk_token '<UNK>'"});
  refuse([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, {"decoder 'WordPiece'"});
  refuse([](json& j) { j.erase("decoder"); }, {"no decoder"});
  refuse(
      [](json& j) {
        j["decoder"] = {{"type", "ByteLevel"}};
      },
      {"ByteLevel decoder needs a ByteLevel pre-tokenizer"});
  refuse(
      [](json& j) {
        j["decoder"] = json::parse(R"({"type":"Sequence","decoders":[{"type":"Fuse"},)"
                                   R"({"type":"Strip","content":" ","start":0,"stop":1}]})");
      },
      {"decoder Strip after Fuse"});
  refuse([](json& j) { j["decoder"] = {{"type", "Fuse"}, {"x", 1}}; }, {"decoder Fuse", "'x'"});
  refuse(
      [&](json& j) {
        j["pre_tokenizer"] = {{"type", "ByteLevel"}};
        j["decoder"] = {{"type", "Metaspace"}, {"replacement", m}};
      },
      {"ByteLevel pre-tokenizer needs the ByteLevel decoder"});
  // A dropout of 0 is deterministic, as the library reads it.
  json j = base;
  j["model"]["dropout"] = 0.0;
  EXPECT_EQ(load(j)->encode("a"), (Ids{1}));
  // Strip not after Fuse strips each token.
  j["decoder"] = {{"type", "Strip"}, {"content", "a"}, {"start", 1}, {"stop", 0}};
  EXPECT_EQ(load(j)->decode(1), "");
}

}  // namespace
}  // namespace kvcache
