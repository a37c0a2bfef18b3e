// DenseLayer: what the dense containers (dynamic, static, sliding, chunked) share on top of a
// SequenceBuffer: lazy initialisation, validation of update() inputs with messages that name
// the layer, the batch-row operations, bytes() and statistics. Subclasses own the sequence
// policy (grow, refuse, slide) and the position bookkeeping.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "cache/cache.h"
#include "cache/cache_layer.h"
#include "cache/sequence_buffer.h"
#include "core/tensor.h"

namespace kvcache {

struct DenseLayerParams {
  std::string name;               // registry name, "dynamic/full_attention"
  int layer_index = -1;           // model layer, for error messages
  std::optional<DType> kv_dtype;  // storage dtype; unset: the first update's dtype
  int64_t max_batch_size = 0;     // fixed-storage containers: rows to preallocate (0: first batch)
  bool fixed_storage = false;     // never reallocate: the storage pointer is stable (static)
  // K == V (CacheConfig::KVContent::kSharedKV): update(k, v) takes k and v of one shape, stores
  // k only (v is not read: the caller passes the same tensor twice) and returns spans whose v
  // is k; bytes() halves.
  bool shared_kv = false;
};

DenseLayerParams dense_params(const CacheConfig& config, int layer_index, std::string name,
                              bool fixed_storage);

class DenseLayer : public CacheLayer {
 public:
  bool is_initialized() const override { return buf_.allocated(); }
  void reorder(std::span<const int64_t> beam_idx) override;
  void repeat_interleave(int64_t r) override;
  void select(std::span<const int64_t> indices) override;
  // Storage plus workspace: the tensors' size_bytes() (the allocator pads each to 64 B).
  size_t bytes() const override;
  std::string_view name() const override { return params_.name; }
  CopyStats stats() const override { return buf_.stats(); }
  int64_t batch_rows() const override { return buf_.allocated() ? buf_.batch() : -1; }
  // Static storage never moves (v5's StaticLayer.is_compileable).
  bool is_compileable() const override { return params_.fixed_storage; }
  // Session save / restore: the storage's shape and dtype, the position bookkeeping and the
  // stored tokens of every live row (nothing of the workspace, the spare capacity or the
  // statistics). load() checks everything against this layer before it changes anything.
  void save(StateWriter& out) const override;
  void load(StateReader& in) override;

  const SequenceBuffer& buffer() const { return buf_; }
  // Tokens physically held (<= seq_length() for windows).
  int64_t stored_tokens() const { return buf_.size(); }
  bool shared_kv() const { return params_.shared_kv; }

 protected:
  explicit DenseLayer(DenseLayerParams params) : params_(std::move(params)) {}

  // Checks k and v ([B, H_kv, n, D], float, matching each other and the storage once
  // initialised; of one shape when shared_kv); returns n. Throws Error naming the layer.
  int64_t check_update(const TensorView& k, const TensorView& v) const;
  // First update: allocates `capacity` slots (rows: max_batch_size or k's batch). Later
  // updates on an empty layer may change the batch (within the row capacity, or by
  // reallocating when the storage is not fixed).
  void prepare_rows(const TensorView& k, const TensorView& v, int64_t capacity);
  // The length crop(n) asks for, given `seq_length` tokens seen (cache/crop_rule.h): n < 0
  // drops the last |n| (all of them when |n| > seq_length), 0 keeps all, n > 0 (deprecated,
  // warns once) keeps the first min(n, seq_length).
  int64_t crop_length(int64_t n, int64_t seq_length) const;
  // "layer 3 (static/full_attention)"
  std::string where() const;
  // Grows the workspace to hold `tokens` slots for the current rows and returns views
  // [batch, H_kv, tokens, D] over it (shared_kv: *v is *k, one workspace).
  void workspace(int64_t tokens, TensorView* k, TensorView* v);
  // Subclasses' position bookkeeping after a row gather (nothing by default).
  virtual void after_rows_changed() {}

  // What a saved layer's position was: tokens seen, tokens stored (the last `stored` of them)
  // and whether past recording was on.
  struct SavedPosition {
    int64_t seq_length = 0;
    int64_t stored = 0;
    bool recording = false;
  };
  // Checks that a saved position fits this container (Error(kFormat) naming the layer) and
  // returns the token slots to allocate when the storage must be (re)allocated for it.
  virtual int64_t restore_capacity(const SavedPosition& p) const = 0;
  // Sets the subclass's bookkeeping once the tokens are in place (nothing by default).
  virtual void restore_position(const SavedPosition& p) { (void)p; }
  virtual bool recording() const { return false; }
  // Error(kFormat) "<where>: cannot restore: <what>".
  [[noreturn]] void refuse_restore(const std::string& what) const;

  DenseLayerParams params_;
  SequenceBuffer buf_;
  Tensor ws_k_;  // [B, H_kv, ws_tokens, D_k]: spans that do not fit the storage (windows)
  Tensor ws_v_;  // [B, H_kv, ws_tokens, D_v]

 private:
  void gather(std::span<const int64_t> rows, const char* op);
};

}  // namespace kvcache
