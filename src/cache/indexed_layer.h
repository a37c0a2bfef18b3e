// IndexedLayer ("dynamic" / "recompute" x "deepseek_sparse_attention"): DeepSeek-V3.2's sparse
// attention layer, transformers' DynamicIndexedLayer: full attention (a DynamicLayer, or a
// RecomputeLayer for the no-cache oracle, owned by composition and honouring kv_content, so an
// MLA latent or K==V works as for full_attention) plus one indexer key per token, appended by
// update_indexer and returned whole ([B, 1, T, c] dense, v aliasing k, kv_offset 0).
//
// The indexer keys live in a SequenceBuffer with K == V (one copy), grown geometrically like
// the dynamic layer's. crop cuts the K/V and the indexer keys to the same length (plain: both
// keep everything); reset forgets both and keeps the memory; reorder / select /
// repeat_interleave move both. "recompute" forgets the indexer keys at every update(), as its
// attention branch forgets its K/V: each call is a sequence of its own.
// "static" has no container for this type: the registry's error lists what exists.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "cache/cache.h"
#include "cache/compressed_cache_layer.h"
#include "cache/sequence_buffer.h"

namespace kvcache {

class IndexedLayer final : public IndexedCacheLayer {
 public:
  static constexpr int64_t kMinCapacity = 16;  // first indexer allocation at least this

  IndexedLayer(std::string name, int layer_index, std::optional<DType> kv_dtype, bool per_call,
               std::unique_ptr<CacheLayer> attention);

  KVSpan update(const TensorView& k, const TensorView& v) override;
  MaskSizes mask_sizes(int64_t query_len) const override {
    return attention_->mask_sizes(query_len);
  }
  int64_t seq_length() const override { return attention_->seq_length(); }
  int64_t max_length() const override { return attention_->max_length(); }
  bool is_initialized() const override { return attention_->is_initialized(); }
  void crop(int64_t n) override;
  void reset() override;
  void reorder(std::span<const int64_t> beam_idx) override;
  void repeat_interleave(int64_t r) override;
  void select(std::span<const int64_t> indices) override;
  void reserve(int64_t tokens) override;
  // Attention storage and workspaces plus the indexer keys' storage.
  size_t bytes() const override { return attention_->bytes() + index_.bytes(); }
  CopyStats stats() const override { return attention_->stats(); }
  std::string_view name() const override { return name_; }

  // index_keys: [B, 1, n, c], any float dtype (stored in kv_dtype, else the first keys' dtype).
  KVSpan update_indexer(const TensorView& index_keys) override;
  // Indexer keys held per row.
  int64_t indexer_length() const { return index_.allocated() ? index_.size() : 0; }
  const CacheLayer& attention() const { return *attention_; }

 private:
  std::string where() const;

  std::string name_;
  int layer_index_;
  std::optional<DType> kv_dtype_;
  bool per_call_;
  std::unique_ptr<CacheLayer> attention_;
  SequenceBuffer index_;  // [B, 1, capacity, c], K == V
  int64_t reserved_ = 0;
};

}  // namespace kvcache
