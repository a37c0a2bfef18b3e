#include "cache/quantized_layer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "cache/crop_rule.h"
#include "cache/layer_state.h"
#include "core/error.h"
#include "kernels/kv_quant.h"

namespace kvcache {

namespace {

enum class QuantWindow { kFull, kSliding, kChunked };

std::unique_ptr<CacheLayer> make_quantized(const CacheConfig& c, int layer, QuantWindow window) {
  QuantizedLayerParams p;
  p.name = window == QuantWindow::kSliding   ? "quantized/sliding_attention"
           : window == QuantWindow::kChunked ? "quantized/chunked_attention"
                                             : "quantized/full_attention";
  p.layer_index = layer;
  p.kv_dtype = c.options.kv_dtype;
  p.quantized = c.options.quantized;
  // kMlaLatent (DeepSeek-V2/V3) is stored as a one-head K (c_kv) and V (k_rot): see the header.
  if (c.kv_content == CacheConfig::KVContent::kSharedKV) {
    // The packed format quantizes keys per channel and values per token, so one stored copy
    // cannot serve as both; two copies would lose the point of K == V.
    throw Error(ErrorKind::kUnsupported,
                "layer " + std::to_string(layer) + " (" + p.name +
                    "): this model's K and V are one tensor (K == V, stored once, DeepSeek-V4); "
                    "the quantized (KIVI) container quantizes keys per channel and values per "
                    "token, so one packed copy cannot serve as both and two copies would double "
                    "what K == V saves; use --cache dynamic or paged");
  }
  const auto positive = [&](int64_t v, const char* what) {
    if (v < 1) {
      throw Error(ErrorKind::kInvalidArgument, "layer " + std::to_string(layer) + " (" + p.name +
                                                   "): " + what + " must be >= 1, got " +
                                                   std::to_string(v) +
                                                   " (set it from the model config)");
    }
    return v;
  };
  if (window == QuantWindow::kSliding)
    p.sliding_window = positive(c.window_of(layer), "sliding_window");
  if (window == QuantWindow::kChunked)
    p.chunk_size = positive(c.attention_chunk_size, "attention_chunk_size");
  return std::make_unique<QuantizedLayer>(std::move(p));
}

}  // namespace

// Full, sliding and chunked attention. Any other layer type finds no entry, and Cache
// construction throws naming the layer index, its type and the implementation
// (LayerRegistry::create), with the reasons registered below for the types this container
// refuses on purpose.
KVCACHE_REGISTER_LAYER(quantized_full, "quantized", "full_attention",
                       [](const CacheConfig& c, int l) {
                         return make_quantized(c, l, QuantWindow::kFull);
                       });
KVCACHE_REGISTER_LAYER(quantized_sliding, "quantized", "sliding_attention",
                       [](const CacheConfig& c, int l) {
                         return make_quantized(c, l, QuantWindow::kSliding);
                       });
KVCACHE_REGISTER_LAYER(quantized_chunked, "quantized", "chunked_attention",
                       [](const CacheConfig& c, int l) {
                         return make_quantized(c, l, QuantWindow::kChunked);
                       });
KVCACHE_REFUSE_LAYER(
    quantized_linear, "quantized", "linear_attention",
    "a linear_attention layer (Gated DeltaNet, Qwen3-Next) keeps a fixed-size recurrent state "
    "(conv window and delta-rule matrix), not per-token K/V, so there are no token groups for "
    "KIVI to quantize and nothing that grows with the context to save; use --cache dynamic, "
    "static, paged or offloaded (they keep the linear state beside the attention K/V)");
KVCACHE_REFUSE_LAYER(quantized_csa, "quantized", "compressed_sparse_attention",
                     "a DeepSeek-V4 compressed layer stores one K == V tensor (window and "
                     "compressed entries, plus the indexer's keys and the buffered rows the next "
                     "window folds), while KIVI quantizes keys per channel and values per token "
                     "as two tensors; use --cache dynamic or paged");
KVCACHE_REFUSE_LAYER(quantized_hca, "quantized", "heavily_compressed_attention",
                     "a DeepSeek-V4 compressed layer stores one K == V tensor (window and "
                     "compressed entries, plus the buffered rows the next window folds), while "
                     "KIVI quantizes keys per channel and values per token as two tensors; use "
                     "--cache dynamic or paged");
KVCACHE_REFUSE_LAYER(quantized_dsa, "quantized", "deepseek_sparse_attention",
                     "DeepSeek-V3.2's sparse attention keeps one indexer key per token beside "
                     "the latent and gathers its top-k tokens' rows from a dense or paged span "
                     "(kernels/sparse_attention.h), which packed KIVI blocks are not; use "
                     "--cache dynamic or paged");

QuantizedLayer::QuantizedLayer(QuantizedLayerParams params) : params_(std::move(params)) {
  const auto bad = [&](const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument, where() + ": " + what);
  };
  const QuantizedOptions& q = params_.quantized;
  if (q.scheme == KVQuantScheme::kKivi && q.bits != 2 && q.bits != 4 && q.bits != 8)
    bad("--kv-bits must be 2, 4 or 8, got " + std::to_string(q.bits));
  if (q.group < 1) bad("--kv-group must be >= 1, got " + std::to_string(q.group));
  if (q.residual < 0) bad("--kv-residual must be >= 0, got " + std::to_string(q.residual));
  if (params_.sliding_window > 0 && params_.chunk_size > 0)
    bad("a layer is sliding or chunked, not both");
  if (params_.kv_dtype && !dtype_is_float(*params_.kv_dtype))
    bad(std::string("the residual is stored as f32, f16 or bf16, not ") +
        dtype_name(*params_.kv_dtype) + " (the packed part's format is set by --kv-bits)");
}

std::string QuantizedLayer::where() const {
  return "layer " + std::to_string(params_.layer_index) + " (" + params_.name + ")";
}

void QuantizedLayer::init(const TensorView& k, const TensorView& v) {
  batch_ = k.dim(0);
  heads_ = k.dim(1);
  dk_ = k.dim(3);
  dv_ = v.dim(3);
  res_dtype_ = params_.kv_dtype.value_or(k.dtype());
  try {
    const QuantizedOptions& q = params_.quantized;
    fmt_ = make_kv_block_format(q.scheme, q.bits, q.group, dk_, dv_);
  } catch (const Error& e) {
    throw Error(ErrorKind::kInvalidArgument, where() + ": " + e.what());
  }
  k_block_bytes_ = kv_k_block_bytes(fmt_);
  v_block_bytes_ = kv_v_block_bytes(fmt_);
  scratch_.assign(static_cast<size_t>(params_.quantized.group * std::max(dk_, dv_)), 0.0f);
  initialized_ = true;
}

int64_t QuantizedLayer::window_start(int64_t p) const {
  if (params_.sliding_window > 0) return std::max<int64_t>(p - params_.sliding_window + 1, 0);
  if (params_.chunk_size > 0) return p / params_.chunk_size * params_.chunk_size;
  return 0;
}

int64_t QuantizedLayer::blocks_to_drop(int64_t p) const {
  if (!windowed()) return 0;
  const int64_t pos0 = first_position();
  // Block i (from blk_begin_) covers [pos0 + i G, pos0 + (i + 1) G). A rollback bound keeps
  // what a query rollback_ positions back sees (window_start is monotone).
  const int64_t from = window_start(std::max<int64_t>(p - rollback_, 0));
  const int64_t dead = (from - pos0) / params_.quantized.group;
  return std::clamp<int64_t>(dead, 0, blk_end_ - blk_begin_);
}

int64_t QuantizedLayer::residual_to_drop(int64_t p) const {
  // A sliding layer keeps its residual: its window moves every step, and trimming would move the
  // whole residual each time; a chunk start moves once per C tokens.
  if (params_.chunk_size <= 0 || blocks_to_drop(p) < blk_end_ - blk_begin_) return 0;
  const int64_t res_first = seq_length_ - n_res_;
  const int64_t from = window_start(std::max<int64_t>(p - rollback_, 0));
  return std::clamp<int64_t>(from - res_first, 0, n_res_);
}

MaskSizes QuantizedLayer::mask_sizes(int64_t query_len) const {
  const int64_t start = first_position() + blocks_to_drop(seq_length_) * params_.quantized.group +
                        residual_to_drop(seq_length_);
  return {seq_length_ + query_len - start, start};
}

void QuantizedLayer::reserve(int64_t tokens) {
  if (tokens < 0)
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": reserve(" + std::to_string(tokens) + "): tokens must be >= 0");
  const int64_t G = params_.quantized.group;
  // A sliding (chunked) layer holds at most its window (chunk) plus the block straddling its
  // start.
  if (params_.sliding_window > 0) tokens = std::min(tokens, params_.sliding_window + G);
  if (params_.chunk_size > 0) tokens = std::min(tokens, params_.chunk_size + G);
  reserved_blocks_ = std::max(reserved_blocks_, (tokens + G - 1) / G);
  const int64_t live = blk_end_ - blk_begin_;
  if (initialized_ && blk_cap_ < reserved_blocks_)
    reserve_blocks(reserved_blocks_ - live, /*exact=*/true);
}

void QuantizedLayer::reserve_blocks(int64_t extra, bool exact) {
  const int64_t live = blk_end_ - blk_begin_;
  if (blk_end_ + extra <= blk_cap_) return;
  const int64_t rows = batch_ * heads_;
  if (live + extra <= blk_cap_ && blk_begin_ > 0) {
    // Compaction (sliding layers): the live blocks move to slot 0 of each (b, h) run.
    for (int64_t r = 0; r < rows; ++r) {
      std::memmove(kbuf_.data() + r * blk_cap_ * k_block_bytes_,
                   kbuf_.data() + (r * blk_cap_ + blk_begin_) * k_block_bytes_,
                   static_cast<size_t>(live * k_block_bytes_));
      std::memmove(vbuf_.data() + r * blk_cap_ * v_block_bytes_,
                   vbuf_.data() + (r * blk_cap_ + blk_begin_) * v_block_bytes_,
                   static_cast<size_t>(live * v_block_bytes_));
    }
    stats_.compactions += 1;
    stats_.bytes_copied += static_cast<size_t>(rows * live * (k_block_bytes_ + v_block_bytes_));
  } else {
    // Geometric growth: appending S tokens copies fewer than 2 S tokens' blocks in total.
    const int64_t cap =
        exact ? live + extra : std::max({2 * blk_cap_, live + extra, reserved_blocks_});
    ByteBuffer nk(static_cast<size_t>(rows * cap * k_block_bytes_));
    ByteBuffer nv(static_cast<size_t>(rows * cap * v_block_bytes_));
    for (int64_t r = 0; r < rows && live > 0; ++r) {  // empty store: no source to copy from
      std::memcpy(nk.data() + r * cap * k_block_bytes_,
                  kbuf_.data() + (r * blk_cap_ + blk_begin_) * k_block_bytes_,
                  static_cast<size_t>(live * k_block_bytes_));
      std::memcpy(nv.data() + r * cap * v_block_bytes_,
                  vbuf_.data() + (r * blk_cap_ + blk_begin_) * v_block_bytes_,
                  static_cast<size_t>(live * v_block_bytes_));
    }
    kbuf_ = std::move(nk);
    vbuf_ = std::move(nv);
    blk_cap_ = cap;
    if (live > 0) {
      stats_.reallocations += 1;
      stats_.bytes_copied += static_cast<size_t>(rows * live * (k_block_bytes_ + v_block_bytes_));
    }
  }
  blk_end_ = live;
  blk_begin_ = 0;
}

void QuantizedLayer::reserve_residual(int64_t tokens) {
  const int64_t cap = res_k_.defined() && res_k_.shape().ndim == 4 ? res_k_.dim(2) : 0;
  const int64_t base = std::max(params_.quantized.residual, params_.quantized.group);
  // Shrink back after a long prefill chunk was flushed, so that bytes() stays near the steady
  // state (R tokens) instead of keeping the largest chunk's residual forever.
  const bool shrink = cap > 2 * base && tokens <= base;
  if (tokens <= cap && !shrink) return;
  const int64_t ncap = shrink ? base : std::max({tokens, base, cap + cap / 2});
  Tensor nk = Tensor::empty(res_dtype_, {batch_, heads_, ncap, dk_});
  Tensor nv = Tensor::empty(res_dtype_, {batch_, heads_, ncap, dv_});
  if (n_res_ > 0) {
    copy_view(res_k_.view().slice(2, 0, n_res_), nk.view().slice(2, 0, n_res_));
    copy_view(res_v_.view().slice(2, 0, n_res_), nv.view().slice(2, 0, n_res_));
    stats_.bytes_copied += dtype_bytes(res_dtype_, batch_ * heads_ * n_res_ * (dk_ + dv_));
    stats_.reallocations += 1;
  }
  res_k_ = std::move(nk);
  res_v_ = std::move(nv);
}

void QuantizedLayer::flush(int64_t tokens) {
  const int64_t G = params_.quantized.group, nb = tokens / G;
  KV_CHECK(tokens % G == 0 && tokens <= n_res_, "flush of whole residual groups only");
  reserve_blocks(nb);
  float* s = scratch_.data();
  const TensorView rk = res_k_.view(), rv = res_v_.view();
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t h = 0; h < heads_; ++h)
      for (int64_t i = 0; i < nb; ++i) {
        for (int64_t t = 0; t < G; ++t)
          convert_n(rk.ptr(b, h, i * G + t), res_dtype_, s + t * dk_, DType::kF32,
                    static_cast<size_t>(dk_));
        kv_quantize_k_block(fmt_, s, dk_, k_block(b, h, blk_end_ + i));
        for (int64_t t = 0; t < G; ++t)
          convert_n(rv.ptr(b, h, i * G + t), res_dtype_, s + t * dv_, DType::kF32,
                    static_cast<size_t>(dv_));
        kv_quantize_v_block(fmt_, s, dv_, v_block(b, h, blk_end_ + i));
      }
  blk_end_ += nb;
  // The remaining residual tokens move to slot 0 (fewer than G of them in the decode cycle).
  drop_residual_front(tokens);
}

void QuantizedLayer::drop_residual_front(int64_t tokens) {
  const int64_t rest = n_res_ - tokens;
  if (rest > 0 && tokens > 0) {
    const TensorView rk = res_k_.view(), rv = res_v_.view();
    for (int64_t b = 0; b < batch_; ++b)
      for (int64_t h = 0; h < heads_; ++h) {
        std::memmove(rk.ptr(b, h, 0), rk.ptr(b, h, tokens), dtype_bytes(res_dtype_, rest * dk_));
        std::memmove(rv.ptr(b, h, 0), rv.ptr(b, h, tokens), dtype_bytes(res_dtype_, rest * dv_));
      }
    stats_.bytes_copied += dtype_bytes(res_dtype_, batch_ * heads_ * rest * (dk_ + dv_));
  }
  n_res_ = rest;
}

KVSpan QuantizedLayer::update(const TensorView& k, const TensorView& v) {
  const auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument, where() + ": update(k, v): " + what);
  };
  if (k.ndim() != 4 || v.ndim() != 4) fail("k and v must be [B, H_kv, S, D]");
  if (!dtype_is_float(k.dtype()) || !dtype_is_float(v.dtype())) fail("k and v must be float");
  if (k.dim(0) != v.dim(0) || k.dim(1) != v.dim(1) || k.dim(2) != v.dim(2))
    fail("k " + k.shape().str() + " and v " + v.shape().str() + " disagree on B, H_kv or S");
  if (k.dim(3) < 1 || v.dim(3) < 1) fail("head dims must be >= 1");
  if (initialized_ &&
      (k.dim(0) != batch_ || k.dim(1) != heads_ || k.dim(3) != dk_ || v.dim(3) != dv_)) {
    if (seq_length_ == 0 && k.dim(1) == heads_ && k.dim(3) == dk_ && v.dim(3) == dv_) {
      // An empty layer may take a new batch size (memory reallocated on demand).
      batch_ = k.dim(0);
      kbuf_.clear();
      vbuf_.clear();
      blk_cap_ = blk_begin_ = blk_end_ = 0;
      res_k_ = Tensor();
      res_v_ = Tensor();
    } else {
      fail("shape " + k.shape().str() + " does not match the layer's [" + std::to_string(batch_) +
           ", " + std::to_string(heads_) + ", S, " + std::to_string(dk_) + "]");
    }
  }
  if (!initialized_) init(k, v);
  const int64_t n = k.dim(2);

  // 1. Sliding and chunked layers: drop the whole blocks no query from now on can see (and a
  // chunked layer's residual tokens of a finished chunk once no block is left).
  const int64_t res_drop = residual_to_drop(seq_length_);
  blk_begin_ += blocks_to_drop(seq_length_);
  drop_residual_front(res_drop);
  // 2. Deferred flush of the residual's oldest whole groups.
  const int64_t G = params_.quantized.group;
  if (n_res_ >= std::max(params_.quantized.residual, G)) flush(n_res_ / G * G);
  // 3. Append the new tokens in full precision.
  reserve_residual(n_res_ + n);
  if (n > 0) {
    copy_view(k, res_k_.view().slice(2, n_res_, n_res_ + n));
    copy_view(v, res_v_.view().slice(2, n_res_, n_res_ + n));
  }
  n_res_ += n;
  seq_length_ += n;

  KVSpan span;
  span.kind = KVSpanKind::kQuantized;
  span.kv_offset = first_position();
  QuantKV& q = span.quant;
  q.scheme = fmt_.scheme;
  q.bits = fmt_.bits;
  q.group = G;
  q.v_group = fmt_.v_group;
  q.batch = batch_;
  q.heads = heads_;
  q.head_dim_k = dk_;
  q.head_dim_v = dv_;
  q.n_blocks = blk_end_ - blk_begin_;
  q.k_block_bytes = k_block_bytes_;
  q.v_block_bytes = v_block_bytes_;
  q.k_head_stride = blk_cap_ * k_block_bytes_;
  q.v_head_stride = blk_cap_ * v_block_bytes_;
  q.k_batch_stride = heads_ * q.k_head_stride;
  q.v_batch_stride = heads_ * q.v_head_stride;
  q.k_blocks = kbuf_.data() + blk_begin_ * k_block_bytes_;
  q.v_blocks = vbuf_.data() + blk_begin_ * v_block_bytes_;
  q.k_residual = res_k_.view().slice(2, 0, n_res_);
  q.v_residual = res_v_.view().slice(2, 0, n_res_);
  return span;
}

void QuantizedLayer::reserve_rollback(int64_t tokens) {
  if (tokens < 0)
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": reserve_rollback(" + std::to_string(tokens) + "): give 0 or more");
  rollback_ = tokens;
}

void QuantizedLayer::crop(int64_t n) {
  const int64_t keep = crop_target_length(n, seq_length_);
  if (keep == seq_length_) return;
  if (keep == 0) {  // always reachable, whatever a window dropped
    reset();
    return;
  }
  const int64_t first = first_position();
  const int64_t need = window_start(keep);
  if (need < first) {
    throw Error(ErrorKind::kOutOfRange,
                where() + ": cannot crop to " + std::to_string(keep) +
                    " tokens: the window already dropped positions before " +
                    std::to_string(first) + " that the next query would see");
  }
  const int64_t packed_end = first + packed_length();
  if (keep >= packed_end) {
    n_res_ = keep - packed_end;
  } else {
    // Cut inside the packed store: keep whole blocks before the cut and dequantize the tokens
    // of the cut block that stay into a fresh residual.
    const int64_t G = params_.quantized.group;
    const int64_t i = (keep - first) / G, part = (keep - first) % G;
    n_res_ = 0;
    reserve_residual(part);
    float* s = scratch_.data();
    const TensorView rk = res_k_.view(), rv = res_v_.view();
    if (part > 0)
      for (int64_t b = 0; b < batch_; ++b)
        for (int64_t h = 0; h < heads_; ++h) {
          kv_dequantize_k_block(fmt_, k_block(b, h, blk_begin_ + i), s, dk_);
          for (int64_t t = 0; t < part; ++t)
            convert_n(s + t * dk_, DType::kF32, rk.ptr(b, h, t), res_dtype_,
                      static_cast<size_t>(dk_));
          kv_dequantize_v_block(fmt_, v_block(b, h, blk_begin_ + i), s, dv_);
          for (int64_t t = 0; t < part; ++t)
            convert_n(s + t * dv_, DType::kF32, rv.ptr(b, h, t), res_dtype_,
                      static_cast<size_t>(dv_));
        }
    blk_end_ = blk_begin_ + i;
    n_res_ = part;
  }
  seq_length_ = keep;
}

// Layout: u32 initialized; when 1: i64 batch, heads, D_k, D_v, str residual dtype, u32 scheme,
// bits, i64 group, seq_length, packed blocks n, residual tokens r, then per (row, head) its n K
// blocks, per (row, head) its n V blocks, then the residual K and V [B, H, r, D].
void QuantizedLayer::save(StateWriter& out) const {
  out.u32(initialized_ ? 1 : 0);
  if (!initialized_) return;
  for (int64_t d : {batch_, heads_, dk_, dv_}) out.i64(d);
  out.str(dtype_name(res_dtype_));
  const QuantizedOptions& q = params_.quantized;
  out.u32(static_cast<uint32_t>(q.scheme));
  out.u32(static_cast<uint32_t>(q.bits));
  out.i64(q.group);
  out.i64(seq_length_);
  const int64_t n = blk_end_ - blk_begin_;
  out.i64(n);
  out.i64(n_res_);
  auto* self = const_cast<QuantizedLayer*>(this);  // k_block/v_block: the same bytes, read only
  for (int64_t r = 0; r < batch_ * heads_ && n > 0; ++r)
    out.write(self->k_block(r / heads_, r % heads_, blk_begin_),
              static_cast<size_t>(n * k_block_bytes_));
  for (int64_t r = 0; r < batch_ * heads_ && n > 0; ++r)
    out.write(self->v_block(r / heads_, r % heads_, blk_begin_),
              static_cast<size_t>(n * v_block_bytes_));
  if (n_res_ > 0) {
    out.view(res_k_.view().slice(2, 0, n_res_));
    out.view(res_v_.view().slice(2, 0, n_res_));
  }
}

void QuantizedLayer::load(StateReader& in) {
  if (in.u32() == 0) {
    reset();
    return;
  }
  int64_t dims[4];
  for (int64_t& d : dims) d = in.i64();
  const std::string dtype = in.str(16);
  const uint32_t scheme = in.u32(), bits = in.u32();
  const int64_t group = in.i64(), seq = in.i64(), n = in.i64(), n_res = in.i64();
  auto refuse = [&](const std::string& what) {
    throw Error(ErrorKind::kFormat, where() + ": cannot restore: " + what);
  };
  const QuantizedOptions& q = params_.quantized;
  if (scheme != static_cast<uint32_t>(q.scheme) || bits != static_cast<uint32_t>(q.bits) ||
      group != q.group)
    refuse("the file was quantized with scheme " + std::to_string(scheme) + ", " +
           std::to_string(bits) + " bits, groups of " + std::to_string(group) +
           "; this layer uses " + std::to_string(static_cast<uint32_t>(q.scheme)) + ", " +
           std::to_string(q.bits) + ", " + std::to_string(q.group));
  DType res = DType::kF32;
  try {
    res = parse_dtype(dtype);
  } catch (const Error&) {
    refuse("unknown residual dtype '" + dtype + "'");
  }
  const DType want = initialized_ ? res_dtype_ : params_.kv_dtype.value_or(res);
  if (res != want) refuse("kv dtype " + dtype + " in the file vs " + dtype_name(want) + " here");
  for (int64_t d : dims)
    if (d < 1) refuse("invalid shape in the file");
  if (initialized_ && (dims[0] != batch_ || dims[1] != heads_ || dims[2] != dk_ || dims[3] != dv_))
    refuse("the file has batch/heads/dims " + std::to_string(dims[0]) + "/" +
           std::to_string(dims[1]) + "/" + std::to_string(dims[2]) + "/" + std::to_string(dims[3]) +
           ", this layer " + std::to_string(batch_) + "/" + std::to_string(heads_) + "/" +
           std::to_string(dk_) + "/" + std::to_string(dv_));
  if (n < 0 || n_res < 0 || seq < n * group + n_res || (!windowed() && seq != n * group + n_res))
    refuse("invalid position in the file");
  if (!initialized_) {  // init() reads only the shapes and dtype of its views
    const TensorView k(nullptr, res, {dims[0], dims[1], 1, dims[2]});
    const TensorView v(nullptr, res, {dims[0], dims[1], 1, dims[3]});
    init(k, v);
  }
  reset();
  reserve_blocks(n, /*exact=*/true);
  for (int64_t r = 0; r < batch_ * heads_ && n > 0; ++r)
    in.read(k_block(r / heads_, r % heads_, 0), static_cast<size_t>(n * k_block_bytes_));
  for (int64_t r = 0; r < batch_ * heads_ && n > 0; ++r)
    in.read(v_block(r / heads_, r % heads_, 0), static_cast<size_t>(n * v_block_bytes_));
  blk_end_ = n;
  reserve_residual(n_res);
  if (n_res > 0) {
    in.view(res_k_.view().slice(2, 0, n_res));
    in.view(res_v_.view().slice(2, 0, n_res));
  }
  n_res_ = n_res;
  seq_length_ = seq;
}

void QuantizedLayer::reset() {
  blk_begin_ = blk_end_ = 0;
  n_res_ = 0;
  seq_length_ = 0;
}

void QuantizedLayer::gather(std::span<const int64_t> rows) {
  for (int64_t r : rows)
    if (r < 0 || r >= batch_)
      throw Error(ErrorKind::kInvalidArgument, where() + ": batch row " + std::to_string(r) +
                                                   " outside [0, " + std::to_string(batch_) + ")");
  if (!initialized_) return;
  const auto nb = static_cast<int64_t>(rows.size());
  const int64_t kr = heads_ * blk_cap_ * k_block_bytes_, vr = heads_ * blk_cap_ * v_block_bytes_;
  ByteBuffer nk(static_cast<size_t>(nb * kr)), nv(static_cast<size_t>(nb * vr));
  for (int64_t i = 0; i < nb; ++i) {
    const int64_t src = rows[static_cast<size_t>(i)];
    std::memcpy(nk.data() + i * kr, kbuf_.data() + src * kr, static_cast<size_t>(kr));
    std::memcpy(nv.data() + i * vr, vbuf_.data() + src * vr, static_cast<size_t>(vr));
  }
  const int64_t cap = res_k_.shape().ndim == 4 ? res_k_.dim(2) : 0;
  Tensor rk = Tensor::empty(res_dtype_, {nb, heads_, cap, dk_});
  Tensor rv = Tensor::empty(res_dtype_, {nb, heads_, cap, dv_});
  for (int64_t i = 0; i < nb && cap > 0; ++i) {
    const int64_t src = rows[static_cast<size_t>(i)];
    copy_view(res_k_.view().slice(0, src, src + 1), rk.view().slice(0, i, i + 1));
    copy_view(res_v_.view().slice(0, src, src + 1), rv.view().slice(0, i, i + 1));
  }
  kbuf_ = std::move(nk);
  vbuf_ = std::move(nv);
  res_k_ = std::move(rk);
  res_v_ = std::move(rv);
  batch_ = nb;
  stats_.bytes_copied +=
      static_cast<size_t>(nb * (kr + vr)) + res_k_.size_bytes() + res_v_.size_bytes();
}

void QuantizedLayer::reorder(std::span<const int64_t> beam_idx) {
  if (initialized_ && static_cast<int64_t>(beam_idx.size()) != batch_) {
    throw Error(ErrorKind::kInvalidArgument, where() + ": reorder needs one index per batch row (" +
                                                 std::to_string(batch_) + "), got " +
                                                 std::to_string(beam_idx.size()));
  }
  gather(beam_idx);
}

void QuantizedLayer::repeat_interleave(int64_t r) {
  if (r < 1)
    throw Error(ErrorKind::kInvalidArgument, where() + ": repeat_interleave(r) needs r >= 1");
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t i = 0; i < r; ++i) rows.push_back(b);
  gather(rows);
}

void QuantizedLayer::select(std::span<const int64_t> indices) {
  gather(indices);
}

size_t QuantizedLayer::bytes() const {
  return kbuf_.size() + vbuf_.size() + res_k_.size_bytes() + res_v_.size_bytes() +
         scratch_.size() * sizeof(float);
}

}  // namespace kvcache
