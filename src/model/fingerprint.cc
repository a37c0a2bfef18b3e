#include "model/fingerprint.h"

#include <cstring>

#include "model/model.h"
#include "model/tokenizer.h"

namespace kvcache {

namespace {
void hash_float(Hasher& h, float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  h.u32(u);
}

// Whole when small, else 64 evenly spaced 1 KiB pieces (the last one ending at the end).
void hash_sample(Hasher& h, const TensorView& t) {
  if (t.data() == nullptr || !t.is_contiguous()) return;
  const size_t n = dtype_bytes(t.dtype(), t.numel());
  const auto* p = static_cast<const unsigned char*>(t.data());
  constexpr size_t kWhole = 64 << 10, kPiece = 1 << 10, kPieces = 64;
  if (n <= kWhole) {
    h.bytes(p, n);
    return;
  }
  for (size_t i = 0; i < kPieces; ++i) {
    const size_t off = (n - kPiece) * i / (kPieces - 1);
    h.bytes(p + off, kPiece);
  }
}
}  // namespace

Digest128 model_fingerprint(const Model& model) {
  const ModelConfig& c = model.config();
  Hasher h;
  h.str("kvcache model fingerprint v1");
  h.str(c.architecture).str(c.summary());
  h.i64(c.dim).i64(c.n_layers).i64(c.n_heads).i64(c.n_kv_heads).i64(c.head_dim);
  h.i64(c.vocab_size).i64(c.sliding_window).i64(c.attention_chunk_size);
  h.i64(c.num_kv_shared_layers).u32(c.rope_interleaved ? 1 : 0);
  hash_float(h, c.rope_theta);
  hash_float(h, c.rope_local_theta);
  hash_float(h, c.query_scale);
  hash_float(h, c.partial_rotary_factor);
  h.u32(static_cast<uint32_t>(c.rope_scaling.type));
  hash_float(h, c.rope_scaling.factor);
  hash_float(h, c.rope_scaling.low_freq_factor);
  hash_float(h, c.rope_scaling.high_freq_factor);
  h.i64(c.rope_scaling.original_max_position_embeddings);
  h.u64(c.rope_freq_factors.size());
  for (const float f : c.rope_freq_factors) hash_float(h, f);
  h.u64(c.layer_types.size());
  for (const auto& t : c.layer_types) h.str(t);
  const auto& tensors = model.file().tensors();
  h.u64(tensors.size());
  for (const auto& [name, view] : tensors) {  // std::map: sorted by name
    h.str(name).str(dtype_name(view.dtype())).u32(static_cast<uint32_t>(view.ndim()));
    for (int i = 0; i < view.ndim(); ++i) h.i64(view.dim(i));
    hash_sample(h, view);
  }
  return h.finish();
}

Digest128 tokenizer_fingerprint(const Tokenizer* tokenizer) {
  Hasher h;
  h.str("kvcache tokenizer v1");
  if (tokenizer == nullptr) return h.str("none").finish();
  const int32_t n = tokenizer->vocab_size();
  h.str(tokenizer->kind()).i64(n).i64(tokenizer->bos_id()).i64(tokenizer->eos_id());
  for (int32_t id = 0; id < n; ++id) h.str(tokenizer->token_text(id)).str(tokenizer->decode(id));
  static constexpr const char* kProbes[] = {
      "Hello, world! It's 2026: the quick brown fox jumps over the lazy dog.",
      "  leading spaces\tand\ttabs\n\nnew lines   trailing  ",
      "don't we'll I'm you're they've she'd 12345 3.14159 -42 1,000,000",
      "int main() { return a->b[i] == 0 ? x : y; } // code",
      "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x99\x82 <s> </s> "
      "<|endoftext|>",
  };
  for (const char* text : kProbes) {
    const std::vector<int32_t> ids = tokenizer->encode(text);
    h.i64(static_cast<int64_t>(ids.size()));
    h.bytes(ids.data(), ids.size() * sizeof(int32_t));
  }
  return h.finish();
}

}  // namespace kvcache
