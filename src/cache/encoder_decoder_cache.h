// EncoderDecoderCache: the cache of an encoder-decoder model (T5), as transformers v5 defines it
// (src/transformers/cache_utils.py, EncoderDecoderCache): a self-attention Cache for the
// decoder's own tokens plus, per decoder layer, the cross-attention keys and values projected
// once from the encoder output.
//
// Rules (v5's):
//   - set_cross(layer, k, v) stores a layer's cross K/V and marks the layer updated (v5's
//     is_updated dict); a second set for the same layer is an error until reset(), because the
//     encoder output does not change while the decoder generates.
//   - reorder / select / repeat_interleave / reset act on both caches; crop acts on the
//     self-attention cache only (the encoder's tokens are never rolled back).
//   - bytes() counts both; seq_length() is the self-attention cache's (the decoder's tokens).
// The self-attention cache is an ordinary Cache: any container the registry builds (dynamic,
// static, paged, ...) through CacheOptions.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "cache/cache.h"
#include "core/kv_span.h"
#include "core/tensor.h"

namespace kvcache {

class EncoderDecoderCache {
 public:
  // self_config: the decoder's self-attention cache (one layer type per decoder layer); the
  // cross-attention cache has as many layers.
  explicit EncoderDecoderCache(const CacheConfig& self_config);

  Cache& self_attention_cache() { return *self_; }
  const Cache& self_attention_cache() const { return *self_; }
  int num_layers() const { return self_->num_layers(); }

  // Stores layer's cross K/V ([B, H, S_enc, D_k] and [B, H, S_enc, D_v], any float dtype; copied,
  // converted to the config's kv_dtype when it is set) and returns the span over them.
  // Error(kInvalidArgument) when the layer is already updated (reset() first), or for a layer index
  // out of range or a malformed view.
  KVSpan set_cross(int layer, const TensorView& k, const TensorView& v);
  // Whether set_cross has run for the layer since construction or reset().
  bool is_updated(int layer) const;
  // The stored cross K/V span; Error(kInvalidArgument) when the layer is not updated.
  KVSpan cross(int layer) const;
  // Encoder tokens the cross cache holds (0 when no layer is updated).
  int64_t encoder_length() const;

  // The decoder's tokens (self-attention cache).
  int64_t seq_length() const { return self_->seq_length(); }

  // The self-attention cache's crop (v5: cross-attention is never cropped).
  void crop(int64_t n);
  // Both caches emptied; every layer's is_updated cleared.
  void reset();
  // Both caches: beam reorder (gather rows beam_idx), batch selection, each row repeated r times.
  void reorder(std::span<const int64_t> beam_idx);
  void select(std::span<const int64_t> indices);
  void repeat_interleave(int64_t r);

  size_t self_bytes() const { return self_->bytes(); }
  size_t cross_bytes() const;
  size_t bytes() const { return self_bytes() + cross_bytes(); }

 private:
  struct CrossLayer {
    Tensor k, v;
    bool updated = false;
  };
  void check_layer(int layer, const char* what) const;
  // Every updated layer's rows replaced by rows `rows` of the old tensors (in that order).
  void gather_cross(std::span<const int64_t> rows, const char* what);

  std::unique_ptr<Cache> self_;
  std::vector<CrossLayer> cross_;
  std::optional<DType> kv_dtype_;  // the self config's storage dtype, also the cross pairs'
};

}  // namespace kvcache
