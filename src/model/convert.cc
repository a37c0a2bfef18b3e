#include "model/convert.h"

#include <vector>

#include "core/error.h"
#include "kernels/matmul.h"
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

}  // namespace

void convert_to_gguf(const ModelFile& model, const GgufConvertOptions& options,
                     const std::string& out_path) {
  GgufWriter w;
  const ModelConfig& c = model.config();
  // Llama-family models are written as `llama` (Q/K rows permuted), the others as the
  // llama.cpp architecture registered for their family (model/gguf_arch.h).
  const GgufArchitecture& arch = c.is_llama_family() ? find_gguf_architecture("llama", model.path())
                                                     : gguf_architecture_for_family(c.architecture);
  arch.write_config(w, c);
  w.set("general.name", GgufValue::str("converted from " + model.path()));
  w.set("general.file_type", GgufValue::u32(0));
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
  std::vector<Tensor> encoded(tensors.size());  // re-encoded matrices
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto& [name, view] = tensors[i];
    // ggml names weight matrices "*.weight" (norms are 1-D); 2-D "*.bias" tensors (GPT-OSS's
    // per-expert biases) stay float.
    const bool matrix = view.ndim() >= 2 && name.ends_with(".weight");
    const int64_t cols = view.dim(view.ndim() - 1);
    if (matrix && options.matrix_dtype && *options.matrix_dtype != view.dtype() &&
        !(*options.matrix_dtype == DType::kQ8_0 && cols % 32 != 0)) {
      encoded[i] = convert_matrix(view, *options.matrix_dtype);
      view = encoded[i].view();
    }
    w.add_tensor(name, view);
  }
  w.write(out_path);
}

}  // namespace kvcache
