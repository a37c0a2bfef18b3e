#include "cache/evicting_layer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>

#include "core/error.h"

namespace kvcache {

namespace {
// Scratch bound of observe_queries: probabilities of at most this many floats per eager call.
constexpr int64_t kMaxWeightFloats = int64_t{1} << 22;  // 16 MiB
}  // namespace

EvictingLayer::EvictingLayer(DenseLayerParams params, const KVPolicy& policy,
                             CacheConfig::KVContent content, int64_t max_cache_len)
    : DenseLayer(std::move(params)), policy_(policy), max_cache_len_(max_cache_len) {
  policy_.validate();
  if (policy_.exact())
    throw Error(ErrorKind::kInvalidArgument,
                where() +
                    ": an evicting layer needs a lossy --kv-policy; exact is the dynamic "
                    "container itself");
  if (content != CacheConfig::KVContent::kPerHead)
    throw Error(
        ErrorKind::kUnsupported,
        where() + ": --kv-policy " + policy_.key() +
            " needs per-head keys and values (GQA attention); this model caches " +
            (content == CacheConfig::KVContent::kMlaLatent ? "MLA latents" : "K == V once") +
            "; use --kv-policy exact");
  if (params_.fixed_storage && max_cache_len_ <= 0)
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": the static cache needs max_cache_len > 0 (got " +
                    std::to_string(max_cache_len_) + "); pass --max-cache-len");
  params_.name = std::string(params_.fixed_storage ? "static" : "dynamic") + "/full_attention+" +
                 policy_.key();
}

int64_t EvictingLayer::kept_before(int64_t n) const {
  const int64_t held = buf_.allocated() ? buf_.size() : 0;
  switch (policy_.kind) {
    case KVPolicyKind::kExact:
      return held;
    case KVPolicyKind::kStreaming: {
      const int64_t sinks = std::min(policy_.sink, seq_length_);
      return std::min(held, sinks + std::max<int64_t>(policy_.window - n, 0));
    }
    case KVPolicyKind::kH2O:
      return std::min(held, policy_.heavy + policy_.recent);
    case KVPolicyKind::kSnapKV:
      if (!compressed_ && prefilled_ && n == 1) return std::min(held, policy_.budget);
      return held;
  }
  return held;
}

MaskSizes EvictingLayer::mask_sizes(int64_t query_len) const {
  const int64_t visible = kept_before(query_len) + query_len;
  return {visible, seq_length_ + query_len - visible};
}

void EvictingLayer::compact_plane(size_t p, const std::vector<char>& keep, int64_t count) {
  Plane& pl = planes_[p];
  const int64_t H = buf_.shape().heads;
  const int64_t b = static_cast<int64_t>(p) / H, h = static_cast<int64_t>(p) % H;
  const TensorView ks = buf_.k_slots(0, buf_.end()), vs = buf_.v_slots(0, buf_.end());
  const size_t k_row = dtype_bytes(ks.dtype(), ks.dim(3)),
               v_row = dtype_bytes(vs.dtype(), vs.dim(3));
  const bool shared = shared_kv();
  const auto held = static_cast<int64_t>(pl.pos.size());
  int64_t hole = 0;
  size_t moved = 0;
  // Kept slots past `count` fill the dropped slots before it, both in ascending order.
  for (int64_t from = count; from < held; ++from) {
    if (!keep[static_cast<size_t>(from)]) continue;
    while (keep[static_cast<size_t>(hole)]) ++hole;
    std::memcpy(ks.ptr(b, h, hole), ks.ptr(b, h, from), k_row);
    if (!shared) std::memcpy(vs.ptr(b, h, hole), vs.ptr(b, h, from), v_row);
    pl.pos[static_cast<size_t>(hole)] = pl.pos[static_cast<size_t>(from)];
    pl.score[static_cast<size_t>(hole)] = pl.score[static_cast<size_t>(from)];
    moved += k_row + (shared ? 0 : v_row);
    ++hole;
  }
  pl.pos.resize(static_cast<size_t>(count));
  pl.score.resize(static_cast<size_t>(count));
  buf_.mutable_stats().bytes_copied += moved;
}

void EvictingLayer::evict(int64_t n) {
  const int64_t held = buf_.size();
  const int64_t count = kept_before(n);
  if (policy_.kind == KVPolicyKind::kSnapKV && n == 1 && prefilled_ && !compressed_) {
    // The prompt ends here, whether or not it exceeds the budget: SnapKV compresses once.
    if (count < held) snapkv_compress();
    compressed_ = true;
    obs_q_.clear();
    obs_q_.shrink_to_fit();
    return;
  }
  if (count >= held) return;
  std::vector<char> keep(static_cast<size_t>(held));
  std::vector<int64_t> order(static_cast<size_t>(held));
  for (size_t p = 0; p < planes_.size(); ++p) {
    const Plane& pl = planes_[p];
    std::fill(keep.begin(), keep.end(), 0);
    std::iota(order.begin(), order.end(), 0);
    // Most recent first.
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return pl.pos[static_cast<size_t>(a)] > pl.pos[static_cast<size_t>(b)];
    });
    if (policy_.kind == KVPolicyKind::kStreaming) {
      int64_t recent = count - std::min(policy_.sink, seq_length_);
      for (int64_t s : order) {
        if (pl.pos[static_cast<size_t>(s)] < policy_.sink) {
          keep[static_cast<size_t>(s)] = 1;
        } else if (recent > 0) {
          keep[static_cast<size_t>(s)] = 1;
          --recent;
        }
      }
    } else {  // H2O: the recent window, then the heaviest of the rest (ties: earlier position)
      const int64_t recent = std::min(policy_.recent, count);
      for (int64_t i = 0; i < recent; ++i) keep[static_cast<size_t>(order[i])] = 1;
      std::vector<int64_t> rest(order.begin() + recent, order.end());
      std::sort(rest.begin(), rest.end(), [&](int64_t a, int64_t b) {
        const float sa = pl.score[static_cast<size_t>(a)], sb = pl.score[static_cast<size_t>(b)];
        if (sa != sb) return sa > sb;
        return pl.pos[static_cast<size_t>(a)] < pl.pos[static_cast<size_t>(b)];
      });
      for (int64_t i = 0; i < count - recent; ++i) keep[static_cast<size_t>(rest[i])] = 1;
    }
    compact_plane(p, keep, count);
  }
  buf_.set_window(0, count);
  buf_.mutable_stats().compactions += 1;
  evicted_ += held - count;
}

void EvictingLayer::snapkv_compress() {
  const int64_t held = buf_.size(), count = policy_.budget;
  const int64_t m = obs_len_;
  KV_CHECK(held == seq_length_, "SnapKV compresses the whole prompt, before any eviction");
  if (m < std::min(policy_.obs_window, seq_length_))
    throw Error(ErrorKind::kUnsupported,
                where() + ": SnapKV scores the prompt by the queries of its last " +
                    std::to_string(policy_.obs_window) + " tokens but only " + std::to_string(m) +
                    " were reported (a crop() dropped them, or the model does not report its "
                    "queries); reset() and prefill the prompt again");
  const int64_t B = buf_.batch(), Hkv = buf_.shape().heads;
  const TensorView q(obs_q_.data(), DType::kF32, {B, obs_heads_, m, obs_dim_});
  std::vector<float> mass(static_cast<size_t>(B * Hkv * held), 0.0f);
  attention_mass(q, seq_length_ - m, mass);
  const int64_t cand = held - m;  // keys before the window compete for budget - m slots
  const int64_t half = policy_.kernel / 2;
  std::vector<float> pooled(static_cast<size_t>(cand));
  std::vector<int64_t> order(static_cast<size_t>(cand));
  std::vector<char> keep(static_cast<size_t>(held));
  for (size_t p = 0; p < planes_.size(); ++p) {
    const float* s = mass.data() + p * static_cast<size_t>(held);
    for (int64_t j = 0; j < cand; ++j) {  // avg_pool1d, zero padding counted in the divisor
      float acc = 0.0f;
      for (int64_t t = std::max<int64_t>(j - half, 0); t <= std::min(j + half, cand - 1); ++t)
        acc += s[t];
      pooled[static_cast<size_t>(j)] = acc / static_cast<float>(policy_.kernel);
    }
    std::iota(order.begin(), order.end(), 0);
    // Slots are positions here: nothing was evicted before the prompt's end.
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const float pa = pooled[static_cast<size_t>(a)], pb = pooled[static_cast<size_t>(b)];
      if (pa != pb) return pa > pb;
      return a < b;
    });
    std::fill(keep.begin(), keep.end(), 0);
    for (int64_t i = 0; i < count - m; ++i) keep[static_cast<size_t>(order[i])] = 1;
    for (int64_t j = cand; j < held; ++j) keep[static_cast<size_t>(j)] = 1;
    compact_plane(p, keep, count);
  }
  buf_.set_window(0, count);
  buf_.mutable_stats().compactions += 1;
  evicted_ += held - count;
}

KVSpan EvictingLayer::update(const TensorView& k, const TensorView& v) {
  const int64_t n = check_update(k, v);
  if (!observed_)
    throw Error(ErrorKind::kUnsupported,
                where() + ": the " + std::string(policy_.kind_name()) +
                    " policy scores keys by the attention they receive, but the queries of the "
                    "last step were not reported (Cache::observe_queries; the GQA attention "
                    "layers report them, model/gqa_attention.cc); use --kv-policy streaming or "
                    "exact with this model");
  const bool fixed = params_.fixed_storage;
  if (fixed && kept_before(n) + n > max_cache_len_)  // before any change: the cache stays intact
    throw Error(ErrorKind::kOutOfRange,
                where() + ": cannot write " + std::to_string(n) + " tokens: with the " +
                    std::to_string(kept_before(n)) + " the policy keeps, the step needs " +
                    std::to_string(kept_before(n) + n) + " of the static storage's " +
                    std::to_string(max_cache_len_) +
                    " slots (max_cache_len); raise --max-cache-len, prefill in smaller chunks "
                    "(--chunk) or use the dynamic cache");
  const bool empty = !buf_.allocated() || buf_.size() == 0;
  prepare_rows(k, v, fixed ? max_cache_len_ : std::max(n, kMinCapacity));
  const int64_t B = buf_.batch(), H = buf_.shape().heads;
  if (empty) {
    planes_.assign(static_cast<size_t>(B * H), Plane{});
    if (fixed) {  // static: every byte at the first update (bytes() never changes after it)
      for (Plane& pl : planes_) {
        pl.pos.reserve(static_cast<size_t>(max_cache_len_));
        pl.score.reserve(static_cast<size_t>(max_cache_len_));
      }
    }
  }
  evict(n);
  const int64_t end = buf_.end();
  KV_CHECK(!fixed || end + n <= buf_.capacity(), "the static check above bounds the step");
  if (end + n > buf_.capacity())
    buf_.reallocate(buf_.batch_capacity(), std::max(2 * buf_.capacity(), end + n));
  buf_.append(k, v);
  for (Plane& pl : planes_) {
    for (int64_t i = 0; i < n; ++i) {
      pl.pos.push_back(seq_length_ + i);
      pl.score.push_back(0.0f);
    }
  }
  seq_length_ += n;
  if (n > 1) prefilled_ = true;
  observed_ = !(policy_.kind == KVPolicyKind::kH2O ||
                (policy_.kind == KVPolicyKind::kSnapKV && !compressed_));
  KVSpan span;
  span.k = buf_.k_slots(0, buf_.end());
  span.v = buf_.v_slots(0, buf_.end());
  span.kv_offset = seq_length_ - buf_.end();
  return span;
}

void EvictingLayer::attention_mass(const TensorView& q, int64_t q_pos0,
                                   std::vector<float>& mass) const {
  const int64_t B = q.dim(0), Hq = q.dim(1), m = q.dim(2);
  const int64_t held = buf_.end(), Hkv = buf_.shape().heads;
  if (Hq % Hkv != 0 || q.dim(0) != buf_.batch() || q.dim(3) != buf_.shape().head_dim_k)
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": observe_queries: q " + q.shape().str() + " does not match " +
                    std::to_string(buf_.batch()) + " rows of " + std::to_string(Hkv) +
                    " KV heads of dim " + std::to_string(buf_.shape().head_dim_k) +
                    " (query heads must be a multiple of the KV heads)");
  const int64_t group = Hq / Hkv;
  const TensorView ks = buf_.k_slots(0, held), vs = buf_.v_slots(0, held);
  AttentionOptions o;
  o.scale = obs_options_.scale;
  o.softcap = obs_options_.softcap;
  o.sinks = obs_options_.sinks;
  o.causal = true;
  o.kv_offset = seq_length_ - held;
  o.kv_split = -1;
  const AttentionFn eager = get_attention_kernel("eager");
  const int64_t rows = std::clamp<int64_t>(kMaxWeightFloats / (B * Hq * held), 1, m);
  Tensor out_scratch = Tensor::empty(DType::kF32, {B, Hq, rows, vs.dim(3)});
  Tensor weights;
  o.weights_out = &weights;
  for (int64_t i0 = 0; i0 < m; i0 += rows) {
    const int64_t i1 = std::min(m, i0 + rows), r = i1 - i0;
    o.q_offset = q_pos0 + i0;
    eager(q.slice(2, i0, i1), ks, vs, out_scratch.view().slice(2, 0, r), o);
    const float* w = weights.data_as<float>();  // [B, Hq, r, held]
    for (int64_t b = 0; b < B; ++b)
      for (int64_t hq = 0; hq < Hq; ++hq) {
        float* acc = mass.data() + (b * Hkv + hq / group) * held;
        for (int64_t i = 0; i < r; ++i) {
          const float* row = w + ((b * Hq + hq) * r + i) * held;
          for (int64_t j = 0; j < held; ++j) acc[j] += row[j];
        }
      }
  }
}

void EvictingLayer::observe_queries(const TensorView& q, const AttentionOptions& options) {
  if (!buf_.allocated() || q.ndim() != 4) return;
  obs_options_.scale = options.scale;
  obs_options_.softcap = options.softcap;
  obs_options_.sinks = options.sinks;
  const int64_t n = q.dim(2);
  if (policy_.kind == KVPolicyKind::kH2O) {
    const int64_t held = buf_.end();
    std::vector<float> mass(static_cast<size_t>(buf_.batch() * buf_.shape().heads * held), 0.0f);
    attention_mass(q, seq_length_ - n, mass);
    for (size_t p = 0; p < planes_.size(); ++p)
      for (int64_t j = 0; j < held; ++j)
        planes_[p].score[static_cast<size_t>(j)] += mass[p * static_cast<size_t>(held) + j];
    scored_ = true;
  } else if (policy_.kind == KVPolicyKind::kSnapKV && !compressed_) {
    // Keep the latest obs_window queries [B, H_q, w, D] (f32, oldest first).
    const int64_t B = q.dim(0), Hq = q.dim(1), D = q.dim(3), w = policy_.obs_window;
    if (obs_heads_ != Hq || obs_dim_ != D || obs_q_.size() != static_cast<size_t>(B * Hq * w * D)) {
      obs_q_.assign(static_cast<size_t>(B * Hq * w * D), 0.0f);
      obs_heads_ = Hq;
      obs_dim_ = D;
      obs_len_ = 0;
    }
    const int64_t take = std::min(n, w), keep = std::min(obs_len_, w - take);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h) {
        float* rows = obs_q_.data() + ((b * Hq + h) * w) * D;
        std::memmove(rows, rows + (obs_len_ - keep) * D,
                     static_cast<size_t>(keep * D) * sizeof(float));
        const TensorView src = q.slice(0, b, b + 1).slice(1, h, h + 1).slice(2, n - take, n);
        const TensorView dst(rows + keep * D, DType::kF32, {1, 1, take, D});
        copy_view(src, dst);
      }
    obs_len_ = keep + take;
  }
  observed_ = true;
}

void EvictingLayer::crop(int64_t n) {
  const int64_t length = crop_length(n, seq_length_);
  if (length == seq_length_) return;
  if (length == 0) {  // the empty state is always reachable
    reset();
    return;
  }
  if (evicted_ > 0 || scored_ || compressed_)
    throw Error(ErrorKind::kUnsupported,
                where() + ": cannot crop to " + std::to_string(length) +
                    " tokens: the policy has already evicted or scored tokens, and a lossy cache "
                    "cannot bring back the state it had at that length (crop before the first "
                    "eviction, or reset())");
  // Nothing evicted: slots are positions.
  buf_.set_window(0, length);
  for (Plane& pl : planes_) {
    pl.pos.resize(static_cast<size_t>(length));
    pl.score.resize(static_cast<size_t>(length));
  }
  seq_length_ = length;
  obs_len_ = 0;  // the observed queries may be the dropped ones
}

void EvictingLayer::reset() {
  if (buf_.allocated()) buf_.set_window(0, 0);
  for (Plane& pl : planes_) {
    pl.pos.clear();
    pl.score.clear();
  }
  seq_length_ = 0;
  evicted_ = 0;
  observed_ = true;
  scored_ = prefilled_ = compressed_ = false;
  obs_len_ = 0;
}

void EvictingLayer::gather_meta(std::span<const int64_t> rows) {
  const int64_t H = buf_.allocated() ? buf_.shape().heads : 0;
  if (H == 0 || planes_.empty()) return;
  std::vector<Plane> planes;
  planes.reserve(rows.size() * static_cast<size_t>(H));
  for (int64_t r : rows)
    for (int64_t h = 0; h < H; ++h) planes.push_back(planes_[static_cast<size_t>(r * H + h)]);
  planes_ = std::move(planes);
  if (!obs_q_.empty() && obs_heads_ > 0) {
    const size_t row = static_cast<size_t>(obs_heads_ * policy_.obs_window * obs_dim_);
    std::vector<float> q;
    q.reserve(rows.size() * row);
    for (int64_t r : rows)
      q.insert(q.end(), obs_q_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r) * row),
               obs_q_.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(r + 1) * row));
    obs_q_ = std::move(q);
  }
}

void EvictingLayer::reorder(std::span<const int64_t> beam_idx) {
  DenseLayer::reorder(beam_idx);  // validates first
  gather_meta(beam_idx);
}

void EvictingLayer::select(std::span<const int64_t> indices) {
  DenseLayer::select(indices);
  gather_meta(indices);
}

void EvictingLayer::repeat_interleave(int64_t r) {
  const int64_t before = buf_.allocated() ? buf_.batch() : 0;
  DenseLayer::repeat_interleave(r);
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < before; ++b)
    for (int64_t i = 0; i < r; ++i) rows.push_back(b);
  gather_meta(rows);
}

void EvictingLayer::activate_past_recording() {
  throw Error(ErrorKind::kUnsupported,
              where() + ": past recording keeps every token so that a crop may go back; the " +
                  policy_.key() + " policy evicts tokens; use --kv-policy exact");
}

size_t EvictingLayer::bytes() const {
  size_t meta = obs_q_.capacity() * sizeof(float);
  for (const Plane& pl : planes_)
    meta += pl.pos.capacity() * sizeof(int64_t) + pl.score.capacity() * sizeof(float);
  return DenseLayer::bytes() + meta;
}

void EvictingLayer::save(StateWriter&) const {
  throw Error(ErrorKind::kUnsupported,
              where() + ": a cache under --kv-policy " + policy_.key() +
                  " cannot be saved to a session file (its kept positions and scores are not "
                  "part of the format); use --kv-policy exact");
}

void EvictingLayer::load(StateReader&) {
  throw Error(ErrorKind::kUnsupported, where() + ": a cache under --kv-policy " + policy_.key() +
                                           " cannot be restored from a session file");
}

int64_t EvictingLayer::restore_capacity(const SavedPosition&) const {
  KV_CHECK(false, "EvictingLayer::load refuses before any restore");
  return 0;
}

std::vector<int64_t> EvictingLayer::kept_positions(int64_t b, int64_t h) const {
  const int64_t H = buf_.allocated() ? buf_.shape().heads : 0;
  if (b < 0 || h < 0 || h >= H || static_cast<size_t>(b * H + h) >= planes_.size())
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": no plane (" + std::to_string(b) + ", " + std::to_string(h) + ")");
  std::vector<int64_t> pos = planes_[static_cast<size_t>(b * H + h)].pos;
  std::sort(pos.begin(), pos.end());
  return pos;
}

float EvictingLayer::score_of(int64_t b, int64_t h, int64_t position) const {
  (void)kept_positions(b, h);  // validates
  const Plane& pl = planes_[static_cast<size_t>(b * buf_.shape().heads + h)];
  for (size_t i = 0; i < pl.pos.size(); ++i)
    if (pl.pos[i] == position) return pl.score[i];
  return -1.0f;
}

namespace {
std::unique_ptr<CacheLayer> make_evicting(const CacheConfig& config, int layer_index) {
  return std::make_unique<EvictingLayer>(
      dense_params(config, layer_index, "dynamic/full_attention", /*fixed_storage=*/false),
      config.options.policy, config.kv_content);
}

std::unique_ptr<CacheLayer> make_static_evicting(const CacheConfig& config, int layer_index) {
  return std::make_unique<EvictingLayer>(
      dense_params(config, layer_index, "static/full_attention", /*fixed_storage=*/true),
      config.options.policy, config.kv_content, config.options.max_cache_len);
}
}  // namespace

KVCACHE_REGISTER_POLICY_LAYER(dynamic_evicting, "dynamic", make_evicting);
KVCACHE_REGISTER_POLICY_LAYER(static_evicting, "static", make_static_evicting);

}  // namespace kvcache
