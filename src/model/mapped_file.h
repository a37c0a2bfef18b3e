// MappedFile: a read-only memory map of a whole file (RAII). Model loaders hand out views that
// point into the mapping instead of copying weights, so a MappedFile must outlive every
// TensorView taken from it. Moving is allowed; copying is not (one owner unmaps). copy_of()
// makes one from bytes in memory (fuzz targets, tests), so every reader parses from memory
// through the same code as from a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace kvcache {

// How a file's bytes get into memory.
//   kMap:  a read-only map of the file (pages come in at first use, shared with the page cache,
//          4 KiB each: a regular file's pages are never transparent huge pages here).
//   kRead: the whole file read into private anonymous memory, 2 MiB-aligned and offered for
//          transparent huge pages (MADV_HUGEPAGE). A decode step streams every weight, and with
//          4 KiB pages each 4 KiB of W is a new TLB entry; on a 2-vCPU Zen 5 VM the 125M f16
//          model decoded 1.03-1.2x faster read this way (docs/benchmarks.md, row 21). Costs the
//          file's size in private memory and a full read at open (`--no-mmap`).
enum class MapMode { kMap, kRead };

class MappedFile {
 public:
  MappedFile() = default;
  // Opens `path` and maps it read-only (MAP_PRIVATE, PROT_READ), or reads it into huge-page
  // memory (MapMode::kRead, then read-only too). Throws Error(kIo) naming the file and the OS
  // reason when it cannot be opened, stat'ed, mapped or read. An empty file gives size 0 and
  // data() == nullptr (nothing to map); format readers then report it as truncated.
  explicit MappedFile(const std::string& path, MapMode mode = MapMode::kMap);
  // A private heap copy of `bytes` standing for a file named `name` (errors name it). Heap rather
  // than an anonymous mapping so that AddressSanitizer sees a read one byte past the end.
  static MappedFile copy_of(std::string name, std::string_view bytes);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool is_open() const { return !path_.empty(); }
  std::string_view bytes() const { return {reinterpret_cast<const char*>(data_), size_}; }

  // Bounds-checked access for format readers: throws Error(kFormat) "<path>: truncated: <what>
  // needs bytes [offset, offset+n) but the file has <size>" when the range does not fit.
  const std::byte* at(uint64_t offset, uint64_t n, std::string_view what) const;

  // Hint that the whole file will be read soon (MADV_WILLNEED); best effort, never throws.
  void prefetch() const;

 private:
  void release();

  std::string path_;
  std::byte* data_ = nullptr;  // into the mapping, or into copy_ (then nothing is mapped)
  size_t size_ = 0;
  std::unique_ptr<std::byte[]> copy_;
};

}  // namespace kvcache
