#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace kvcache {

namespace {
std::string os_reason() {
  return std::strerror(errno);
}
}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(ErrorKind::kIo, path + ": cannot open: " + os_reason());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string reason = os_reason();
    ::close(fd);
    throw Error(ErrorKind::kIo, path + ": cannot stat: " + reason);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(ErrorKind::kIo, path + ": not a regular file (expected a model file)");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string reason = os_reason();
      ::close(fd);
      size_ = 0;
      throw Error(ErrorKind::kIo,
                  path + ": cannot mmap " + std::to_string(st.st_size) + " bytes: " + reason);
    }
    data_ = static_cast<std::byte*>(p);
  }
  // The mapping keeps the file alive; the descriptor is no longer needed.
  ::close(fd);
}

MappedFile MappedFile::copy_of(std::string name, std::string_view bytes) {
  MappedFile f;
  f.path_ = std::move(name);
  f.size_ = bytes.size();
  if (!bytes.empty()) {
    f.copy_ = std::make_unique_for_overwrite<std::byte[]>(bytes.size());
    std::memcpy(f.copy_.get(), bytes.data(), bytes.size());
    f.data_ = f.copy_.get();
  }
  return f;
}

MappedFile::~MappedFile() {
  release();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      copy_(std::move(other.copy_)) {
  other.path_.clear();
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    other.path_.clear();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    copy_ = std::move(other.copy_);
  }
  return *this;
}

void MappedFile::release() {
  if (data_ != nullptr && copy_ == nullptr) ::munmap(data_, size_);
  copy_.reset();
  data_ = nullptr;
  size_ = 0;
}

const std::byte* MappedFile::at(uint64_t offset, uint64_t n, std::string_view what) const {
  if (offset > size_ || n > size_ - offset) {
    throw Error(ErrorKind::kFormat, path_ + ": truncated: " + std::string(what) + " needs bytes [" +
                                        std::to_string(offset) + ", " + std::to_string(offset + n) +
                                        ") but the file has " + std::to_string(size_) + " bytes");
  }
  return data_ + offset;
}

void MappedFile::prefetch() const {
  if (data_ != nullptr && copy_ == nullptr) (void)::madvise(data_, size_, MADV_WILLNEED);
}

}  // namespace kvcache
