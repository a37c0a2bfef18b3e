// Save / restore of a cache's content (session files, runtime/session_file.h): each container
// writes what it holds through a StateWriter and reads it back through a StateReader, so that a
// restored cache continues exactly as the saved one would have (restore ≡ recompute). The
// file format around these bytes (magic, version, model fingerprint, layer types, checksum)
// is the session file's business; a layer writes only its own fields, little-endian, and
// checks on load that they fit it (shape, dtype, capacity), throwing Error(kFormat) naming the
// layer and what differs before it changes anything it cannot undo.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "core/tensor.h"

namespace kvcache {

class StateWriter {
 public:
  virtual ~StateWriter() = default;
  virtual void write(const void* data, size_t n) = 0;

  void u32(uint32_t v);
  void i64(int64_t v);
  void str(std::string_view s);  // u32 length, bytes
  // A view's elements in row-major order of its shape (strided views are walked, not copied
  // whole), in its own dtype.
  void view(const TensorView& v);
};

class StateReader {
 public:
  virtual ~StateReader() = default;
  // Reads exactly n bytes; Error(kFormat) "session file ... ends early" when there are fewer.
  virtual void read(void* data, size_t n) = 0;

  uint32_t u32();
  int64_t i64();
  std::string str(size_t max_len = 1 << 20);
  // Fills a view (its shape and dtype are what the writer wrote: the caller checked them).
  void view(const TensorView& v);
};

}  // namespace kvcache
