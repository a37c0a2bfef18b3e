#include "model/tokenizer_bpe.h"

#include <algorithm>
#include <cstdio>
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
  if (!params_.byte_level && !params_.decode_text) {
    throw Error(ErrorKind::kInvalidArgument,
                "a BpeTokenizer that is not byte-level needs BpeParams::decode_text");
  }
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
  bool pending_unk = false;
  for_each_symbol(sym, [&](const MergeSymbol& s) {
    const std::string_view piece = s.view();
    if (const int32_t id = vocab_.find(piece); id >= 0) {
      if (pending_unk) out.push_back(params_.unk);
      pending_unk = false;
      out.push_back(id);
      return;
    }
    if (!params_.byte_level || params_.byte_fallback || params_.unk >= 0) {
      fall_back(piece, out, pending_unk);
      return;
    }
    // A symbol that is no token (a vocabulary without all 256 byte symbols): its single bytes,
    // where those are tokens.
    for (char c : piece) {
      if (const int32_t id = vocab_.find(std::string_view(&c, 1)); id >= 0) out.push_back(id);
    }
  });
  if (pending_unk) out.push_back(params_.unk);
}

// tokenizers' BPE::merge_word (models/bpe/model.rs) decides per character before merging; the
// merges only join tokens (their parts must be in the vocabulary), so a character that is no
// token is still alone here and deciding after the merges gives the same ids. As there, a
// pending unknown token is written when the next known character comes (or at the word's end),
// after any byte tokens in between.
void BpeTokenizer::fall_back(std::string_view symbol, std::vector<int32_t>& out,
                             bool& pending_unk) const {
  for (size_t i = 0; i < symbol.size();) {
    const size_t n =
        std::min(utf8_sequence_length(static_cast<unsigned char>(symbol[i])), symbol.size() - i);
    const std::string_view ch = symbol.substr(i, n);
    i += n;
    if (params_.byte_fallback) {
      int32_t ids[4];
      bool all = true;
      for (size_t k = 0; k < ch.size() && all; ++k) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", static_cast<unsigned char>(ch[k]));
        ids[k] = vocab_.find(name);
        all = ids[k] >= 0;
      }
      if (all) {
        out.insert(out.end(), ids, ids + ch.size());
        continue;
      }
    }
    if (params_.unk < 0) continue;  // no unknown token: the character is dropped
    if (pending_unk && !params_.fuse_unk) out.push_back(params_.unk);
    pending_unk = true;
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  bool first = true;
  for (const Vocabulary::Fragment& f : vocab_.partition(text)) {
    // Metaspace's prepend_scheme "first" prefixes only text that begins the input.
    const bool at_start = first;
    first = false;
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
    const std::vector<std::string> words = params_.pre->split(piece, at_start);
    std::string encoded;
    for (const std::string& w : words) {
      if (!params_.byte_level) {
        encode_word(w, out);
        continue;
      }
      encoded.clear();
      for (char c : w) append_utf8(encoded, byte_to_unicode(static_cast<uint8_t>(c)));
      encode_word(encoded, out);
    }
  }
  return out;
}

std::string BpeTokenizer::decode_piece(int32_t, const std::string& t) const {
  if (!params_.byte_level) return params_.decode_text(t);
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
