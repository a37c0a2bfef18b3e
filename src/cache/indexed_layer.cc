#include "cache/indexed_layer.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "cache/dense_layer.h"
#include "cache/dynamic_layer.h"
#include "cache/recompute_layer.h"
#include "core/error.h"

namespace kvcache {

IndexedLayer::IndexedLayer(std::string name, int layer_index, std::optional<DType> kv_dtype,
                           bool per_call, std::unique_ptr<CacheLayer> attention)
    : name_(std::move(name)),
      layer_index_(layer_index),
      kv_dtype_(kv_dtype),
      per_call_(per_call),
      attention_(std::move(attention)) {}

std::string IndexedLayer::where() const {
  return "layer " + std::to_string(layer_index_) + " (" + name_ + ")";
}

KVSpan IndexedLayer::update(const TensorView& k, const TensorView& v) {
  // recompute: this call's keys only (the attention branch drops its own tokens likewise).
  if (per_call_ && index_.allocated()) index_.set_window(0, 0);
  return attention_->update(k, v);
}

KVSpan IndexedLayer::update_indexer(const TensorView& index_keys) {
  const TensorView& x = index_keys;
  if (x.ndim() != 4 || x.dim(0) < 1 || x.dim(1) < 1 || x.dim(3) < 1 || !dtype_is_float(x.dtype())) {
    throw Error(ErrorKind::kInvalidArgument,
                where() +
                    ": update_indexer(index_keys): index_keys must be float [B, 1, n, c]; "
                    "got " +
                    x.shape().str() + " " + dtype_name(x.dtype()));
  }
  const int64_t n = x.dim(2);
  if (!index_.allocated()) {
    SequenceBufferShape s;
    s.batch = x.dim(0);
    s.heads = x.dim(1);
    s.head_dim_k = s.head_dim_v = x.dim(3);
    s.dtype = kv_dtype_.value_or(x.dtype());
    s.shared_kv = true;
    index_.allocate(s, s.batch, std::max({n, kMinCapacity, reserved_}));
  } else {
    const SequenceBufferShape& s = index_.shape();
    if (x.dim(1) != s.heads || x.dim(3) != s.head_dim_k) {
      throw Error(ErrorKind::kInvalidArgument,
                  where() + ": update_indexer(index_keys): " + x.shape().str() +
                      " does not match the indexer keys' " + std::to_string(s.heads) +
                      " head(s) of width " + std::to_string(s.head_dim_k) +
                      " set by the first call");
    }
    if (x.dim(0) != s.batch) {
      if (index_.size() > 0) {
        throw Error(ErrorKind::kInvalidArgument,
                    where() + ": update_indexer(index_keys): batch " + std::to_string(x.dim(0)) +
                        " but the cache holds " + std::to_string(s.batch) +
                        " rows; use reorder/select/repeat_interleave, or reset()");
      }
      if (x.dim(0) > index_.batch_capacity()) index_.reallocate(x.dim(0), index_.capacity());
      index_.set_batch(x.dim(0));
    }
  }
  if (index_.end() + n > index_.capacity()) {
    index_.reallocate(index_.batch_capacity(), std::max(2 * index_.capacity(), index_.end() + n));
  }
  index_.append(x, x);
  KVSpan span;
  span.k = index_.k_slots(0, index_.end());
  span.v = index_.v_slots(0, index_.end());
  span.kv_offset = 0;
  return span;
}

void IndexedLayer::crop(int64_t n) {
  const int64_t seq = attention_->seq_length();
  attention_->crop(n);  // validates n (Error before any change)
  const int64_t length = std::min(seq, attention_->seq_length());  // the rule applied once
  if (index_.allocated() && index_.end() > length) index_.set_window(0, length);
}

void IndexedLayer::reset() {
  attention_->reset();
  if (index_.allocated()) index_.set_window(0, 0);
}

void IndexedLayer::reorder(std::span<const int64_t> beam_idx) {
  attention_->reorder(beam_idx);  // validates against its batch first
  if (index_.allocated()) index_.gather_rows(beam_idx);
}

void IndexedLayer::select(std::span<const int64_t> indices) {
  attention_->select(indices);
  if (index_.allocated()) index_.gather_rows(indices);
}

void IndexedLayer::repeat_interleave(int64_t r) {
  attention_->repeat_interleave(r);
  if (!index_.allocated() || r == 1) return;
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < index_.batch(); ++b)
    for (int64_t j = 0; j < r; ++j) rows.push_back(b);
  index_.gather_rows(rows);
}

void IndexedLayer::reserve(int64_t tokens) {
  attention_->reserve(tokens);
  if (tokens < 0) return;
  reserved_ = std::max(reserved_, tokens);
  if (index_.allocated() && index_.capacity() < tokens)
    index_.reallocate(index_.batch_capacity(), tokens);
}

namespace {
template <bool kRecompute>
std::unique_ptr<CacheLayer> make_indexed(const CacheConfig& config, int layer_index) {
  const std::string name =
      std::string(kRecompute ? "recompute" : "dynamic") + "/deepseek_sparse_attention";
  DenseLayerParams d = dense_params(config, layer_index, name, /*fixed_storage=*/false);
  const std::optional<DType> dtype = d.kv_dtype;
  std::unique_ptr<CacheLayer> attention;
  if (kRecompute)
    attention = std::make_unique<RecomputeLayer>(std::move(d));
  else
    attention = std::make_unique<DynamicLayer>(std::move(d));
  return std::make_unique<IndexedLayer>(name, layer_index, dtype, kRecompute, std::move(attention));
}
}  // namespace

KVCACHE_REGISTER_LAYER(dynamic_dsa, "dynamic", "deepseek_sparse_attention", make_indexed<false>);
KVCACHE_REGISTER_LAYER(recompute_dsa, "recompute", "deepseek_sparse_attention", make_indexed<true>);

}  // namespace kvcache
