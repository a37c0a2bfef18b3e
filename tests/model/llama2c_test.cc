// llama2.c checkpoint loader and tokenizer: the real stories260K files and synthetic ones,
// good and broken.
#include "model/llama2c.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "model/mapped_file.h"
#include "model/tokenizer_llama2c.h"
#include "scratch_dir.h"
#include "shared_data.h"

namespace kvcache {
namespace {

using testing_util::read_file;
using testing_util::stories_dir;
using testing_util::write_file;

// A synthetic llama2.c checkpoint: header + `floats` random values.
std::string checkpoint_bytes(std::array<int32_t, 7> h, size_t floats) {
  std::string s(28 + floats * 4, '\0');
  std::memcpy(s.data(), h.data(), 28);
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 0.1f);
  for (size_t i = 0; i < floats; ++i) {
    const float f = d(rng);
    std::memcpy(s.data() + 28 + i * 4, &f, 4);
  }
  return s;
}
// Floats a checkpoint of this header holds (llama2.c's memory_map_weights order).
size_t checkpoint_floats(int dim, int hidden, int layers, int heads, int kv_heads, int vocab,
                         int seq) {
  const size_t hd = static_cast<size_t>(dim / heads), kv = static_cast<size_t>(kv_heads) * hd;
  const size_t v = static_cast<size_t>(vocab < 0 ? -vocab : vocab);
  size_t n = v * dim + layers * (2 * dim + dim * dim * 2 + 2 * dim * kv + 3 * dim * hidden) + dim +
             seq * hd;
  if (vocab < 0) n += v * dim;
  return n;
}

void expect_error(const std::string& path, const std::string& needle) {
  try {
    load_llama2c(path);
    ADD_FAILURE() << "no error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "want \"" << needle << "\" in: " << msg;
  }
}

TEST(Llama2cLoader, Stories260KConfigAndZeroCopyViews) {
  KVCACHE_REQUIRE_STORIES();
  const std::string path = stories_dir() + "/stories260K.bin";
  EXPECT_TRUE(is_llama2c_checkpoint(path));
  auto m = load_llama2c(path);
  const ModelConfig& c = m->config();
  EXPECT_EQ(m->format(), "llama2c");
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_EQ(m->find("output.weight"), nullptr);
  EXPECT_EQ(c.layer_types, std::vector<std::string>(5, "full_attention"));
  // The views read the file's bytes in place: token_embd right after the header; w1 of layer 0
  // where llama2.c's pointer arithmetic puts it.
  const std::string raw = read_file(path);
  const TensorView& emb = m->tensor("token_embd.weight");
  EXPECT_EQ(std::memcmp(emb.data(), raw.data() + 28, 512 * 64 * 4), 0);
  const size_t w1_off =
      28 + 4 * (512 * 64 + 5 * 64 + 5 * 64 * 64 + 2 * 5 * 64 * 32 + 5 * 64 * 64 + 5 * 64);
  EXPECT_EQ(
      std::memcmp(m->tensor("blk.0.ffn_gate.weight").data(), raw.data() + w1_off, 4 * 172 * 64), 0);
  const size_t w2_l1 = w1_off + 4 * (5 * 172 * 64 + 172 * 64);
  EXPECT_EQ(
      std::memcmp(m->tensor("blk.1.ffn_down.weight").data(), raw.data() + w2_l1, 4 * 64 * 172), 0);
  EXPECT_EQ(m->tensor("blk.3.attn_k.weight").shape(), (Shape{32, 64}));
}

TEST(Llama2cLoader, UnsharedClassifierWithNegativeVocab) {
  const testing_util::ScratchDir dir("llama2c");
  const std::string path = dir.file("unshared.bin");
  const size_t n = checkpoint_floats(16, 24, 2, 4, 2, -40, 8);
  write_file(path, checkpoint_bytes({16, 24, 2, 4, 2, -40, 8}, n));
  auto m = load_llama2c(path);
  EXPECT_FALSE(m->config().tie_word_embeddings);
  EXPECT_EQ(m->config().vocab_size, 40);
  const TensorView& out = m->tensor("output.weight");
  EXPECT_EQ(out.shape(), (Shape{40, 16}));
  EXPECT_NE(out.data(), m->tensor("token_embd.weight").data());
  // wcls is the last array of the file.
  const std::string raw = read_file(path);
  EXPECT_EQ(std::memcmp(out.data(), raw.data() + raw.size() - 40 * 16 * 4, 40 * 16 * 4), 0);
}

TEST(Llama2cLoader, BadFilesNameTheFileAndTheProblem) {
  const testing_util::ScratchDir dir("llama2c");
  const std::array<int32_t, 7> good = {16, 24, 2, 4, 2, 40, 8};
  const size_t n = checkpoint_floats(16, 24, 2, 4, 2, 40, 8);
  const std::string bytes = checkpoint_bytes(good, n);

  write_file(dir.file("ok.bin"), bytes);
  EXPECT_NO_THROW(load_llama2c(dir.file("ok.bin")));

  write_file(dir.file("empty.bin"), "");
  expect_error(dir.file("empty.bin"), "header");
  write_file(dir.file("short_header.bin"), bytes.substr(0, 20));
  expect_error(dir.file("short_header.bin"), "header");
  write_file(dir.file("truncated.bin"), bytes.substr(0, bytes.size() - 100));
  expect_error(dir.file("truncated.bin"), "truncated");
  expect_error(dir.file("truncated.bin"), "freq_cis_real");  // the tensor cut short
  write_file(dir.file("cut_early.bin"), bytes.substr(0, 28 + 4 * 40 * 16 + 12));
  expect_error(dir.file("cut_early.bin"), "attn_norm.weight");
  write_file(dir.file("oversized.bin"), bytes + std::string(64, '\0'));
  expect_error(dir.file("oversized.bin"), "oversized");
  expect_error(dir.file("missing.bin"), "missing.bin");

  auto with_header = [&](std::array<int32_t, 7> h) {
    std::string b = bytes;
    std::memcpy(b.data(), h.data(), 28);
    return b;
  };
  write_file(dir.file("zero_heads.bin"), with_header({16, 24, 2, 0, 2, 40, 8}));
  expect_error(dir.file("zero_heads.bin"), "n_heads");
  write_file(dir.file("gqa.bin"), with_header({16, 24, 2, 4, 3, 40, 8}));
  expect_error(dir.file("gqa.bin"), "n_kv_heads");
  write_file(dir.file("dim.bin"), with_header({18, 24, 2, 4, 2, 40, 8}));
  expect_error(dir.file("dim.bin"), "multiple of n_heads");
  write_file(dir.file("huge.bin"), with_header({16, 24, 2, 4, 2, 40, 2000000000}));
  expect_error(dir.file("huge.bin"), "seq_len");
  write_file(dir.file("text.bin"), std::string(4096, 'x'));
  expect_error(dir.file("text.bin"), "not a valid llama2.c checkpoint");
  EXPECT_FALSE(is_llama2c_checkpoint(dir.file("text.bin")));
  EXPECT_FALSE(is_llama2c_checkpoint(dir.file("missing.bin")));
  EXPECT_TRUE(is_llama2c_checkpoint(dir.file("ok.bin")));
}

// ---- tokenizer ----

TEST(Llama2cTokenizer, Stories260KPromptsAsLlama2c) {
  KVCACHE_REQUIRE_STORIES();
  const Llama2cTokenizer tok(stories_dir() + "/tok512.bin", 512);
  EXPECT_EQ(tok.encode("Once upon a time"), (std::vector<int32_t>{403, 407, 261, 378}));
  EXPECT_TRUE(tok.encode("").empty());
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  // run.c drops the leading space of the first piece after BOS, and prints <0x0A> as '\n'.
  EXPECT_EQ(tok.decode_for_print(1, 403), "Once");
  EXPECT_EQ(tok.decode_for_print(378, 403), " Once");
  EXPECT_EQ(tok.decode_for_print(432, 13), "\n");
  EXPECT_EQ(tok.decode(13), "\n");
  EXPECT_EQ(tok.decode(1), "");
  EXPECT_EQ(tok.decode(403), " Once");
  // piece_after, what the server streams and echoes, drops that space too (a byte stays a byte).
  EXPECT_EQ(tok.piece_after(1, 403), "Once");
  EXPECT_EQ(tok.piece_after(378, 403), " Once");
  EXPECT_EQ(tok.piece_after(-1, 403), " Once");
  EXPECT_EQ(tok.piece_after(1, 13), "\n");
  // Plain ASCII round-trips (with the space prefix encode adds).
  const std::string text = "Lily saw a big, red ball.\nShe was happy!";
  std::string back;
  for (int32_t id : tok.encode(text)) back += tok.decode(id);
  EXPECT_EQ(back, " " + text);
  // Not in the vocabulary: UTF-8 bytes fall back to <0xNN> tokens (3 + byte in llama2.c).
  EXPECT_EQ(tok.encode("\xC3\xA9"),
            (std::vector<int32_t>{tok.encode(" ")[0], 485}));   // é is a piece
  const std::vector<int32_t> ids = tok.encode("\xE4\xB8\xAD");  // U+4E2D is not
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[1], 3 + 0xE4);
  EXPECT_EQ(ids[2], 3 + 0xB8);
  EXPECT_EQ(ids[3], 3 + 0xAD);
  // safe_printf prints no lone non-ASCII or control byte.
  EXPECT_EQ(tok.decode_for_print(5, 3 + 0xC3), "");
  EXPECT_EQ(tok.decode_for_print(5, 3 + 0x07), "");
  EXPECT_THROW(tok.decode(512), Error);
}

// A hand-made vocabulary: <unk> <s> </s>, 256 byte tokens, then scored pieces.
std::string tokenizer_bytes(const std::vector<std::pair<std::string, float>>& extra,
                            int32_t max_len = 8) {
  std::vector<std::pair<std::string, float>> v = {{"<unk>", 0}, {"\n<s>\n", 0}, {"\n</s>\n", 0}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    v.emplace_back(name, 0.0f);
  }
  v.insert(v.end(), extra.begin(), extra.end());
  std::string s(4, '\0');
  std::memcpy(s.data(), &max_len, 4);
  for (const auto& [piece, score] : v) {
    const auto len = static_cast<int32_t>(piece.size());
    s.append(reinterpret_cast<const char*>(&score), 4);
    s.append(reinterpret_cast<const char*>(&len), 4);
    s += piece;
  }
  return s;
}

TEST(Llama2cTokenizer, MergesHighestScoreFirstLeftmostOnTies) {
  const testing_util::ScratchDir dir("llama2c");
  const std::vector<std::pair<std::string, float>> extra = {{" ", -1},     {"a", -2},  {"b", -3},
                                                            {"ab", -10},   {"ba", -5}, {"aba", -4},
                                                            {" aba", -20}, {"bb", -10}};
  const int32_t base = 259;  // ids of `extra` start here
  write_file(dir.file("tok.bin"), tokenizer_bytes(extra));
  const Llama2cTokenizer tok(dir.file("tok.bin"), base + static_cast<int32_t>(extra.size()));
  // " aba": pairs " a"(absent) "ab"(-10) "ba"(-5) -> ba first; then a+ba = "aba"(-4); then "
  // "+"aba" (-20).
  EXPECT_EQ(tok.encode("aba"), (std::vector<int32_t>{base + 6}));
  // "abb": "ab"(-10) vs "bb"(-10): equal scores, the leftmost pair merges.
  EXPECT_EQ(tok.encode("abb"), (std::vector<int32_t>{base, base + 3, base + 2}));
  // Unknown character -> byte fallback via the <0xNN> pieces.
  EXPECT_EQ(tok.encode("c"), (std::vector<int32_t>{base, 3 + 'c'}));
}

// run.c's encode() as it is written, over the tokenizer's public tables: the O(n^2) loop that
// rescans every adjacent pair after each merge. The reference the heap-based merges of
// Llama2cTokenizer::encode must reproduce id for id.
std::vector<int32_t> reference_encode(const Llama2cTokenizer& tok, std::string_view text) {
  std::unordered_map<std::string, int32_t> index;  // piece -> lowest id, as the tokenizer's
  for (int32_t id = tok.vocab_size() - 1; id >= 0; --id) index[tok.token_text(id)] = id;
  auto lookup = [&](const std::string& s) {
    const auto it = index.find(s);
    return it == index.end() ? -1 : it->second;
  };
  std::vector<int32_t> ids;
  if (!text.empty() && lookup(" ") >= 0) ids.push_back(lookup(" "));
  std::string cp;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) cp.clear();
    cp.push_back(static_cast<char>(c));
    if (i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80 &&
        cp.size() < 4)
      continue;
    if (lookup(cp) >= 0) {
      ids.push_back(lookup(cp));
    } else {
      for (const char b : cp) {
        char name[8];
        std::snprintf(name, sizeof(name), "<0x%02X>", static_cast<unsigned char>(b));
        ids.push_back(lookup(name) >= 0 ? lookup(name) : 3 + static_cast<unsigned char>(b));
      }
    }
    cp.clear();
  }
  for (;;) {
    float best_score = -1e10f;
    int32_t best_id = -1;
    size_t best_idx = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      const int32_t id = lookup(tok.token_text(ids[i]) + tok.token_text(ids[i + 1]));
      if (id >= 0 && tok.score(id) > best_score) {
        best_score = tok.score(id);
        best_id = id;
        best_idx = i;
      }
    }
    if (best_id < 0) break;
    ids[best_idx] = best_id;
    ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best_idx) + 1);
  }
  return ids;
}

// Texts made of vocabulary pieces (so that merges chain), with stray bytes and multi-byte
// characters mixed in.
std::string random_text(const Llama2cTokenizer& tok, std::mt19937& rng, size_t pieces) {
  std::string s;
  std::uniform_int_distribution<int32_t> id(3 + 256 < tok.vocab_size() ? 3 + 256 : 0,
                                            tok.vocab_size() - 1);
  std::uniform_int_distribution<int> kind(0, 19), byte(0, 255);
  for (size_t i = 0; i < pieces; ++i) {
    const int k = kind(rng);
    if (k == 0)
      s.push_back(static_cast<char>(byte(rng)));
    else if (k == 1)
      s += "\xC3\xA9";
    else if (k == 2)
      s += ' ';
    else
      s += tok.token_text(id(rng));
  }
  return s;
}

TEST(Llama2cTokenizer, HeapMergesGiveRunCsIdsOnRealAndRandomTexts) {
  KVCACHE_REQUIRE_STORIES();
  const Llama2cTokenizer tok(stories_dir() + "/tok512.bin", 512);
  std::vector<std::string> texts;
  for (const char* f :
       {"/golden/stories260K/once_upon_a_time.txt", "/golden/stories260K/empty.txt",
        "/vocab/ggml-vocab-llama-spm.gguf.inp", "/vocab/ggml-vocab-gpt-2.gguf.inp"}) {
    const std::string t = read_file(testing_util::shared_dir() + f);
    if (!t.empty()) texts.push_back(t.substr(0, 2000));
  }
  ASSERT_FALSE(texts.empty());
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i)
    texts.push_back(random_text(tok, rng, 1 + static_cast<size_t>(rng() % 60)));
  for (const std::string& t : texts)
    EXPECT_EQ(tok.encode(t), reference_encode(tok, t)) << "\"" << t << "\"";
}

// A vocabulary of every string of 2 to 4 letters over {a, b, c, space} with scores from a set
// of three: ties everywhere, so the order of equal-score merges decides the ids. Some pieces
// score -1e10 or NaN, which run.c never merges; one piece exists twice (the lowest id is used).
TEST(Llama2cTokenizer, HeapMergesBreakTiesLeftmostAsRunC) {
  const testing_util::ScratchDir dir("llama2c");
  std::vector<std::pair<std::string, float>> extra = {{" ", -1}, {"a", -1}, {"b", -1}, {"c", -1}};
  std::mt19937 rng(5);
  const float kScores[] = {-2.0f, -3.0f, -3.0f, -4.0f};
  std::vector<std::string> words = {""};
  for (int len = 1; len <= 4; ++len) {
    std::vector<std::string> longer;
    for (const std::string& w : words)
      for (const char c : {'a', 'b', 'c', ' '}) longer.push_back(w + c);
    words = longer;
    if (len < 2) continue;
    for (const std::string& w : words) {
      const unsigned r = rng() % 40;
      const float score = r == 0   ? -1e10f
                          : r == 1 ? std::numeric_limits<float>::quiet_NaN()
                                   : kScores[rng() % 4];
      extra.emplace_back(w, score);
    }
  }
  extra.emplace_back("ab", 5.0f);  // a second "ab": never looked up (the first one wins)
  write_file(dir.file("ties.bin"), tokenizer_bytes(extra));
  const Llama2cTokenizer tok(dir.file("ties.bin"), 259 + static_cast<int32_t>(extra.size()));
  std::uniform_int_distribution<int> letter(0, 3);
  for (int i = 0; i < 500; ++i) {
    std::string t;
    const size_t n = 1 + rng() % (i < 450 ? 40 : 400);
    for (size_t k = 0; k < n; ++k) t.push_back("abc "[letter(rng)]);
    EXPECT_EQ(tok.encode(t), reference_encode(tok, t)) << "\"" << t << "\"";
  }
}

// The cost bound itself, counted rather than timed: run.c's loop looks up every adjacent pair
// after every merge (n^2/2 lookups: 2 s of a core for 16,000 characters); the heap looks up the
// n - 1 first pairs and the two a merge creates.
TEST(Llama2cTokenizer, EncodeLooksUpEachPairOnceAndTwoPerMerge) {
  KVCACHE_REQUIRE_STORIES();
  const Llama2cTokenizer tok(stories_dir() + "/tok512.bin", 512);
  std::string text;
  while (text.size() < 16000)
    text += "Once upon a time, there was a little girl named Lily. She loved to play outside. ";
  Llama2cTokenizer::EncodeCounts counts;
  const std::vector<int32_t> ids = tok.encode(text, &counts);
  EXPECT_EQ(counts.symbols, static_cast<int64_t>(text.size()) + 1);
  EXPECT_EQ(counts.merges, counts.symbols - static_cast<int64_t>(ids.size()));
  EXPECT_GT(counts.merges, counts.symbols / 2);
  EXPECT_GE(counts.pair_lookups, counts.symbols - 1);
  EXPECT_LE(counts.pair_lookups, counts.symbols - 1 + 2 * counts.merges);  // < 3 n
  EXPECT_LE(counts.pair_lookups, 3 * counts.symbols);
  EXPECT_EQ(ids, tok.encode(text));
}

TEST(Llama2cTokenizer, BadFilesNameTheFileAndTheProblem) {
  const testing_util::ScratchDir dir("llama2c");
  const std::string bytes = tokenizer_bytes({{" ", -1}});
  write_file(dir.file("tok.bin"), bytes);
  EXPECT_NO_THROW(Llama2cTokenizer(dir.file("tok.bin"), 260));
  auto expect = [&](const std::string& path, int32_t vocab, const std::string& needle) {
    try {
      Llama2cTokenizer t(path, vocab);
      ADD_FAILURE() << "no error for " << path;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect(dir.file("tok.bin"), 300, "truncated");  // vocabulary larger than the file
  write_file(dir.file("cut.bin"), bytes.substr(0, bytes.size() - 3));
  expect(dir.file("cut.bin"), 260, "token 259");
  write_file(dir.file("empty.bin"), "");
  expect(dir.file("empty.bin"), 260, "truncated");
  std::string bad_len = bytes;
  const int32_t huge = 1000;
  std::memcpy(bad_len.data() + 4 + 4, &huge, 4);  // token 0's length
  write_file(dir.file("bad_len.bin"), bad_len);
  expect(dir.file("bad_len.bin"), 260, "length");
  expect(dir.file("nope.bin"), 260, "cannot open");
  // A vocabulary size the bytes cannot hold is refused before the tables are sized (2^31 - 1
  // entries asked for 64 GiB of strings: std::bad_alloc before the check).
  expect(dir.file("tok.bin"), INT32_MAX, "cannot hold");
  const Llama2cTokenizer mem("in-memory tok.bin", std::string_view(bytes), 260);
  EXPECT_EQ(mem.vocab_size(), 260);
  EXPECT_EQ(count_llama2c_tokenizer_entries(bytes), 260);
  EXPECT_EQ(count_llama2c_tokenizer_entries(bytes.substr(0, bytes.size() - 1)), 0);
}

}  // namespace
}  // namespace kvcache
