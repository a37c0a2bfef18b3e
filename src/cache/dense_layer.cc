#include "cache/dense_layer.h"

#include <algorithm>
#include <string>
#include <vector>

#include "cache/crop_rule.h"
#include "cache/layer_state.h"
#include "core/error.h"

namespace kvcache {

DenseLayerParams dense_params(const CacheConfig& config, int layer_index, std::string name,
                              bool fixed_storage) {
  DenseLayerParams p;
  p.name = std::move(name);
  p.layer_index = layer_index;
  p.kv_dtype = config.options.kv_dtype;
  p.max_batch_size = config.options.max_batch_size;
  p.fixed_storage = fixed_storage;
  p.shared_kv = config.kv_content == CacheConfig::KVContent::kSharedKV;
  if (p.kv_dtype && !dtype_is_float(*p.kv_dtype)) {
    throw Error(ErrorKind::kUnsupported,
                "layer " + std::to_string(layer_index) + " (" + p.name + "): kv_dtype " +
                    dtype_name(*p.kv_dtype) +
                    " is a block type; dense containers store f32, f16 or bf16 (quantized "
                    "storage needs a quantized container)");
  }
  if (p.max_batch_size < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "max_batch_size must be >= 0, got " + std::to_string(p.max_batch_size));
  }
  return p;
}

std::string DenseLayer::where() const {
  return "layer " + std::to_string(params_.layer_index) + " (" + params_.name + ")";
}

int64_t DenseLayer::check_update(const TensorView& k, const TensorView& v) const {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument, where() + ": update(k, v): " + what);
  };
  if (k.ndim() != 4 || v.ndim() != 4) {
    fail("k and v must be 4-D [B, H_kv, S, D]; got k " + k.shape().str() + ", v " +
         v.shape().str());
  }
  if (k.dim(0) != v.dim(0) || k.dim(1) != v.dim(1) || k.dim(2) != v.dim(2)) {
    fail("k " + k.shape().str() + " and v " + v.shape().str() +
         " must agree on batch, heads and tokens");
  }
  if (k.dim(0) < 1 || k.dim(1) < 1 || k.dim(3) < 1 || v.dim(3) < 1) {
    fail("empty batch, heads or head dim: k " + k.shape().str() + ", v " + v.shape().str());
  }
  if (params_.shared_kv && !(k.shape() == v.shape())) {
    fail(
        "this layer stores K == V once (kv_content kSharedKV): k and v must be the same tensor "
        "(update(kv, kv)); got k " +
        k.shape().str() + ", v " + v.shape().str());
  }
  if (!dtype_is_float(k.dtype()) || !dtype_is_float(v.dtype())) {
    fail(std::string("k and v must be f32, f16 or bf16; got ") + dtype_name(k.dtype()) + ", " +
         dtype_name(v.dtype()));
  }
  if (buf_.allocated()) {
    const SequenceBufferShape& s = buf_.shape();
    if (k.dim(1) != s.heads || k.dim(3) != s.head_dim_k || v.dim(3) != s.head_dim_v) {
      fail("k " + k.shape().str() + ", v " + v.shape().str() + " do not match the cache's " +
           std::to_string(s.heads) + " KV heads and head dims " + std::to_string(s.head_dim_k) +
           "/" + std::to_string(s.head_dim_v) + " set by the first update");
    }
    if (buf_.size() > 0 && k.dim(0) != s.batch) {
      fail("batch " + std::to_string(k.dim(0)) + " but the cache holds " + std::to_string(s.batch) +
           " rows; use reorder/select/repeat_interleave, or reset()");
    }
  }
  return k.dim(2);
}

void DenseLayer::prepare_rows(const TensorView& k, const TensorView& v, int64_t capacity) {
  const int64_t batch = k.dim(0);
  if (!buf_.allocated()) {
    int64_t rows = batch;
    if (params_.max_batch_size > 0) {
      if (batch > params_.max_batch_size) {
        throw Error(ErrorKind::kOutOfRange, where() + ": batch " + std::to_string(batch) +
                                                " exceeds max_batch_size " +
                                                std::to_string(params_.max_batch_size) +
                                                "; raise --max-batch-size or split the batch");
      }
      if (params_.fixed_storage) rows = params_.max_batch_size;
    }
    SequenceBufferShape s;
    s.batch = batch;
    s.heads = k.dim(1);
    s.head_dim_k = k.dim(3);
    s.head_dim_v = v.dim(3);
    s.dtype = params_.kv_dtype.value_or(k.dtype());
    s.shared_kv = params_.shared_kv;
    buf_.allocate(s, rows, capacity);
    return;
  }
  if (batch == buf_.batch()) return;
  // Empty (check_update refuses a batch change otherwise): adopt the new batch.
  if (batch > buf_.batch_capacity()) {
    if (params_.fixed_storage) {
      throw Error(ErrorKind::kOutOfRange, where() + ": batch " + std::to_string(batch) +
                                              " exceeds the " +
                                              std::to_string(buf_.batch_capacity()) +
                                              " preallocated rows; raise --max-batch-size");
    }
    buf_.reallocate(batch, buf_.capacity());
  }
  buf_.set_batch(batch);
}

void DenseLayer::workspace(int64_t tokens, TensorView* k, TensorView* v) {
  const SequenceBufferShape& s = buf_.shape();
  // Reuse while large enough for this batch and length; regrow otherwise.
  if (ws_k_.dim(0) < s.batch || ws_k_.dim(2) < tokens || ws_k_.dtype() != s.dtype) {
    ws_k_ = Tensor();
    ws_v_ = Tensor();
    ws_k_ = Tensor::empty(s.dtype, {s.batch, s.heads, tokens, s.head_dim_k});
    if (!s.shared_kv) ws_v_ = Tensor::empty(s.dtype, {s.batch, s.heads, tokens, s.head_dim_v});
  }
  const int64_t cap = ws_k_.dim(2);
  *k = TensorView(ws_k_.data(), s.dtype, {s.batch, s.heads, tokens, s.head_dim_k},
                  Dims{s.heads * cap * s.head_dim_k, cap * s.head_dim_k, s.head_dim_k, 1});
  if (s.shared_kv) {
    *v = *k;
    return;
  }
  *v = TensorView(ws_v_.data(), s.dtype, {s.batch, s.heads, tokens, s.head_dim_v},
                  Dims{s.heads * cap * s.head_dim_v, cap * s.head_dim_v, s.head_dim_v, 1});
}

int64_t DenseLayer::crop_length(int64_t n, int64_t seq_length) const {
  return crop_target_length(n, seq_length);
}

size_t DenseLayer::bytes() const {
  return buf_.bytes() + ws_k_.size_bytes() + ws_v_.size_bytes();
}

void DenseLayer::gather(std::span<const int64_t> rows, const char* op) {
  const auto batch = buf_.batch();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= batch) {
      throw Error(ErrorKind::kInvalidArgument,
                  where() + ": " + op + ": index " + std::to_string(rows[i]) + " at position " +
                      std::to_string(i) + " is outside the batch [0, " + std::to_string(batch) +
                      ")");
    }
  }
  if (static_cast<int64_t>(rows.size()) > buf_.batch_capacity() && params_.fixed_storage) {
    throw Error(ErrorKind::kOutOfRange, where() + ": " + op + " needs " +
                                            std::to_string(rows.size()) + " rows but " +
                                            std::to_string(buf_.batch_capacity()) +
                                            " are preallocated; raise --max-batch-size");
  }
  buf_.gather_rows(rows);
  after_rows_changed();
}

void DenseLayer::reorder(std::span<const int64_t> beam_idx) {
  if (!buf_.allocated()) return;
  if (static_cast<int64_t>(beam_idx.size()) != buf_.batch()) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": reorder: beam_idx has " + std::to_string(beam_idx.size()) +
                    " entries but the batch has " + std::to_string(buf_.batch()) + " rows");
  }
  gather(beam_idx, "reorder");
}

void DenseLayer::repeat_interleave(int64_t r) {
  if (r < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": repeat_interleave: repeats must be >= 1, got " + std::to_string(r));
  }
  if (!buf_.allocated() || r == 1) return;
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(buf_.batch() * r));
  for (int64_t b = 0; b < buf_.batch(); ++b)
    for (int64_t i = 0; i < r; ++i) rows.push_back(b);
  gather(rows, "repeat_interleave");
}

void DenseLayer::select(std::span<const int64_t> indices) {
  if (!buf_.allocated()) return;
  if (indices.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": select: no rows listed; a cache needs at least one row (use reset())");
  }
  gather(indices, "select");
}

void DenseLayer::refuse_restore(const std::string& what) const {
  throw Error(ErrorKind::kFormat, where() + ": cannot restore: " + what);
}

// Layout: u32 allocated; when 1: str dtype, i64 batch, heads, head_dim_k, head_dim_v,
// u32 shared_kv, i64 seq_length, i64 stored, u32 recording, then K [batch, heads, stored, D_k]
// and (unless shared_kv) V, row-major in the storage dtype.
void DenseLayer::save(StateWriter& out) const {
  out.u32(buf_.allocated() ? 1 : 0);
  if (!buf_.allocated()) return;
  const SequenceBufferShape& s = buf_.shape();
  out.str(dtype_name(s.dtype));
  out.i64(s.batch);
  out.i64(s.heads);
  out.i64(s.head_dim_k);
  out.i64(s.head_dim_v);
  out.u32(s.shared_kv ? 1 : 0);
  out.i64(seq_length());
  out.i64(buf_.size());
  out.u32(recording() ? 1 : 0);
  out.view(buf_.k_slots(buf_.begin(), buf_.end()));
  if (!s.shared_kv) out.view(buf_.v_slots(buf_.begin(), buf_.end()));
}

void DenseLayer::load(StateReader& in) {
  if (in.u32() == 0) {  // saved before its first update
    reset();
    return;
  }
  SequenceBufferShape s;
  const std::string dtype = in.str(16);
  s.batch = in.i64();
  s.heads = in.i64();
  s.head_dim_k = in.i64();
  s.head_dim_v = in.i64();
  s.shared_kv = in.u32() != 0;
  SavedPosition p;
  p.seq_length = in.i64();
  p.stored = in.i64();
  p.recording = in.u32() != 0;

  try {
    s.dtype = parse_dtype(dtype);
  } catch (const Error&) {
    refuse_restore("unknown kv dtype '" + dtype + "' in the file");
  }
  if (!dtype_is_float(s.dtype)) refuse_restore("kv dtype " + dtype + " is not a float type");
  const DType want = buf_.allocated() ? buf_.shape().dtype : params_.kv_dtype.value_or(s.dtype);
  if (s.dtype != want)
    refuse_restore(std::string("kv dtype ") + dtype + " in the file vs " + dtype_name(want) +
                   " here");
  if (s.shared_kv != params_.shared_kv)
    refuse_restore(std::string("the file stores ") + (s.shared_kv ? "K == V once" : "K and V") +
                   ", this layer " + (params_.shared_kv ? "K == V once" : "K and V"));
  if (s.batch < 1 || s.heads < 1 || s.head_dim_k < 1 || s.head_dim_v < 1 ||
      (s.shared_kv && s.head_dim_k != s.head_dim_v))
    refuse_restore("invalid shape in the file: batch " + std::to_string(s.batch) + ", heads " +
                   std::to_string(s.heads) + ", head dims " + std::to_string(s.head_dim_k) + "/" +
                   std::to_string(s.head_dim_v));
  if (buf_.allocated()) {
    const SequenceBufferShape& h = buf_.shape();
    if (s.heads != h.heads || s.head_dim_k != h.head_dim_k || s.head_dim_v != h.head_dim_v)
      refuse_restore("the file has " + std::to_string(s.heads) + " KV heads of dims " +
                     std::to_string(s.head_dim_k) + "/" + std::to_string(s.head_dim_v) +
                     ", this layer " + std::to_string(h.heads) + " of " +
                     std::to_string(h.head_dim_k) + "/" + std::to_string(h.head_dim_v));
  }
  if (params_.max_batch_size > 0 && s.batch > params_.max_batch_size)
    refuse_restore("batch " + std::to_string(s.batch) + " in the file vs max_batch_size " +
                   std::to_string(params_.max_batch_size) + " here");
  if (p.stored < 0 || p.seq_length < p.stored)
    refuse_restore("invalid position in the file: " + std::to_string(p.stored) + " tokens of " +
                   std::to_string(p.seq_length) + " stored");
  const int64_t capacity = restore_capacity(p);  // checks the container's own limits

  // Everything checked: from here on the layer changes. Reuse the storage when it fits.
  if (buf_.allocated() && buf_.capacity() >= p.stored && buf_.batch_capacity() >= s.batch) {
    buf_.set_window(0, 0);
    buf_.set_batch(s.batch);
  } else {
    const int64_t rows =
        params_.fixed_storage && params_.max_batch_size > 0 ? params_.max_batch_size : s.batch;
    buf_.allocate(s, rows, std::max(capacity, p.stored));
  }
  buf_.set_window(0, p.stored);
  in.view(buf_.k_slots(0, p.stored));
  if (!s.shared_kv) in.view(buf_.v_slots(0, p.stored));
  restore_position(p);
}

}  // namespace kvcache
