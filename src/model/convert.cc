#include "model/convert.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <optional>
#include <vector>

#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/quant_types.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"
#include "model/tokenizer_llama2c.h"

namespace kvcache {

namespace {

// Re-encodes a contiguous [..., rows, cols] matrix (or stack of them: experts) into `dst_t`
// (through f32, row by row).
Tensor convert_matrix(const TensorView& src, DType dst_t) {
  const int64_t cols = src.dim(src.ndim() - 1), rows = src.numel() / cols;
  Tensor out = Tensor::empty(dst_t, src.shape());
  std::vector<float> row(static_cast<size_t>(cols));
  const size_t src_rb = dtype_bytes(src.dtype(), cols), dst_rb = dtype_bytes(dst_t, cols);
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(static_cast<const std::byte*>(src.data()) + static_cast<size_t>(r) * src_rb,
                   src.dtype(), row.data(), cols);
    void* dst = static_cast<std::byte*>(out.data()) + static_cast<size_t>(r) * dst_rb;
    if (dst_t == DType::kQ8_0) {
      quantize_row_q8_0(row.data(), static_cast<BlockQ8_0*>(dst), cols);
    } else if (const QuantKernels* q = quant_kernels(dst_t)) {
      q->quantize_ref(row.data(), dst, cols / dtype_info(dst_t).block_elems);
    } else {
      convert_n(row.data(), DType::kF32, dst, dst_t, static_cast<size_t>(cols));
    }
  }
  return out;
}

void add_vocabulary(GgufWriter& w, const Llama2cTokenizer& tok) {
  const int32_t n = tok.vocab_size();
  std::vector<std::string> tokens(static_cast<size_t>(n));
  std::vector<float> scores(static_cast<size_t>(n));
  std::vector<int32_t> types(static_cast<size_t>(n));
  constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;  // llama.cpp token types
  for (int32_t i = 0; i < n; ++i) {
    std::string t = tok.token_text(i);
    int32_t type = kNormal;
    if (i == 0) {
      t = "<unk>", type = kUnknown;
    } else if (i == tok.bos_id()) {
      t = "<s>", type = kControl;
    } else if (i == tok.eos_id()) {
      t = "</s>", type = kControl;
    } else if (t.size() == 6 && t.starts_with("<0x") && t.ends_with(">")) {
      type = kByte;
    } else {
      std::string spm;  // SentencePiece spells the space U+2581 (E2 96 81)
      for (char c : t) spm += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
      t = std::move(spm);
    }
    tokens[static_cast<size_t>(i)] = std::move(t);
    scores[static_cast<size_t>(i)] = tok.score(i);
    types[static_cast<size_t>(i)] = type;
  }
  w.set("tokenizer.ggml.model", GgufValue::str("llama"));
  w.set("tokenizer.ggml.tokens", GgufValue::str_array(std::move(tokens)));
  w.set("tokenizer.ggml.scores", GgufValue::f32_array(std::move(scores)));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array(std::move(types)));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<uint32_t>(tok.bos_id())));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<uint32_t>(tok.eos_id())));
  w.set("tokenizer.ggml.unknown_token_id", GgufValue::u32(0));
  w.set("tokenizer.ggml.add_bos_token", GgufValue::boolean(true));
  w.set("tokenizer.ggml.add_space_prefix", GgufValue::boolean(true));
}

// llama.cpp's use_more_bits (llama-quant.cpp): the layers of a Q4_K_M file whose attn_v and
// ffn_down keep more bits.
bool use_more_bits(int64_t layer, int64_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

// The layer of "blk.N.<...>", or -1.
int64_t block_index(const std::string& name) {
  if (!name.starts_with("blk.")) return -1;
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos || dot == 4) return -1;
  int64_t n = 0;
  for (size_t i = 4; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    n = n * 10 + (name[i] - '0');
  }
  return n;
}

DType mix_dtype(QuantMix mix, const std::string& name, int64_t n_layers) {
  KV_CHECK(mix == QuantMix::kQ4_K_M, "mix_dtype: unknown mix");
  if (name == "output.weight") return DType::kQ6_K;
  const int64_t layer = block_index(name);
  if (layer >= 0 && (name.ends_with(".attn_v.weight") || name.ends_with(".ffn_down.weight")) &&
      use_more_bits(layer, n_layers)) {
    return DType::kQ6_K;
  }
  return DType::kQ4_K;
}

// The dtype a matrix of `cols` columns can take when `want` is asked for: q8_0 needs rows of
// whole 32-blocks, the GGUF block types whole blocks of theirs; a k-quant falls back to q8_0
// (llama-quantize falls back too), anything else keeps `have`.
DType fitting_dtype(DType want, DType have, int64_t cols) {
  const int64_t be = dtype_info(want).block_elems;
  if (cols % be == 0) return want;
  if (be == 256 && cols % 32 == 0) return DType::kQ8_0;
  return have;
}

// general.file_type of a file whose most common tensor dtype is `t`: llama.h's llama_ftype, as
// llama.cpp's loader guesses it for files without the key (llama.cpp
// src/llama-model-loader.cpp, the switch on type_max; ids from include/llama.h). The key is
// informational (llama.cpp prints it, e.g. as llama-bench's model type), so it must not claim
// "all F32" for an f16 or q8_0 file.
uint32_t llama_file_type(DType t) {
  switch (t) {
    case DType::kF32:
      return 0;  // LLAMA_FTYPE_ALL_F32
    case DType::kF16:
      return 1;  // LLAMA_FTYPE_MOSTLY_F16
    case DType::kQ4_0:
      return 2;  // LLAMA_FTYPE_MOSTLY_Q4_0
    case DType::kQ4_1:
      return 3;  // LLAMA_FTYPE_MOSTLY_Q4_1
    case DType::kQ8_0:
      return 7;  // LLAMA_FTYPE_MOSTLY_Q8_0
    case DType::kQ5_0:
      return 8;  // LLAMA_FTYPE_MOSTLY_Q5_0
    case DType::kQ5_1:
      return 9;  // LLAMA_FTYPE_MOSTLY_Q5_1
    case DType::kQ2_K:
      return 10;  // LLAMA_FTYPE_MOSTLY_Q2_K
    case DType::kQ3_K:
      return 12;  // LLAMA_FTYPE_MOSTLY_Q3_K_M
    case DType::kQ4_K:
      return 15;  // LLAMA_FTYPE_MOSTLY_Q4_K_M
    case DType::kQ5_K:
      return 17;  // LLAMA_FTYPE_MOSTLY_Q5_K_M
    case DType::kQ6_K:
      return 18;  // LLAMA_FTYPE_MOSTLY_Q6_K
    case DType::kIQ4_NL:
      return 25;  // LLAMA_FTYPE_MOSTLY_IQ4_NL
    case DType::kBF16:
      return 32;  // LLAMA_FTYPE_MOSTLY_BF16
  }
  KV_CHECK(false, "llama_file_type: unknown dtype");
  return 0;
}

}  // namespace

void parse_convert_dtype(const std::string& name, GgufConvertOptions& options) {
  std::string lower = name;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower == "q4_k_m") {
    options.mix = QuantMix::kQ4_K_M;
    options.matrix_dtype.reset();
    return;
  }
  const DType t = parse_dtype(name);
  if (!dtype_is_float(t) && t != DType::kQ8_0 &&
      (quant_kernels(t) == nullptr || quant_kernels(t)->quantize_ref == nullptr)) {
    throw Error(ErrorKind::kUnsupported, "--dtype " + name +
                                             ": no quantizer for this type; use f32, f16, bf16, "
                                             "q8_0, a k-quant (q2_K..q6_K) or q4_K_M");
  }
  options.mix = QuantMix::kNone;
  options.matrix_dtype = t;
}

GgufConvertReport convert_to_gguf(const ModelFile& model, const GgufConvertOptions& options,
                                  const std::string& out_path) {
  GgufWriter w;
  const ModelConfig& c = model.config();
  // Llama-family models are written as `llama` (Q/K rows permuted), the others as the
  // llama.cpp architecture registered for their family (model/gguf_arch.h).
  const GgufArchitecture& arch = c.is_llama_family() ? find_gguf_architecture("llama", model.path())
                                                     : gguf_architecture_for_family(c.architecture);
  arch.write_config(w, c);
  w.set("general.name", GgufValue::str("converted from " + model.path()));
  KV_CHECK(options.mix == QuantMix::kNone || !options.matrix_dtype,
           "convert_to_gguf: a mix and a matrix dtype");
  // Set again once the tensors' dtypes are known (set() keeps the key's place).
  w.set("general.file_type", GgufValue::u32(0));
  GgufConvertReport report;
  if (options.tokenizer != nullptr) {
    if (options.tokenizer->vocab_size() != model.config().vocab_size) {
      throw Error(ErrorKind::kInvalidArgument, options.tokenizer->path() + ": tokenizer has " +
                                                   std::to_string(options.tokenizer->vocab_size()) +
                                                   " tokens, the model " +
                                                   std::to_string(model.config().vocab_size));
    }
    add_vocabulary(w, *options.tokenizer);
  }
  std::vector<Tensor> owned;  // converted copies, alive until write()
  GgufTensorList tensors;
  if (arch.write_tensors != nullptr) {
    arch.write_tensors(model, tensors, owned);
  } else {
    write_gguf_tensors_by_table(arch, model, tensors);
  }
  std::vector<Tensor> encoded(tensors.size());    // re-encoded matrices
  std::array<size_t, kDTypeCount> dtype_count{};  // tensors written, per dtype
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& [name, view] = tensors[i];
    // ggml names weight matrices "*.weight" (norms are 1-D); 2-D "*.bias" tensors (GPT-OSS's
    // per-expert biases) stay float.
    const bool matrix = view.ndim() >= 2 && name.ends_with(".weight");
    const int64_t cols = view.dim(view.ndim() - 1);
    std::optional<DType> want = options.matrix_dtype;
    if (matrix && options.mix != QuantMix::kNone) want = mix_dtype(options.mix, name, c.n_layers);
    if (matrix && want && *want != view.dtype()) {
      const DType t = fitting_dtype(*want, view.dtype(), cols);
      if (t != *want && dtype_info(*want).block_elems == 256) {
        report.fallbacks.push_back(name + ": " + dtype_name(t) + " instead of " +
                                   dtype_name(*want) + " (rows of " + std::to_string(cols) +
                                   " are not whole blocks of 256)");
      }
      if (t != view.dtype()) {
        encoded[i] = convert_matrix(view, t);
        view = encoded[i].view();
      }
    }
    w.add_tensor(name, view);
    ++dtype_count[static_cast<size_t>(view.dtype())];
  }
  // The mix names itself (llama.h's LLAMA_FTYPE_MOSTLY_Q4_K_M = 15); otherwise the most common
  // dtype names the file, as llama.cpp names a file without the key.
  const auto most = std::max_element(dtype_count.begin(), dtype_count.end());
  w.set("general.file_type",
        GgufValue::u32(options.mix == QuantMix::kQ4_K_M
                           ? 15
                           : llama_file_type(static_cast<DType>(most - dtype_count.begin()))));
  w.write(out_path);
  return report;
}

}  // namespace kvcache
