#include "model/tokenizer_bpe.h"

#include <optional>

#include "core/error.h"
#include "model/symbol_merge.h"
#include "model/unicode.h"

namespace kvcache {

namespace {

struct Bigram {
  int left;
  int right;
  int rank;
  std::string text;  // the merged text when queued; a mismatch later means the entry is stale
};

// Lowest rank first; on ties the leftmost pair (llama.cpp's llm_bigram_bpe::comparator).
struct BigramGreater {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

BpeTokenizer::BpeTokenizer(Vocabulary vocab, BpeParams params)
    : VocabTokenizer(std::move(vocab)), params_(std::move(params)) {
  if (!params_.pre)
    throw Error(ErrorKind::kInvalidArgument, "BpeTokenizer needs a pre-tokenizer (BpeParams::pre)");
  ranks_.reserve(params_.merges.size());
  for (size_t i = 0; i < params_.merges.size(); ++i) {
    ranks_.emplace(params_.merges[i], static_cast<int>(i));  // the first occurrence keeps its rank
  }
  params_.merges.clear();
  params_.merges.shrink_to_fit();
}

int BpeTokenizer::rank(const std::string& a, const std::string& b) const {
  auto it = ranks_.find({a, b});
  return it == ranks_.end() ? -1 : it->second;
}

void BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  if (params_.ignore_merges) {
    if (int32_t id = vocab_.find(word); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  std::vector<MergeSymbol> sym = utf8_symbols(word);
  auto text_of = [&](int i) { return std::string(sym[static_cast<size_t>(i)].view()); };
  merge_symbol_pairs<Bigram, BigramGreater>(
      sym,
      [&](int left, int right) -> std::optional<Bigram> {
        std::string a = text_of(left), b = text_of(right);
        const int r = rank(a, b);
        if (r < 0) return std::nullopt;
        return Bigram{left, right, r, a + b};
      },
      [&](const Bigram& b) { return text_of(b.left) + text_of(b.right) == b.text; });
  for_each_symbol(sym, [&](const MergeSymbol& s) {
    const std::string_view piece = s.view();
    if (const int32_t id = vocab_.find(piece); id >= 0) {
      out.push_back(id);
      return;
    }
    // A symbol that is no token (a vocabulary without all 256 byte symbols): its single bytes,
    // where those are tokens.
    for (char c : piece) {
      if (const int32_t id = vocab_.find(std::string_view(&c, 1)); id >= 0) out.push_back(id);
    }
  });
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  for (const Vocabulary::Fragment& f : vocab_.partition(text)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    std::string normalized;
    std::string_view piece = f.text;
    for (const auto& n : params_.normalizers) {
      normalized = n(piece);
      piece = normalized;
    }
    const std::vector<std::string> words = params_.pre->split(piece);
    std::string encoded;
    for (const std::string& w : words) {
      encoded.clear();
      for (char c : w) append_utf8(encoded, byte_to_unicode(static_cast<uint8_t>(c)));
      encode_word(encoded, out);
    }
  }
  return out;
}

std::string BpeTokenizer::decode_piece(int32_t, const std::string& t) const {
  std::string out;
  for (uint32_t cp : utf8_to_codepoints(t)) {
    const int b = unicode_to_byte(cp);
    if (b >= 0)
      out.push_back(static_cast<char>(b));
    else
      append_utf8(out, cp);  // not in the byte alphabet: keep the character
  }
  return out;
}

}  // namespace kvcache
