#include "model/tokenizer_bpe.h"

#include <queue>

#include "core/error.h"
#include "model/unicode.h"

namespace kvcache {

namespace {

struct Symbol {
  int prev;
  int next;
  const char* text;
  size_t n;  // 0 once merged into its left neighbour
};

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
    : vocab_(std::move(vocab)), params_(std::move(params)) {
  vocab_.build_index();
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
  std::vector<Symbol> sym;
  for (size_t off = 0; off < word.size();) {
    const size_t n = std::min(utf8_sequence_length(static_cast<unsigned char>(word[off])), word.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + n == word.size() ? -1 : idx + 1, word.data() + off, n});
    off += n;
  }
  std::priority_queue<Bigram, std::vector<Bigram>, BigramGreater> queue;
  auto text_of = [&](int i) { return std::string(sym[static_cast<size_t>(i)].text, sym[static_cast<size_t>(i)].n); };
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    std::string a = text_of(left), b = text_of(right);
    const int r = rank(a, b);
    if (r < 0) return;
    queue.push({left, right, r, a + b});
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = sym[static_cast<size_t>(b.left)];
    Symbol& r = sym[static_cast<size_t>(b.right)];
    if (l.n == 0 || r.n == 0) continue;
    if (text_of(b.left) + text_of(b.right) != b.text) continue;  // outdated by an earlier merge
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[static_cast<size_t>(i)].next) {
    const std::string piece = text_of(i);
    if (const int32_t id = vocab_.find(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    // A symbol that is no token (a vocabulary without all 256 byte symbols): its single bytes,
    // where those are tokens.
    for (char c : piece) {
      if (const int32_t id = vocab_.find(std::string_view(&c, 1)); id >= 0) out.push_back(id);
    }
  }
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  for (const Vocabulary::Fragment& f : vocab_.partition(text)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    const std::vector<std::string> words =
        params_.pre == BpePreTokenizer::kGpt2 ? pretokenize_gpt2(f.text) : pretokenize_llama3(f.text);
    std::string encoded;
    for (const std::string& w : words) {
      encoded.clear();
      for (char c : w) append_utf8(encoded, byte_to_unicode(static_cast<uint8_t>(c)));
      encode_word(encoded, out);
    }
  }
  return out;
}

const std::string& BpeTokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_.size()) {
    throw Error(ErrorKind::kInvalidArgument, "token id " + std::to_string(id) + " is outside the vocabulary of " +
                                                 std::to_string(vocab_.size()));
  }
  return vocab_.tokens[static_cast<size_t>(id)];
}

std::string BpeTokenizer::decode(int32_t id) const {
  const std::string& t = token_text(id);
  switch (vocab_.types[static_cast<size_t>(id)]) {
    case TokenType::kControl:
    case TokenType::kUnused:
      return "";
    case TokenType::kUserDefined:
      return t;
    default:
      break;
  }
  std::string out;
  for (uint32_t cp : utf8_to_codepoints(t)) {
    const int b = unicode_to_byte(cp);
    if (b >= 0) out.push_back(static_cast<char>(b));
    else append_utf8(out, cp);  // not in the byte alphabet: keep the character
  }
  return out;
}

}  // namespace kvcache
