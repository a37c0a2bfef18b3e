// PagedCompressedLayer ("paged" / "compressed_sparse_attention", "heavily_compressed_attention")
// and PagedIndexedLayer ("paged" / "deepseek_sparse_attention"): the faces of
// cache/compressed_cache_layer.h over a PagedKVStore (issue 39; the store's header describes the
// layout: the sliding K==V window in the sliding group, the compressed entries and CSA's indexer
// keys in a kCompressed group per rate whose blocks hold block_tokens entries, the compressors'
// buffers and overlaps in the per-sequence state slots, DSA's indexer keys one per token in the
// full group's blocks).
//
// Differences from the dense containers, as PagedLinearLayer's:
// - spans are kPaged (update's window keeps positions with null blocks, kv_offset 0, like a
//   paged sliding layer; compressed(s) one page slot per entry; update_indexer one per token);
// - the views store_compression_weights / update_overlap_state return are store workspaces of
//   this layer and stream, valid until its next call of the same kind;
// - a compressed layer crops only to 0 or to the current length (the compressors' state keeps
//   no history), and its step is done when the window was written and every batch row's streams
//   fed (rows with windows: after update_compressor_states);
// - lifecycle calls act on the store's batch through the store's leader layer.
// Both need the store the other layers share (CacheOptions::paged.store).
#pragma once

#include <memory>
#include <string>

#include "cache/compressed_cache_layer.h"
#include "cache/paged_store.h"

namespace kvcache {

// The lifecycle of a layer of a shared store: applied once, by the store's leader.
template <typename Base>
class PagedStoreLayer : public Base {
 public:
  PagedStoreLayer(std::shared_ptr<PagedKVStore> store, int layer, std::string name)
      : store_(std::move(store)), layer_(layer), name_(std::move(name)) {
    store_->attach_layer(layer_);
  }
  MaskSizes mask_sizes(int64_t query_len) const override { return {seq_length() + query_len, 0}; }
  int64_t seq_length() const override { return store_->layer_length(layer_); }
  int64_t max_length() const override { return -1; }
  bool is_initialized() const override { return store_->allocated() && !store_->batch().empty(); }
  void crop(int64_t n) override {
    if (is_leader()) store_->crop(n);
  }
  void reset() override {
    if (is_leader()) store_->reset();
  }
  void reorder(std::span<const int64_t> beam_idx) override {
    if (is_leader()) store_->reorder(beam_idx);
  }
  void repeat_interleave(int64_t r) override {
    if (is_leader()) store_->repeat_interleave(r);
  }
  void select(std::span<const int64_t> indices) override {
    if (is_leader()) store_->remap(indices);
  }
  size_t bytes() const override {
    return store_->layer_page_bytes(layer_) + store_->layer_state_bytes(layer_) +
           (is_leader() ? store_->leader_extra_bytes() : 0);
  }
  std::string_view name() const override { return name_; }
  PagedKVStore& store() const { return *store_; }

 protected:
  bool is_leader() const { return store_->leader_layer() == layer_; }
  std::shared_ptr<PagedKVStore> store_;
  int layer_ = 0;
  std::string name_;
};

class PagedCompressedLayer final : public PagedStoreLayer<CompressedCacheLayer> {
 public:
  PagedCompressedLayer(std::shared_ptr<PagedKVStore> store, int layer);

  KVSpan update(const TensorView& k, const TensorView& v) override;
  int64_t compress_rate() const override { return store_->compress_rate(layer_); }
  bool has_overlap() const override { return store_->has_indexer_stream(layer_); }
  bool has_indexer() const override { return store_->has_indexer_stream(layer_); }
  CompressionChunk store_compression_weights(CompressedStream s, int64_t row, const TensorView& kv,
                                             const TensorView& gate) override {
    return store_->compressor_feed(layer_, s, row, kv, gate);
  }
  OverlapPrior update_overlap_state(CompressedStream s, int64_t row,
                                    const CompressionChunk& chunk) override {
    return store_->compressor_overlap(layer_, s, row, chunk);
  }
  void update_compressor_states(CompressedStream s, int64_t row,
                                const TensorView& entries) override {
    store_->compressor_entries(layer_, s, row, entries);
  }
  KVSpan compressed(CompressedStream s) const override {
    return store_->compressed_span(layer_, s);
  }
  int64_t entry_count(CompressedStream s, int64_t row) const override {
    return store_->compressed_entries(layer_, s, row);
  }
};

class PagedIndexedLayer final : public PagedStoreLayer<IndexedCacheLayer> {
 public:
  PagedIndexedLayer(std::shared_ptr<PagedKVStore> store, int layer);

  KVSpan update(const TensorView& k, const TensorView& v) override {
    return store_->write(layer_, k, v);
  }
  KVSpan update_indexer(const TensorView& index_keys) override {
    return store_->write_indexer(layer_, index_keys);
  }
};

}  // namespace kvcache
