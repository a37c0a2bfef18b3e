// The indexer top-k and sparse attention kernels (see sparse_attention.h): the argument checks
// both they and the references use, and the fast kernels.
//
// sparse_attention: a task is (batch row b, query t, KV head hk, part of the key list). The key
// list of a query is its window rows then its entries (the selected ones, -1s dropped, or every
// visible one), read where the spans keep them. Each 16-key tile is widened to f32 once and
// transposed once for all the G = H_q / H_kv query heads of the group (MQA: the 64 heads of
// V4 share every K/V row load), then scored as a small GEMM (4 heads x 16 keys in registers),
// folded into the heads' online softmax (FlashAttention-2's running max and denominator) and
// multiplied into the accumulators. A K == V span (V4) widens each row once for both. Decode
// has one group: the key list is cut into parts whose partial (max, denominator, accumulator)
// states are merged with the sink at the end (flash-decoding), so both threads work.
//
// indexer_topk: scores are computed per 16-key tile packed transposed once for all heads and
// every query of a task, keys split across tasks; the selection is a partial one (nth_element
// finds the k-th score; the entries above it and the lowest-index ties at it are kept, then
// only those k are sorted).
#include "kernels/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/attention_simd.h"
#include "kernels/attention_skeleton.h"
#include "kernels/sparse_attention_internal.h"

namespace kvcache {
namespace detail {

namespace {

[[noreturn]] void bad(const char* who, const std::string& msg,
                      ErrorKind kind = ErrorKind::kInvalidArgument) {
  throw Error(kind, std::string(who) + ": " + msg);
}

std::string shape_of(const TensorView& t) {
  return t.ndim() == 0 ? "[]" : t.shape().str();
}

bool float_storage(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

bool inner_unit(const TensorView& t) {
  return t.ndim() == 0 || t.dim(t.ndim() - 1) <= 1 || t.stride(t.ndim() - 1) == 1;
}

void require_f32(const char* who, const char* name, const TensorView& t, const Shape& want) {
  if (t.dtype() != DType::kF32 || !(t.shape() == want) || !inner_unit(t) ||
      (t.data() == nullptr && t.numel() > 0))
    bad(who, std::string(name) + " must be f32 " + want.str() +
                 " with a unit innermost stride, got " + dtype_name(t.dtype()) + " " + shape_of(t));
}

SpanRows rows_of(const TensorView& t, const PagedKV* paged) {
  SpanRows r;
  r.base = static_cast<const std::byte*>(t.data());
  r.dtype = t.dtype();
  r.width = t.dim(3);
  const int64_t e = static_cast<int64_t>(dtype_bytes(t.dtype(), 1));
  r.s0 = t.stride(0) * e;
  r.s1 = t.stride(1) * e;
  r.s2 = t.stride(2) * e;
  r.paged = paged;
  return r;
}

// Checks a dense or paged span of B rows; `name` names it in errors.
SpanInfo inspect_span(const char* who, const char* name, const KVSpan& s, int64_t B) {
  SpanInfo info;
  info.span = &s;
  const std::string n(name);
  if (s.kind == KVSpanKind::kQuantized || s.kind == KVSpanKind::kPagedQuantized)
    bad(who, n + ": quantized spans are not supported (use a dense or paged cache)",
        ErrorKind::kUnsupported);
  const bool paged = s.kind == KVSpanKind::kPaged;
  const TensorView& k = paged ? s.paged.k_pages : s.k;
  const TensorView& v = paged ? s.paged.v_pages : s.v;
  if (k.ndim() == 0) {
    if (v.ndim() != 0) bad(who, n + " has a v view but no k view");
    return info;  // absent
  }
  info.present = true;
  if (k.ndim() != 4)
    bad(who, n + ".k must be 4-D [" + (paged ? "num_pages" : "B") + ", H_kv, " +
                 (paged ? "block_tokens" : "T") + ", D], got " + shape_of(k));
  if (!float_storage(k.dtype()))
    bad(who, n + " must be stored as f32, f16 or bf16, got " + dtype_name(k.dtype()),
        ErrorKind::kUnsupported);
  if (!inner_unit(k) || (k.data() == nullptr && k.numel() > 0))
    bad(who, n + ".k needs data with a unit innermost stride");
  info.heads = k.dim(1);
  info.dk = k.dim(3);
  info.dtype = k.dtype();
  info.kv_offset = s.kv_offset;
  if (info.heads <= 0) bad(who, n + " has no KV head");
  if (s.kv_offset < 0) bad(who, n + ".kv_offset must be >= 0");
  const TensorView& vv = v.ndim() == 0 ? k : v;
  if (vv.ndim() != 4 || vv.dtype() != k.dtype() || vv.dim(0) != k.dim(0) || vv.dim(1) != k.dim(1) ||
      vv.dim(2) != k.dim(2) || !inner_unit(vv) || (vv.data() == nullptr && vv.numel() > 0))
    bad(who, n +
                 ".v must match k in dtype and in every dim but the last, with a unit "
                 "innermost stride; got k " +
                 shape_of(k) + ", v " + shape_of(v));
  info.dv = vv.dim(3);
  info.v_is_k = vv.data() == k.data() && vv.dim(3) == k.dim(3) && vv.strides() == k.strides();
  const PagedKV* pk = paged ? &s.paged : nullptr;
  if (!paged) {
    if (k.dim(0) != B)
      bad(who, n + " has " + std::to_string(k.dim(0)) + " batch rows, q has " + std::to_string(B));
  } else {
    const PagedKV& p = s.paged;
    if (p.batch != B)
      bad(who, n + " pages " + std::to_string(p.batch) + " sequences, q has " + std::to_string(B));
    if (p.block_tokens <= 0 || p.block_tokens != k.dim(2))
      bad(who, n + ": block_tokens " + std::to_string(p.block_tokens) +
                   " must be > 0 and equal k_pages.dim(2) (" + std::to_string(k.dim(2)) + ")");
    if (B > 0 && (p.indptr == nullptr || p.last_page_len == nullptr || p.indices == nullptr))
      bad(who, n + ": indptr, indices and last_page_len must be set");
    if (B > 0 && p.indptr[0] != 0) bad(who, n + ": indptr[0] must be 0");
    const int64_t P = k.dim(0);
    for (int64_t b = 0; b < B; ++b) {
      const std::string where = " (sequence " + std::to_string(b) + ")";
      if (p.indptr[b + 1] < p.indptr[b]) bad(who, n + ": indptr must be non-decreasing" + where);
      const int64_t np = p.indptr[b + 1] - p.indptr[b], last = p.last_page_len[b];
      if (np == 0 ? last != 0 : (last < 1 || last > p.block_tokens))
        bad(who, n + ": last_page_len " + std::to_string(last) + " must be in [1, " +
                     std::to_string(p.block_tokens) + "] (0 without pages)" + where);
      for (int64_t i = p.indptr[b]; i < p.indptr[b + 1]; ++i)
        if (p.indices[i] < 0 || p.indices[i] >= P)
          bad(who, n + ": page id " + std::to_string(p.indices[i]) + " at indices[" +
                       std::to_string(i) + "] is outside [0, " + std::to_string(P) + ")" + where);
    }
  }
  info.k = rows_of(k, pk);
  info.v = rows_of(vv, pk);
  return info;
}

}  // namespace

int64_t SpanInfo::length(int64_t b) const {
  if (!present) return 0;
  return span->kind == KVSpanKind::kPaged ? span->paged.seq_len(b) : span->k.dim(2);
}

void SparsePlan::window_rows(int64_t b, int64_t t, int64_t& lo, int64_t& hi) const {
  if (!window.present) {
    lo = hi = 0;
    return;
  }
  const int64_t p = pos(b, t);
  hi = p + 1 - window.kv_offset;  // rows are positions kv_offset + j
  lo = std::max<int64_t>(hi - W, 0);
}

int64_t SparsePlan::limit(int64_t b, int64_t t) const {
  return entries.present ? (pos(b, t) + 1) / rate_ : 0;
}

SparsePlan check_sparse_attention(const char* who, const TensorView& q, const KVSpan& window,
                                  const KVSpan& entries, std::span<const int64_t> pos,
                                  const SparseAttentionParams& p, const TensorView& out) {
  SparsePlan P;
  if (q.ndim() != 4 || q.dtype() != DType::kF32 || !inner_unit(q) ||
      (q.data() == nullptr && q.numel() > 0))
    bad(who, "q must be f32 [B, H_q, S, D] with a unit innermost stride, got " +
                 std::string(dtype_name(q.dtype())) + " " + shape_of(q));
  P.B = q.dim(0);
  P.Hq = q.dim(1);
  P.S = q.dim(2);
  P.D = q.dim(3);
  if (static_cast<int64_t>(pos.size()) != P.B)
    bad(who,
        "pos has " + std::to_string(pos.size()) + " entries, q has B = " + std::to_string(P.B));
  for (int64_t b = 0; b < P.B; ++b)
    if (pos[static_cast<size_t>(b)] < 0) bad(who, "pos[" + std::to_string(b) + "] is negative");
  if (p.rate < 1) bad(who, "rate must be >= 1, got " + std::to_string(p.rate));
  if (!(p.scale >= 0.0f) || std::isinf(p.scale))
    bad(who, "scale must be finite and >= 0 (0: 1/sqrt(D))");
  P.rate_ = p.rate;
  P.pos_ = pos;
  P.W = p.sliding_window;
  P.window = inspect_span(who, "window", window, P.B);
  P.entries = inspect_span(who, "entries", entries, P.B);
  const SpanInfo* any = P.window.present ? &P.window : P.entries.present ? &P.entries : nullptr;
  P.Hkv = any ? any->heads : 1;
  P.Dv = any ? any->dv : out.dim(3);
  for (const SpanInfo* s : {&P.window, &P.entries}) {
    if (!s->present) continue;
    const char* n = s == &P.window ? "window" : "entries";
    if (s->heads != P.Hkv || s->dv != P.Dv)
      bad(who, "window and entries must have the same H_kv and D_v");
    if (s->dk != P.D)
      bad(who, std::string(n) + " rows are " + std::to_string(s->dk) + " wide, q's D is " +
                   std::to_string(P.D));
  }
  if (P.Hq % P.Hkv != 0)
    bad(who,
        "H_q " + std::to_string(P.Hq) + " must be a multiple of H_kv " + std::to_string(P.Hkv));
  P.G = P.Hq / P.Hkv;
  require_f32(who, "out", out, Shape{P.B, P.Hq, P.S, P.Dv});
  if (P.window.present && P.W < 1)
    bad(who, "sliding_window must be >= 1 with a window span, got " + std::to_string(P.W));
  for (int64_t b = 0; b < P.B && P.S > 0; ++b) {
    const int64_t first = P.pos(b, 0), last = P.pos(b, P.S - 1);
    const std::string where = " (batch row " + std::to_string(b) + ", queries at positions " +
                              std::to_string(first) + ".." + std::to_string(last) + ")";
    if (P.window.present) {
      const int64_t off = P.window.kv_offset, len = P.window.length(b);
      if (off + len != last + 1)
        bad(who, "the window span holds positions " + std::to_string(off) + ".." +
                     std::to_string(off + len - 1) + ", it must end at the last query" + where);
      if (off > std::max<int64_t>(first - P.W + 1, 0))
        bad(who, "the window span starts at position " + std::to_string(off) +
                     ", after the first query's window (sliding_window " + std::to_string(P.W) +
                     ")" + where);
    }
    if (P.entries.present) {
      if (P.entries.kv_offset != 0) bad(who, "entries.kv_offset must be 0 (entry 0 first)");
      const int64_t len = P.entries.length(b), want = (last + 1) / p.rate;
      if (len != want)
        bad(who, "the entries span holds " + std::to_string(len) +
                     " entries, the last query "
                     "sees (pos + 1) / rate = " +
                     std::to_string(want) + where);
    }
  }
  if (p.selected != nullptr) {
    if (p.top_k < 0) bad(who, "top_k must be >= 0");
    if (!P.entries.present && p.top_k > 0) bad(who, "selected entries but no entries span");
    std::vector<int64_t> seen;  // stamp per entry: the last query that selected it
    for (int64_t b = 0; b < P.B; ++b)
      for (int64_t t = 0; t < P.S; ++t) {
        const int64_t lim = P.limit(b, t), stamp = b * P.S + t;
        if (static_cast<int64_t>(seen.size()) < lim) seen.resize(static_cast<size_t>(lim), -1);
        const int32_t* sel = p.selected + stamp * p.top_k;
        for (int64_t i = 0; i < p.top_k; ++i) {
          const int64_t e = sel[i];
          if (e == -1) continue;
          if (e < 0 || e >= lim)
            bad(who, "selected[" + std::to_string(b) + ", " + std::to_string(t) + ", " +
                         std::to_string(i) + "] = " + std::to_string(e) + " is outside [0, " +
                         std::to_string(lim) + "), the entries visible at position " +
                         std::to_string(P.pos(b, t)) + " (-1: none)");
          if (seen[static_cast<size_t>(e)] == stamp)
            bad(who, "selected[" + std::to_string(b) + ", " + std::to_string(t) + "] lists entry " +
                         std::to_string(e) + " twice");
          seen[static_cast<size_t>(e)] = stamp;
        }
      }
  }
  P.scale = p.scale > 0 ? p.scale : 1.0f / std::sqrt(static_cast<float>(P.D));
  return P;
}

IndexerPlan check_indexer_topk(const char* who, const TensorView& q_index,
                               const TensorView& weights, const KVSpan& keys,
                               std::span<const int64_t> pos, const IndexerParams& params,
                               const int32_t* selected) {
  IndexerPlan P;
  if (q_index.ndim() != 4) bad(who, "q_index must be f32 [B, S, H_I, c], got " + shape_of(q_index));
  P.B = q_index.dim(0);
  P.S = q_index.dim(1);
  P.HI = q_index.dim(2);
  P.C = q_index.dim(3);
  require_f32(who, "q_index", q_index, Shape{P.B, P.S, P.HI, P.C});
  require_f32(who, "weights", weights, Shape{P.B, P.S, P.HI});
  if (static_cast<int64_t>(pos.size()) != P.B)
    bad(who, "pos has " + std::to_string(pos.size()) +
                 " entries, q_index has B = " + std::to_string(P.B));
  for (int64_t b = 0; b < P.B; ++b)
    if (pos[static_cast<size_t>(b)] < 0) bad(who, "pos[" + std::to_string(b) + "] is negative");
  if (params.rate < 1) bad(who, "rate must be >= 1, got " + std::to_string(params.rate));
  if (params.top_k < 0) bad(who, "top_k must be >= 0, got " + std::to_string(params.top_k));
  if (!std::isfinite(params.index_scale)) bad(who, "index_scale must be finite");
  P.pos = pos;
  P.keys = inspect_span(who, "keys", keys, P.B);
  if (P.keys.present) {
    if (P.keys.heads != 1)
      bad(who, "keys must have one head ([B, 1, T, c]), got " + std::to_string(P.keys.heads));
    if (P.keys.dk != P.C)
      bad(who,
          "keys are " + std::to_string(P.keys.dk) + " wide, q_index's c is " + std::to_string(P.C));
    if (P.keys.kv_offset != 0) bad(who, "keys.kv_offset must be 0 (entry 0 first)");
  }
  for (int64_t b = 0; b < P.B && P.S > 0; ++b) {
    const int64_t last = pos[static_cast<size_t>(b)] + P.S - 1;
    const int64_t len = P.keys.length(b), want = (last + 1) / params.rate;
    if (len != want)
      bad(who, "the keys span holds " + std::to_string(len) + " entries for batch row " +
                   std::to_string(b) + ", its last query (position " + std::to_string(last) +
                   ") sees (pos + 1) / rate = " + std::to_string(want));
  }
  if (selected == nullptr && P.B * P.S * params.top_k > 0) bad(who, "selected is null");
  return P;
}

// ---------------------------------------------------------------------------------------------
// Building blocks of the fast kernels: 16-key tiles, transposed (d-major) so a register holds
// 8 keys' products for one head.
namespace {

constexpr int64_t kTile = 16;

// kt[d * kTile + j] = rows[j][d] for j < n, 0 for n <= j < kTile.
void transpose_tile(const float* rows, int64_t n, int64_t D, float* kt) {
  for (int64_t j = 0; j < kTile; ++j) {
    if (j < n) {
      const float* r = rows + j * D;
      for (int64_t d = 0; d < D; ++d) kt[d * kTile + j] = r[d];
    } else {
      for (int64_t d = 0; d < D; ++d) kt[d * kTile + j] = 0.0f;
    }
  }
}

// s[h * kTile + j] = q[h * D ..] . kt[., j] for h < G, all kTile lanes.
void tile_scores(const float* q, int64_t G, int64_t D, const float* kt, float* s) {
  int64_t h = 0;
#if KVCACHE_ATTN_AVX512
  // A zmm holds the tile's 16 keys: 8 heads in registers, one load and 8 broadcasts per d.
  for (; h + 8 <= G; h += 8) {
    __m512 a[8];
    for (auto& r : a) r = _mm512_setzero_ps();
    const float* q0 = q + h * D;
    for (int64_t d = 0; d < D; ++d) {
      const __m512 k = _mm512_loadu_ps(kt + d * kTile);
      for (int r = 0; r < 8; ++r) a[r] = _mm512_fmadd_ps(_mm512_set1_ps(q0[r * D + d]), k, a[r]);
    }
    for (int r = 0; r < 8; ++r) _mm512_storeu_ps(s + (h + r) * kTile, a[r]);
  }
#endif
#if KVCACHE_ATTN_AVX2
  for (; h + 4 <= G; h += 4) {
    __m256 a[4][2];
    for (auto& r : a) r[0] = r[1] = _mm256_setzero_ps();
    const float* q0 = q + h * D;
    for (int64_t d = 0; d < D; ++d) {
      const __m256 k0 = _mm256_loadu_ps(kt + d * kTile), k1 = _mm256_loadu_ps(kt + d * kTile + 8);
      for (int r = 0; r < 4; ++r) {
        const __m256 qb = _mm256_broadcast_ss(q0 + r * D + d);
        a[r][0] = _mm256_fmadd_ps(qb, k0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(qb, k1, a[r][1]);
      }
    }
    for (int r = 0; r < 4; ++r) {
      _mm256_storeu_ps(s + (h + r) * kTile, a[r][0]);
      _mm256_storeu_ps(s + (h + r) * kTile + 8, a[r][1]);
    }
  }
#endif
  for (; h < G; ++h) {
    float acc[kTile] = {};
    const float* qr = q + h * D;
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < kTile; ++j) acc[j] = std::fma(qr[d], kt[d * kTile + j], acc[j]);
    std::memcpy(s + h * kTile, acc, sizeof(acc));
  }
}

// acc[h * Dv + d] += sum_{j < n} p[h * kTile + j] * v[j * Dv + d] for h < G.
void tile_pv(const float* p, int64_t G, int64_t n, const float* v, int64_t Dv, float* acc) {
  int64_t h = 0;
#if KVCACHE_ATTN_AVX2
  for (; h + 4 <= G; h += 4) {
    const float* p0 = p + h * kTile;
    float* a0 = acc + h * Dv;
    int64_t d = 0;
#if KVCACHE_ATTN_AVX512
    // 4 heads x 64 columns in 16 registers: 4 loads and 4 broadcasts per 16 FMAs.
    for (; d + 64 <= Dv; d += 64) {
      __m512 a[4][4];
      for (int r = 0; r < 4; ++r)
        for (int i = 0; i < 4; ++i) a[r][i] = _mm512_loadu_ps(a0 + r * Dv + d + 16 * i);
      for (int64_t j = 0; j < n; ++j) {
        __m512 vv[4];
        for (int i = 0; i < 4; ++i) {
          vv[i] = _mm512_loadu_ps(v + j * Dv + d + 16 * i);
          detail::pin(vv[i]);
        }
        detail::pv_step64<4>(p0 + j, kTile, vv, a);
      }
      for (int r = 0; r < 4; ++r)
        for (int i = 0; i < 4; ++i) _mm512_storeu_ps(a0 + r * Dv + d + 16 * i, a[r][i]);
    }
#endif
    for (; d + 16 <= Dv; d += 16) {
      __m256 a[4][2];
      for (int r = 0; r < 4; ++r) {
        a[r][0] = _mm256_loadu_ps(a0 + r * Dv + d);
        a[r][1] = _mm256_loadu_ps(a0 + r * Dv + d + 8);
      }
      for (int64_t j = 0; j < n; ++j) {
        const __m256 v0 = _mm256_loadu_ps(v + j * Dv + d), v1 = _mm256_loadu_ps(v + j * Dv + d + 8);
        for (int r = 0; r < 4; ++r) {
          const __m256 pb = _mm256_broadcast_ss(p0 + r * kTile + j);
          a[r][0] = _mm256_fmadd_ps(pb, v0, a[r][0]);
          a[r][1] = _mm256_fmadd_ps(pb, v1, a[r][1]);
        }
      }
      for (int r = 0; r < 4; ++r) {
        _mm256_storeu_ps(a0 + r * Dv + d, a[r][0]);
        _mm256_storeu_ps(a0 + r * Dv + d + 8, a[r][1]);
      }
    }
    for (; d < Dv; ++d)
      for (int r = 0; r < 4; ++r) {
        float x = a0[r * Dv + d];
        for (int64_t j = 0; j < n; ++j) x = std::fma(p0[r * kTile + j], v[j * Dv + d], x);
        a0[r * Dv + d] = x;
      }
  }
#endif
  for (; h < G; ++h) {
    float* a = acc + h * Dv;
    for (int64_t j = 0; j < n; ++j) {
      const float pj = p[h * kTile + j];
      const float* vr = v + j * Dv;
      for (int64_t d = 0; d < Dv; ++d) a[d] = std::fma(pj, vr[d], a[d]);
    }
  }
}

// One online-softmax step of a head over a tile's n logits in s (overwritten by exp(s - m)):
// the fused kernels' update (the SIMD one, or the skeleton's scalar one on a portable build).
void online_update(float* s, int64_t n, float& m, float& l, float* acc, int64_t Dv) {
#if KVCACHE_ATTN_AVX2
  detail::softmax_update(s, n, m, l, acc, Dv);
#else
  detail::softmax_update_scalar(s, n, m, l, acc, Dv);
#endif
}

// A key of a query's list: its K and V rows and their storage.
struct KeyRow {
  const std::byte* k;
  const std::byte* v;
  DType dtype;
  bool v_is_k;
};

// The key list of query (b, t), KV head hk: window rows, then entries.
struct KeyList {
  const SparsePlan* P;
  int64_t b, t, hk, w_lo, n_window, n_entries;
  const int32_t* sel = nullptr;  // compacted selected entries, or null: entries 0..n_entries
  KeyRow operator[](int64_t i) const {
    if (i < n_window) {
      const SpanInfo& w = P->window;
      return {w.k.row(b, hk, w_lo + i), w.v.row(b, hk, w_lo + i), w.dtype, w.v_is_k};
    }
    const SpanInfo& e = P->entries;
    const int64_t j = sel ? sel[i - n_window] : i - n_window;
    return {e.k.row(b, hk, j), e.v.row(b, hk, j), e.dtype, e.v_is_k};
  }
  int64_t size() const { return n_window + n_entries; }
};

// The running softmax state of the G heads of a group over part of its key list.
struct HeadsState {
  float* m;
  float* l;
  float* acc;  // [G, Dv]
};

// Runs keys [k0, k1) of `keys` for the G heads whose scaled queries are qs ([G, D]).
void attend_part(const SparsePlan& P, const KeyList& keys, int64_t k0, int64_t k1, const float* qs,
                 HeadsState st) {
  const int64_t G = P.G, D = P.D, Dv = P.Dv;
  thread_local std::vector<float> krow, kt, vrow, s;
  krow.resize(static_cast<size_t>(kTile * D));
  kt.resize(static_cast<size_t>(kTile * D));
  vrow.resize(static_cast<size_t>(kTile * Dv));
  s.resize(static_cast<size_t>(G * kTile));
  for (int64_t g = 0; g < G; ++g) {
    st.m[g] = kNegInf;
    st.l[g] = 0.0f;
  }
  std::fill(st.acc, st.acc + G * Dv, 0.0f);
  for (int64_t j0 = k0; j0 < k1; j0 += kTile) {
    const int64_t n = std::min(kTile, k1 - j0);
    bool v_from_k = Dv == D;
    for (int64_t j = 0; j < n; ++j) {
      const KeyRow r = keys[j0 + j];
      convert_n(r.k, r.dtype, krow.data() + j * D, DType::kF32, static_cast<size_t>(D));
      v_from_k = v_from_k && r.v_is_k;
    }
    transpose_tile(krow.data(), n, D, kt.data());
    tile_scores(qs, G, D, kt.data(), s.data());
    for (int64_t g = 0; g < G; ++g)
      online_update(s.data() + g * kTile, n, st.m[g], st.l[g], st.acc + g * Dv, Dv);
    const float* v = krow.data();
    if (!v_from_k) {  // V rows of their own (or a tile mixing K == V rows with others)
      for (int64_t j = 0; j < n; ++j) {
        const KeyRow r = keys[j0 + j];
        convert_n(r.v, r.dtype, vrow.data() + j * Dv, DType::kF32, static_cast<size_t>(Dv));
      }
      v = vrow.data();
    }
    tile_pv(s.data(), G, n, v, Dv, st.acc);
  }
}

// out rows (head h = hk * G + g) from the parts' states and the sinks.
void finish(const SparsePlan& P, const SparseAttentionParams& params, const TensorView& out,
            int64_t b, int64_t t, int64_t hk, const HeadsState* parts, int64_t n_parts) {
  const int64_t G = P.G, Dv = P.Dv;
  for (int64_t g = 0; g < G; ++g) {
    const int64_t h = hk * G + g;
    const float sink = params.sinks ? params.sinks[h] : kNegInf;
    float M = sink;
    for (int64_t i = 0; i < n_parts; ++i) M = std::max(M, parts[i].m[g]);
    float* o = out.ptr_as<float>(b, h, t);
    std::fill(o, o + Dv, 0.0f);
    if (M == kNegInf) continue;  // sees nothing and has no sink
    float L = params.sinks ? std::exp(sink - M) : 0.0f;
    for (int64_t i = 0; i < n_parts; ++i) {
      if (parts[i].m[g] == kNegInf) continue;
      const float f = std::exp(parts[i].m[g] - M);
      L += parts[i].l[g] * f;
      const float* a = parts[i].acc + g * Dv;
      for (int64_t d = 0; d < Dv; ++d) o[d] += f * a[d];
    }
    const float inv = 1.0f / L;
    for (int64_t d = 0; d < Dv; ++d) o[d] *= inv;
  }
}

}  // namespace
}  // namespace detail

void sparse_attention(const TensorView& q, const KVSpan& window, const KVSpan& entries,
                      std::span<const int64_t> pos, const SparseAttentionParams& params,
                      const TensorView& out) {
  using namespace detail;
  const SparsePlan P =
      check_sparse_attention("sparse_attention", q, window, entries, pos, params, out);
  const int64_t G = P.G, D = P.D, Dv = P.Dv;
  const int64_t n_groups = P.B * P.S * P.Hkv;
  if (n_groups == 0 || G == 0) return;
  ThreadPool& pool = default_pool();
  const int64_t threads = pool.n_threads();
  // Longest key list, to decide how far decode splits.
  int64_t max_keys = 0;
  for (int64_t b = 0; b < P.B; ++b)
    for (int64_t t = 0; t < P.S; ++t) {
      int64_t lo = 0, hi = 0;
      P.window_rows(b, t, lo, hi);
      const int64_t ne = params.selected ? params.top_k : P.limit(b, t);
      max_keys = std::max(max_keys, hi - lo + ne);
    }
  // Parts per group: enough tasks for every thread (x4, for balance) when groups are few, but
  // at least 4 tiles per part (the merge costs a pass over G x D_v per part).
  int64_t parts = 1;
  if (n_groups < 2 * threads)
    parts = std::clamp<int64_t>((4 * threads + n_groups - 1) / n_groups, 1,
                                std::max<int64_t>(max_keys / (4 * kTile), 1));
  const int64_t state_floats = G * (Dv + 2);
  thread_local std::vector<float> partials;  // [group, part] states when parts > 1
  if (parts > 1) partials.resize(static_cast<size_t>(n_groups * parts * state_floats));
  float* part_base = partials.data();

  pool.parallel_for(n_groups * parts, [&](int64_t task) {
    const int64_t grp = task / parts, part = task % parts;
    const int64_t hk = grp % P.Hkv, bt = grp / P.Hkv, t = bt % P.S, b = bt / P.S;
    thread_local std::vector<float> qs, own;
    thread_local std::vector<int32_t> sel;
    KeyList keys{&P, b, t, hk, 0, 0, 0, nullptr};
    int64_t lo = 0, hi = 0;
    P.window_rows(b, t, lo, hi);
    keys.w_lo = lo;
    keys.n_window = hi - lo;
    if (params.selected) {
      const int32_t* s = params.selected + (b * P.S + t) * params.top_k;
      sel.clear();
      for (int64_t i = 0; i < params.top_k; ++i)
        if (s[i] >= 0) sel.push_back(s[i]);
      keys.sel = sel.data();
      keys.n_entries = static_cast<int64_t>(sel.size());
    } else {
      keys.n_entries = P.limit(b, t);
    }
    const int64_t nk = keys.size();
    const int64_t k0 = nk * part / parts, k1 = nk * (part + 1) / parts;
    qs.resize(static_cast<size_t>(G * D));
    for (int64_t g = 0; g < G; ++g) {
      const float* qr = q.ptr_as<const float>(b, hk * G + g, t);
      for (int64_t d = 0; d < D; ++d) qs[static_cast<size_t>(g * D + d)] = qr[d] * P.scale;
    }
    float* sbase = nullptr;
    if (parts > 1) {
      sbase = part_base + task * state_floats;
    } else {
      own.resize(static_cast<size_t>(state_floats));
      sbase = own.data();
    }
    const HeadsState st{sbase, sbase + G, sbase + 2 * G};
    attend_part(P, keys, k0, k1, qs.data(), st);
    if (parts == 1) finish(P, params, out, b, t, hk, &st, 1);
  });
  if (parts == 1) return;
  pool.parallel_for(n_groups, [&](int64_t grp) {
    const int64_t hk = grp % P.Hkv, bt = grp / P.Hkv, t = bt % P.S, b = bt / P.S;
    thread_local std::vector<HeadsState> states;
    states.clear();
    for (int64_t i = 0; i < parts; ++i) {
      float* s = part_base + (grp * parts + i) * state_floats;
      states.push_back({s, s + G, s + 2 * G});
    }
    finish(P, params, out, b, t, hk, states.data(), parts);
  });
}

// ---------------------------------------------------------------------------------------------
namespace detail {
namespace {

constexpr int64_t kQueryGroup = 4;   // queries sharing each packed key tile
constexpr int64_t kKeyChunk = 1024;  // keys per scoring task

// scores[s] (s < n <= kTile) of one query: sum_h w[h] relu(q[h] . k_s), times scale (the dot
// products as the attention's tile_scores computes them, into dots: [H, kTile]).
void indexer_tile(const float* q, const float* w, int64_t H, int64_t C, const float* kt,
                  float scale, int64_t n, float* dots, float* scores) {
  tile_scores(q, H, C, kt, dots);
  float out[kTile] = {};
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < kTile; ++j)
      out[j] = std::fma(w[h], std::max(dots[h * kTile + j], 0.0f), out[j]);
  for (int64_t j = 0; j < n; ++j) {
    const float x = out[j] * scale;
    scores[j] = std::isnan(x) ? kNegInf : x;
  }
}

// The top k of scores[0, n) by (-score, index), written to sel[0, k) and -1 past n.
void select_top(const float* scores, int64_t n, int64_t k, int32_t* sel) {
  const int64_t kk = std::min(k, n);
  thread_local std::vector<float> tmp;
  thread_local std::vector<int32_t> idx;
  idx.clear();
  if (kk > 0) {
    tmp.assign(scores, scores + n);
    std::nth_element(tmp.begin(), tmp.begin() + (kk - 1), tmp.end(), std::greater<float>());
    const float thr = tmp[static_cast<size_t>(kk - 1)];
    for (int64_t s = 0; s < n; ++s)
      if (scores[s] > thr) idx.push_back(static_cast<int32_t>(s));
    for (int64_t s = 0; s < n && static_cast<int64_t>(idx.size()) < kk; ++s)
      if (scores[s] == thr) idx.push_back(static_cast<int32_t>(s));
    std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
      return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
    });
  }
  for (int64_t i = 0; i < k; ++i) sel[i] = i < kk ? idx[static_cast<size_t>(i)] : -1;
}

}  // namespace
}  // namespace detail

void indexer_topk(const TensorView& q_index, const TensorView& weights, const KVSpan& keys,
                  std::span<const int64_t> pos, const IndexerParams& params, int32_t* selected) {
  using namespace detail;
  const IndexerPlan P =
      check_indexer_topk("indexer_topk", q_index, weights, keys, pos, params, selected);
  const int64_t B = P.B, S = P.S, H = P.HI, C = P.C, K = params.top_k;
  if (B * S == 0 || K == 0) return;
  int64_t t_max = 0;
  for (int64_t b = 0; b < B; ++b) t_max = std::max(t_max, P.keys.length(b));
  ThreadPool& pool = default_pool();
  // Queries per pass: their scores, [n_q, t_max] f32, stay under 64 MiB.
  const int64_t per_pass = std::max<int64_t>(1, (int64_t{16} << 20) / std::max<int64_t>(t_max, 1));
  thread_local std::vector<float> scores;
  struct Task {
    int64_t b, t0, t1, s0, s1;
  };
  std::vector<Task> tasks;
  for (int64_t q0 = 0; q0 < B * S; q0 += per_pass) {
    const int64_t q1 = std::min(B * S, q0 + per_pass);
    scores.resize(static_cast<size_t>((q1 - q0) * std::max<int64_t>(t_max, 1)));
    float* sc = scores.data();
    tasks.clear();
    for (int64_t qi = q0; qi < q1;) {  // query groups within one batch row, x key chunks
      const int64_t b = qi / S, t0 = qi % S, t1 = std::min({S, t0 + kQueryGroup, t0 + q1 - qi});
      const int64_t lim = P.limit(b, t1 - 1, params.rate);
      for (int64_t s0 = 0; s0 < lim; s0 += kKeyChunk)
        tasks.push_back({b, t0, t1, s0, std::min(lim, s0 + kKeyChunk)});
      qi += t1 - t0;
    }
    pool.parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t i) {
      const Task& tk = tasks[static_cast<size_t>(i)];
      thread_local std::vector<float> krow, kt, dots;
      krow.resize(static_cast<size_t>(kTile * C));
      kt.resize(static_cast<size_t>(kTile * C));
      dots.resize(static_cast<size_t>(kTile * H));
      for (int64_t s0 = tk.s0; s0 < tk.s1; s0 += kTile) {
        const int64_t n = std::min(kTile, tk.s1 - s0);
        for (int64_t j = 0; j < n; ++j)
          convert_n(P.keys.k.row(tk.b, 0, s0 + j), P.keys.dtype, krow.data() + j * C, DType::kF32,
                    static_cast<size_t>(C));
        transpose_tile(krow.data(), n, C, kt.data());
        for (int64_t t = tk.t0; t < tk.t1; ++t) {
          const int64_t lim = P.limit(tk.b, t, params.rate);
          if (s0 >= lim) continue;
          float tile[kTile];
          indexer_tile(q_index.ptr_as<const float>(tk.b, t), weights.ptr_as<const float>(tk.b, t),
                       H, C, kt.data(), params.index_scale, n, dots.data(), tile);
          float* row = sc + (tk.b * S + t - q0) * t_max;
          std::copy(tile, tile + std::min(n, lim - s0), row + s0);
        }
      }
    });
    pool.parallel_for(q1 - q0, [&](int64_t i) {
      const int64_t qi = q0 + i, b = qi / S, t = qi % S;
      select_top(sc + i * t_max, P.limit(b, t, params.rate), K, selected + qi * K);
    });
  }
}

}  // namespace kvcache
