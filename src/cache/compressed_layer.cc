#include "cache/compressed_layer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "cache/crop_rule.h"
#include "cache/recompute_layer.h"
#include "cache/window_layer.h"
#include "core/error.h"

namespace kvcache {

namespace {

const char* stream_name(CompressedStream s) {
  return s == CompressedStream::kIndexer ? "indexer" : "compressor";
}

// Rows [from, to) of batch row `row` of a [rows, n, width] f32 tensor, as [to - from, width].
TensorView row_rows(const Tensor& t, int64_t row, int64_t from, int64_t to) {
  float* base = t.data_as<float>();
  if (base != nullptr) base += (row * t.dim(1) + from) * t.dim(2);
  return TensorView(base, DType::kF32, {to - from, t.dim(2)});
}

// [n, width] f32 view of a row-major float vector from row `from`.
TensorView vec_rows(const std::vector<float>& v, int64_t width, int64_t from, int64_t to) {
  auto* base = const_cast<float*>(v.data()) + from * width;
  return TensorView(base, DType::kF32, {to - from, width});
}

// Appends src ([n, width], any float dtype) to a row-major f32 vector.
void append_rows(std::vector<float>& v, const TensorView& src) {
  const size_t old = v.size();
  v.resize(old + static_cast<size_t>(src.numel()));
  copy_view(src, TensorView(v.data() + old, DType::kF32, src.shape()));
}

// Row i of the result is row rows[i] of t (leading axis); empty stays empty.
Tensor gather_leading(const Tensor& t, std::span<const int64_t> rows) {
  if (t.shape().ndim == 0) return Tensor();
  Shape s = t.shape();
  s.dims[0] = static_cast<int64_t>(rows.size());
  Tensor out = Tensor::empty(t.dtype(), s);
  const size_t row_bytes = t.dim(0) == 0 ? 0 : t.size_bytes() / static_cast<size_t>(t.dim(0));
  if (row_bytes == 0) return out;
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<std::byte*>(out.data()) + i * row_bytes,
                static_cast<const std::byte*>(t.data()) + static_cast<size_t>(rows[i]) * row_bytes,
                row_bytes);
  return out;
}

template <typename T>
std::vector<T> gather_vector(const std::vector<T>& v, std::span<const int64_t> rows) {
  std::vector<T> out;
  out.reserve(rows.size());
  for (int64_t r : rows) out.push_back(v[static_cast<size_t>(r)]);
  return out;
}

size_t vector_bytes(const std::vector<std::vector<float>>& v) {
  size_t b = 0;
  for (const auto& x : v) b += x.capacity() * sizeof(float);
  return b;
}

}  // namespace

std::unique_ptr<CacheLayer> make_compressed_layer(const CacheConfig& config, int layer_index,
                                                  const std::string& implementation,
                                                  const std::string& layer_type, bool csa) {
  CompressedLayerParams p;
  p.name = implementation + "/" + layer_type;
  p.layer_index = layer_index;
  const auto it = config.compressed.rates.find(layer_type);
  if (it == config.compressed.rates.end() || it->second < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                "layer " + std::to_string(layer_index) + " (" + p.name + "): " +
                    (it == config.compressed.rates.end()
                         ? std::string("no compress rate for '") + layer_type + "'"
                         : "compress rate " + std::to_string(it->second) + " for '" + layer_type +
                               "' must be >= 1") +
                    " in CacheConfig::compressed.rates; set it from the model config's "
                    "compress_rates (compress_ratios)");
  }
  p.rate = it->second;
  p.overlap = csa;
  p.indexer = csa;
  p.per_call = implementation == "recompute";
  // The window branch is always K==V (V4's shared-KV MQA), whatever kv_content says.
  DenseLayerParams d = dense_params(config, layer_index, p.name, /*fixed_storage=*/false);
  d.shared_kv = true;
  p.kv_dtype = d.kv_dtype;
  std::unique_ptr<CacheLayer> sliding;
  if (p.per_call) {
    sliding = std::make_unique<RecomputeLayer>(std::move(d));
  } else {
    WindowLayerParams w;
    w.kind = WindowKind::kSliding;
    w.window = config.sliding_window;
    sliding = std::make_unique<WindowLayer>(std::move(d), w);
  }
  return std::make_unique<CompressedLayer>(std::move(p), std::move(sliding));
}

CompressedLayer::CompressedLayer(CompressedLayerParams params, std::unique_ptr<CacheLayer> sliding)
    : params_(std::move(params)), sliding_(std::move(sliding)) {
  KV_CHECK(params_.rate >= 1 && sliding_ != nullptr, "bad compressed layer parameters");
}

std::string CompressedLayer::where() const {
  return "layer " + std::to_string(params_.layer_index) + " (" + params_.name + ")";
}

const CompressedLayer::Stream& CompressedLayer::stream(CompressedStream s, const char* op) const {
  const int i = static_cast<int>(s);
  if (i != 0 && i != 1) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": " + op + ": unknown stream " + std::to_string(i));
  }
  if (s == CompressedStream::kIndexer && !params_.indexer) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": " + op +
                    ": this layer has no indexer stream (only compressed_sparse_attention layers "
                    "keep the indexer's compressed keys)");
  }
  return streams_[i];
}

CompressedLayer::Stream& CompressedLayer::stream(CompressedStream s, const char* op) {
  return const_cast<Stream&>(static_cast<const CompressedLayer&>(*this).stream(s, op));
}

void CompressedLayer::check_row(int64_t row, const char* op) const {
  if (row < 0 || row >= batch_) {
    throw Error(
        ErrorKind::kInvalidArgument,
        where() + ": " + op + ": row " + std::to_string(row) + " is outside the batch [0, " +
            std::to_string(batch_) + ")" +
            (batch_ == 0 ? "; the sliding update(kv, kv) sets the batch: call it first" : ""));
  }
}

void CompressedLayer::allocate_rows(Stream& st, int64_t rows) {
  const int64_t r = params_.rate;
  st.buf_kv = Tensor::empty(DType::kF32, {rows, r - 1, st.width});
  st.buf_gate = Tensor::empty(DType::kF32, {rows, r - 1, st.width});
  if (params_.overlap) {
    st.ovl_kv = Tensor::empty(DType::kF32, {rows, r, st.width / 2});
    st.ovl_gate = Tensor::empty(DType::kF32, {rows, r, st.width / 2});
    if (st.prior_kv.shape().ndim == 0) {
      st.prior_kv = Tensor::empty(DType::kF32, {r, st.width / 2});
      st.prior_gate = Tensor::empty(DType::kF32, {r, st.width / 2});
    }
  }
}

void CompressedLayer::grow_entries(Stream& st, int64_t rows, int64_t cap) {
  Tensor next = Tensor::empty(st.dtype, {rows, 1, cap, st.dim});
  if (st.entries.shape().ndim == 4) {
    const int64_t keep_rows = std::min(rows, st.entries.dim(0));
    for (int64_t b = 0; b < keep_rows; ++b) {
      const int64_t n = st.count[static_cast<size_t>(b)];
      if (n == 0) continue;
      copy_view(st.entries.view().slice(0, b, b + 1).slice(2, 0, n),
                next.view().slice(0, b, b + 1).slice(2, 0, n));
    }
  }
  st.entries = std::move(next);
}

void CompressedLayer::clear_row(Stream& st, int64_t row) {
  const auto i = static_cast<size_t>(row);
  st.buf_len[i] = 0;
  st.windows[i] = 0;
  st.count[i] = 0;
  st.has_ovl[i] = 0;
  st.hist_start[i] = 0;
  st.hist_kv[i].clear();
  st.hist_gate[i].clear();
  st.seed_kv[i].clear();
  st.seed_gate[i].clear();
  st.last_row = -1;
}

void CompressedLayer::clear_streams() {
  for (Stream& st : streams_)
    for (int64_t b = 0; b < batch_; ++b) clear_row(st, b);
}

void CompressedLayer::set_batch(int64_t batch) {
  for (Stream& st : streams_) {
    const auto n = static_cast<size_t>(batch);
    st.buf_len.assign(n, 0);
    st.windows.assign(n, 0);
    st.count.assign(n, 0);
    st.has_ovl.assign(n, 0);
    st.hist_start.assign(n, 0);
    st.hist_kv.resize(n);
    st.hist_gate.resize(n);
    st.seed_kv.resize(n);
    st.seed_gate.resize(n);
    st.last_row = -1;
    if (st.width > 0 && st.buf_kv.dim(0) < batch) allocate_rows(st, batch);
    if (st.entries.shape().ndim == 4 && st.entries.dim(0) < batch)
      grow_entries(st, batch, st.entries.dim(2));
  }
  batch_ = batch;
  clear_streams();
}

KVSpan CompressedLayer::update(const TensorView& k, const TensorView& v) {
  // recompute: a whole sequence per call (RecomputeLayer drops its own tokens likewise).
  if (params_.per_call) clear_streams();
  KVSpan span = sliding_->update(k, v);  // validates; refuses a batch change unless empty
  if (k.dim(0) != batch_) set_batch(k.dim(0));
  return span;
}

CompressionChunk CompressedLayer::store_compression_weights(CompressedStream s, int64_t row,
                                                            const TensorView& kv,
                                                            const TensorView& gate) {
  Stream& st = stream(s, "store_compression_weights");
  check_row(row, "store_compression_weights");
  const auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument, where() + ": store_compression_weights(" +
                                                 stream_name(s) + ", row " + std::to_string(row) +
                                                 "): " + what);
  };
  if (kv.ndim() != 2 || !(kv.shape() == gate.shape()) || kv.dim(1) < 1 ||
      !dtype_is_float(kv.dtype()) || !dtype_is_float(gate.dtype())) {
    fail("kv and gate must be float [n, width] of one shape; got kv " + kv.shape().str() +
         ", gate " + gate.shape().str());
  }
  const int64_t width = kv.dim(1);
  if (params_.overlap && width % 2 != 0)
    fail("width " + std::to_string(width) + " must be even (the Ca and Cb halves)");
  if (st.width != 0 && width != st.width)
    fail("width " + std::to_string(width) + " but this stream's rows are " +
         std::to_string(st.width) + " wide");
  if (st.width == 0) {
    st.width = width;
    // Entries are as wide as the rows (HCA), or as one half (CSA folds Ca with Cb).
    st.dim = params_.overlap ? width / 2 : width;
    allocate_rows(st, batch_);
  }
  const auto i = static_cast<size_t>(row);
  const int64_t r = params_.rate;
  const int64_t n = kv.dim(0);
  const int64_t held = st.buf_len[i];
  const int64_t usable = (held + n) / r * r;
  if (recording_) {
    append_rows(st.hist_kv[i], kv);
    append_rows(st.hist_gate[i], gate);
  }
  CompressionChunk out;
  out.first_window_position = st.count[i] * r;
  out.n_windows = usable / r;
  if (usable == 0) {  // everything waits in the buffer
    copy_view(kv, row_rows(st.buf_kv, row, held, held + n));
    copy_view(gate, row_rows(st.buf_gate, row, held, held + n));
    st.buf_len[i] = held + n;
    out.kv = TensorView(st.chunk_kv.data(), DType::kF32, {0, width});
    out.gate = TensorView(st.chunk_gate.data(), DType::kF32, {0, width});
    return out;
  }
  if (st.chunk_kv.shape().ndim == 0 || st.chunk_kv.dim(0) < usable) {
    st.chunk_kv = Tensor();
    st.chunk_gate = Tensor();
    st.chunk_kv = Tensor::empty(DType::kF32, {usable, width});
    st.chunk_gate = Tensor::empty(DType::kF32, {usable, width});
  }
  out.kv = st.chunk_kv.view().slice(0, 0, usable);
  out.gate = st.chunk_gate.view().slice(0, 0, usable);
  // Buffered rows first (usable >= r > held: the buffer empties), then the new ones.
  copy_view(row_rows(st.buf_kv, row, 0, held), out.kv.slice(0, 0, held));
  copy_view(row_rows(st.buf_gate, row, 0, held), out.gate.slice(0, 0, held));
  copy_view(kv.slice(0, 0, usable - held), out.kv.slice(0, held, usable));
  copy_view(gate.slice(0, 0, usable - held), out.gate.slice(0, held, usable));
  const int64_t rest = held + n - usable;
  copy_view(kv.slice(0, n - rest, n), row_rows(st.buf_kv, row, 0, rest));
  copy_view(gate.slice(0, n - rest, n), row_rows(st.buf_gate, row, 0, rest));
  st.buf_len[i] = rest;
  st.windows[i] += out.n_windows;
  if (params_.overlap) {
    // The prior (the previous last window's Ca half), then the new one from the raw rows.
    st.last_prior = st.has_ovl[i] != 0;
    if (st.last_prior) {
      copy_view(row_rows(st.ovl_kv, row, 0, r), st.prior_kv.view());
      copy_view(row_rows(st.ovl_gate, row, 0, r), st.prior_gate.view());
    }
    const int64_t h = width / 2;
    copy_view(out.kv.slice(0, usable - r, usable).slice(1, 0, h), row_rows(st.ovl_kv, row, 0, r));
    copy_view(out.gate.slice(0, usable - r, usable).slice(1, 0, h),
              row_rows(st.ovl_gate, row, 0, r));
    st.has_ovl[i] = 1;
  }
  st.last_row = row;
  st.last_windows = out.n_windows;
  return out;
}

OverlapPrior CompressedLayer::update_overlap_state(CompressedStream s, int64_t row,
                                                   const CompressionChunk& chunk) {
  Stream& st = stream(s, "update_overlap_state");
  check_row(row, "update_overlap_state");
  const std::string what =
      where() + ": update_overlap_state(" + stream_name(s) + ", row " + std::to_string(row) + "): ";
  if (!params_.overlap) {
    throw Error(ErrorKind::kInvalidArgument,
                what +
                    "this layer folds non-overlapping windows and keeps no overlap state "
                    "(only compressed_sparse_attention layers do)");
  }
  if (chunk.n_windows < 1 || st.last_row != row || st.last_windows != chunk.n_windows) {
    throw Error(ErrorKind::kInvalidArgument,
                what +
                    "call it right after the store_compression_weights of this stream and row "
                    "that returned the chunk, and only when the chunk holds windows (it has " +
                    std::to_string(chunk.n_windows) + ")");
  }
  OverlapPrior prior;
  if (st.last_prior) {
    prior.kv = st.prior_kv.view();
    prior.gate = st.prior_gate.view();
  }
  return prior;
}

void CompressedLayer::update_compressor_states(CompressedStream s, int64_t row,
                                               const TensorView& entries) {
  Stream& st = stream(s, "update_compressor_states");
  check_row(row, "update_compressor_states");
  const auto i = static_cast<size_t>(row);
  const auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument, where() + ": update_compressor_states(" +
                                                 stream_name(s) + ", row " + std::to_string(row) +
                                                 "): " + what);
  };
  if (entries.ndim() == 0) return;  // nothing folded (an empty view)
  if (entries.ndim() != 2 || entries.dim(1) < 1 || !dtype_is_float(entries.dtype()))
    fail("entries must be float [n_windows, D]; got " + entries.shape().str());
  const int64_t n = entries.dim(0);
  const int64_t d = entries.dim(1);
  if (st.width == 0) fail("no window was emitted yet (store_compression_weights first)");
  if (d != st.dim) {
    fail("entries are " + std::to_string(d) + " wide but this stream's are " +
         std::to_string(st.dim) +
         (params_.overlap ? " (half the rows' width)" : " (the rows' width)"));
  }
  if (st.count[i] + n > st.windows[i]) {
    fail(std::to_string(n) + " entries would make " + std::to_string(st.count[i] + n) +
         " but only " + std::to_string(st.windows[i]) +
         " windows were emitted by store_compression_weights");
  }
  if (n == 0) return;
  if (st.entries.shape().ndim != 4) st.dtype = params_.kv_dtype.value_or(entries.dtype());
  const int64_t cap = st.entries.shape().ndim == 4 ? st.entries.dim(2) : 0;
  const int64_t need = st.count[i] + n;
  if (need > cap) grow_entries(st, batch_, std::max({need, 2 * cap, reserved_entries_}));
  copy_view(entries, TensorView(st.entries.view().ptr(row, 0, st.count[i]), st.dtype, {n, st.dim}));
  st.count[i] = need;
}

KVSpan CompressedLayer::compressed(CompressedStream s) const {
  const Stream& st = stream(s, "compressed");
  const int64_t t = batch_ > 0 ? st.count[0] : 0;
  for (int64_t b = 1; b < batch_; ++b) {
    if (st.count[static_cast<size_t>(b)] != t) {
      throw Error(ErrorKind::kInvalidArgument,
                  where() + ": compressed(" + stream_name(s) + "): row 0 holds " +
                      std::to_string(t) + " entries but row " + std::to_string(b) + " holds " +
                      std::to_string(st.count[static_cast<size_t>(b)]) +
                      "; a dense span needs every row at one position (use the paged cache for "
                      "rows at different positions)");
    }
  }
  KVSpan span;
  const DType dt = st.entries.shape().ndim == 4 ? st.dtype : params_.kv_dtype.value_or(DType::kF32);
  if (st.entries.shape().ndim != 4) {
    span.k = TensorView(nullptr, dt, {batch_, 1, 0, st.dim});
  } else {
    const int64_t cap = st.entries.dim(2);
    span.k = TensorView(st.entries.data(), dt, {batch_, 1, t, st.dim},
                        Dims{cap * st.dim, cap * st.dim, st.dim, 1});
  }
  span.v = span.k;
  span.kv_offset = 0;
  return span;
}

int64_t CompressedLayer::entry_count(CompressedStream s, int64_t row) const {
  const Stream& st = stream(s, "entry_count");
  check_row(row, "entry_count");
  return st.count[static_cast<size_t>(row)];
}

TensorView CompressedLayer::buffer_kv(CompressedStream s, int64_t row) const {
  const Stream& st = stream(s, "buffer_kv");
  check_row(row, "buffer_kv");
  if (st.width == 0) return TensorView(nullptr, DType::kF32, {0, 0});
  return row_rows(st.buf_kv, row, 0, st.buf_len[static_cast<size_t>(row)]);
}

TensorView CompressedLayer::buffer_gate(CompressedStream s, int64_t row) const {
  const Stream& st = stream(s, "buffer_gate");
  check_row(row, "buffer_gate");
  if (st.width == 0) return TensorView(nullptr, DType::kF32, {0, 0});
  return row_rows(st.buf_gate, row, 0, st.buf_len[static_cast<size_t>(row)]);
}

TensorView CompressedLayer::overlap_kv(CompressedStream s, int64_t row) const {
  const Stream& st = stream(s, "overlap_kv");
  check_row(row, "overlap_kv");
  if (!st.has_ovl[static_cast<size_t>(row)]) return TensorView();
  return row_rows(st.ovl_kv, row, 0, params_.rate);
}

TensorView CompressedLayer::overlap_gate(CompressedStream s, int64_t row) const {
  const Stream& st = stream(s, "overlap_gate");
  check_row(row, "overlap_gate");
  if (!st.has_ovl[static_cast<size_t>(row)]) return TensorView();
  return row_rows(st.ovl_gate, row, 0, params_.rate);
}

void CompressedLayer::restart_history(Stream& st, int64_t row) {
  const auto i = static_cast<size_t>(row);
  st.hist_start[i] = st.windows[i] * params_.rate;
  st.hist_kv[i].clear();
  st.hist_gate[i].clear();
  st.seed_kv[i].clear();
  st.seed_gate[i].clear();
  if (st.width == 0) return;
  append_rows(st.hist_kv[i], row_rows(st.buf_kv, row, 0, st.buf_len[i]));
  append_rows(st.hist_gate[i], row_rows(st.buf_gate, row, 0, st.buf_len[i]));
  if (st.has_ovl[i]) {
    append_rows(st.seed_kv[i], row_rows(st.ovl_kv, row, 0, params_.rate));
    append_rows(st.seed_gate[i], row_rows(st.ovl_gate, row, 0, params_.rate));
  }
}

void CompressedLayer::activate_past_recording() {
  sliding_->activate_past_recording();
  if (recording_) return;
  recording_ = true;
  for (Stream& st : streams_)
    for (int64_t b = 0; b < batch_; ++b) restart_history(st, b);
}

std::string CompressedLayer::crop_problem(const Stream& st, int64_t row, int64_t length) const {
  const auto i = static_cast<size_t>(row);
  const int64_t r = params_.rate;
  const int64_t len = st.windows[i] * r + st.buf_len[i];
  if (length >= len || length == 0) return "";
  const std::string seq = std::to_string(seq_length());
  if (!recording_) {
    return "its compressed state there is gone (windows folded, rows not kept); without past "
           "recording only 0 and " +
           seq +
           " are reachable: call activate_past_recording() before generating tokens you may "
           "drop (e.g. speculative drafts)";
  }
  const int64_t hs = st.hist_start[i];
  const int64_t start = length / r * r;
  if (start < hs) {
    return "past recording keeps this stream's rows from position " + std::to_string(hs) +
           " (where recording started, rounded down to a window of " + std::to_string(r) +
           "), so only 0 and [" + std::to_string(hs) + ", " + seq +
           "] are reachable; call activate_past_recording() earlier";
  }
  if (params_.overlap && start > 0 && start == hs && st.seed_kv[i].empty())
    return "no overlap was kept at position " + std::to_string(hs);
  return "";
}

void CompressedLayer::apply_crop(Stream& st, int64_t row, int64_t length) {
  const auto i = static_cast<size_t>(row);
  const int64_t r = params_.rate;
  const int64_t len = st.windows[i] * r + st.buf_len[i];
  if (length >= len) return;
  if (length == 0) {
    clear_row(st, row);
    return;
  }
  const int64_t hs = st.hist_start[i];
  const int64_t w = length / r;
  const int64_t start = w * r;
  const int64_t wd = st.width;
  KV_CHECK(static_cast<int64_t>(st.hist_kv[i].size()) >= (length - hs) * wd,
           "recorded history shorter than the stream");
  copy_view(vec_rows(st.hist_kv[i], wd, start - hs, length - hs),
            row_rows(st.buf_kv, row, 0, length - start));
  copy_view(vec_rows(st.hist_gate[i], wd, start - hs, length - hs),
            row_rows(st.buf_gate, row, 0, length - start));
  st.buf_len[i] = length - start;
  st.windows[i] = w;
  st.count[i] = std::min(st.count[i], w);
  if (params_.overlap) {
    st.has_ovl[i] = 0;
    if (w > 0 && start == hs) {
      copy_view(vec_rows(st.seed_kv[i], wd / 2, 0, r), row_rows(st.ovl_kv, row, 0, r));
      copy_view(vec_rows(st.seed_gate[i], wd / 2, 0, r), row_rows(st.ovl_gate, row, 0, r));
      st.has_ovl[i] = 1;
    } else if (w > 0) {
      const int64_t from = start - r - hs;
      copy_view(vec_rows(st.hist_kv[i], wd, from, from + r).slice(1, 0, wd / 2),
                row_rows(st.ovl_kv, row, 0, r));
      copy_view(vec_rows(st.hist_gate[i], wd, from, from + r).slice(1, 0, wd / 2),
                row_rows(st.ovl_gate, row, 0, r));
      st.has_ovl[i] = 1;
    }
  }
  st.hist_kv[i].resize(static_cast<size_t>((length - hs) * wd));
  st.hist_gate[i].resize(static_cast<size_t>((length - hs) * wd));
}

void CompressedLayer::check_crop(int64_t n) const {
  const int64_t seq = seq_length();
  const int64_t length = crop_target_length(n, seq);
  if (length == 0 || length == seq || params_.per_call) return;
  for (int s = 0; s < 2; ++s) {
    const Stream& st = streams_[s];
    if (st.width == 0) continue;
    for (int64_t b = 0; b < batch_; ++b) {
      const std::string problem = crop_problem(st, b, length);
      if (!problem.empty()) {
        throw Error(ErrorKind::kOutOfRange,
                    where() + ": cannot crop to " + std::to_string(length) + " tokens: the " +
                        stream_name(static_cast<CompressedStream>(s)) + " stream of row " +
                        std::to_string(b) + ": " + problem);
      }
    }
  }
  // The window's own rule, asked without cropping it (WindowLayer::crop states the same).
  if (const auto* w = dynamic_cast<const WindowLayer*>(sliding_.get())) {
    const int64_t from = w->window_start(length);
    if (from < w->first_stored_position()) {
      throw Error(ErrorKind::kOutOfRange,
                  where() + ": cannot crop to " + std::to_string(length) +
                      " tokens: a query there needs window keys from position " +
                      std::to_string(from) + " but the window holds only positions [" +
                      std::to_string(w->first_stored_position()) + ", " + std::to_string(seq) +
                      "); call activate_past_recording() before generating tokens you may drop");
    }
  }
}

void CompressedLayer::crop(int64_t n) {
  const int64_t seq = seq_length();
  const int64_t length = crop_target_length(n, seq);
  if (length == 0) {  // always possible, even where the window has moved on
    reset();
    return;
  }
  // The window is given the count to drop (<= 0), not the length: a positive length would be
  // the deprecated form and warn although the caller used the current one.
  if (params_.per_call) {  // a recompute layer holds one call; the next update starts afresh
    sliding_->crop(length - sliding_->seq_length());
    clear_streams();
    return;
  }
  if (length == seq) {
    sliding_->crop(0);  // back to its working size if it records its past
    return;
  }
  check_crop(n);                                    // every check before any change
  sliding_->crop(length - sliding_->seq_length());  // cannot refuse now
  for (Stream& st : streams_) {
    st.last_row = -1;
    if (st.width == 0) continue;
    for (int64_t b = 0; b < batch_; ++b) apply_crop(st, b, length);
  }
}

void CompressedLayer::reset() {
  sliding_->reset();
  clear_streams();
}

void CompressedLayer::gather(std::span<const int64_t> rows) {
  for (Stream& st : streams_) {
    st.buf_kv = gather_leading(st.buf_kv, rows);
    st.buf_gate = gather_leading(st.buf_gate, rows);
    st.ovl_kv = gather_leading(st.ovl_kv, rows);
    st.ovl_gate = gather_leading(st.ovl_gate, rows);
    st.entries = gather_leading(st.entries, rows);
    st.buf_len = gather_vector(st.buf_len, rows);
    st.windows = gather_vector(st.windows, rows);
    st.count = gather_vector(st.count, rows);
    st.has_ovl = gather_vector(st.has_ovl, rows);
    st.hist_start = gather_vector(st.hist_start, rows);
    st.hist_kv = gather_vector(st.hist_kv, rows);
    st.hist_gate = gather_vector(st.hist_gate, rows);
    st.seed_kv = gather_vector(st.seed_kv, rows);
    st.seed_gate = gather_vector(st.seed_gate, rows);
    st.last_row = -1;
  }
  batch_ = static_cast<int64_t>(rows.size());
}

namespace {
void check_rows(std::span<const int64_t> rows, int64_t batch, const std::string& what) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= batch) {
      throw Error(ErrorKind::kInvalidArgument, what + ": index " + std::to_string(rows[i]) +
                                                   " at position " + std::to_string(i) +
                                                   " is outside the batch [0, " +
                                                   std::to_string(batch) + ")");
    }
  }
}
}  // namespace

void CompressedLayer::reorder(std::span<const int64_t> beam_idx) {
  if (batch_ == 0) return;
  if (static_cast<int64_t>(beam_idx.size()) != batch_) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": reorder: beam_idx has " + std::to_string(beam_idx.size()) +
                    " entries but the batch has " + std::to_string(batch_) + " rows");
  }
  check_rows(beam_idx, batch_, where() + ": reorder");
  sliding_->reorder(beam_idx);
  gather(beam_idx);
}

void CompressedLayer::select(std::span<const int64_t> indices) {
  if (batch_ == 0) return;
  if (indices.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": select: no rows listed; a cache needs at least one row (use reset())");
  }
  check_rows(indices, batch_, where() + ": select");
  sliding_->select(indices);
  gather(indices);
}

void CompressedLayer::repeat_interleave(int64_t r) {
  if (r < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": repeat_interleave: repeats must be >= 1, got " + std::to_string(r));
  }
  if (batch_ == 0 || r == 1) return;
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t j = 0; j < r; ++j) rows.push_back(b);
  sliding_->repeat_interleave(r);
  gather(rows);
}

void CompressedLayer::reserve(int64_t tokens) {
  sliding_->reserve(tokens);
  if (tokens < 0) return;  // the window layer ignores it; nothing to reserve
  reserved_entries_ = std::max(reserved_entries_, (tokens + params_.rate - 1) / params_.rate);
  for (Stream& st : streams_)
    if (st.entries.shape().ndim == 4 && st.entries.dim(2) < reserved_entries_)
      grow_entries(st, st.entries.dim(0), reserved_entries_);
}

size_t CompressedLayer::bytes() const {
  size_t b = sliding_->bytes();
  for (const Stream& st : streams_) {
    for (const Tensor* t : {&st.buf_kv, &st.buf_gate, &st.ovl_kv, &st.ovl_gate, &st.prior_kv,
                            &st.prior_gate, &st.chunk_kv, &st.chunk_gate, &st.entries})
      b += t->size_bytes();
    b += vector_bytes(st.hist_kv) + vector_bytes(st.hist_gate) + vector_bytes(st.seed_kv) +
         vector_bytes(st.seed_gate);
  }
  return b;
}

}  // namespace kvcache
