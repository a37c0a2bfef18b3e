// The greedy pair merge at the heart of the BPE-family tokenizers (SentencePiece BPE, byte-level
// BPE), as llama.cpp's llm_tokenizer_spm/bpe sessions run it: a run of text split into UTF-8
// characters kept as a linked list of symbols, every mergeable adjacent pair waiting in a heap,
// the best pair merged into its left symbol, and only the two pairs a merge creates queued
// anew. What makes a pair mergeable, which pair is best and when a queued pair went stale are
// the tokenizer's: it passes them in.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <queue>
#include <string_view>
#include <vector>

#include "model/unicode.h"

namespace kvcache {

// One symbol of a run: a view into the run's text, which must outlive the symbols.
struct MergeSymbol {
  int prev;  // -1 at the start of the list
  int next;  // -1 at the end
  const char* text;
  size_t n;  // bytes; 0 once merged into its left neighbour
  std::string_view view() const { return {text, n}; }
};

// The run's UTF-8 characters (by lead byte, unvalidated: a stray byte stands alone), linked in
// order.
inline std::vector<MergeSymbol> utf8_symbols(std::string_view text) {
  std::vector<MergeSymbol> sym;
  sym.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t n =
        std::min(utf8_sequence_length(static_cast<unsigned char>(text[off])), text.size() - off);
    const int idx = static_cast<int>(sym.size());
    sym.push_back({idx - 1, off + n == text.size() ? -1 : idx + 1, text.data() + off, n});
    off += n;
  }
  return sym;
}

// Merges adjacent symbols of `sym` until no queued pair is left. Pair has int members `left`
// and `right` (symbol indices); Order is the heap's comparator (the best pair compares greatest).
// propose(left, right) returns the Pair to queue for two neighbours, or nullopt when they do not
// merge; fresh(pair) says whether a popped pair still describes its two symbols (false once an
// earlier merge grew either of them). A pair whose side was merged away is skipped before.
template <class Pair, class Order, class Propose, class Fresh>
void merge_symbol_pairs(std::vector<MergeSymbol>& sym, Propose propose, Fresh fresh) {
  std::priority_queue<Pair, std::vector<Pair>, Order> queue;
  auto offer = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    if (std::optional<Pair> p = propose(left, right)) queue.push(std::move(*p));
  };
  for (int i = 1; i < static_cast<int>(sym.size()); ++i) offer(i - 1, i);
  while (!queue.empty()) {
    const Pair p = queue.top();
    queue.pop();
    MergeSymbol& l = sym[static_cast<size_t>(p.left)];
    MergeSymbol& r = sym[static_cast<size_t>(p.right)];
    if (l.n == 0 || r.n == 0 || !fresh(p)) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = p.left;
    offer(l.prev, p.left);
    offer(p.left, l.next);
  }
}

// Calls f(symbol) for each symbol left in the list, in text order.
template <class F>
void for_each_symbol(const std::vector<MergeSymbol>& sym, F f) {
  for (int i = sym.empty() ? -1 : 0; i != -1; i = sym[static_cast<size_t>(i)].next)
    f(sym[static_cast<size_t>(i)]);
}

}  // namespace kvcache
