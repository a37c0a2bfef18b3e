#include "runtime/session_file.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "cache/layer_state.h"
#include "core/error.h"
#include "model/fingerprint.h"
#include "model/model.h"
#include "runtime/session.h"
#include "runtime/session_file_io.h"

namespace kvcache {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'C', 'S', 'E', 'S', 'S', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kDigestBytes = 16;

void refuse_paged(const Session& session, const std::string& what) {
  if (session.paged_store())
    throw Error(ErrorKind::kUnsupported,
                what + ": a paged session (--cache paged) cannot be " +
                    "saved to or restored from a session file; use --cache dynamic or static");
}

std::string kv_dtype_of(const Session& session) {
  return dtype_name(session.cache().config().options.kv_dtype.value_or(DType::kF32));
}

}  // namespace

SessionFileWriter::SessionFileWriter(const std::string& path) : path_(path), tmp_(path + ".tmp") {
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (!file_)
    throw Error(ErrorKind::kIo, "cannot write session file " + tmp_ + ": " + std::strerror(errno));
  buffer_.reserve(kBufferBytes);
}

SessionFileWriter::~SessionFileWriter() {
  if (file_) {  // not committed: leave nothing behind
    std::fclose(file_);
    std::remove(tmp_.c_str());
  }
}

void SessionFileWriter::write(const void* data, size_t n) {
  hasher_.bytes(data, n);
  bytes_ += n;
  const auto* p = static_cast<const char*>(data);
  if (buffer_.size() + n > kBufferBytes) flush();
  if (n >= kBufferBytes) {
    put(p, n);
    return;
  }
  buffer_.insert(buffer_.end(), p, p + n);
}

void SessionFileWriter::flush() {
  if (!buffer_.empty()) put(buffer_.data(), buffer_.size());
  buffer_.clear();
}

void SessionFileWriter::put(const char* p, size_t n) {
  if (std::fwrite(p, 1, n, file_) != n)
    throw Error(ErrorKind::kIo, "cannot write session file " + tmp_ + ": " + std::strerror(errno));
}

void SessionFileWriter::header(const Digest128& fingerprint, const std::string& implementation,
                               const std::string& kv_dtype,
                               const std::vector<std::string>& layer_types,
                               std::span<const int32_t> tokens) {
  write(kMagic, sizeof(kMagic));
  u32(kVersion);
  const Digest128 fp = fingerprint;
  for (uint64_t w : {fp.hi, fp.lo}) i64(static_cast<int64_t>(w));
  str(implementation);
  str(kv_dtype);
  u32(static_cast<uint32_t>(layer_types.size()));
  for (const std::string& t : layer_types) str(t);
  i64(static_cast<int64_t>(tokens.size()));
  for (int32_t t : tokens) u32(static_cast<uint32_t>(t));
}

uint64_t SessionFileWriter::commit() {
  const Digest128 d = hasher_.finish();
  uint8_t b[kDigestBytes];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(d.hi >> (8 * i));
  for (int i = 0; i < 8; ++i) b[8 + i] = static_cast<uint8_t>(d.lo >> (8 * i));
  buffer_.insert(buffer_.end(), b, b + kDigestBytes);
  bytes_ += kDigestBytes;
  flush();
  const bool ok = std::fflush(file_) == 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok || !closed) {
    std::remove(tmp_.c_str());
    throw Error(ErrorKind::kIo, "cannot write session file " + tmp_ + " (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) {
    std::remove(tmp_.c_str());
    throw Error(ErrorKind::kIo, "cannot rename " + tmp_ + " to " + path_ + ": " + ec.message());
  }
  return bytes_;
}

void SessionFileReader::read(void* data, size_t n) {
  std::memcpy(data, take(n), n);
}

const uint8_t* SessionFileReader::take(size_t n) {
  if (n > end_ - offset_)
    throw Error(ErrorKind::kFormat, "session file " + path_ + " ends early (truncated?)");
  const uint8_t* p = bytes_ + offset_;
  offset_ += n;
  return p;
}

SessionFileReader::SessionFileReader(const std::string& path, bool verify) : path_(path) {
  if (!std::filesystem::is_regular_file(path))
    throw Error(ErrorKind::kIo, "cannot open session file " + path);
  file_ = MappedFile(path);
  bytes_ = reinterpret_cast<const uint8_t*>(file_.data());
  const size_t size = file_.size();
  end_ = size;
  char magic[sizeof(kMagic)] = {};
  if (size < sizeof(kMagic) + 4 + kDigestBytes ||
      (std::memcpy(magic, bytes_, sizeof(kMagic)), std::memcmp(magic, kMagic, 8) != 0)) {
    if (size >= sizeof(kMagic) && std::memcmp(bytes_, kMagic, 8) == 0)
      throw Error(ErrorKind::kFormat,
                  "session file " + path + " is truncated (" + std::to_string(size) + " bytes)");
    throw Error(ErrorKind::kFormat, path + " is not a kvcache session file (no KVCSESS magic)");
  }
  offset_ = sizeof(kMagic);
  info_.version = u32();
  if (info_.version > kVersion)
    throw Error(ErrorKind::kFormat, "session file " + path + " has version " +
                                        std::to_string(info_.version) +
                                        ", newer than this build's " + std::to_string(kVersion) +
                                        "; upgrade kvcache to read it");
  if (info_.version < 1)
    throw Error(ErrorKind::kFormat, "session file " + path + " has an invalid version " +
                                        std::to_string(info_.version));
  end_ = size - kDigestBytes;
  if (verify) {
    const Digest128 want = digest128(bytes_, end_);
    Digest128 got;
    for (int i = 0; i < 8; ++i) got.hi |= static_cast<uint64_t>(bytes_[end_ + i]) << (8 * i);
    for (int i = 0; i < 8; ++i) got.lo |= static_cast<uint64_t>(bytes_[end_ + 8 + i]) << (8 * i);
    if (!(want == got))
      throw Error(ErrorKind::kFormat,
                  "session file " + path + ": checksum mismatch: the file is damaged or truncated");
  }
  info_.fingerprint.hi = static_cast<uint64_t>(i64());
  info_.fingerprint.lo = static_cast<uint64_t>(i64());
  info_.implementation = str(256);
  info_.kv_dtype = str(16);
  const uint32_t n_layers = u32();
  if (n_layers > 100000)
    throw Error(ErrorKind::kFormat, "session file " + path + ": " + std::to_string(n_layers) +
                                        " layers (damaged file?)");
  info_.layer_types.resize(n_layers);
  for (std::string& t : info_.layer_types) t = str(256);
  const int64_t n_tokens = i64();
  if (n_tokens < 0 || static_cast<uint64_t>(n_tokens) > (end_ - offset_) / 4)
    throw Error(ErrorKind::kFormat, "session file " + path + ": " + std::to_string(n_tokens) +
                                        " tokens do not fit the file (damaged or truncated)");
  info_.tokens.resize(static_cast<size_t>(n_tokens));
  for (int32_t& t : info_.tokens) t = static_cast<int32_t>(u32());
  info_.file_bytes = size;
}

void SessionFileReader::expect_end() const {
  if (offset_ != end_)
    throw Error(ErrorKind::kFormat, "session file " + path_ + ": " +
                                        std::to_string(end_ - offset_) +
                                        " bytes after the saved state (damaged file?)");
}

void SessionFileReader::check_matches(const Digest128& fingerprint,
                                      const std::string& implementation,
                                      const std::string& kv_dtype,
                                      const std::vector<std::string>& layer_types) const {
  const SessionFileInfo& f = info_;
  const std::string file = "session file " + path_;
  if (!(f.fingerprint == fingerprint))
    throw Error(ErrorKind::kFormat, file + " was saved from another model (fingerprint " +
                                        f.fingerprint.hex() + " vs " + fingerprint.hex() +
                                        " for the model loaded)");
  if (f.layer_types.size() != layer_types.size())
    throw Error(ErrorKind::kFormat, file + " has " + std::to_string(f.layer_types.size()) +
                                        " layers, the model " + std::to_string(layer_types.size()));
  for (size_t i = 0; i < layer_types.size(); ++i)
    if (f.layer_types[i] != layer_types[i])
      throw Error(ErrorKind::kFormat, file + ": layer types differ at layer " + std::to_string(i) +
                                          " (" + f.layer_types[i] + " in the file vs " +
                                          layer_types[i] + " here)");
  if (f.implementation != implementation)
    throw Error(ErrorKind::kFormat, file + " was saved from a '" + f.implementation +
                                        "' cache; this one is '" + implementation +
                                        "' (pass --cache " + f.implementation + ")");
  if (f.kv_dtype != kv_dtype)
    throw Error(ErrorKind::kFormat, file + ": kv dtype " + f.kv_dtype + " in the file vs " +
                                        kv_dtype + " here (pass --kv-dtype " + f.kv_dtype + ")");
}

uint64_t save_session(const Session& session, std::span<const int32_t> tokens,
                      const std::string& path) {
  refuse_paged(session, "save " + path);
  if (static_cast<int64_t>(tokens.size()) != session.position())
    throw Error(ErrorKind::kInvalidArgument, "save_session: " + std::to_string(tokens.size()) +
                                                 " tokens given but the session is at position " +
                                                 std::to_string(session.position()));
  SessionFileWriter out(path);
  out.header(model_fingerprint(session.model()), session.config().cache.implementation,
             kv_dtype_of(session), session.cache().config().layer_types, tokens);
  session.cache().save(out);
  return out.commit();
}

SessionFileInfo load_session(Session& session, const std::string& path) {
  refuse_paged(session, "load " + path);
  SessionFileReader in(path, /*verify=*/true);  // the whole file, checksum verified
  in.check_matches(model_fingerprint(session.model()), session.config().cache.implementation,
                   kv_dtype_of(session), session.cache().config().layer_types);
  session.reset();
  try {
    session.cache().load(in);
    in.expect_end();
    session.restored(static_cast<int64_t>(in.info().tokens.size()));
  } catch (const Error& e) {
    session.reset();  // a half-restored cache is never left behind
    throw Error(e.kind(), "session file " + path + ": " + e.what());
  }
  return in.info();
}

SessionFileInfo read_session_info(const std::string& path, bool verify) {
  return SessionFileReader(path, verify).info();
}

}  // namespace kvcache
