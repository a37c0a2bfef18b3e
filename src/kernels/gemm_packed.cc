#include "kernels/gemm_packed.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "core/prefetch.h"
#include "core/thread_pool.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "core/x86_intrin.h"  // <immintrin.h> without GCC 12's false warnings
#define KVCACHE_GEMM_AVX2 1
#endif

namespace kvcache {

#ifdef KVCACHE_GEMM_AVX2
namespace {

constexpr int kNr = 16;  // W rows per micro-panel: two 8-lane vectors
constexpr int kMr = 6;   // x rows per micro-tile: 6 x 2 accumulators + 2 W vectors + 1 broadcast
constexpr int64_t kBlockM = 96;  // x rows per pass over a micro-panel (which stays in L1)

// Elements [k0, k0 + kc) of W row r as f32 (k0 a multiple of 32 for q8_0's blocks).
void dequantize_segment(const MatmulParams& p, int64_t r, int64_t k0, int64_t kc, float* dst) {
  const auto* row =
      static_cast<const std::byte*>(p.w) + static_cast<size_t>(r) * dtype_bytes(p.w_dtype, p.k);
  dequantize_row(row + dtype_bytes(p.w_dtype, k0), p.w_dtype, dst, kc);
}

// The first 64-byte aligned float at or after p (the micro-kernel loads its panel aligned).
float* align64(float* p) {
  return p + ((64 - reinterpret_cast<uintptr_t>(p) % 64) % 64) / sizeof(float);
}

// o[c][i] = r[i][c]: the 8 x 8 transpose of eight vectors.
inline void transpose8x8(const __m256 (&r)[8], __m256 (&o)[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    const int b = 4 * h;
    s[b + 0] = _mm256_shuffle_ps(t[b + 0], t[b + 2], 0x44);
    s[b + 1] = _mm256_shuffle_ps(t[b + 0], t[b + 2], 0xEE);
    s[b + 2] = _mm256_shuffle_ps(t[b + 1], t[b + 3], 0x44);
    s[b + 3] = _mm256_shuffle_ps(t[b + 1], t[b + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    o[i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x20);
    o[4 + i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x31);
  }
}

// dst[c * 16 + i] = r[i][c]: eight vectors (W rows) become eight k steps of a micro-panel.
inline void transpose_to_panel(const __m256 (&r)[8], float* dst) {
  __m256 o[8];
  transpose8x8(r, o);
  for (int c = 0; c < 8; ++c) _mm256_storeu_ps(dst + c * kNr, o[c]);
}

#if defined(__AVX512F__)
// In place, one stage of a 16 x 16 transpose on two registers: (a, b) become the low and the
// high interleaves of a and b at 32- or 64-bit granularity (zip32, zip64), or the even and
// the odd 128-bit blocks of a then b (zip128).
inline void zip32(__m512& a, __m512& b) {
  const __m512 lo = _mm512_unpacklo_ps(a, b);
  b = _mm512_unpackhi_ps(a, b);
  a = lo;
}
inline void zip64(__m512& a, __m512& b) {
  const __m512d x = _mm512_castps_pd(a), y = _mm512_castps_pd(b);
  a = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
  b = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
}
inline void zip128(__m512& a, __m512& b) {
  const __m512 even = _mm512_shuffle_f32x4(a, b, 0x88);
  b = _mm512_shuffle_f32x4(a, b, 0xDD);
  a = even;
}

// Row i of W (16 elements at at + i * row_bytes) as 16 floats.
template <bool kHalf>
inline __m512 load_w16(const std::byte* at, int64_t row_bytes, int i) {
  const std::byte* src = at + i * row_bytes;
  if constexpr (kHalf) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  } else {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(src));
  }
}

// Sixteen k steps of one micro-panel: dst[c * 16 + i] = W row i (at + i * row_bytes) element c,
// the 16 x 16 transpose in four shuffle stages (32-bit pairs, 64-bit pairs, then 128-bit
// blocks twice) done in place on sixteen named registers. (Not arrays of 16 zmm indexed in
// loops: GCC 12 keeps such arrays on the stack, a store and a reload around every shuffle.)
// The in-place stages leave column c in the register of row c with bits 0 and 1 of c swapped.
template <bool kHalf>
inline void transpose16_to_panel(const std::byte* at, int64_t row_bytes, float* dst) {
  __m512 r0 = load_w16<kHalf>(at, row_bytes, 0), r1 = load_w16<kHalf>(at, row_bytes, 1);
  __m512 r2 = load_w16<kHalf>(at, row_bytes, 2), r3 = load_w16<kHalf>(at, row_bytes, 3);
  __m512 r4 = load_w16<kHalf>(at, row_bytes, 4), r5 = load_w16<kHalf>(at, row_bytes, 5);
  __m512 r6 = load_w16<kHalf>(at, row_bytes, 6), r7 = load_w16<kHalf>(at, row_bytes, 7);
  __m512 r8 = load_w16<kHalf>(at, row_bytes, 8), r9 = load_w16<kHalf>(at, row_bytes, 9);
  __m512 r10 = load_w16<kHalf>(at, row_bytes, 10), r11 = load_w16<kHalf>(at, row_bytes, 11);
  __m512 r12 = load_w16<kHalf>(at, row_bytes, 12), r13 = load_w16<kHalf>(at, row_bytes, 13);
  __m512 r14 = load_w16<kHalf>(at, row_bytes, 14), r15 = load_w16<kHalf>(at, row_bytes, 15);
  zip32(r0, r1), zip32(r2, r3), zip32(r4, r5), zip32(r6, r7);
  zip32(r8, r9), zip32(r10, r11), zip32(r12, r13), zip32(r14, r15);
  zip64(r0, r2), zip64(r1, r3), zip64(r4, r6), zip64(r5, r7);
  zip64(r8, r10), zip64(r9, r11), zip64(r12, r14), zip64(r13, r15);
  zip128(r0, r4), zip128(r2, r6), zip128(r1, r5), zip128(r3, r7);
  zip128(r8, r12), zip128(r10, r14), zip128(r9, r13), zip128(r11, r15);
  zip128(r0, r8), zip128(r2, r10), zip128(r1, r9), zip128(r3, r11);
  zip128(r4, r12), zip128(r6, r14), zip128(r5, r13), zip128(r7, r15);
  const __m512 cols[16] = {r0, r2, r1, r3, r4, r6, r5, r7, r8, r10, r9, r11, r12, r14, r13, r15};
#pragma GCC unroll 16
  for (int c = 0; c < 16; ++c) _mm512_store_ps(dst + c * 16, cols[c]);
}

// One micro-panel (kNr = 16 full rows of f16 (kHalf) or f32 W, kc % 16 == 0) through 16 x 16
// zmm transposes: half the conversions and a third fewer shuffles than two 8 x 8 ymm
// transposes per 16 columns, and each row's next lines are prefetched 128 bytes ahead (the 16
// rows are 16 interleaved streams, 1.5-4 KiB apart, that the hardware prefetcher follows
// poorly).
template <bool kHalf>
void pack_panel_zmm(const MatmulParams& p, int64_t row0, int64_t k0, int64_t kc, float* dst) {
  static_assert(kNr == 16, "one zmm per panel row");
  constexpr int64_t esize = kHalf ? 2 : 4;
  const auto* base = static_cast<const std::byte*>(p.w) + (row0 * p.k + k0) * esize;
  const int64_t row_bytes = p.k * esize;
  for (int64_t kk = 0; kk < kc; kk += kNr) {
    const std::byte* at = base + kk * esize;
    if ((kk * esize) % 64 == 0) {
#pragma GCC unroll 16
      for (int i = 0; i < kNr; ++i) prefetch_l1(at + i * row_bytes + 128);
    }
    transpose16_to_panel<kHalf>(at, row_bytes, dst + kk * kNr);
  }
}
#endif

// Packs W rows [r0, r0 + rows) x k [k0, k0 + kc) as micro-panels of kNr rows:
// panel[(s * kc + kk) * kNr + c] = W[r0 + s * kNr + c][k0 + kk]; rows past the end are zero.
void pack_block(const MatmulParams& p, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                float* panel, float* tmp) {
  for (int64_t s0 = 0; s0 < rows; s0 += kNr) {
    const int64_t nr = std::min<int64_t>(kNr, rows - s0);
#if defined(__AVX512F__)
    if ((p.w_dtype == DType::kF16 || p.w_dtype == DType::kF32) && nr == kNr && kc % kNr == 0) {
      float* dst = panel + (s0 / kNr) * kc * kNr;
      if (p.w_dtype == DType::kF16) {
        pack_panel_zmm<true>(p, r0 + s0, k0, kc, dst);
      } else {
        pack_panel_zmm<false>(p, r0 + s0, k0, kc, dst);
      }
      continue;
    }
#endif
    if ((p.w_dtype == DType::kF16 || p.w_dtype == DType::kF32) && nr == kNr && kc % 8 == 0) {
      // f16 rows widened in registers (f32 rows loaded) and transposed straight into the panel.
      float* dst = panel + (s0 / kNr) * kc * kNr;
      const int64_t first = (r0 + s0) * p.k + k0;
      for (int64_t kk = 0; kk < kc; kk += 8) {
        for (int h = 0; h < 2; ++h) {
          __m256 r[8];
          for (int i = 0; i < 8; ++i) {
            const int64_t at = first + (8 * h + i) * p.k + kk;
            r[i] = p.w_dtype == DType::kF16
                       ? _mm256_cvtph_ps(_mm_loadu_si128(
                             reinterpret_cast<const __m128i*>(static_cast<const f16_t*>(p.w) + at)))
                       : _mm256_loadu_ps(static_cast<const float*>(p.w) + at);
          }
          transpose_to_panel(r, dst + kk * kNr + 8 * h);
        }
      }
      continue;
    }
    for (int64_t c = 0; c < kNr; ++c) {
      float* t = tmp + c * kc;
      if (c < nr) {
        dequantize_segment(p, r0 + s0 + c, k0, kc, t);
      } else {
        std::fill(t, t + kc, 0.0f);
      }
    }
    float* dst = panel + (s0 / kNr) * kc * kNr;
    int64_t kk = 0;
    for (; kk + 8 <= kc; kk += 8) {
      for (int h = 0; h < 2; ++h) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(tmp + (8 * h + i) * kc + kk);
        transpose_to_panel(r, dst + kk * kNr + 8 * h);
      }
    }
    for (; kk < kc; ++kk)
      for (int c = 0; c < kNr; ++c) dst[kk * kNr + c] = tmp[c * kc + kk];
  }
}

// The micro-kernel's vector: 8 lanes (AVX2: one micro-panel is two of them) or, with AVX-512,
// 16 lanes (one micro-panel per vector, two neighbouring panels per micro-tile).
struct Ymm {
  using V = __m256;
  static constexpr int kLanes = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V loadu(const float* p) { return _mm256_loadu_ps(p); }
  static V load(const float* p) { return _mm256_load_ps(p); }
  static V bcast(const float* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static void storeu(float* p, V x) { _mm256_storeu_ps(p, x); }
};
#if defined(__AVX512F__)
struct Zmm {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V loadu(const float* p) { return _mm512_loadu_ps(p); }
  static V load(const float* p) { return _mm512_load_ps(p); }
  static V bcast(const float* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static void storeu(float* p, V x) { _mm512_storeu_ps(p, x); }
};
#endif

// y[MR x 2 * lanes] (row stride ldy) = (accumulate ? y : 0) + a · [b0 | b1] over kc steps, where
// a[kk * 6 + i] is x row i at column kk (a packed tile of x) and b0 / b1 advance one micro-panel
// step (kNr floats) per k: the two halves of one panel (Ymm: b0 = panel, b1 = panel + 8) or two
// neighbouring panels (Zmm: 32 W rows, one panel per vector). Every output is the same FMA chain
// over k in the same order either way, so the same bits; a core with full-width 512-bit units
// issues as many 512-bit FMAs per cycle as 256-bit ones, so the zmm tile does the work in half
// the instructions. Twelve named accumulators: with arrays indexed in a loop GCC keeps them on
// the stack, a store per FMA. MR < 6 is the last tile of x: only its real rows are computed
// (each output is the same FMA chain over k whatever MR, so the same bits as a full tile's row).
// Row R of a micro-tile (two accumulators), present when R < MR: load, one k step, store.
template <class W, int R, int MR>
__attribute__((always_inline)) inline void tile_row_load(const float* y, int64_t ldy,
                                                         typename W::V& c0, typename W::V& c1) {
  if constexpr (R < MR) c0 = W::loadu(y + R * ldy), c1 = W::loadu(y + R * ldy + W::kLanes);
}
template <class W, int R, int MR>
__attribute__((always_inline)) inline void tile_row_fma(const float* a, typename W::V b0,
                                                        typename W::V b1, typename W::V& c0,
                                                        typename W::V& c1) {
  if constexpr (R < MR) {
    const typename W::V x = W::bcast(a + R);
    c0 = W::fma(x, b0, c0);
    c1 = W::fma(x, b1, c1);
  }
}
template <class W, int R, int MR>
__attribute__((always_inline)) inline void tile_row_store(float* y, int64_t ldy, typename W::V c0,
                                                          typename W::V c1) {
  if constexpr (R < MR) W::storeu(y + R * ldy, c0), W::storeu(y + R * ldy + W::kLanes, c1);
}
template <class W, int MR>
inline void micro_kernel(const float* a, const float* b0p, const float* b1p, int64_t kc, float* y,
                         int64_t ldy, bool accumulate) {
  static_assert(MR >= 1 && MR <= kMr);
  using V = typename W::V;
  V c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
  c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = W::zero();
  if (accumulate) {
    tile_row_load<W, 0, MR>(y, ldy, c00, c01);
    tile_row_load<W, 1, MR>(y, ldy, c10, c11);
    tile_row_load<W, 2, MR>(y, ldy, c20, c21);
    tile_row_load<W, 3, MR>(y, ldy, c30, c31);
    tile_row_load<W, 4, MR>(y, ldy, c40, c41);
    tile_row_load<W, 5, MR>(y, ldy, c50, c51);
  }
  for (int64_t kk = 0; kk < kc; ++kk, a += kMr, b0p += kNr, b1p += kNr) {
    const V b0 = W::load(b0p), b1 = W::load(b1p);
    tile_row_fma<W, 0, MR>(a, b0, b1, c00, c01);
    tile_row_fma<W, 1, MR>(a, b0, b1, c10, c11);
    tile_row_fma<W, 2, MR>(a, b0, b1, c20, c21);
    tile_row_fma<W, 3, MR>(a, b0, b1, c30, c31);
    tile_row_fma<W, 4, MR>(a, b0, b1, c40, c41);
    tile_row_fma<W, 5, MR>(a, b0, b1, c50, c51);
  }
  tile_row_store<W, 0, MR>(y, ldy, c00, c01);
  tile_row_store<W, 1, MR>(y, ldy, c10, c11);
  tile_row_store<W, 2, MR>(y, ldy, c20, c21);
  tile_row_store<W, 3, MR>(y, ldy, c30, c31);
  tile_row_store<W, 4, MR>(y, ldy, c40, c41);
  tile_row_store<W, 5, MR>(y, ldy, c50, c51);
}
// A micro-tile of mr (1-6) real rows straight into y: a last tile of x gets a kernel of its own
// height rather than the 6-row kernel's FMAs on zero rows.
template <class W>
inline void micro_tile(int mr, const float* a, const float* b0p, const float* b1p, int64_t kc,
                       float* y, int64_t ldy, bool accumulate) {
  switch (mr) {
    case 1:
      micro_kernel<W, 1>(a, b0p, b1p, kc, y, ldy, accumulate);
      break;
    case 2:
      micro_kernel<W, 2>(a, b0p, b1p, kc, y, ldy, accumulate);
      break;
    case 3:
      micro_kernel<W, 3>(a, b0p, b1p, kc, y, ldy, accumulate);
      break;
    case 4:
      micro_kernel<W, 4>(a, b0p, b1p, kc, y, ldy, accumulate);
      break;
    case 5:
      micro_kernel<W, 5>(a, b0p, b1p, kc, y, ldy, accumulate);
      break;
    default:
      micro_kernel<W, 6>(a, b0p, b1p, kc, y, ldy, accumulate);
      break;
  }
}
#if defined(__AVX512F__)
constexpr bool kPanelPairs = true;
#else
constexpr bool kPanelPairs = false;
#endif

// x rows [m0, m1) x k [k0, k0 + kc) as tiles of kMr rows: a[(t * kc + kk) * kMr + i] =
// x[m0 + t * kMr + i][k0 + kk]. Unpacked, a tile's rows sit ldx apart — 8 KiB for K = 2,048, the
// same L1 and L2 sets for every row — and thrash both caches; packed, a tile is one contiguous
// stream.
void pack_x(const MatmulParams& p, int64_t m0, int64_t m1, int64_t k0, int64_t kc, float* a) {
  for (int64_t t0 = m0; t0 < m1; t0 += kMr) {
    const int64_t mr = std::min<int64_t>(kMr, m1 - t0);
    float* dst = a + (t0 - m0) * kc;
    if (mr == kMr) {
      const float* src[kMr];
      for (int i = 0; i < kMr; ++i) src[i] = p.x + (t0 + i) * p.ldx + k0;
      int64_t kk = 0;
      // Eight k steps at a time: transpose 6 rows (+2 zero rows), store each step's 6 values
      // with an 8-wide store that the next step overwrites; the last one masked to 6 lanes so
      // nothing lands in the next tile (another thread may be packing it).
      const __m256i six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
      for (; kk + 8 <= kc; kk += 8) {
        __m256 r[8], o[8];
        for (int i = 0; i < kMr; ++i) r[i] = _mm256_loadu_ps(src[i] + kk);
        r[6] = r[7] = _mm256_setzero_ps();
        transpose8x8(r, o);
        for (int c = 0; c < 7; ++c) _mm256_storeu_ps(dst + c * kMr, o[c]);
        _mm256_maskstore_ps(dst + 7 * kMr, six, o[7]);
        dst += 8 * kMr;
      }
      for (; kk < kc; ++kk, dst += kMr)
        for (int i = 0; i < kMr; ++i) dst[i] = src[i][kk];
      continue;
    }
    for (int64_t kk = 0; kk < kc; ++kk, dst += kMr)  // the last tile: missing rows are zeros
      for (int64_t i = 0; i < kMr; ++i) dst[i] = i < mr ? p.x[(t0 + i) * p.ldx + k0 + kk] : 0.0f;
  }
}

// n floats of a per-thread buffer, 64-byte aligned (16 floats of slack for the alignment).
float* scratch(std::vector<float>& v, size_t n) {
  if (v.size() < n + 16) v.resize(n + 16);
  return align64(v.data());
}

// W rows [b0, b0 + rows) for every row of x, from x packed by pack_x (chunk k0 at m_pad * k0).
void gemm_block(const MatmulParams& p, const float* a_pack, int64_t m_pad, int64_t b0,
                int64_t rows) {
  thread_local std::vector<float> panel_buf, tmp_buf;
  float* panel = scratch(panel_buf, static_cast<size_t>(kPackRows * kPackK));
  float* tmp = scratch(tmp_buf, static_cast<size_t>(kNr * kPackK));
  alignas(32) float edge[kMr * kNr] = {};  // a micro-tile past the last row of W
  // Rows of x per pass over a micro-panel: at most kBlockM, in equal passes of whole tiles (200
  // rows: 72, 72, 56 rather than 96, 96, 8, whose last pass reloads every panel for a tile).
  const int64_t n_passes = (p.m + kBlockM - 1) / kBlockM;
  const int64_t block_m = ((p.m + n_passes - 1) / n_passes + kMr - 1) / kMr * kMr;
  for (int64_t k0 = 0; k0 < p.k; k0 += kPackK) {
    const int64_t kc = std::min(kPackK, p.k - k0);
    const bool accumulate = k0 > 0;
    const float* a_chunk = a_pack + m_pad * k0;
    pack_block(p, b0, rows, k0, kc, panel, tmp);
    for (int64_t m0 = 0; m0 < p.m; m0 += block_m) {
      const int64_t m1 = std::min(p.m, m0 + block_m);
      for (int64_t s0 = 0; s0 < rows;) {
        const float* sub = panel + (s0 / kNr) * kc * kNr;
        const int64_t nr = std::min<int64_t>(kNr, rows - s0);
        // Two full micro-panels side by side take the 32-column zmm micro-kernel.
        const bool pair = kPanelPairs && rows - s0 >= 2 * kNr;
        for (int64_t i = m0; i < m1; i += kMr) {
          const int mr = static_cast<int>(std::min<int64_t>(kMr, m1 - i));
          const float* a_tile = a_chunk + i * kc;
          float* y = p.y + i * p.ldy + b0 + s0;
          if (accumulate && i + kMr < m1) {  // the next tile's y rows, for its accumulate loads
            for (int r = 0; r < kMr; ++r) prefetch_l1(y + (kMr + r) * p.ldy);
          }
#if defined(__AVX512F__)
          if (pair) {
            micro_tile<Zmm>(mr, a_tile, sub, sub + kc * kNr, kc, y, p.ldy, accumulate);
            continue;
          }
#endif
          if (nr == kNr) {
            micro_tile<Ymm>(mr, a_tile, sub, sub + 8, kc, y, p.ldy, accumulate);
            continue;
          }
          for (int r = 0; r < mr; ++r)
            for (int64_t c = 0; c < nr; ++c)
              edge[r * kNr + c] = accumulate ? y[r * p.ldy + c] : 0.0f;
          micro_kernel<Ymm, kMr>(a_tile, sub, sub + 8, kc, edge, kNr, accumulate);
          for (int r = 0; r < mr; ++r)
            for (int64_t c = 0; c < nr; ++c) y[r * p.ldy + c] = edge[r * kNr + c];
        }
        s0 += pair ? 2 * kNr : kNr;
      }
    }
  }
  if (p.bias != nullptr) {
    for (int64_t i = 0; i < p.m; ++i)
      for (int64_t r = b0; r < b0 + rows; ++r) p.y[i * p.ldy + r] += p.bias[r];
  }
}

}  // namespace

bool gemm_packed_available() {
  return true;
}

void gemm_packed(std::span<const MatmulParams> group, ThreadPool* pool) {
  KV_CHECK(!group.empty() && group.size() <= kMaxMatmulGroup,
           "gemm_packed: 1 to kMaxMatmulGroup products");
  const MatmulParams& p = group[0];
  for (const MatmulParams& g : group) {
    KV_CHECK(g.x == p.x && g.ldx == p.ldx && g.m == p.m && g.k == p.k,
             "gemm_packed: a group must share x");
    KV_CHECK(g.k % dtype_info(g.w_dtype).block_elems == 0,
             "gemm_packed: the row length must be whole blocks of the weight type");
  }
  // x is packed once per call, shared by every product and task (the caller's buffer: the
  // pool's workers only read it while the caller waits in parallel_for).
  thread_local std::vector<float> a_buf;
  const int64_t m_tiles = (p.m + kMr - 1) / kMr, m_pad = m_tiles * kMr;
  static_assert(kMr == 6, "gemm_packed_scratch_floats pads rows to 6");
  const size_t need = gemm_packed_scratch_floats(p.m, p.k);
  float* a_pack = p.pack_scratch != nullptr && p.pack_scratch_floats >= need
                      ? align64(p.pack_scratch)
                      : scratch(a_buf, need - 16);
  const int64_t n_chunks = (p.k + kPackK - 1) / kPackK;
  constexpr int64_t kPackTiles = 16;  // tiles of x per packing task
  const int64_t tile_groups = (m_tiles + kPackTiles - 1) / kPackTiles;
  auto pack = [&](int64_t t) {
    const int64_t k0 = (t % n_chunks) * kPackK, kc = std::min(kPackK, p.k - k0);
    const int64_t m0 = (t / n_chunks) * kPackTiles * kMr, m1 = std::min(p.m, m0 + kPackTiles * kMr);
    pack_x(p, m0, m1, k0, kc, a_pack + m_pad * k0 + m0 * kc);
  };
  // The blocks of every product in one loop: a layer's Q, K and V (768 + 256 + 256 rows for
  // llama-125m) are 10 blocks to balance over the threads instead of 6, 2 and 2.
  int64_t first_block[kMaxMatmulGroup + 1] = {};
  for (size_t g = 0; g < group.size(); ++g)
    first_block[g + 1] = first_block[g] + (group[g].n + kPackRows - 1) / kPackRows;
  auto block = [&](int64_t t) {
    size_t g = 0;
    while (t >= first_block[g + 1]) ++g;
    const int64_t b0 = (t - first_block[g]) * kPackRows;
    gemm_block(group[g], a_pack, m_pad, b0, std::min(kPackRows, group[g].n - b0));
  };
  const int64_t n_blocks = first_block[group.size()];
  if (pool == nullptr || pool->n_threads() <= 1) {
    for (int64_t t = 0; t < n_chunks * tile_groups; ++t) pack(t);
    for (int64_t t = 0; t < n_blocks; ++t) block(t);
    return;
  }
  pool->parallel_for(n_chunks * tile_groups, pack);
  pool->parallel_for(n_blocks, block);
}

#else  // no AVX2: matmul() falls back to OpenBLAS sgemm

bool gemm_packed_available() {
  return false;
}

void gemm_packed(std::span<const MatmulParams>, ThreadPool*) {
  KV_CHECK(false, "gemm_packed: this build has no AVX2/FMA/F16C");
}

#endif

}  // namespace kvcache
