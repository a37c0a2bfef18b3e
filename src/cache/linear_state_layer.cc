#include "cache/linear_state_layer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "cache/crop_rule.h"
#include "cache/layer_state.h"
#include "core/error.h"

namespace kvcache {

namespace {
std::string list(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s.empty() ? "none" : s;
}
}  // namespace

LinearStateLayer::LinearStateLayer(LinearStateParams params) : params_(std::move(params)) {
  const LinearStateShape& s = params_.shape;
  if (s.conv_kernel < 1 || s.conv_dim < 1 || s.heads_v < 1 || s.head_dim_k < 1 ||
      s.head_dim_v < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": the linear-attention state shape is missing or invalid (conv_kernel " +
                    std::to_string(s.conv_kernel) + ", conv_dim " + std::to_string(s.conv_dim) +
                    ", heads_v " + std::to_string(s.heads_v) + ", head_dim_k " +
                    std::to_string(s.head_dim_k) + ", head_dim_v " + std::to_string(s.head_dim_v) +
                    "); set CacheConfig::linear from the model's linear_conv_kernel_dim, "
                    "linear_num_value_heads, linear_key_head_dim, linear_value_head_dim and "
                    "conv channels (all >= 1)");
  }
  if (params_.max_batch_size < 0) {
    throw Error(ErrorKind::kInvalidArgument, where() + ": max_batch_size must be >= 0, got " +
                                                 std::to_string(params_.max_batch_size));
  }
  if (params_.auto_snapshots < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                where() +
                    ": linear_state.auto_snapshots must be >= 0 (0: explicit snapshots "
                    "only), got " +
                    std::to_string(params_.auto_snapshots));
  }
  if (params_.max_batch_size > 0) allocate(params_.max_batch_size);
}

std::string LinearStateLayer::where() const {
  return "layer " + std::to_string(params_.layer_index) + " (" + params_.name + ")";
}

int64_t LinearStateLayer::rec_row_elems() const {
  const LinearStateShape& s = params_.shape;
  return s.heads_v * s.head_dim_k * s.head_dim_v;
}

KVSpan LinearStateLayer::update(const TensorView&, const TensorView&) {
  throw Error(ErrorKind::kInvalidArgument,
              where() +
                  " is a linear_attention layer: it stores no keys or values; call "
                  "update_conv_state / update_recurrent_state for it, update(k, v) for attention "
                  "layers only");
}

MaskSizes LinearStateLayer::mask_sizes(int64_t) const {
  throw Error(ErrorKind::kInvalidArgument,
              where() +
                  " is a linear_attention layer: it has no attention mask; ask an "
                  "attention layer (Cache::mask_sizes of a full or sliding layer)");
}

void LinearStateLayer::allocate(int64_t rows) {
  const LinearStateShape& s = params_.shape;
  Tensor conv = Tensor::zeros(DType::kF32, {rows, window(), s.conv_dim});
  Tensor rec = Tensor::zeros(DType::kF32, {rows, s.heads_v, s.head_dim_k, s.head_dim_v});
  // Keep what the rows in use hold (a dynamic layer growing its batch).
  if (batch_ > 0) {
    std::memcpy(conv.data(), conv_.data(),
                static_cast<size_t>(batch_ * conv_row_elems()) * sizeof(float));
    std::memcpy(rec.data(), rec_.data(),
                static_cast<size_t>(batch_ * rec_row_elems()) * sizeof(float));
  }
  conv_ = std::move(conv);
  rec_ = std::move(rec);
  ws_ = Tensor::zeros(DType::kF32, {rows, window(), s.conv_dim});
  rows_ = rows;
}

void LinearStateLayer::ensure_rows(int64_t batch, const char* op) {
  if (batch < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": " + op + ": empty batch (" + std::to_string(batch) + " rows)");
  }
  if (batch == batch_) return;
  if (seq_ > 0 || has_previous_) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": " + op + ": batch " + std::to_string(batch) +
                    " but the cache holds state for " + std::to_string(batch_) +
                    " rows; use reorder/select/repeat_interleave, or reset()");
  }
  if (batch > rows_) {
    if (params_.max_batch_size > 0 && batch > params_.max_batch_size) {
      throw Error(ErrorKind::kOutOfRange, where() + ": " + op + ": batch " + std::to_string(batch) +
                                              " exceeds max_batch_size " +
                                              std::to_string(params_.max_batch_size) +
                                              "; raise --max-batch-size or split the batch");
    }
    if (params_.fixed_rows && rows_ > 0) {
      throw Error(ErrorKind::kOutOfRange,
                  where() + ": " + op + ": batch " + std::to_string(batch) + " but " +
                      std::to_string(rows_) +
                      " rows were allocated and a static state never moves; set "
                      "max_batch_size to the largest batch, or use the dynamic cache");
    }
    batch_ = 0;  // nothing to keep: the layer is empty
    allocate(batch);
  }
  batch_ = batch;
  if (recording_) restart_history();
}

void LinearStateLayer::restart_history() {
  // The window at the current position, token-major, as the history's first K-1 rows.
  const int64_t c = params_.shape.conv_dim;
  history_.assign(static_cast<size_t>(window() * batch_ * c), 0.0f);
  if (batch_ > 0) {
    TensorView dst(history_.data(), DType::kF32, {batch_, window(), c}, Dims{c, batch_ * c, 1, 0});
    copy_view(conv_state(), dst);
  }
  record_from_ = seq_;
  snapshots_.clear();
  if (batch_ > 0 && seq_ > 0) snapshot();
}

ConvStateUpdate LinearStateLayer::update_conv_state(const TensorView& x) {
  const int64_t c = params_.shape.conv_dim;
  if (x.ndim() != 3 || x.dim(2) != c || x.dim(1) < 1 || !dtype_is_float(x.dtype())) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": update_conv_state(x): x must be the new conv inputs [B, T, " +
                    std::to_string(c) + "] (T >= 1, f32, f16 or bf16); got " + x.shape().str() +
                    " " + dtype_name(x.dtype()));
  }
  if (params_.per_call) reset();
  ensure_rows(x.dim(0), "update_conv_state");
  const int64_t t = x.dim(1);
  const int64_t w = window();
  ConvStateUpdate out;
  out.previous = ws_.view().slice(0, 0, batch_);
  out.state = conv_state();
  copy_view(out.state, out.previous);
  // New window = last w rows of (previous, x).
  const int64_t keep = std::max<int64_t>(0, w - t);  // rows of previous that stay
  if (keep > 0) copy_view(out.previous.slice(1, w - keep, w), out.state.slice(1, 0, keep));
  if (w - keep > 0) copy_view(x.slice(1, t - (w - keep), t), out.state.slice(1, keep, w));
  if (recording_) {
    const size_t old = history_.size();
    history_.resize(old + static_cast<size_t>(t * batch_ * c));
    TensorView dst(history_.data() + old, DType::kF32, {batch_, t, c}, Dims{c, batch_ * c, 1, 0});
    copy_view(x, dst);
  }
  seq_ += t;
  has_previous_ = true;
  return out;
}

TensorView LinearStateLayer::update_recurrent_state(const TensorView& state) {
  const LinearStateShape& s = params_.shape;
  if (state.ndim() != 4 || state.dim(1) != s.heads_v || state.dim(2) != s.head_dim_k ||
      state.dim(3) != s.head_dim_v || !dtype_is_float(state.dtype())) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": update_recurrent_state(state): state must be [B, " +
                    std::to_string(s.heads_v) + ", " + std::to_string(s.head_dim_k) + ", " +
                    std::to_string(s.head_dim_v) + "] (f32, f16 or bf16); got " +
                    state.shape().str() + " " + dtype_name(state.dtype()));
  }
  ensure_rows(state.dim(0), "update_recurrent_state");
  const TensorView stored = recurrent_state();
  const bool same = state.data() == stored.data() && state.dtype() == DType::kF32 &&
                    state.strides() == stored.strides();
  if (!same) {
    const auto* b = static_cast<const std::byte*>(state.data());
    const auto* lo = static_cast<const std::byte*>(rec_.data());
    if (b >= lo && b < lo + rec_.size_bytes()) {
      throw Error(ErrorKind::kInvalidArgument,
                  where() +
                      ": update_recurrent_state(state): state overlaps the stored state "
                      "without being it; pass recurrent_state() itself or a separate tensor");
    }
    copy_view(state, stored);
  }
  has_previous_ = true;
  if (recording_ && params_.auto_snapshots > 0) {
    snapshot();
    forget_oldest_snapshots();
  }
  return stored;
}

void LinearStateLayer::forget_oldest_snapshots() {
  while (static_cast<int64_t>(snapshots_.size()) > params_.auto_snapshots)
    snapshots_.erase(snapshots_.begin());
  if (snapshots_.empty() || snapshots_.begin()->first <= record_from_) return;
  // No crop can return before the oldest snapshot (except to 0): drop the inputs before its
  // window.
  const int64_t oldest = snapshots_.begin()->first;
  const auto drop = static_cast<size_t>((oldest - record_from_) * batch_ * params_.shape.conv_dim);
  history_.erase(history_.begin(), history_.begin() + static_cast<std::ptrdiff_t>(drop));
  record_from_ = oldest;
}

TensorView LinearStateLayer::rows_in_use(const Tensor& storage, const char* what) const {
  if (batch_ == 0) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": " + what +
                    ": no state yet: the batch is set by the first update_conv_state / "
                    "update_recurrent_state");
  }
  return storage.view().slice(0, 0, batch_);
}

TensorView LinearStateLayer::conv_state() const {
  return rows_in_use(conv_, "conv_state()");
}

TensorView LinearStateLayer::recurrent_state() const {
  return rows_in_use(rec_, "recurrent_state()");
}

int64_t LinearStateLayer::crop_target(int64_t n) const {
  return crop_target_length(n, seq_);
}

std::vector<int64_t> LinearStateLayer::snapshot_positions() const {
  std::vector<int64_t> out;
  for (const auto& [pos, _] : snapshots_) out.push_back(pos);
  return out;
}

void LinearStateLayer::check_crop(int64_t n) const {
  const int64_t keep = crop_target(n);
  if (keep == seq_ || keep == 0) return;
  const std::string what =
      where() + ": crop to " + std::to_string(keep) + " of " + std::to_string(seq_) + " tokens: ";
  if (!recording_) {
    throw Error(ErrorKind::kUnsupported,
                what +
                    "a linear-attention state cannot go back without past recording; call "
                    "activate_past_recording() before the tokens you may crop, and snapshot() "
                    "at the positions to return to (or crop to 0 to start over)");
  }
  if (keep < record_from_) {
    throw Error(ErrorKind::kUnsupported,
                what + "the recorded conv inputs start at position " +
                    std::to_string(record_from_) +
                    " (where past recording started, or the oldest snapshot kept); the state "
                    "before it is lost (crop to " +
                    std::to_string(record_from_) + " or later, or to 0)");
  }
  if (snapshots_.count(keep) == 0) {
    throw Error(ErrorKind::kUnsupported,
                what + "the recurrent state was not snapshotted there; snapshots at: " +
                    list(snapshot_positions()) +
                    " (call snapshot() / Cache::snapshot_linear_states() at the positions a crop "
                    "may return to)");
  }
}

void LinearStateLayer::crop(int64_t n) {
  check_crop(n);
  const int64_t keep = crop_target(n);
  if (keep == 0) {
    reset();
    return;
  }
  if (keep == seq_) {
    shrink_to_working_size();
    return;
  }
  const int64_t c = params_.shape.conv_dim;
  const int64_t first = keep - record_from_;  // history row of the window's first input
  const TensorView src(history_.data() + first * batch_ * c, DType::kF32, {batch_, window(), c},
                       Dims{c, batch_ * c, 1, 0});
  copy_view(src, conv_state());
  const std::vector<float>& snap = snapshots_.at(keep);
  std::memcpy(rec_.data(), snap.data(), snap.size() * sizeof(float));
  history_.resize(static_cast<size_t>((first + window()) * batch_ * c));
  snapshots_.erase(snapshots_.upper_bound(keep), snapshots_.end());
  seq_ = keep;
  has_previous_ = true;
  shrink_to_working_size();
}

void LinearStateLayer::shrink_to_working_size() {
  // transformers v5's LinearAttentionCacheLayerMixin.crop keeps conv_kernel_size inputs after
  // any crop, crop(0) included: the recorded inputs and snapshots before seq_ go, recording stays
  // on and restarts here.
  if (!recording_ || record_from_ >= seq_) return;
  const int64_t c = params_.shape.conv_dim;
  const auto drop = static_cast<size_t>((seq_ - record_from_) * batch_ * c);
  history_.erase(history_.begin(), history_.begin() + static_cast<std::ptrdiff_t>(drop));
  record_from_ = seq_;
  snapshots_.erase(snapshots_.begin(), snapshots_.lower_bound(seq_));
}

// Layout: i64 batch (0: saved before its first update), seq_length, u32 has_previous,
// i64 K-1, C, H_v, d_k, d_v, then conv [batch, K-1, C] and recurrent [batch, H_v, d_k, d_v], f32.
void LinearStateLayer::save(StateWriter& out) const {
  const LinearStateShape& s = params_.shape;
  out.i64(batch_);
  if (batch_ == 0) return;
  out.i64(seq_);
  out.u32(has_previous_ ? 1 : 0);
  for (int64_t d : {window(), s.conv_dim, s.heads_v, s.head_dim_k, s.head_dim_v}) out.i64(d);
  out.view(conv_state());
  out.view(recurrent_state());
}

void LinearStateLayer::load(StateReader& in) {
  const int64_t batch = in.i64();
  if (batch == 0) {
    reset();
    return;
  }
  const int64_t seq = in.i64();
  const bool has_previous = in.u32() != 0;
  const LinearStateShape& s = params_.shape;
  int64_t dims[5];
  for (int64_t& d : dims) d = in.i64();
  const int64_t want[5] = {window(), s.conv_dim, s.heads_v, s.head_dim_k, s.head_dim_v};
  auto refuse = [&](const std::string& what) {
    throw Error(ErrorKind::kFormat, where() + ": cannot restore: " + what);
  };
  if (!std::equal(dims, dims + 5, want)) {
    auto str = [](const int64_t* d) {
      std::string r;
      for (int i = 0; i < 5; ++i) {
        if (i > 0) r += '/';
        r += std::to_string(d[i]);
      }
      return r;
    };
    refuse("state shape (K-1/C/H_v/d_k/d_v) " + str(dims) + " in the file vs " + str(want) +
           " here");
  }
  if (batch < 0 || seq < 0) refuse("invalid batch or position in the file");
  if (params_.max_batch_size > 0 && batch > params_.max_batch_size)
    refuse("batch " + std::to_string(batch) + " in the file vs max_batch_size " +
           std::to_string(params_.max_batch_size) + " here");
  if (params_.fixed_rows && rows_ > 0 && batch > rows_)
    refuse("batch " + std::to_string(batch) + " in the file but " + std::to_string(rows_) +
           " rows are allocated");
  const bool was_recording = recording_;
  recording_ = false;  // no history to restart: it would describe the zero state
  reset();
  ensure_rows(batch, "load");
  recording_ = was_recording;
  in.view(conv_state());
  in.view(recurrent_state());
  seq_ = seq;
  has_previous_ = has_previous;
  if (recording_) restart_history();
}

void LinearStateLayer::reset() {
  if (rows_ > 0) {
    std::memset(conv_.data(), 0, conv_.size_bytes());
    std::memset(rec_.data(), 0, rec_.size_bytes());
  }
  seq_ = 0;
  has_previous_ = false;
  if (recording_) {
    restart_history();
  } else {
    history_.clear();
    snapshots_.clear();
  }
}

void LinearStateLayer::gather(std::span<const int64_t> rows, const char* op) {
  for (int64_t r : rows) {
    if (r < 0 || r >= batch_) {
      throw Error(ErrorKind::kInvalidArgument, where() + ": " + op + ": row " + std::to_string(r) +
                                                   " outside the batch [0, " +
                                                   std::to_string(batch_) + ")");
    }
  }
  const auto n = static_cast<int64_t>(rows.size());
  if (n < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": " + op + ": no rows given (the batch must keep at least one)");
  }
  if (n > rows_) {
    if (params_.fixed_rows) {
      throw Error(ErrorKind::kOutOfRange,
                  where() + ": " + op + ": " + std::to_string(n) + " rows but " +
                      std::to_string(rows_) +
                      " were allocated and a static state never moves; set max_batch_size to " +
                      "at least " + std::to_string(n) + ", or use the dynamic cache");
    }
    allocate(n);  // keeps rows [0, batch_)
  }
  // Per-row gathers through a copy of the rows in use, written back in place (same address).
  auto gather_rows = [&](float* data, int64_t row_elems, int64_t tokens) {
    // data: [tokens][batch_][row_elems] (tokens 1: [batch_][row_elems]); rewritten to n rows.
    std::vector<float> old(data, data + tokens * batch_ * row_elems);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < n; ++i)
        std::memcpy(data + (t * n + i) * row_elems,
                    old.data() + (t * batch_ + rows[static_cast<size_t>(i)]) * row_elems,
                    static_cast<size_t>(row_elems) * sizeof(float));
  };
  gather_rows(conv_.data_as<float>(), conv_row_elems(), 1);
  gather_rows(rec_.data_as<float>(), rec_row_elems(), 1);
  const int64_t c = params_.shape.conv_dim;
  if (!history_.empty()) {
    const int64_t tokens = static_cast<int64_t>(history_.size()) / (batch_ * c);
    if (n > batch_) history_.resize(static_cast<size_t>(tokens * n * c));
    gather_rows(history_.data(), c, tokens);
    history_.resize(static_cast<size_t>(tokens * n * c));
  }
  for (auto& [pos, snap] : snapshots_) {
    if (n > batch_) snap.resize(static_cast<size_t>(n * rec_row_elems()));
    gather_rows(snap.data(), rec_row_elems(), 1);
    snap.resize(static_cast<size_t>(n * rec_row_elems()));
  }
  batch_ = n;
}

void LinearStateLayer::reorder(std::span<const int64_t> beam_idx) {
  if (batch_ == 0) return;  // no state yet
  if (static_cast<int64_t>(beam_idx.size()) != batch_) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": reorder: " + std::to_string(beam_idx.size()) +
                    " beam indices for a batch of " + std::to_string(batch_));
  }
  gather(beam_idx, "reorder");
}

void LinearStateLayer::repeat_interleave(int64_t r) {
  if (r < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": repeat_interleave(" + std::to_string(r) + "): r must be >= 1");
  }
  if (batch_ == 0 || r == 1) return;
  std::vector<int64_t> rows;
  for (int64_t i = 0; i < batch_; ++i)
    for (int64_t j = 0; j < r; ++j) rows.push_back(i);
  gather(rows, "repeat_interleave");
}

void LinearStateLayer::select(std::span<const int64_t> indices) {
  if (batch_ == 0) return;
  gather(indices, "select");
}

void LinearStateLayer::activate_past_recording() {
  if (recording_) return;
  recording_ = true;
  restart_history();
}

void LinearStateLayer::snapshot() {
  if (!recording_) {
    throw Error(ErrorKind::kInvalidArgument,
                where() +
                    ": snapshot() needs past recording (the conv window is rebuilt from "
                    "the recorded inputs); call activate_past_recording() first");
  }
  if (batch_ == 0 || seq_ == 0) return;  // position 0 is the zero state: always restorable
  const TensorView st = recurrent_state();
  const auto* p = static_cast<const float*>(st.data());
  snapshots_[seq_].assign(p, p + batch_ * rec_row_elems());
}

size_t LinearStateLayer::bytes() const {
  size_t b = conv_.size_bytes() + rec_.size_bytes() + ws_.size_bytes() +
             history_.capacity() * sizeof(float);
  for (const auto& [_, snap] : snapshots_) b += snap.capacity() * sizeof(float);
  return b;
}

namespace {
template <bool kStatic>
std::unique_ptr<CacheLayer> make_linear(const CacheConfig& config, int layer_index) {
  LinearStateParams p;
  p.name = kStatic ? "static/linear_attention" : "dynamic/linear_attention";
  p.layer_index = layer_index;
  p.shape = config.linear;
  p.max_batch_size = config.options.max_batch_size;
  p.fixed_rows = kStatic;
  p.auto_snapshots = config.options.linear_state.auto_snapshots;
  return std::make_unique<LinearStateLayer>(std::move(p));
}
// The no-cache forward's container: each call's conv and recurrent state start from zero.
std::unique_ptr<CacheLayer> make_recompute_linear(const CacheConfig& config, int layer_index) {
  LinearStateParams p;
  p.name = "recompute/linear_attention";
  p.layer_index = layer_index;
  p.shape = config.linear;
  p.per_call = true;
  return std::make_unique<LinearStateLayer>(std::move(p));
}
}  // namespace

KVCACHE_REGISTER_LAYER(dynamic_linear, "dynamic", "linear_attention", make_linear<false>);
KVCACHE_REGISTER_LAYER(static_linear, "static", "linear_attention", make_linear<true>);
KVCACHE_REGISTER_LAYER(recompute_linear, "recompute", "linear_attention", make_recompute_linear);

}  // namespace kvcache
