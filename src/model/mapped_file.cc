#include "model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/error.h"

namespace kvcache {

namespace {
std::string os_reason() {
  return std::strerror(errno);
}
constexpr size_t kHugePage = size_t{2} << 20;

// MapMode::kRead: an anonymous mapping of `size` bytes starting on a 2 MiB boundary (the slack
// of an oversized mapping trimmed, so that every whole 2 MiB of it can be a huge page), advised
// MADV_HUGEPAGE, filled with the file's bytes by pread and made read-only. munmap(p, size)
// releases it, as a file mapping.
std::byte* read_into_huge_pages(int fd, const std::string& path, size_t size) {
  const size_t span = size + kHugePage;
  void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    throw Error(ErrorKind::kIo, path + ": cannot allocate " + std::to_string(size) +
                                    " bytes to read it into (--no-mmap): " + os_reason() +
                                    "; map it instead (drop --no-mmap)");
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t start = (base + kHugePage - 1) / kHugePage * kHugePage;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t end = start + (size + page - 1) / page * page;
  if (start > base) ::munmap(raw, start - base);
  if (base + span > end) ::munmap(reinterpret_cast<void*>(end), base + span - end);
  auto* p = reinterpret_cast<std::byte*>(start);
#if defined(MADV_HUGEPAGE)
  (void)::madvise(p, size, MADV_HUGEPAGE);  // best effort: THP may be off
#endif
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, p + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string reason =
          n == 0 ? "the file ended early (changed while read?)" : os_reason();
      ::munmap(p, size);
      throw Error(ErrorKind::kIo, path + ": cannot read " + std::to_string(size) +
                                      " bytes at offset " + std::to_string(done) + ": " + reason);
    }
    done += static_cast<size_t>(n);
  }
  (void)::mprotect(p, size, PROT_READ);
  return p;
}

}  // namespace

MappedFile::MappedFile(const std::string& path, MapMode mode) : path_(path) {
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
  if (size_ > 0 && mode == MapMode::kRead) {
    try {
      data_ = read_into_huge_pages(fd, path, size_);
    } catch (...) {
      ::close(fd);
      size_ = 0;
      throw;
    }
  } else if (size_ > 0) {
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
