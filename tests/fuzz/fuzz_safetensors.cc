// Safetensors: the 8-byte header length, the JSON header (dtypes, shapes, data_offsets, overlaps,
// bounds, __metadata__), the ModelFile load_hf_model builds from the tensors (name mapping and
// weight checks, against a tiny llama config) and, the same bytes read as text, the sharded
// index model.safetensors.index.json.
#include "core/error.h"
#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "model/safetensors.h"

namespace kvcache::fuzz {

int fuzz_safetensors(const uint8_t* data, size_t size) {
  const std::string_view bytes = as_text(data, size);
  try {
    (void)parse_safetensors_index(std::string(bytes), "fuzz/model.safetensors.index.json");
  } catch (const Error&) {
  }
  std::shared_ptr<const SafetensorsFile> f;
  try {
    f = SafetensorsFile::open(MappedFile::copy_of("fuzz/model.safetensors", bytes));
  } catch (const Error&) {
    return 0;
  }
  for (const auto& [name, view] : f->tensors()) {
    (void)hf_to_canonical_name(name);
    (void)view.numel();
  }
  try {
    (void)hf_model_from_safetensors("fuzz", tiny_llama_config(), {f});
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace kvcache::fuzz
