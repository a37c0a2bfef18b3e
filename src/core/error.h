// Errors in three tiers (see docs/architecture.md):
//  1. bad input (files, configs, requests, arguments) -> throw kvcache::Error with a message that
//     says what, where, and what to do; caught at the CLI/server boundary (exit code 2);
//  2. expected outcomes (no free block, no prefix match) -> return values, never exceptions;
//  3. broken invariants (bugs) -> KV_CHECK aborts with file:line, always on, also in Release.
#pragma once

#include <stdexcept>
#include <string>

namespace kvcache {

enum class ErrorKind {
  kInvalidArgument,  // a caller passed something that cannot work (shape, index, option)
  kOutOfRange,       // a write or read past a fixed capacity (static cache, window)
  kFormat,           // a file's bytes do not follow its format
  kIo,               // a file cannot be opened, read or written
  kUnsupported,      // valid input this build does not handle (dtype, layer type)
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message);

}  // namespace kvcache

// Always-on invariant check for tier-3 errors (bugs). Never use it for user input.
#define KV_CHECK(cond, msg)                                                 \
  do {                                                                      \
    if (!(cond)) ::kvcache::check_failed(__FILE__, __LINE__, #cond, (msg)); \
  } while (0)
