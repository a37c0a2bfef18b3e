// GGUF: the reader (header, metadata of every type, tensor infos, alignment, data bounds), every
// typed getter, tensor views, the model loader (config counts, rope factors, weight checks), the
// planner's GGUF reader and the tokenizer stored in the metadata — what `kvcache generate`,
// `plan`, `tokenize` and `serve` do with a .gguf.
#include "core/error.h"
#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "model/gguf.h"
#include "model/kv_plan.h"

namespace kvcache::fuzz {

namespace {

// Each typed getter on each key: wrong types must be Errors, never library exceptions.
void read_every_key(const GgufFile& g) {
  for (const auto& [key, value] : g.metadata()) {
    try {
      (void)g.get_int(key);
    } catch (const Error&) {
    }
    try {
      (void)g.get_float(key);
    } catch (const Error&) {
    }
    try {
      (void)g.get_bool_or(key, false);
    } catch (const Error&) {
    }
    try {
      (void)g.get_string(key);
    } catch (const Error&) {
    }
    try {
      (void)g.get_array(key, GgufType::kString);
    } catch (const Error&) {
    }
    try {
      (void)g.get_array(key, GgufType::kInt32);
    } catch (const Error&) {
    }
    try {
      (void)g.get_array(key, GgufType::kFloat32);
    } catch (const Error&) {
    }
    (void)value.array_size();
  }
  for (const GgufTensorInfo& info : g.tensor_infos()) {
    try {
      (void)g.tensor_view(info);
    } catch (const Error&) {
    }
  }
}

}  // namespace

int fuzz_gguf(const uint8_t* data, size_t size) {
  std::shared_ptr<const GgufFile> g;
  try {
    g = GgufFile::open(MappedFile::copy_of("fuzz.gguf", as_text(data, size)));
  } catch (const Error&) {
    return 0;
  }
  read_every_key(*g);
  try {
    (void)load_gguf_model(g);
  } catch (const Error&) {
  }
  try {
    const PlanModel m = plan_model_from_gguf(*g);
    const PlanOptions o;
    (void)plan_table(m, o, compute_plan(m, o));
  } catch (const Error&) {
  }
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = tokenizer_from_gguf(*g);
  } catch (const Error&) {
    return 0;
  }
  exercise_tokenizer(*tok);
  return 0;
}

}  // namespace kvcache::fuzz
