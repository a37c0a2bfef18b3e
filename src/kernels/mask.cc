#include "kernels/mask.h"

#include <utility>

#include "core/error.h"
#include "core/thread_pool.h"

namespace kvcache {

MaskFn causal_mask() {
  return [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; };
}

MaskFn sliding_window_overlay(int64_t window) {
  if (window <= 0)
    throw Error(ErrorKind::kInvalidArgument,
                "sliding_window_overlay: window must be > 0, got " + std::to_string(window));
  return [window](int64_t, int64_t, int64_t q, int64_t kv) { return kv > q - window; };
}

MaskFn chunked_overlay(int64_t chunk_size) {
  if (chunk_size <= 0)
    throw Error(ErrorKind::kInvalidArgument,
                "chunked_overlay: chunk_size must be > 0, got " + std::to_string(chunk_size));
  return [chunk_size](int64_t, int64_t, int64_t q, int64_t kv) {
    return floor_div(kv, chunk_size) == floor_div(q, chunk_size);
  };
}

MaskFn chunked_overlay(int64_t chunk_size, const int64_t* left_padding) {
  if (chunk_size <= 0)
    throw Error(ErrorKind::kInvalidArgument,
                "chunked_overlay: chunk_size must be > 0, got " + std::to_string(chunk_size));
  return [chunk_size, left_padding](int64_t b, int64_t, int64_t q, int64_t kv) {
    const int64_t lp = left_padding ? left_padding[b] : 0;
    return floor_div(kv - lp, chunk_size) == floor_div(q - lp, chunk_size);
  };
}

MaskFn packed_sequence_mask(const int32_t* doc_ids, int64_t len) {
  if (!doc_ids || len <= 0)
    throw Error(ErrorKind::kInvalidArgument, "packed_sequence_mask: doc_ids must be [B, len > 0]");
  return [doc_ids, len](int64_t b, int64_t, int64_t q, int64_t kv) {
    if (q < 0 || q >= len || kv < 0 || kv >= len) return false;
    return doc_ids[b * len + q] == doc_ids[b * len + kv];
  };
}

MaskFn padding_mask(const int64_t* begin, const int64_t* end) {
  return [begin, end](int64_t b, int64_t, int64_t, int64_t kv) {
    return (!begin || kv >= begin[b]) && (!end || kv < end[b]);
  };
}

MaskFn and_masks(std::vector<MaskFn> masks) {
  return [m = std::move(masks)](int64_t b, int64_t h, int64_t q, int64_t kv) {
    for (const MaskFn& f : m)
      if (!f(b, h, q, kv)) return false;
    return true;
  };
}

MaskFn or_masks(std::vector<MaskFn> masks) {
  return [m = std::move(masks)](int64_t b, int64_t h, int64_t q, int64_t kv) {
    for (const MaskFn& f : m)
      if (f(b, h, q, kv)) return true;
    return false;
  };
}

MaskFn mask_spec_fn(const MaskSpec& s) {
  // The user function is copied too, so the result outlives the spec's pointer.
  MaskFn user = s.fn ? *s.fn : MaskFn();
  MaskSpec spec = s;
  spec.fn = nullptr;
  return [spec, user](int64_t b, int64_t h, int64_t q, int64_t kv) {
    return builtin_visible(spec, b, q, kv) && (!user || user(b, h, q, kv));
  };
}

MaskGeometry make_geometry(int64_t batch, int64_t heads, int64_t q_len, int64_t kv_len,
                           int64_t q_offset, int64_t kv_offset) {
  MaskGeometry g;
  g.batch = batch;
  g.heads = heads;
  g.q_len = q_len;
  g.kv_len = kv_len;
  g.kv_offset = kv_offset;
  g.q_offset = q_offset >= 0 ? q_offset : kv_offset + kv_len - q_len;
  return g;
}

Tensor materialize_additive_mask(const MaskSpec& s, const MaskGeometry& g) {
  const int64_t planes = s.fn ? g.heads : 1;
  Tensor m = Tensor::empty(DType::kF32, {g.batch, planes, g.q_len, g.kv_len});
  float* p = m.data_as<float>();
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t h = 0; h < planes; ++h)
      for (int64_t i = 0; i < g.q_len; ++i)
        for (int64_t j = 0; j < g.kv_len; ++j)
          *p++ = mask_visible(s, b, h, g.q_offset + i, g.kv_offset + j) ? 0.0f : neg_inf;
  return m;
}

TileClass classify_tile(const MaskSpec& s, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t k0,
                        int64_t k1) {
  if (q0 >= q1 || k0 >= k1) return TileClass::kEmpty;
  bool any = false, all = true;
  for (int64_t q = q0; q < q1; ++q) {
    const KeyRange r = key_range(s, b, q);
    const int64_t lo = std::max(r.lo, k0), hi = std::min(r.hi, k1);
    if (lo < hi) any = true;
    if (lo != k0 || hi != k1) all = false;
  }
  if (!any) return TileClass::kEmpty;
  if (!s.doc_ids && !s.fn) return all ? TileClass::kFull : TileClass::kPartial;
  // Documents and user functions: evaluate the pairs the intervals leave visible.
  any = false;
  for (int64_t q = q0; q < q1; ++q)
    for (int64_t kv = k0; kv < k1; ++kv) {
      const bool v = mask_visible(s, b, h, q, kv);
      any |= v;
      all &= v;
    }
  return !any ? TileClass::kEmpty : all ? TileClass::kFull : TileClass::kPartial;
}

bool mask_is_all_visible(const MaskSpec& s, const MaskGeometry& g) {
  if (g.q_len == 0 || g.kv_len == 0) return true;
  const int64_t heads = s.fn ? g.heads : 1;
  for (int64_t b = 0; b < g.batch; ++b)
    for (int64_t h = 0; h < heads; ++h)
      if (classify_tile(s, b, h, g.q_offset, g.q_offset + g.q_len, g.kv_offset,
                        g.kv_offset + g.kv_len) != TileClass::kFull)
        return false;
  return true;
}

BlockMask BlockMask::create(const MaskFn& fn, const MaskGeometry& g, bool per_head) {
  if (!fn) throw Error(ErrorKind::kInvalidArgument, "BlockMask::create: empty mask function");
  if (g.batch < 0 || g.q_len < 0 || g.kv_len < 0 || g.heads < 1)
    throw Error(ErrorKind::kInvalidArgument,
                "BlockMask::create: geometry needs batch, q_len, kv_len >= 0 and heads >= 1");
  auto d = std::make_shared<Data>();
  d->geo = g;
  d->per_head = per_head;
  d->planes = per_head ? g.heads : 1;
  d->tiles = (g.kv_len + kTile - 1) / kTile;
  d->words.assign(static_cast<size_t>(g.batch * d->planes * g.q_len * d->tiles), 0);
  const int64_t rows = g.batch * d->planes * g.q_len;
  uint64_t* words = d->words.data();
  const int64_t tiles = d->tiles;
  default_pool().parallel_for(rows, [&](int64_t row) {
    const int64_t qi = row % g.q_len, plane = (row / g.q_len) % d->planes;
    const int64_t b = row / (g.q_len * d->planes);
    uint64_t* w = words + row * tiles;
    for (int64_t j = 0; j < g.kv_len; ++j)
      if (fn(b, plane, g.q_offset + qi, g.kv_offset + j))
        w[j / kTile] |= uint64_t{1} << (j % kTile);
  });
  // Captures the data by address (the function lives inside it: a shared_ptr would be a cycle).
  const Data* raw = d.get();
  d->fn = [raw](int64_t b, int64_t h, int64_t q_pos, int64_t kv_pos) {
    const int64_t qi = q_pos - raw->geo.q_offset, kj = kv_pos - raw->geo.kv_offset;
    if (b < 0 || b >= raw->geo.batch || qi < 0 || qi >= raw->geo.q_len || kj < 0 ||
        kj >= raw->geo.kv_len)
      return false;
    const int64_t plane = raw->per_head ? h : 0;
    const uint64_t w = raw->words[static_cast<size_t>(
        ((b * raw->planes + plane) * raw->geo.q_len + qi) * raw->tiles + kj / kTile)];
    return ((w >> (kj % kTile)) & 1) != 0;
  };
  BlockMask m;
  m.d_ = std::move(d);
  return m;
}

double BlockMask::density() const {
  if (!d_ || d_->words.empty()) return 0;
  int64_t ones = 0;
  for (uint64_t w : d_->words) ones += __builtin_popcountll(w);
  return static_cast<double>(ones) /
         static_cast<double>(d_->geo.batch * d_->planes * d_->geo.q_len * d_->geo.kv_len);
}

}  // namespace kvcache
