// The session file's framing (runtime/session_file.h), shared by the dense sessions and the
// server's paged sequences: a writer that hashes as it writes to path + ".tmp" and renames on
// commit, and a reader that loads the whole file, checks magic, version and (optionally) the
// checksum before anyone reads the payload.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "cache/layer_state.h"
#include "core/digest.h"
#include "model/mapped_file.h"
#include "runtime/session_file.h"

namespace kvcache {

class SessionFileWriter : public StateWriter {
 public:
  explicit SessionFileWriter(const std::string& path);  // Error(kIo) when it cannot be created
  ~SessionFileWriter() override;                        // uncommitted: the .tmp is removed
  SessionFileWriter(const SessionFileWriter&) = delete;
  SessionFileWriter& operator=(const SessionFileWriter&) = delete;

  // Everything up to the payload (runtime/session_file.h's format).
  void header(const Digest128& fingerprint, const std::string& implementation,
              const std::string& kv_dtype, const std::vector<std::string>& layer_types,
              std::span<const int32_t> tokens);
  void write(const void* data, size_t n) override;
  // Appends the checksum, closes and renames the .tmp onto the path; returns the file's bytes.
  uint64_t commit();

 private:
  static constexpr size_t kBufferBytes = size_t{4} << 20;
  void flush();
  void put(const char* p, size_t n);

  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  std::vector<char> buffer_;
  Hasher hasher_;
  uint64_t bytes_ = 0;
};

class SessionFileReader : public StateReader {
 public:
  // Maps the whole file and reads its header; verify: the checksum too (Error(kFormat) when it
  // does not match). Error(kIo) when the file cannot be read.
  SessionFileReader(const std::string& path, bool verify);

  const SessionFileInfo& info() const { return info_; }
  // Error(kFormat) naming what differs first: model fingerprint, layer types, implementation,
  // kv dtype.
  void check_matches(const Digest128& fingerprint, const std::string& implementation,
                     const std::string& kv_dtype,
                     const std::vector<std::string>& layer_types) const;
  void read(void* data, size_t n) override;
  // The next n bytes in place (valid while the reader lives); Error(kFormat) like read().
  const uint8_t* take(size_t n);
  // Error(kFormat) unless the payload was read exactly to its end.
  void expect_end() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  MappedFile file_;  // mapped, not copied: restore reads the page cache once
  const uint8_t* bytes_ = nullptr;
  size_t offset_ = 0;
  size_t end_ = 0;  // the payload's end (the checksum follows)
  SessionFileInfo info_;
};

}  // namespace kvcache
