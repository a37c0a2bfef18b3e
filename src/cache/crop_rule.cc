#include "cache/crop_rule.h"

#include <algorithm>
#include <atomic>
#include <cstdio>

namespace kvcache {

namespace {
std::atomic<bool> g_warned{false};
}  // namespace

int64_t crop_target_length(int64_t n, int64_t seq_length) {
  if (n <= 0) return std::max<int64_t>(0, seq_length + n);  // n = 0: seq_length
  if (!g_warned.exchange(true)) {
    std::fprintf(stderr,
                 "kvcache: warning: crop(n) with n > 0 (keep the first n tokens) is deprecated, "
                 "as in transformers v5; pass a negative n to remove the last |n| tokens\n");
  }
  return std::min(n, seq_length);
}

bool crop_deprecation_warned() {
  return g_warned.load();
}

void reset_crop_deprecation_warning() {
  g_warned.store(false);
}

}  // namespace kvcache
