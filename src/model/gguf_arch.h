// The GGUF architecture registry: one .cc file per llama.cpp architecture (src/model/
// gguf_arch_<name>.cc) registers what turns a GGUF of that `general.architecture` into one of our
// families and back:
//   - its llama.cpp name and the ModelConfig::architecture (family) it becomes;
//   - the family keys it reads from llama.cpp's metadata (`<name>.*`, llama.cpp
//     src/llama-arch.cpp LLM_KV_NAMES, read per architecture in src/llama-model.cpp
//     load_hparams) on top of the common ones (read_gguf_common_config);
//   - the cache shape `kvcache plan` and the loader share (layer types, sliding pattern, MLA);
//   - the GGUF <-> family tensor names (llama.cpp src/llama-arch.cpp LLM_TENSOR_NAMES; which
//     transformers tensor each is: gguf-py/gguf/tensor_mapping.py), "{N}" standing for the layer;
//   - the per-tensor fix-ups llama.cpp's convert_hf_to_gguf.py applies (Gemma norms stored as
//     w + 1, llama's Q/K row permutation, split or fused tensors): `load_tensors` undoes them
//     (or says so in the config), `write_tensors` applies them for `kvcache convert`.
//
//   KVCACHE_REGISTER_GGUF_ARCH(gemma2, GgufArchitecture{"gemma2", "gemma2", ...});
//
// The llama family (llama, mistral, qwen2) keeps llama.cpp's names as its canonical names, so
// its table is empty; the transformers-named families map every GGUF name to the transformers
// name their family code reads (model/weight_spec.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "model/model_file.h"

namespace kvcache {

class GgufFile;
class GgufWriter;
struct DecoderLayout;

// One tensor name pair; "{N}" is the layer index in both (at most once per name).
struct GgufTensorName {
  const char* gguf;    // "blk.{N}.attn_q.weight"
  const char* family;  // "model.layers.{N}.self_attn.q_proj.weight"
};

using GgufTensorList = std::vector<std::pair<std::string, TensorView>>;

struct GgufArchitecture {
  const char* name;    // general.architecture as llama.cpp writes it ("gemma2", "gpt-oss")
  const char* family;  // the ModelConfig::architecture it becomes ("gemma2", "gpt_oss")
  // Cache shape beyond the common keys (read_decoder_layout(GgufFile) read block_count, head
  // counts, key_length, context_length and a window applying to every layer): the per-layer
  // pattern, MLA dims. nullptr: the common reading is complete.
  void (*read_layout)(const GgufFile& g, DecoderLayout& d);
  // The family keys, after read_gguf_common_config filled mf's config and the tensors were
  // added (so it may look at them: biases present, a rope_freqs tensor). nullptr: none.
  void (*read_config)(const GgufFile& g, ModelFile& mf);
  // Name map (empty: GGUF names are the family's names).
  std::vector<GgufTensorName> tensors;
  // Adds every tensor of `g` to `mf` under its family name, undoing llama.cpp's fix-ups
  // (copies kept alive by mf). nullptr: load_gguf_tensors_by_table.
  void (*load_tensors)(const GgufFile& g, ModelFile& mf);
  // Writer side (`kvcache convert`): the metadata of `c` under llama.cpp's keys, general.
  // architecture included. nullptr: this architecture is read only.
  void (*write_config)(GgufWriter& w, const ModelConfig& c);
  // Lists every tensor of `model` under its GGUF name with llama.cpp's fix-ups applied; copies
  // go to `owned` (alive until the file is written). nullptr: write_gguf_tensors_by_table.
  void (*write_tensors)(const ModelFile& model, GgufTensorList& out, std::vector<Tensor>& owned);
};

// Registers an architecture; a name registered twice aborts (a bug).
void register_gguf_architecture(const GgufArchitecture& arch);
// The entry for a GGUF's general.architecture: Error(kUnsupported) "<path>: GGUF architecture
// 'mamba' is not supported; supported: deepseek2, gemma2, ..." otherwise.
const GgufArchitecture& find_gguf_architecture(const std::string& name, const std::string& path);
// The entry `kvcache convert` writes a family as (the first registered with that family and a
// writer): Error(kUnsupported) naming the family and the ones that can be written otherwise.
const GgufArchitecture& gguf_architecture_for_family(const std::string& family);
// Registered names, sorted ("deepseek2, gemma2, llama, ...").
std::string gguf_architecture_list();

#define KVCACHE_REGISTER_GGUF_ARCH(ident, ...)          \
  static const bool kvcache_gguf_arch_##ident = [] {    \
    ::kvcache::register_gguf_architecture(__VA_ARGS__); \
    return true;                                        \
  }()

// --- helpers for the entries ---

// The family name of GGUF tensor `gguf_name` by `arch.tensors` ("" when no entry matches).
std::string gguf_to_family_name(const GgufArchitecture& arch, const std::string& gguf_name);
// The GGUF name of family tensor `family_name` ("" when no entry matches).
std::string family_to_gguf_name(const GgufArchitecture& arch, const std::string& family_name);
// Adds every tensor of `g` renamed by arch.tensors (identity when the table is empty); a tensor
// the table does not know is Error(kFormat) naming it (no tensor is silently dropped).
void load_gguf_tensors_by_table(const GgufArchitecture& arch, const GgufFile& g, ModelFile& mf);
// Lists every tensor of `model` under its GGUF name; a tensor the table does not know is
// Error(kUnsupported) naming it.
void write_gguf_tensors_by_table(const GgufArchitecture& arch, const ModelFile& model,
                                 GgufTensorList& out);
// Error(kUnsupported) naming the file and `arch` when `{arch}.attention.value_length` is set and
// differs from the key length `head_dim` (the GQA families need one head size for K and V).
void check_gguf_value_length(const GgufFile& g, const std::string& arch, int64_t head_dim);
// Gemma's converter fix-up (convert_hf_to_gguf.py Gemma2Model / Gemma3Model.modify_tensors):
// every "*norm.weight" of `out` replaced by an f32 copy holding w + 1 (kept in `owned`).
void add_one_to_gguf_norms(GgufTensorList& out, std::vector<Tensor>& owned);

// The keys every architecture shares (llama.cpp LLM_KV_*, prefixed "<arch>."): the cache shape
// from read_decoder_layout (which calls the entry's read_layout), feed_forward_length,
// context_length, rope.freq_base, rope.dimension_count, attention.layer_norm_rms_epsilon, the
// vocabulary size and bos/eos ids; c.architecture = the family.
void read_gguf_common_config(const GgufFile& g, const GgufArchitecture& arch, ModelConfig& c);
// The writer's counterpart for `arch_name`: general.architecture and the keys above.
void write_gguf_common_config(GgufWriter& w, const std::string& arch_name, const ModelConfig& c);

}  // namespace kvcache
