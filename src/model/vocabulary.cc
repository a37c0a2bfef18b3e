#include "model/vocabulary.h"

#include <algorithm>

namespace kvcache {

void Vocabulary::build_index() {
  scores.resize(tokens.size(), 0.0f);
  types.resize(tokens.size(), TokenType::kNormal);
  index_.clear();
  index_.reserve(tokens.size());
  user_defined_.clear();
  for (size_t i = 0; i < tokens.size(); ++i) {
    index_[tokens[i]] = static_cast<int32_t>(i);
    if (types[i] == TokenType::kUserDefined && !tokens[i].empty())
      user_defined_.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(user_defined_.begin(), user_defined_.end(), [&](int32_t a, int32_t b) {
    return tokens[static_cast<size_t>(a)].size() > tokens[static_cast<size_t>(b)].size();
  });
}

std::vector<Vocabulary::Fragment> Vocabulary::partition(std::string_view text) const {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, text});
  for (int32_t id : user_defined_) {
    const std::string& tok = tokens[static_cast<size_t>(id)];
    std::vector<Fragment> next;
    for (const Fragment& f : frags) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      std::string_view rest = f.text;
      for (size_t hit; (hit = rest.find(tok)) != std::string_view::npos;) {
        if (hit > 0) next.push_back({-1, rest.substr(0, hit)});
        next.push_back({id, {}});
        rest = rest.substr(hit + tok.size());
      }
      if (!rest.empty()) next.push_back({-1, rest});
    }
    frags = std::move(next);
  }
  return frags;
}

}  // namespace kvcache
