#include "runtime/builtin_model.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "core/error.h"
#include "model/dummy.h"

// The two files, linked in by the assembler (KVCACHE_BUILTIN_MODEL_DIR: models/stories260K).
// .incbin keeps the 1 MB out of the compiler; read-only data, 64-byte aligned.
asm(".section .rodata\n"
    ".balign 64\n"
    ".global kvcache_stories260k_bin, kvcache_stories260k_bin_end\n"
    ".global kvcache_tok512_bin, kvcache_tok512_bin_end\n"
    ".hidden kvcache_stories260k_bin, kvcache_stories260k_bin_end\n"
    ".hidden kvcache_tok512_bin, kvcache_tok512_bin_end\n"
    "kvcache_stories260k_bin:\n"
    ".incbin \"" KVCACHE_BUILTIN_MODEL_DIR
    "/stories260K.bin\"\n"
    "kvcache_stories260k_bin_end:\n"
    ".balign 64\n"
    "kvcache_tok512_bin:\n"
    ".incbin \"" KVCACHE_BUILTIN_MODEL_DIR
    "/tok512.bin\"\n"
    "kvcache_tok512_bin_end:\n"
    ".text\n");

extern "C" {
extern const char kvcache_stories260k_bin[], kvcache_stories260k_bin_end[];
extern const char kvcache_tok512_bin[], kvcache_tok512_bin_end[];
}

namespace kvcache {

namespace fs = std::filesystem;

namespace {

// Writes `bytes` to `path` unless a file of that size is there already: through a temporary
// name and a rename, so two processes starting at once never see half a file.
void materialize(const fs::path& path, std::string_view bytes) {
  std::error_code ec;
  if (fs::exists(path, ec) && fs::file_size(path, ec) == bytes.size()) return;
  const fs::path tmp = path.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!out)
      throw Error(ErrorKind::kIo, tmp.string() + ": cannot write the built-in model (set " +
                                      "KVCACHE_CACHE_DIR to a writable folder)");
  }
  fs::rename(tmp, path, ec);
  if (ec)
    throw Error(ErrorKind::kIo, path.string() + ": cannot write the built-in model: " +
                                    ec.message() + " (set KVCACHE_CACHE_DIR to a writable folder)");
}

}  // namespace

std::optional<std::string> builtin_model_path(const std::string& name) {
  if (name != "stories260K") return std::nullopt;
  const fs::path dir = fs::path(default_model_cache_dir()) / "stories260K";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw Error(ErrorKind::kIo, dir.string() + ": cannot create the model cache folder: " +
                                    ec.message() + " (set KVCACHE_CACHE_DIR to a writable folder)");
  materialize(dir / "tok512.bin",
              std::string_view(kvcache_tok512_bin,
                               static_cast<size_t>(kvcache_tok512_bin_end - kvcache_tok512_bin)));
  materialize(
      dir / "stories260K.bin",
      std::string_view(kvcache_stories260k_bin,
                       static_cast<size_t>(kvcache_stories260k_bin_end - kvcache_stories260k_bin)));
  return (dir / "stories260K.bin").string();
}

}  // namespace kvcache
