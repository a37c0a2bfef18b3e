// The gated delta rule (recurrent and chunked forms), its gates and the gated RMSNorm; see
// gated_delta.h for the math, the layouts and the tolerance.
#include "kernels/gated_delta.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/attention_simd.h"
#include "kernels/view_checks.h"

namespace kvcache {
namespace {

using view_checks::fail;
using view_checks::require_shape;

// ---- small vector helpers ----

// sum x[i]^2 in float: 8 lanes (then hsum1's tree) where AVX2 is built, sequential otherwise.
float sum_squares(const float* x, int64_t n) {
  int64_t i = 0;
  float s = 0.0f;
#if KVCACHE_ATTN_AVX2
  __m256 acc = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  s = detail::hsum1(acc);
#endif
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

// dst = src * (1 / sqrt(sum src^2 + eps)) * scale (l2), or src * scale: transformers' l2norm
// then `query * scale`, as two float products.
void normalize_row(const float* src, int64_t d, bool l2, float eps, float scale, float* dst) {
  const float inv = l2 ? 1.0f / std::sqrt(sum_squares(src, d) + eps) : 1.0f;
  for (int64_t i = 0; i < d; ++i) dst[i] = (src[i] * inv) * scale;
}

// out[j] = exp(x0 - x[j]) for j < n: the decay factors exp(gc_i - gc_j) of a chunk row.
void exp_diff_row(float x0, const float* x, int64_t n, float* out) {
  int64_t j = 0;
#if KVCACHE_ATTN_AVX2
  const __m256 v0 = _mm256_set1_ps(x0);
  for (; j + 8 <= n; j += 8) {
    _mm256_storeu_ps(out + j, detail::exp256(_mm256_sub_ps(v0, _mm256_loadu_ps(x + j))));
  }
#endif
  for (; j < n; ++j) out[j] = std::exp(x0 - x[j]);
}

// ---- register-tiled product of small matrices (the chunked form) ----

// C = c_scale * C + A B, or c_scale * C - A B (subtract), over rows i < m, columns j < n.
// Each output is one FMA chain over l in order, then combined with C once.
struct SmallGemm {
  int64_t m = 0, n = 0, k = 0;
  const float* a = nullptr;
  int64_t a_row = 0, a_col = 1;  // A(i, l) = a[i * a_row + l * a_col]
  const float* b = nullptr;
  int64_t ldb = 0;  // B(l, j) = b[l * ldb + j]
  float* c = nullptr;
  int64_t ldc = 0;
  float c_scale = 0.0f;  // 0: C is not read
  bool subtract = false;
  // A(i, l) == 0 for l > i: the row tile at i0 (kTileRows rows) sums l < i0 + kTileRows only
  // (the zeros of A above its diagonal inside the tile must be stored).
  bool a_lower = false;
  // Only C(i, j) with j <= i is wanted: the row tile at i0 computes columns j < i0 + kTileRows
  // only (the others of those rows are left as they were, or hold garbage near the diagonal).
  bool c_lower = false;
};

// The common fields; the flags are set by the caller.
SmallGemm gemm_of(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_row, const float* b,
                  int64_t ldb, float* c, int64_t ldc) {
  return SmallGemm{
      .m = m, .n = n, .k = k, .a = a, .a_row = a_row, .b = b, .ldb = ldb, .c = c, .ldc = ldc};
}

constexpr int kTileRows = 6;

#if KVCACHE_ATTN_AVX2
inline __m256i lane_mask(int64_t n) {  // lanes [0, n) set, n clamped to [0, 8]
  const int32_t c = static_cast<int32_t>(std::clamp<int64_t>(n, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Keeps v in a register: GCC folds a vector loaded from memory into every FMA that uses it
// (one load per use; attention_simd.h's pin() for the 512-bit case), so every FMA of the tile
// reloaded its B vector and the loop was bound by loads (perf: the chunked form spent 70% in
// it; pinned, it took ~0.6x the time).
__attribute__((always_inline)) inline void pin(__m256& v) {
  asm("" : "+x"(v));
}

// NR rows x 16 columns at (i0, j0); kTail: columns masked by m0, m1. Six rows: 12 accumulators,
// two B vectors and a broadcast fill 15 of the 16 AVX2 registers.
template <int NR, bool kTail>
void gemm_tile(const SmallGemm& g, int64_t i0, int64_t j0, int64_t kend, __m256i m0, __m256i m1) {
  __m256 acc0[NR], acc1[NR];
  for (int r = 0; r < NR; ++r) acc0[r] = acc1[r] = _mm256_setzero_ps();
  const float* a = g.a + i0 * g.a_row;
  const float* b = g.b + j0;
  for (int64_t l = 0; l < kend; ++l, a += g.a_col, b += g.ldb) {
    __m256 b0 = kTail ? _mm256_maskload_ps(b, m0) : _mm256_loadu_ps(b);
    __m256 b1 = kTail ? _mm256_maskload_ps(b + 8, m1) : _mm256_loadu_ps(b + 8);
    pin(b0);
    pin(b1);
    for (int r = 0; r < NR; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + r * g.a_row);
      acc0[r] = _mm256_fmadd_ps(ar, b0, acc0[r]);
      acc1[r] = _mm256_fmadd_ps(ar, b1, acc1[r]);
    }
  }
  const __m256 cs = _mm256_set1_ps(g.c_scale);
  for (int r = 0; r < NR; ++r) {
    float* c = g.c + (i0 + r) * g.ldc + j0;
    __m256 c0 = _mm256_setzero_ps(), c1 = _mm256_setzero_ps();
    if (g.c_scale != 0.0f) {
      c0 = _mm256_mul_ps(kTail ? _mm256_maskload_ps(c, m0) : _mm256_loadu_ps(c), cs);
      c1 = _mm256_mul_ps(kTail ? _mm256_maskload_ps(c + 8, m1) : _mm256_loadu_ps(c + 8), cs);
    }
    c0 = g.subtract ? _mm256_sub_ps(c0, acc0[r]) : _mm256_add_ps(c0, acc0[r]);
    c1 = g.subtract ? _mm256_sub_ps(c1, acc1[r]) : _mm256_add_ps(c1, acc1[r]);
    if (kTail) {
      _mm256_maskstore_ps(c, m0, c0);
      _mm256_maskstore_ps(c + 8, m1, c1);
    } else {
      _mm256_storeu_ps(c, c0);
      _mm256_storeu_ps(c + 8, c1);
    }
  }
}

template <bool kTail>
void gemm_tile_rows(int nr, const SmallGemm& g, int64_t i0, int64_t j0, int64_t kend, __m256i m0,
                    __m256i m1) {
  switch (nr) {
    case 1:
      gemm_tile<1, kTail>(g, i0, j0, kend, m0, m1);
      break;
    case 2:
      gemm_tile<2, kTail>(g, i0, j0, kend, m0, m1);
      break;
    case 3:
      gemm_tile<3, kTail>(g, i0, j0, kend, m0, m1);
      break;
    case 4:
      gemm_tile<4, kTail>(g, i0, j0, kend, m0, m1);
      break;
    case 5:
      gemm_tile<5, kTail>(g, i0, j0, kend, m0, m1);
      break;
    default:
      gemm_tile<6, kTail>(g, i0, j0, kend, m0, m1);
      break;
  }
}
#endif

void small_gemm(const SmallGemm& g) {
#if KVCACHE_ATTN_AVX2
  // Column strips outer: a strip of B (16 columns x k rows) stays in L1 while every row tile
  // of A streams past it.
  const int64_t n_max = g.n;
  const __m256i all = _mm256_set1_epi32(-1);
  for (int64_t j0 = 0; j0 < n_max; j0 += 16) {
    for (int64_t i0 = 0; i0 < g.m; i0 += kTileRows) {
      const int nr = static_cast<int>(std::min<int64_t>(kTileRows, g.m - i0));
      const int64_t kend = g.a_lower ? std::min(g.k, i0 + nr) : g.k;
      const int64_t nend = g.c_lower ? std::min(g.n, i0 + nr) : g.n;
      if (j0 >= nend) continue;
      if (j0 + 16 <= nend) {
        gemm_tile_rows<false>(nr, g, i0, j0, kend, all, all);
      } else {
        gemm_tile_rows<true>(nr, g, i0, j0, kend, lane_mask(nend - j0), lane_mask(nend - j0 - 8));
      }
    }
  }
#else
  for (int64_t i = 0; i < g.m; ++i) {
    const int64_t i0 = i - i % kTileRows;
    const int64_t kend = g.a_lower ? std::min(g.k, i0 + kTileRows) : g.k;
    const int64_t nend = g.c_lower ? std::min(g.n, i0 + kTileRows) : g.n;
    for (int64_t j = 0; j < nend; ++j) {
      float acc = 0.0f;
      for (int64_t l = 0; l < kend; ++l) acc += g.a[i * g.a_row + l * g.a_col] * g.b[l * g.ldb + j];
      float& c = g.c[i * g.ldc + j];
      const float c0 = g.c_scale != 0.0f ? c * g.c_scale : 0.0f;
      c = g.subtract ? c0 - acc : c0 + acc;
    }
  }
#endif
}

// ---- per-call geometry and scratch ----

struct Geometry {
  int64_t T, Hk, Hv, dk, dv, group;
  float scale;
};

Geometry geometry_of(const GatedDeltaParams& p) {
  Geometry g{};
  g.T = p.q.dim(0);
  g.Hk = p.q.dim(1);
  g.dk = p.q.dim(2);
  g.Hv = p.v.dim(1);
  g.dv = p.v.dim(2);
  g.group = g.Hv / g.Hk;
  g.scale = p.scale > 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(g.dk));
  return g;
}

// Per-thread scratch, grown on demand (a decode step allocates nothing after the first).
float* scratch(size_t n) {
  thread_local std::vector<float> buf;
  if (buf.size() < n) buf.resize(n);
  return buf.data();
}

inline const float* row_of(const TensorView& t, int64_t i0, int64_t i1) {
  return t.data_as<const float>() + i0 * t.stride(0) + i1 * t.stride(1);
}
inline float* mut_row_of(const TensorView& t, int64_t i0, int64_t i1) {
  return t.data_as<float>() + i0 * t.stride(0) + i1 * t.stride(1);
}
inline float at2(const TensorView& t, int64_t i0, int64_t i1) {
  return *row_of(t, i0, i1);
}

// Normalises the q and k rows of tokens [t0, t0 + n) of key head hk into qn, kn ([n, dk]).
void normalize_qk(const GatedDeltaParams& p, const Geometry& geo, int64_t hk, int64_t t0, int64_t n,
                  float* qn, float* kn) {
  for (int64_t t = 0; t < n; ++t) {
    normalize_row(row_of(p.q, t0 + t, hk), geo.dk, p.qk_l2norm, p.l2norm_eps, geo.scale,
                  qn + t * geo.dk);
    normalize_row(row_of(p.k, t0 + t, hk), geo.dk, p.qk_l2norm, p.l2norm_eps, 1.0f,
                  kn + t * geo.dk);
  }
}

// ---- recurrent form ----

constexpr int64_t kRecTokenBlock = 64;  // tokens normalised at once per head
constexpr int64_t kStrip = 32;          // state columns kept in L1 across a token block

// One strip of columns [j0, j0 + w) of head h over tokens [t0, t0 + n) (q, k normalised).
// Per token: kv = S^T k (two accumulator sets, even and odd rows: twice the FMA chains), then
// delta = (v - decay kv) beta, S = decay S + k delta^T and o = S^T q in one pass. The decay is
// applied to k^T S instead of S first (the same value in exact arithmetic; one pass less).
#if KVCACHE_ATTN_AVX2
template <bool kTail>
void recurrent_strip(const GatedDeltaParams& p, const Geometry& geo, int64_t h, int64_t t0,
                     int64_t n, const float* qn, const float* kn, float* S, int64_t lds, int64_t j0,
                     int64_t w) {
  constexpr int NV = kStrip / 8;
  __m256i mask[NV];
  for (int r = 0; r < NV; ++r) mask[r] = lane_mask(w - 8 * r);
  auto load = [&](const float* x, int r) {
    return kTail ? _mm256_maskload_ps(x + 8 * r, mask[r]) : _mm256_loadu_ps(x + 8 * r);
  };
  auto store = [&](float* x, int r, __m256 v) {
    if (kTail) {
      _mm256_maskstore_ps(x + 8 * r, mask[r], v);
    } else {
      _mm256_storeu_ps(x + 8 * r, v);
    }
  };
  const int64_t dk = geo.dk;
  for (int64_t t = 0; t < n; ++t) {
    const float* k = kn + t * dk;
    const float* q = qn + t * dk;
    const __m256 decay = _mm256_set1_ps(std::exp(at2(p.g, t0 + t, h)));
    const __m256 beta = _mm256_set1_ps(at2(p.beta, t0 + t, h));
    __m256 a[NV], b[NV];
    for (int r = 0; r < NV; ++r) a[r] = b[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 2 <= dk; i += 2) {
      const __m256 k0 = _mm256_broadcast_ss(k + i), k1 = _mm256_broadcast_ss(k + i + 1);
      const float* s0 = S + i * lds + j0;
      for (int r = 0; r < NV; ++r) {
        a[r] = _mm256_fmadd_ps(k0, load(s0, r), a[r]);
        b[r] = _mm256_fmadd_ps(k1, load(s0 + lds, r), b[r]);
      }
    }
    if (i < dk) {
      const __m256 k0 = _mm256_broadcast_ss(k + i);
      for (int r = 0; r < NV; ++r) a[r] = _mm256_fmadd_ps(k0, load(S + i * lds + j0, r), a[r]);
    }
    const float* v = row_of(p.v, t0 + t, h) + j0;
    __m256 delta[NV], o[NV];
    for (int r = 0; r < NV; ++r) {
      const __m256 kv = _mm256_mul_ps(decay, _mm256_add_ps(a[r], b[r]));
      delta[r] = _mm256_mul_ps(_mm256_sub_ps(load(v, r), kv), beta);
      o[r] = _mm256_setzero_ps();
    }
    for (i = 0; i < dk; ++i) {
      const __m256 ki = _mm256_broadcast_ss(k + i), qi = _mm256_broadcast_ss(q + i);
      float* s = S + i * lds + j0;
      for (int r = 0; r < NV; ++r) {
        const __m256 sn = _mm256_fmadd_ps(ki, delta[r], _mm256_mul_ps(decay, load(s, r)));
        store(s, r, sn);
        o[r] = _mm256_fmadd_ps(qi, sn, o[r]);
      }
    }
    float* out = mut_row_of(p.out, t0 + t, h) + j0;
    for (int r = 0; r < NV; ++r) store(out, r, o[r]);
  }
}
#else
template <bool kTail>
void recurrent_strip(const GatedDeltaParams& p, const Geometry& geo, int64_t h, int64_t t0,
                     int64_t n, const float* qn, const float* kn, float* S, int64_t lds, int64_t j0,
                     int64_t w) {
  const int64_t dk = geo.dk;
  float kv[kStrip], delta[kStrip], o[kStrip];
  for (int64_t t = 0; t < n; ++t) {
    const float* k = kn + t * dk;
    const float* q = qn + t * dk;
    const float decay = std::exp(at2(p.g, t0 + t, h)), beta = at2(p.beta, t0 + t, h);
    std::fill(kv, kv + w, 0.0f);
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < w; ++j) kv[j] += k[i] * S[i * lds + j0 + j];
    const float* v = row_of(p.v, t0 + t, h) + j0;
    for (int64_t j = 0; j < w; ++j) delta[j] = (v[j] - decay * kv[j]) * beta;
    std::fill(o, o + w, 0.0f);
    for (int64_t i = 0; i < dk; ++i) {
      float* s = S + i * lds + j0;
      for (int64_t j = 0; j < w; ++j) {
        s[j] = decay * s[j] + k[i] * delta[j];
        o[j] += q[i] * s[j];
      }
    }
    float* out = mut_row_of(p.out, t0 + t, h) + j0;
    std::copy(o, o + w, out);
  }
}
#endif

void recurrent_head(const GatedDeltaParams& p, const Geometry& geo, int64_t h) {
  const int64_t hk = h / geo.group;
  const int64_t block = std::min(kRecTokenBlock, geo.T);
  float* qn = scratch(static_cast<size_t>(2 * block * geo.dk));
  float* kn = qn + block * geo.dk;
  float* S = p.state.data_as<float>() + h * p.state.stride(0);
  const int64_t lds = p.state.stride(1);
  for (int64_t t0 = 0; t0 < geo.T; t0 += block) {
    const int64_t n = std::min(block, geo.T - t0);
    normalize_qk(p, geo, hk, t0, n, qn, kn);
    for (int64_t j0 = 0; j0 < geo.dv; j0 += kStrip) {
      const int64_t w = std::min(kStrip, geo.dv - j0);
      if (w == kStrip) {
        recurrent_strip<false>(p, geo, h, t0, n, qn, kn, S, lds, j0, w);
      } else {
        recurrent_strip<true>(p, geo, h, t0, n, qn, kn, S, lds, j0, w);
      }
    }
  }
}

// ---- chunked form ----

// One value head over all chunks. Per chunk of L tokens (gc: cumulative log-decay within the
// chunk, D[i][j] = exp(gc_i - gc_j) for j <= i), as torch_chunk_gated_delta_rule:
//   T  = (I + strict_tril(diag(beta) K K^T * D))^-1   (its row-by-row forward substitution)
//   U  = T diag(beta) V,  W = T diag(beta exp(gc)) K
//   V' = U - W S                               (the chunk's values net of what S predicts)
//   O  = diag(exp(gc)) Q S + tril(Q K^T * D) V'
//   S  = exp(gc_last) S + (diag(exp(gc_last - gc)) K)^T V'
// Every exponent is <= 0 when g <= 0, so nothing overflows however strong the decay.
void chunked_head(const GatedDeltaParams& p, const Geometry& geo, int64_t h) {
  const int64_t C = std::min(p.chunk_size, geo.T), dk = geo.dk, dv = geo.dv;
  const int64_t hk = h / geo.group;
  float* base = scratch(static_cast<size_t>(5 * C * dk + 2 * C * dv + 4 * C * C + 2 * C));
  float* qn = base;         // [C, dk]  normalised, scaled q; then exp(gc) q
  float* kn = qn + C * dk;  // [C, dk]  normalised k
  float* kt = kn + C * dk;  // [dk, C]  kn transposed
  float* kb = kt + C * dk;  // [C, dk]  beta exp(gc) k; then exp(gc_last - gc) k
  float* w = kb + C * dk;   // [C, dk]
  float* vb = w + C * dk;   // [C, dv]  beta v
  float* u = vb + C * dv;   // [C, dv]  U, then V'
  float* qk = u + C * dv;   // [C, C]   Q K^T, then tril(Q K^T * D)
  float* kk = qk + C * C;   // [C, C]   K K^T, then -beta K K^T * D (strictly lower)
  float* tm = kk + C * C;   // [C, C]   T
  float* dec = tm + C * C;  // [C, C]   D
  float* gc = dec + C * C;  // [C]
  float* eg = gc + C;       // [C]      exp(gc)
  float* S = p.state.data_as<float>() + h * p.state.stride(0);
  const int64_t lds = p.state.stride(1);

  for (int64_t t0 = 0; t0 < geo.T; t0 += C) {
    const int64_t L = std::min(C, geo.T - t0);
    normalize_qk(p, geo, hk, t0, L, qn, kn);
    for (int64_t t = 0; t < L; ++t)
      for (int64_t i = 0; i < dk; ++i) kt[i * C + t] = kn[t * dk + i];
    float acc = 0.0f;
    for (int64_t t = 0; t < L; ++t) {
      acc += at2(p.g, t0 + t, h);
      gc[t] = acc;
      eg[t] = std::exp(acc);
    }

    SmallGemm qkg = gemm_of(L, L, dk, qn, dk, kt, C, qk, C);  // Q K^T, then K K^T: lower triangles
    qkg.c_lower = true;
    small_gemm(qkg);
    qkg.a = kn;
    qkg.c = kk;
    small_gemm(qkg);

    for (int64_t i = 0; i < L; ++i) {
      float* d = dec + i * C;
      exp_diff_row(gc[i], gc, i + 1, d);
      float* aq = qk + i * C;
      float* ak = kk + i * C;
      for (int64_t j = 0; j <= i; ++j) aq[j] *= d[j];
      for (int64_t j = i + 1; j < L; ++j) aq[j] = 0.0f;
      for (int64_t j = 0; j < i; ++j) ak[j] = -((at2(p.beta, t0 + i, h) * ak[j]) * d[j]);
    }
    // T by transformers' row recurrence: row i = r + sum_{m < i} r[m] T[m, :m], r = row i of
    // -beta K K^T * D; then the unit diagonal.
    for (int64_t i = 0; i < L; ++i) {
      const float* r = kk + i * C;
      float* ti = tm + i * C;
      std::copy(r, r + i, ti);
      for (int64_t m = 1; m < i; ++m) {
        const float rm = r[m];
        const float* tmr = tm + m * C;
        for (int64_t j = 0; j < m; ++j) ti[j] += rm * tmr[j];
      }
      ti[i] = 1.0f;
      std::fill(ti + i + 1, ti + L, 0.0f);
    }

    for (int64_t t = 0; t < L; ++t) {
      const float bt = at2(p.beta, t0 + t, h);
      const float* v = row_of(p.v, t0 + t, h);
      for (int64_t j = 0; j < dv; ++j) vb[t * dv + j] = v[j] * bt;
      for (int64_t i = 0; i < dk; ++i) kb[t * dk + i] = (kn[t * dk + i] * bt) * eg[t];
    }
    SmallGemm tg = gemm_of(L, dv, L, tm, C, vb, dv, u, dv);  // U = T (beta V)
    tg.a_lower = true;
    small_gemm(tg);
    tg.n = dk;  // W = T (beta exp(gc) K)
    tg.b = kb;
    tg.ldb = dk;
    tg.c = w;
    tg.ldc = dk;
    small_gemm(tg);
    SmallGemm ws = gemm_of(L, dv, dk, w, dk, S, lds, u, dv);  // V' = U - W S
    ws.c_scale = 1.0f;
    ws.subtract = true;
    small_gemm(ws);

    for (int64_t t = 0; t < L; ++t)
      for (int64_t i = 0; i < dk; ++i) qn[t * dk + i] *= eg[t];
    SmallGemm qs = gemm_of(L, dv, dk, qn, dk, S, lds, mut_row_of(p.out, t0, h), p.out.stride(0));
    small_gemm(qs);  // O = exp(gc) Q S
    qs.k = L;        // O += tril(Q K^T * D) V'
    qs.a = qk;
    qs.a_row = C;
    qs.a_lower = true;
    qs.b = u;
    qs.ldb = dv;
    qs.c_scale = 1.0f;
    small_gemm(qs);

    for (int64_t t = 0; t < L; ++t) {
      const float f = std::exp(gc[L - 1] - gc[t]);
      for (int64_t i = 0; i < dk; ++i) kb[t * dk + i] = kn[t * dk + i] * f;
    }
    SmallGemm su = gemm_of(dk, dv, L, kb, 1, u, dv, S, lds);  // S = exp(gc_last) S + Kd^T V'
    su.a_col = dk;
    su.c_scale = eg[L - 1];
    small_gemm(su);
  }
}

template <typename HeadFn>
void run_heads(const GatedDeltaParams& p, int64_t Hv, HeadFn&& fn) {
  ThreadPool& pool = p.pool ? *p.pool : default_pool();
  pool.parallel_for(Hv, fn);
}

}  // namespace

void validate_gated_delta(const GatedDeltaParams& p, const char* who) {
  view_checks::require_f32_rows(who, "q", p.q, 3);
  view_checks::require_f32_rows(who, "k", p.k, 3);
  view_checks::require_f32_rows(who, "v", p.v, 3);
  view_checks::require_f32_rows(who, "g", p.g, 2);
  view_checks::require_f32_rows(who, "beta", p.beta, 2);
  view_checks::require_f32_rows(who, "state", p.state, 3);
  view_checks::require_f32_rows(who, "out", p.out, 3);
  const int64_t T = p.q.dim(0), Hk = p.q.dim(1), dk = p.q.dim(2);
  const int64_t Hv = p.v.dim(1), dv = p.v.dim(2);
  if (Hk <= 0 || dk <= 0 || Hv <= 0 || dv <= 0) {
    fail(who, "heads and head dims must be > 0 (q " + p.q.shape().str() + ", v " +
                  p.v.shape().str() + ")");
  }
  require_shape(who, "k", p.k, p.q.shape());
  if (p.v.dim(0) != T) {
    fail(who, "v has " + std::to_string(p.v.dim(0)) + " tokens, q has " + std::to_string(T));
  }
  if (Hv % Hk != 0) {
    fail(who, "H_v (" + std::to_string(Hv) + ", v's heads) must be a multiple of H_k (" +
                  std::to_string(Hk) + ", q's and k's heads)");
  }
  require_shape(who, "g", p.g, Shape{T, Hv});
  require_shape(who, "beta", p.beta, Shape{T, Hv});
  require_shape(who, "state", p.state, Shape{Hv, dk, dv});
  require_shape(who, "out", p.out, Shape{T, Hv, dv});
  if (p.chunk_size <= 0) fail(who, "chunk_size must be > 0, got " + std::to_string(p.chunk_size));
  if (!(p.scale >= 0.0f) || !std::isfinite(p.scale)) fail(who, "scale must be finite and >= 0");
  if (!(p.l2norm_eps >= 0.0f)) fail(who, "l2norm_eps must be >= 0");
}

void gated_delta_recurrent(const GatedDeltaParams& p) {
  validate_gated_delta(p, "gated_delta_recurrent");
  const Geometry geo = geometry_of(p);
  if (geo.T == 0) return;
  run_heads(p, geo.Hv, [&](int64_t h) { recurrent_head(p, geo, h); });
}

void gated_delta_chunked(const GatedDeltaParams& p) {
  validate_gated_delta(p, "gated_delta_chunked");
  const Geometry geo = geometry_of(p);
  if (geo.T == 0) return;
  run_heads(p, geo.Hv, [&](int64_t h) { chunked_head(p, geo, h); });
}

void gated_delta_gates(const GatedDeltaGateParams& p) {
  const char* who = "gated_delta_gates";
  view_checks::require_f32_rows(who, "a", p.a, 2);
  view_checks::require_f32_rows(who, "b", p.b, 2);
  view_checks::require_f32_rows(who, "a_log", p.a_log, 1);
  view_checks::require_f32_rows(who, "dt_bias", p.dt_bias, 1);
  view_checks::require_f32_rows(who, "g", p.g, 2);
  view_checks::require_f32_rows(who, "beta", p.beta, 2);
  const Shape& s = p.a.shape();
  require_shape(who, "b", p.b, s);
  require_shape(who, "g", p.g, s);
  require_shape(who, "beta", p.beta, s);
  require_shape(who, "a_log", p.a_log, Shape{s[1]});
  require_shape(who, "dt_bias", p.dt_bias, Shape{s[1]});
  const float* a_log = p.a_log.data_as<const float>();
  const float* dt_bias = p.dt_bias.data_as<const float>();
  for (int64_t t = 0; t < s[0]; ++t) {
    const float* a = row_of(p.a, t, 0);
    const float* b = row_of(p.b, t, 0);
    float* g = mut_row_of(p.g, t, 0);
    float* beta = mut_row_of(p.beta, t, 0);
    for (int64_t h = 0; h < s[1]; ++h) {
      const float x = a[h] + dt_bias[h];
      const float softplus = x > 20.0f ? x : std::log1p(std::exp(x));  // torch's threshold
      const float bh = b[h];  // read both inputs before writing (outputs may alias them)
      g[h] = -std::exp(a_log[h]) * softplus;
      beta[h] = 1.0f / (1.0f + std::exp(-bh));
    }
  }
}

void rms_norm_gated(const RmsNormGatedParams& p) {
  const char* who = "rms_norm_gated";
  view_checks::require_f32_rows(who, "x", p.x, 3);
  view_checks::require_f32_rows(who, "z", p.z, 3);
  view_checks::require_f32_rows(who, "weight", p.weight, 1);
  view_checks::require_f32_rows(who, "y", p.y, 3);
  const Shape& s = p.x.shape();
  require_shape(who, "z", p.z, s);
  require_shape(who, "y", p.y, s);
  require_shape(who, "weight", p.weight, Shape{s[2]});
  if (!(p.eps >= 0.0f)) fail(who, "eps must be >= 0");
  const int64_t D = s[2];
  const float* w = p.weight.data_as<const float>();
  for (int64_t t = 0; t < s[0]; ++t) {
    for (int64_t h = 0; h < s[1]; ++h) {
      const float* x = row_of(p.x, t, h);
      float* y = mut_row_of(p.y, t, h);
      const float r = 1.0f / std::sqrt(sum_squares(x, D) / static_cast<float>(D) + p.eps);
      for (int64_t j = 0; j < D; ++j) y[j] = w[j] * (x[j] * r);
      // silu(z) * y, swiglu's arithmetic (a float product commutes, so the bits are those of
      // transformers' (w * norm(x)) * silu(z)).
      swiglu(row_of(p.z, t, h), y, y, D);
    }
  }
}

}  // namespace kvcache
