// llama2.c checkpoints: the 28-byte header (ranges, divisibility), the exact file size it
// implies, and the per-layer views of the stacked tensors — load_llama2c as `kvcache generate`
// calls it on a .bin file.
#include "core/error.h"
#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "model/llama2c.h"

namespace kvcache::fuzz {

int fuzz_llama2c_checkpoint(const uint8_t* data, size_t size) {
  try {
    const std::unique_ptr<ModelFile> m =
        load_llama2c(MappedFile::copy_of("fuzz.bin", as_text(data, size)));
    (void)m->weight_bytes();
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace kvcache::fuzz
