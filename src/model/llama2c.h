// Loader for llama2.c checkpoints (karpathy/llama2.c `run.c` format, "version 0"): a header of
// 7 little-endian int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len)
// then float32 tensors stacked over layers in llama2.c's order — token_embedding, rms_att, wq,
// wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, freq_cis_real/imag (unused), and wcls only when
// vocab_size is negative (positive: the classifier shares the embedding table).
// The file is memory-mapped; the ModelFile's tensors are views into it under the canonical
// GGUF names of model_file.h, so the runtime treats every format alike.
#pragma once

#include <memory>
#include <string>

#include "model/mapped_file.h"
#include "model/model_file.h"

namespace kvcache {

// True when `path` looks like a llama2.c checkpoint (no magic exists: a plausible header and
// the exact file size it implies). Never throws for unreadable files (returns false).
bool is_llama2c_checkpoint(const std::string& path);

// Opens a checkpoint. Throws Error(kIo) when the file cannot be read and Error(kFormat) naming
// the file and the problem: header values out of range, size not matching the header (which
// tensor is cut short), and so on.
std::unique_ptr<ModelFile> load_llama2c(const std::string& path, MapMode mode = MapMode::kMap);
// The same from a mapping or an in-memory copy (MappedFile::copy_of): fuzzers, tests.
std::unique_ptr<ModelFile> load_llama2c(MappedFile file);

}  // namespace kvcache
