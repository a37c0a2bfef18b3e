#include "model/fingerprint.h"

#include <cstring>

#include "model/model.h"

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

}  // namespace kvcache
