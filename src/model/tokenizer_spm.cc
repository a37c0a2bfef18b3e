#include "model/tokenizer_spm.h"

#include <cstdio>
#include <map>
#include <queue>

#include "core/error.h"
#include "model/unicode.h"

namespace kvcache {

namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

std::string escape_spaces(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  for (char c : s) {
    if (c == ' ') out += kSpaceMarker;
    else out.push_back(c);
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

struct Symbol {
  int prev;
  int next;
  const char* text;
  size_t n;  // bytes; 0 once merged into its left neighbour
};

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
    : vocab_(std::move(vocab)), add_space_prefix_(add_space_prefix) {
  vocab_.build_index();
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
    if (id >= 0) out.push_back(id);
    else if (vocab_.unk >= 0) out.push_back(vocab_.unk);  // a vocabulary without byte fallback
  }
}

void SpmTokenizer::encode_run(const std::string& text, std::vector<int32_t>& out) const {
  std::vector<Symbol> sym;
  sym.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t n = std::min(utf8_sequence_length(static_cast<unsigned char>(text[off])), text.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + n == text.size() ? -1 : idx + 1, text.data() + off, n});
    off += n;
  }
  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
  // Which two symbols a merged text came from, so an unknown merged symbol can be split again.
  std::map<std::string, std::pair<int, int>, std::less<>> rev_merge;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const std::string_view merged(sym[static_cast<size_t>(left)].text,
                                  sym[static_cast<size_t>(left)].n + sym[static_cast<size_t>(right)].n);
    const int32_t id = vocab_.find(merged);
    if (id < 0) return;
    queue.push({left, right, vocab_.scores[static_cast<size_t>(id)], merged.size()});
    rev_merge[std::string(merged)] = {left, right};
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[static_cast<size_t>(b.left)];
    Symbol& r = sym[static_cast<size_t>(b.right)];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // one side already merged away
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  // Emit each final symbol: a token if it is one, else undo its merges recursively, and bytes
  // for pieces that never were tokens.
  auto emit = [&](auto&& self, const Symbol& s) -> void {
    const std::string_view piece(s.text, s.n);
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
  for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[static_cast<size_t>(i)].next) {
    emit(emit, sym[static_cast<size_t>(i)]);
  }
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

const std::string& SpmTokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_.size()) {
    throw Error(ErrorKind::kInvalidArgument, "token id " + std::to_string(id) + " is outside the vocabulary of " +
                                                 std::to_string(vocab_.size()));
  }
  return vocab_.tokens[static_cast<size_t>(id)];
}

std::string SpmTokenizer::decode(int32_t id) const {
  const std::string& t = token_text(id);
  switch (vocab_.types[static_cast<size_t>(id)]) {
    case TokenType::kControl:
    case TokenType::kUnused:
      return "";
    case TokenType::kUnknown:
      return "\xE2\x96\x85";  // U+2585, llama.cpp's rendering of <unk>
    case TokenType::kByte:
      if (const int b = spm_byte_token_value(t); b >= 0) return std::string(1, static_cast<char>(b));
      return t;  // loaders refuse such vocabularies; a hand-built one decodes the text as is
    case TokenType::kUserDefined:
      return t;
    default:
      return unescape_spaces(t);
  }
}

}  // namespace kvcache
