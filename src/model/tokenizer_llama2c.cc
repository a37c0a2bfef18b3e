#include "model/tokenizer_llama2c.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <queue>

#include "core/error.h"

namespace kvcache {

namespace {

// run.c parses byte pieces with sscanf("<0x%02hhX>"): "<0x" and one or two hex digits.
int parse_byte_piece(std::string_view s) {
  if (s.size() < 4 || s.substr(0, 3) != "<0x") return -1;
  int v = 0, digits = 0;
  for (size_t i = 3; i < s.size() && digits < 2; ++i, ++digits) {
    const char c = s[i];
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      break;
    v = v * 16 + d;
  }
  return digits > 0 ? v : -1;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, path + ": cannot open the tokenizer file");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

int32_t count_llama2c_tokenizer_entries(std::string_view b) {
  if (b.size() < 4) return 0;
  size_t off = 4;
  int32_t n = 0;
  while (off < b.size()) {
    int32_t len = 0;
    if (b.size() - off < 8 || n == INT32_MAX) return 0;
    std::memcpy(&len, b.data() + off + 4, 4);
    if (len < 0 || static_cast<size_t>(len) > b.size() - off - 8) return 0;
    off += 8 + static_cast<size_t>(len);
    ++n;
  }
  return n;
}

Llama2cTokenizer::Llama2cTokenizer(const std::string& path, int32_t vocab_size)
    : Llama2cTokenizer(path, read_file(path), vocab_size) {}

Llama2cTokenizer::Llama2cTokenizer(const std::string& path, std::string_view bytes,
                                   int32_t vocab_size)
    : path_(path) {
  if (vocab_size <= 0) {
    throw Error(ErrorKind::kInvalidArgument,
                path + ": vocabulary size " + std::to_string(vocab_size) + " must be positive");
  }
  // Every entry takes at least its 8-byte score and length: a count the bytes cannot hold is
  // refused before the tables are allocated.
  if (bytes.size() < 4 || static_cast<uint64_t>(vocab_size) > (bytes.size() - 4) / 8) {
    throw Error(
        ErrorKind::kFormat,
        path + ": truncated llama2.c tokenizer: " + std::to_string(bytes.size()) +
            " bytes cannot hold " + std::to_string(vocab_size) +
            " entries of at least 8 bytes each (does the tokenizer match the model's vocabulary?)");
  }
  size_t off = 0;
  auto read = [&](void* dst, size_t n, const std::string& what) {
    if (bytes.size() - off < n) {
      throw Error(ErrorKind::kFormat,
                  path + ": truncated llama2.c tokenizer: " + what + " needs bytes [" +
                      std::to_string(off) + ", " + std::to_string(off + n) + ") but the file has " +
                      std::to_string(bytes.size()) + " (does the tokenizer match the model's " +
                      std::to_string(vocab_size) + "-token vocabulary?)");
    }
    std::memcpy(dst, bytes.data() + off, n);
    off += n;
  };
  int32_t max_len = 0;
  read(&max_len, 4, "the header");
  if (max_len <= 0 || max_len > (1 << 16)) {
    throw Error(ErrorKind::kFormat, path + ": not a llama2.c tokenizer: max_token_length " +
                                        std::to_string(max_len) + " is out of range");
  }
  pieces_.resize(static_cast<size_t>(vocab_size));
  scores_.resize(static_cast<size_t>(vocab_size));
  for (int32_t i = 0; i < vocab_size; ++i) {
    const std::string what = "token " + std::to_string(i);
    read(&scores_[static_cast<size_t>(i)], 4, what + "'s score");
    int32_t len = 0;
    read(&len, 4, what + "'s length");
    if (len < 0 || len > max_len) {
      throw Error(ErrorKind::kFormat,
                  path + ": " + what + " has length " + std::to_string(len) +
                      ", outside [0, max_token_length=" + std::to_string(max_len) + "]");
    }
    std::string piece(static_cast<size_t>(len), '\0');
    read(piece.data(), static_cast<size_t>(len), what + "'s bytes");
    // run.c stores pieces as C strings: anything after an embedded NUL is invisible to it.
    piece.resize(std::strlen(piece.c_str()));
    pieces_[static_cast<size_t>(i)] = std::move(piece);
  }
  // Index after all strings are in place (string_views point into pieces_).
  for (int32_t i = 0; i < vocab_size; ++i) index_.emplace(pieces_[static_cast<size_t>(i)], i);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    const int32_t id = lookup(name);
    byte_ids_[b] = id >= 0 ? id : (3 + b < vocab_size ? 3 + b : -1);
  }
  space_id_ = lookup(" ");
}

int32_t Llama2cTokenizer::lookup(std::string_view piece) const {
  const auto it = index_.find(piece);
  return it == index_.end() ? -1 : it->second;
}

const std::string& Llama2cTokenizer::checked(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    throw Error(ErrorKind::kInvalidArgument, "token id " + std::to_string(id) +
                                                 " is outside the vocabulary [0, " +
                                                 std::to_string(vocab_size()) + ")");
  }
  return pieces_[static_cast<size_t>(id)];
}

const std::string& Llama2cTokenizer::token_text(int32_t id) const {
  return checked(id);
}
float Llama2cTokenizer::score(int32_t id) const {
  checked(id);
  return scores_[static_cast<size_t>(id)];
}

std::vector<int32_t> Llama2cTokenizer::encode(std::string_view text) const {
  return encode(text, nullptr);
}

namespace {

// A mergeable adjacent pair as it was when queued. Nodes keep their first index for life (a
// merge keeps the left node and retires the right one), so index order is text order, and a
// node's version changes whenever its token does or it is retired: an entry whose versions
// still match describes a pair that is adjacent now, with the merge it had then.
struct PairCandidate {
  float score;
  int32_t left, right;
  uint32_t left_version, right_version;
  int32_t merged_id;
};

// run.c's scan keeps the first pair of the highest score (strictly greater replaces): the heap
// pops the highest score, and among equal scores the leftmost pair.
struct PairCandidateLess {
  bool operator()(const PairCandidate& a, const PairCandidate& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

// run.c starts its search from best_score = -1e10: a pair scoring no more never merges.
constexpr float kNoMergeScore = -1e10f;

}  // namespace

std::vector<int32_t> Llama2cTokenizer::encode(std::string_view text, EncodeCounts* counts) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() + 1);
  // add_dummy_prefix: a " " piece before non-empty text (SentencePiece's default).
  if (!text.empty() && space_id_ >= 0) ids.push_back(space_id_);
  // Split into UTF-8 code points (at most 4 bytes; stray continuation bytes stand alone), look
  // each up whole, else fall back to one token per byte. Mirrors run.c's state machine.
  std::string cp;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c & 0xC0) != 0x80) cp.clear();
    cp.push_back(static_cast<char>(c));
    const bool next_is_cont =
        i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
    if (next_is_cont && cp.size() < 4) continue;
    const int32_t id = lookup(cp);
    if (id >= 0) {
      ids.push_back(id);
    } else {
      for (const char b : cp) {
        const int32_t bid = byte_ids_[static_cast<unsigned char>(b)];
        if (bid < 0) {
          throw Error(ErrorKind::kUnsupported,
                      path_ + ": the vocabulary has no byte-fallback token for byte " +
                          std::to_string(static_cast<unsigned char>(b)));
        }
        ids.push_back(bid);
      }
    }
    cp.clear();
  }
  EncodeCounts local;
  EncodeCounts& n = counts != nullptr ? *counts : local;
  n = EncodeCounts{};
  n.symbols = static_cast<int64_t>(ids.size());
  if (ids.size() < 2) return ids;

  // Greedy merges as run.c makes them — the adjacent pair whose concatenation is a vocabulary
  // piece of the highest score, leftmost on ties, until no pair merges — without rescanning
  // every pair after each merge (O(n^2) in the text's length). The tokens form
  // a linked list, every mergeable pair waits in a max-heap, and a merge queues only the two
  // pairs it creates; entries a merge made stale are skipped when they surface. Lookups:
  // n - 1 + 2 per merge; heap work O(n log n).
  const auto count = static_cast<int32_t>(ids.size());
  std::vector<int32_t> prev(ids.size()), next(ids.size());
  std::vector<uint32_t> version(ids.size(), 0);
  for (int32_t i = 0; i < count; ++i) {
    prev[static_cast<size_t>(i)] = i - 1;
    next[static_cast<size_t>(i)] = i + 1 < count ? i + 1 : -1;
  }
  std::priority_queue<PairCandidate, std::vector<PairCandidate>, PairCandidateLess> heap;
  std::string merged;
  auto queue_pair = [&](int32_t left, int32_t right) {
    const auto l = static_cast<size_t>(left), r = static_cast<size_t>(right);
    merged = pieces_[static_cast<size_t>(ids[l])];
    merged += pieces_[static_cast<size_t>(ids[r])];
    ++n.pair_lookups;
    const int32_t id = lookup(merged);
    if (id < 0) return;
    const float score = scores_[static_cast<size_t>(id)];
    if (!(score > kNoMergeScore)) return;  // NaN never wins run.c's comparison either
    heap.push({score, left, right, version[l], version[r], id});
  };
  for (int32_t i = 0; i + 1 < count; ++i) queue_pair(i, i + 1);
  while (!heap.empty()) {
    const PairCandidate c = heap.top();
    heap.pop();
    const auto l = static_cast<size_t>(c.left), r = static_cast<size_t>(c.right);
    if (version[l] != c.left_version || version[r] != c.right_version) continue;  // stale
    ids[l] = c.merged_id;
    ++version[l];
    ++version[r];  // retired
    next[l] = next[r];
    if (next[r] >= 0) prev[static_cast<size_t>(next[r])] = c.left;
    ++n.merges;
    if (prev[l] >= 0) queue_pair(prev[l], c.left);
    if (next[l] >= 0) queue_pair(c.left, next[l]);
  }
  // Node 0 is never retired (it is nobody's right neighbour): the list starts there.
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(count - n.merges));
  for (int32_t i = 0; i >= 0; i = next[static_cast<size_t>(i)])
    out.push_back(ids[static_cast<size_t>(i)]);
  return out;
}

std::string Llama2cTokenizer::decode(int32_t id) const {
  const std::string& piece = checked(id);
  if (id == bos_id() || id == eos_id()) return "";
  const int b = parse_byte_piece(piece);
  if (b >= 0) return std::string(1, static_cast<char>(b));
  return piece;
}

std::string Llama2cTokenizer::decode_for_print(int32_t prev_id, int32_t id) const {
  std::string_view piece = checked(id);
  if (prev_id == bos_id() && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
  std::string out;
  const int b = parse_byte_piece(piece);
  if (b >= 0) {
    out.assign(1, static_cast<char>(b));
  } else {
    out.assign(piece);
  }
  // safe_printf: single bytes must be printable ASCII or whitespace (C locale isprint/isspace).
  if (out.size() == 1) {
    const auto c = static_cast<unsigned char>(out[0]);
    const bool printable = c >= 0x20 && c <= 0x7E;
    const bool space = c == ' ' || (c >= '\t' && c <= '\r');
    if (!printable && !space) out.clear();
  }
  return out;
}

}  // namespace kvcache
