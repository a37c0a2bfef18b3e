#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace kvcache {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kOutOfRange:
      return "out of range";
    case ErrorKind::kFormat:
      return "bad format";
    case ErrorKind::kIo:
      return "i/o error";
    case ErrorKind::kUnsupported:
      return "unsupported";
  }
  return "error";
}

void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "kvcache: internal invariant broken at %s:%d: %s (%s)\n", file, line,
               condition, message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace kvcache
