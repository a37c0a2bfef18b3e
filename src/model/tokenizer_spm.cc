#include "model/tokenizer_spm.h"

#include <cstdio>
#include <map>
#include <optional>

#include "model/symbol_merge.h"

namespace kvcache {

namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

std::string escape_spaces(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  for (char c : s) {
    if (c == ' ')
      out += kSpaceMarker;
    else
      out.push_back(c);
  }
  return out;
}

std::string unescape_spaces(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    if (s.substr(i, 3) == kSpaceMarker) {
      out.push_back(' ');
      i += 3;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;  // bytes of the merged text: stale entries are detected by it
};

// Highest score first; on ties the leftmost pair (llama.cpp's llm_bigram_spm::comparator).
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

int spm_byte_token_value(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return -1;
  const int hi = hex_digit(t[3]), lo = hex_digit(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

SpmTokenizer::SpmTokenizer(Vocabulary vocab, bool add_space_prefix)
    : VocabTokenizer(std::move(vocab)), add_space_prefix_(add_space_prefix) {
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    byte_tokens_[b] = vocab_.find(buf);
    if (byte_tokens_[b] < 0) byte_tokens_[b] = vocab_.find(std::string(1, static_cast<char>(b)));
  }
}

void SpmTokenizer::push_bytes(std::string_view piece, std::vector<int32_t>& out) const {
  for (char c : piece) {
    const int32_t id = byte_tokens_[static_cast<unsigned char>(c)];
    if (id >= 0)
      out.push_back(id);
    else if (vocab_.unk >= 0)
      out.push_back(vocab_.unk);  // a vocabulary without byte fallback
  }
}

void SpmTokenizer::encode_run(const std::string& text, std::vector<int32_t>& out) const {
  std::vector<MergeSymbol> sym = utf8_symbols(text);
  // Which two symbols a merged text came from, so an unknown merged symbol can be split again.
  std::map<std::string, std::pair<int, int>, std::less<>> rev_merge;
  merge_symbol_pairs<Bigram, BigramLess>(
      sym,
      [&](int left, int right) -> std::optional<Bigram> {
        const std::string_view merged(
            sym[static_cast<size_t>(left)].text,
            sym[static_cast<size_t>(left)].n + sym[static_cast<size_t>(right)].n);
        const int32_t id = vocab_.find(merged);
        if (id < 0) return std::nullopt;
        rev_merge[std::string(merged)] = {left, right};
        return Bigram{left, right, vocab_.scores[static_cast<size_t>(id)], merged.size()};
      },
      [&](const Bigram& b) {
        return sym[static_cast<size_t>(b.left)].n + sym[static_cast<size_t>(b.right)].n == b.size;
      });
  // Emit each final symbol: a token if it is one, else undo its merges recursively, and bytes
  // for pieces that never were tokens.
  auto emit = [&](auto&& self, const MergeSymbol& s) -> void {
    const std::string_view piece = s.view();
    const int32_t id = vocab_.find(piece);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
    auto it = rev_merge.find(piece);
    if (it == rev_merge.end()) {
      push_bytes(piece, out);
      return;
    }
    self(self, sym[static_cast<size_t>(it->second.first)]);
    self(self, sym[static_cast<size_t>(it->second.second)]);
  };
  for_each_symbol(sym, [&](const MergeSymbol& s) { emit(emit, s); });
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  bool prev_special = true;  // the first run gets the space prefix
  for (const Vocabulary::Fragment& f : vocab_.partition(text)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    std::string run = (add_space_prefix_ && prev_special) ? " " : "";
    run += f.text;
    encode_run(escape_spaces(run), out);
    prev_special = false;
  }
  return out;
}

std::string SpmTokenizer::decode_piece(int32_t id, const std::string& t) const {
  switch (vocab_.types[static_cast<size_t>(id)]) {
    case TokenType::kUnknown:
      return "\xE2\x96\x85";  // U+2585, llama.cpp's rendering of <unk>
    case TokenType::kByte:
      if (const int b = spm_byte_token_value(t); b >= 0)
        return std::string(1, static_cast<char>(b));
      return t;  // loaders refuse such vocabularies; a hand-built one decodes the text as is
    default:
      return unescape_spaces(t);
  }
}

}  // namespace kvcache
