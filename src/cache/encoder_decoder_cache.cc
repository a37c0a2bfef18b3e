#include "cache/encoder_decoder_cache.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace kvcache {

EncoderDecoderCache::EncoderDecoderCache(const CacheConfig& self_config)
    : self_(std::make_unique<Cache>(self_config)),
      cross_(static_cast<size_t>(self_->num_layers())),
      kv_dtype_(self_config.options.kv_dtype) {
  if (kv_dtype_ && !dtype_is_float(*kv_dtype_))
    throw Error(ErrorKind::kUnsupported,
                std::string("EncoderDecoderCache: the cross-attention pairs are stored dense; "
                            "kv_dtype ") +
                    dtype_name(*kv_dtype_) + " is not f32, f16 or bf16");
}

void EncoderDecoderCache::check_layer(int layer, const char* what) const {
  if (layer < 0 || layer >= num_layers())
    throw Error(ErrorKind::kInvalidArgument,
                std::string("EncoderDecoderCache::") + what + ": layer " + std::to_string(layer) +
                    " is outside [0, " + std::to_string(num_layers()) + ")");
}

KVSpan EncoderDecoderCache::set_cross(int layer, const TensorView& k, const TensorView& v) {
  check_layer(layer, "set_cross");
  CrossLayer& c = cross_[static_cast<size_t>(layer)];
  if (c.updated)
    throw Error(ErrorKind::kInvalidArgument,
                "EncoderDecoderCache::set_cross: layer " + std::to_string(layer) +
                    " already holds the encoder's keys and values (they are computed once per "
                    "encoder input); reset() the cache before encoding another input");
  if (k.ndim() != 4 || v.ndim() != 4 || k.dim(0) != v.dim(0) || k.dim(1) != v.dim(1) ||
      k.dim(2) != v.dim(2) || k.dtype() != v.dtype() || !dtype_is_float(k.dtype()))
    throw Error(
        ErrorKind::kInvalidArgument,
        "EncoderDecoderCache::set_cross: layer " + std::to_string(layer) +
            " needs K [B, H, S_enc, D_k] and V [B, H, S_enc, D_v] of one float dtype, got " +
            k.shape().str() + " and " + v.shape().str());
  // Every layer holds the same encoder output's projections: one batch and one length.
  for (const CrossLayer& o : cross_) {
    if (o.updated && (o.k.dim(0) != k.dim(0) || o.k.dim(2) != k.dim(2)))
      throw Error(ErrorKind::kInvalidArgument,
                  "EncoderDecoderCache::set_cross: layer " + std::to_string(layer) + " gets " +
                      k.shape().str() + " but another layer holds " + o.k.shape().str() +
                      " (one encoder output per cache)");
  }
  // Stored in the cache's kv_dtype, as the self-attention layers store theirs (unset: as given).
  const DType dt = kv_dtype_.value_or(k.dtype());
  c.k = Tensor::empty(dt, k.shape());
  c.v = Tensor::empty(dt, v.shape());
  copy_view(k, c.k.view());
  copy_view(v, c.v.view());
  c.updated = true;
  return cross(layer);
}

bool EncoderDecoderCache::is_updated(int layer) const {
  check_layer(layer, "is_updated");
  return cross_[static_cast<size_t>(layer)].updated;
}

KVSpan EncoderDecoderCache::cross(int layer) const {
  check_layer(layer, "cross");
  const CrossLayer& c = cross_[static_cast<size_t>(layer)];
  if (!c.updated)
    throw Error(ErrorKind::kInvalidArgument,
                "EncoderDecoderCache::cross: layer " + std::to_string(layer) +
                    " has no cross-attention keys yet (run the encoder and set_cross first)");
  KVSpan s;
  s.kind = KVSpanKind::kDense;
  s.k = c.k.view();
  s.v = c.v.view();
  return s;
}

int64_t EncoderDecoderCache::encoder_length() const {
  for (const CrossLayer& c : cross_)
    if (c.updated) return c.k.dim(2);
  return 0;
}

void EncoderDecoderCache::crop(int64_t n) {
  self_->crop(n);
}

void EncoderDecoderCache::reset() {
  self_->reset();
  for (CrossLayer& c : cross_) c = CrossLayer{};
}

void EncoderDecoderCache::gather_cross(std::span<const int64_t> rows, const char* what) {
  for (CrossLayer& c : cross_) {
    if (!c.updated) continue;
    for (Tensor* t : {&c.k, &c.v}) {
      const int64_t B = t->dim(0);
      const size_t row_bytes = t->size_bytes() / static_cast<size_t>(B);
      Tensor out = Tensor::empty(
          t->dtype(), {static_cast<int64_t>(rows.size()), t->dim(1), t->dim(2), t->dim(3)});
      for (size_t i = 0; i < rows.size(); ++i) {
        KV_CHECK(rows[i] >= 0 && rows[i] < B, std::string("EncoderDecoderCache::") + what +
                                                  ": row index checked before, now out of range");
        std::memcpy(
            static_cast<std::byte*>(out.data()) + i * row_bytes,
            static_cast<const std::byte*>(t->data()) + static_cast<size_t>(rows[i]) * row_bytes,
            row_bytes);
      }
      *t = std::move(out);
    }
  }
}

void EncoderDecoderCache::reorder(std::span<const int64_t> beam_idx) {
  int64_t B = 0;
  for (const CrossLayer& c : cross_)
    if (c.updated) B = c.k.dim(0);
  for (int64_t i : beam_idx)
    if (B > 0 && (i < 0 || i >= B))
      throw Error(ErrorKind::kInvalidArgument,
                  "EncoderDecoderCache::reorder: beam index " + std::to_string(i) +
                      " is outside the cross-attention cache's batch [0, " + std::to_string(B) +
                      ")");
  // The self cache validates its own rows first; nothing has changed when it throws.
  self_->reorder(beam_idx);
  gather_cross(beam_idx, "reorder");
}

void EncoderDecoderCache::select(std::span<const int64_t> indices) {
  int64_t B = 0;
  for (const CrossLayer& c : cross_)
    if (c.updated) B = c.k.dim(0);
  for (int64_t i : indices)
    if (B > 0 && (i < 0 || i >= B))
      throw Error(ErrorKind::kInvalidArgument,
                  "EncoderDecoderCache::select: index " + std::to_string(i) +
                      " is outside the cross-attention cache's batch [0, " + std::to_string(B) +
                      ")");
  self_->select(indices);
  gather_cross(indices, "select");
}

void EncoderDecoderCache::repeat_interleave(int64_t r) {
  if (r < 1)
    throw Error(
        ErrorKind::kInvalidArgument,
        "EncoderDecoderCache::repeat_interleave: repeats must be >= 1, got " + std::to_string(r));
  self_->repeat_interleave(r);
  int64_t B = 0;
  for (const CrossLayer& c : cross_)
    if (c.updated) B = c.k.dim(0);
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < r; ++j) rows.push_back(b);
  gather_cross(rows, "repeat_interleave");
}

size_t EncoderDecoderCache::cross_bytes() const {
  size_t n = 0;
  for (const CrossLayer& c : cross_)
    if (c.updated) n += c.k.size_bytes() + c.v.size_bytes();
  return n;
}

}  // namespace kvcache
