// The "fused" / "flex" attention kernel: online softmax over 64-key tiles of K/V read in place
// (FlashAttention-2's recurrence, Dao 2023: running max m, denominator l, unnormalised
// accumulator acc, rescaled by exp(m_old - m_new) when the max grows), never an S x S buffer.
//
// Work decomposition (the attention skeleton's, attention_skeleton.h, shared with the quantized
// kernel; this file holds the 64-key tile geometry, the logits and P.V of a tile and the decode
// prefetch, FusedTiles). A task is (batch b, kv head hk, query tile, kv split). Its rows are the
// G = H_q / H_kv query heads of the group times the tile's query positions, so every K/V tile
// is loaded once per group and reused by all G heads (GQA without repeat_kv). Decode has one
// query position, so B x H_kv tasks may leave threads idle; the key range is then split into
// partitions whose partial (m, l, acc) states are merged afterwards (flash-decoding, Dao et
// al. 2023). Tiles are classified per row from the mask's key intervals: empty tiles are
// skipped, full tiles are not masked, only partial tiles pay for the mask. Tasks of many rows
// (prefill) transpose each K tile once and widen each V tile once to f32, so the score and P.V
// loops run as small GEMMs shared by all rows (SimdOps::scores_t, pv_f32).
//
// Determinism: the score of a (row, key) pair, the softmax update and the P.V accumulation use
// the same arithmetic order whatever the row/key blocking, and tiles are aligned to absolute
// key indices, so a decode row equals the prefill's row bit for bit when no split is made,
// and a paged call equals the dense call on the same keys bit for bit (runs of rows within a
// page change where keys come from, never the order of the arithmetic).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/prefetch.h"
#include "core/thread_pool.h"
#include "kernels/attention_internal.h"
#include "kernels/attention_simd.h"
#include "kernels/attention_skeleton.h"

namespace kvcache::detail {
namespace {

constexpr int64_t kTk = 64;  // keys per tile (a 64-key f16 tile of D=128 is 16 KiB)
// Target rows (heads x positions) per task. A task packs (transposes, widens) every key tile it
// reads once for all its rows, so more rows per task divide that work; past ~192 rows more do
// not pay, and at 192 the per-thread workspace stays in L2 (s, acc and qs: 48 KiB each at
// D = 64).
constexpr int64_t kRowsPerTask = 192;
constexpr int64_t kMinTransposedRows = 8;  // rows per task from which key tiles are transposed
// Rows per register block of the transposed score kernel (x 16 keys: 10 accumulators). Not 6
// rows (12 accumulators): the lane tree keeps 3 partial sums per accumulator, which spill
// either way, and 6-row blocks spill more of them. With AVX-512: 4 rows x 32 keys (two zmm
// registers per row), see SimdOps::score_t_block16.
constexpr int64_t kScoreRows = KVCACHE_ATTN_AVX512 ? 4 : 5;
// What the transposed (many-row) score path prefetches while it packs a tile's keys: this
// tile's V rows, and the K rows one tile (kTk keys) ahead.
struct Prefetch {
  const std::byte* v = nullptr;  // V row 0 of the current run
  int64_t vstride = 0, v_row_bytes = 0;
  const std::byte* k_next = nullptr;  // K row of key (run start + kTk), null past the end
  int64_t kstride = 0, k_row_bytes = 0;
};

// Decode prefetch. A decode task reads a tile of K rows (the logits), then the tile's V rows
// (P.V), then the next tile's K rows... (the skeleton's for_each_tile). The score loop and P.V's
// first column pass each prefetch, into L1, the row kAheadKeys ahead of the one they reach,
// continuing into what the kernel reads next (`then`). Short on purpose: an L1 miss, load or
// software prefetch alike, holds one of the core's few line fill buffers until its line
// arrives, so lines prefetched into L1 far ahead would hold them for a full DRAM latency and
// starve the demand loads. The stream the loop does not read stays in flight through `far`:
// at row j the loop also prefetches, into L2, row j of the rows the kernel reads one stream
// later (the score loop: the same keys' V rows; P.V: the next tile's K rows), so both K and V
// are requested at the pace of the compute, a tile (8-16 KiB) ahead of their use. (Decode used
// to interleave P.V and the next tile's logits 2 KiB at a time to keep both streams moving; the
// far prefetch does that without the extra calls and accumulator reloads: architecture.md,
// "Speed against the machine's limits".)
constexpr int64_t kAheadKeys = 4;

// Rows of K or V in memory: row 0, the stride, how many, the bytes of a row.
struct RowRun {
  const std::byte* p = nullptr;
  int64_t stride = 0, n = 0, row_bytes = 0;
  // Rows [r, r + nk) as one range of bytes when they are contiguous rows of `bytes`, else null.
  const std::byte* range(int64_t r, int64_t nk, int64_t bytes) const {
    return r + nk <= n && stride == bytes && row_bytes == bytes ? p + r * bytes : nullptr;
  }
};

struct StreamAhead {
  RowRun cur;   // what the loop reads
  RowRun then;  // what the kernel reads after it (n = 0: nothing)
  RowRun far;   // what it reads a stream later, from row 0 (n = 0: nothing)
  // The loop reads row j now.
  void at(int64_t j) const {
    const int64_t r = j + kAheadKeys;
    if (const std::byte* p = row(r)) lines(p, r < cur.n ? cur.row_bytes : then.row_bytes);
    if (j < far.n) lines(far.p + j * far.stride, far.row_bytes, /*l2=*/true);
  }
  // Row r of the stream (past cur.n: of `then`), or null past both.
  const std::byte* row(int64_t r) const {
    if (r < cur.n) return cur.p + r * cur.stride;
    return r - cur.n < then.n ? then.p + (r - cur.n) * then.stride : nullptr;
  }
  static void lines(const std::byte* p, int64_t bytes, bool l2 = false) {
    for (int64_t off = 0; off < bytes; off += 64) l2 ? prefetch_l2(p + off) : prefetch_l1(p + off);
  }
};

// ---------------------------------------------------------------------------------------------
// Scalar building blocks (the portable fallback, and the reference for the SIMD ones).
template <DType KD>
struct ScalarOps {
  using T = typename Elem<KD>::T;
  static constexpr bool kTransposedScores = false;  // no pack_keys_t / scores_t
  static constexpr bool kSimd = false;              // the skeleton's scalar softmax update
  // s[r * kTk + j] = qs_r . k_j for rows [0, R), keys [0, n)
  static void scores(const float* qs, int64_t R, int64_t Dk, const std::byte* kb, int64_t kstride,
                     int64_t n, float* s, const StreamAhead&) {
    for (int64_t j = 0; j < n; ++j) {
      const T* kr = reinterpret_cast<const T*>(kb + j * kstride);
      for (int64_t r = 0; r < R; ++r) {
        const float* qr = qs + r * Dk;
        float acc = 0;
        for (int64_t d = 0; d < Dk; ++d) acc = std::fma(qr[d], Elem<KD>::get(kr[d]), acc);
        s[r * kTk + j] = acc;
      }
    }
  }
  static void softcap(float* s, int64_t n, float c) { softcap_scalar(s, n, c); }
  // acc[r] += sum_j p[r, j] v_j
  static void pv(const float* p, int64_t R, const std::byte* vb, int64_t vstride, int64_t n,
                 int64_t Dv, float* acc, const StreamAhead* = nullptr) {
    for (int64_t j = 0; j < n; ++j) {
      const T* vr = reinterpret_cast<const T*>(vb + j * vstride);
      for (int64_t r = 0; r < R; ++r) {
        const float pj = p[r * kTk + j];
        float* a = acc + r * Dv;
        for (int64_t d = 0; d < Dv; ++d) a[d] = std::fma(pj, Elem<KD>::get(vr[d]), a[d]);
      }
    }
  }
};

#if KVCACHE_ATTN_AVX2
// ---------------------------------------------------------------------------------------------
// AVX2 + FMA + F16C building blocks.
template <DType KD>
struct SimdOps {
  using T = typename Elem<KD>::T;
  static constexpr bool kTransposedScores = true;
  static constexpr bool kSimd = true;

  // NR rows x NK keys of dot products, accumulators held in registers. DC is the head dim when
  // known at compile time (64, 128: unrolled loop, no tail), else 0 and dk is used.
  template <int NR, int NK, int DC>
  static void score_block(const float* qs, int64_t dk, const T* const* kr, float* s) {
    const int64_t Dk = DC ? DC : dk;
    __m256 acc[NR * NK];
    for (int i = 0; i < NR * NK; ++i) acc[i] = _mm256_setzero_ps();
    int64_t d = 0;
#pragma GCC unroll 4
    for (; d + 8 <= Dk; d += 8) {
      __m256 kv[NK];
      for (int c = 0; c < NK; ++c) kv[c] = load8<KD>(kr[c] + d);
      for (int r = 0; r < NR; ++r) {
        __m256 qv = _mm256_loadu_ps(qs + r * Dk + d);
        // Keep q in a register: GCC otherwise folds the load into each of the NK FMAs, and
        // the loop becomes bound by load ports instead of FMA ports.
        if constexpr (NK > 1) asm("" : "+x"(qv));
        for (int c = 0; c < NK; ++c) acc[r * NK + c] = _mm256_fmadd_ps(qv, kv[c], acc[r * NK + c]);
      }
    }
    static_assert(DC % 8 == 0, "compile-time head dims are multiples of 8");
    {
      // Horizontal sums 8 accumulators at a time (hsum8: one transposing reduction with
      // hsum1's tree, so the same bits as 8 hsum1 calls for a third of the shuffles). 4 x 3
      // blocks: one hsum8 and one hsum4 instead of 12 reductions.
      constexpr int kN = NR * NK, kPad = (kN + 7) / 8 * 8;
      alignas(32) float res[kPad];
      // After whole groups of 8, a remainder of 4-7 accumulators takes one hsum4 (4 x 3 = 8 + 4)
      // and 1-3 are reduced one by one (3 x 3 = 8 + 1): cheaper than a padded group of 8, and
      // the same tree, so the same bits.
      constexpr int kWhole = kN / 8 * 8;
      for (int i = 0; i < kWhole; i += 8) _mm256_store_ps(res + i, hsum8(acc + i));
      int i4 = kWhole;
      if constexpr (kN - kWhole >= 4) {
        _mm_store_ps(res + kWhole, hsum4(acc + kWhole));
        i4 += 4;
      }
      for (int i = i4; i < kN; ++i) res[i] = hsum1(acc[i]);
      for (int r = 0; r < NR; ++r)
        for (int c = 0; c < NK; ++c) {
          float x = res[r * NK + c];
          if constexpr (DC == 0)  // DC is 0, 64 or 128: a compile-time dim has no tail
            for (int64_t dd = d; dd < Dk; ++dd)
              x = std::fma(qs[r * Dk + dd], Elem<KD>::get(kr[c][dd]), x);
          s[r * kTk + c] = x;
        }
    }
  }

#if KVCACHE_ATTN_AVX512
  // score_block for a compile-time head dim with keys in pairs: one zmm accumulator holds the
  // 8 lanes of key 2p (lanes 0-7) and of key 2p + 1 (lanes 8-15) against the query's 8
  // elements broadcast to both halves, so every lane sums the same products in the same order
  // as score_block's, and the halves go through the same hsum8 tree: the same bits, half the
  // FMA instructions.
  // l1, l2 (or null): ranges of NK rows of DC elements to prefetch into L1 and L2, spread over
  // the loop's steps.
  template <int NR, int NK, int DC>
  static void score_block_x2(const float* qs, const T* const* kr, float* s,
                             const std::byte* l1 = nullptr, const std::byte* l2 = nullptr) {
    static_assert(NK % 2 == 0 && DC > 0 && DC % 8 == 0 && NR * NK % 8 == 0);
    constexpr int NP = NK / 2;
    constexpr int kStepBytes = NK * 8 * int{sizeof(T)};  // of each range, per step of 8 elements
    __m512 acc[NR * NP];
    for (__m512& a : acc) a = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int d = 0; d < DC; d += 8) {
      if (l1)
        for (int b = 0; b < kStepBytes; b += 64) {
          prefetch_l1(l1 + d / 8 * kStepBytes + b);
          prefetch_l2(l2 + d / 8 * kStepBytes + b);
        }
      __m512 kv[NP];
      for (int p = 0; p < NP; ++p) kv[p] = load8x2<KD>(kr[2 * p] + d, kr[2 * p + 1] + d);
      for (int r = 0; r < NR; ++r) {
        const __m512 qv = _mm512_broadcast_f32x8(_mm256_loadu_ps(qs + r * DC + d));
        for (int p = 0; p < NP; ++p) acc[r * NP + p] = _mm512_fmadd_ps(qv, kv[p], acc[r * NP + p]);
      }
    }
    // The lane sums with hsum8's tree, on zmm registers: acc[i] holds y[2i] | y[2i + 1] (y[r * NK
    // + c]: the 8 lanes of row r, key c). zhadd is _mm256_hadd_ps on both halves at once, so
    // two levels of it turn 4 accumulators into U = [the lane 0-3 and 4-7 partial sums of y[8g],
    // y[8g + 2], y[8g + 4], y[8g + 6] | the same for the odd y], and one add of 128-bit blocks
    // finishes ((x0+x1)+(x2+x3)) + ((x4+x5)+(x6+x7)): the same adds as hsum8, in half the
    // shuffles and without extracting the halves (4 x 8 block: 42 instructions instead of 100).
    static_assert(NR * NP % 4 == 0);
    constexpr int kGroups = NR * NP / 4;
    const auto zhadd = [](__m512 a, __m512 b) {
      return _mm512_add_ps(_mm512_shuffle_ps(a, b, 0x88), _mm512_shuffle_ps(a, b, 0xDD));
    };
    __m512 u[kGroups];
    for (int g = 0; g < kGroups; ++g)
      u[g] = zhadd(zhadd(acc[4 * g], acc[4 * g + 1]), zhadd(acc[4 * g + 2], acc[4 * g + 3]));
    alignas(64) float res[16 * ((kGroups + 1) / 2)];
    for (int g = 0; g < kGroups; g += 2) {
      const __m512 b = u[g + 1 < kGroups ? g + 1 : g];
      _mm512_store_ps(res + 8 * g, _mm512_add_ps(_mm512_shuffle_f32x4(u[g], b, 0x88),
                                                 _mm512_shuffle_f32x4(u[g], b, 0xDD)));
    }
    // res[8 g + 4 e + j] (e = 0: even, 1: odd) is y[8 g + 2 j + e].
    for (int g = 0; g < kGroups; ++g)
      for (int e = 0; e < 2; ++e)
        for (int j = 0; j < 4; ++j) {
          const int y = 8 * g + 2 * j + e;
          s[y / NK * kTk + y % NK] = res[8 * g + 4 * e + j];
        }
  }
#endif

  // Prefetches the bytes [0, row_bytes) of row j (stride `stride`) of a stream into L1.
  static void prefetch_row(const std::byte* base, int64_t stride, int64_t j, int64_t row_bytes) {
    StreamAhead::lines(base + j * stride, row_bytes);
  }

  // Keys per score block for NR rows: as many independent accumulator chains as the 16 ymm
  // registers hold (NR * NK accumulators + NK keys + 1 query). A block's chains are only
  // Dk / 8 FMAs long, so more chains hide the FMA latency and the horizontal-sum epilogue.
  static constexpr int keys_per_block(int NR) {
    return NR >= 3 ? 3 : NR == 2 ? 4 : 6;
  }

  // pf: null, or the stream to prefetch along the keys (see StreamAhead). Without software
  // prefetch the first load of every K row stalls on memory.
  template <int NR, int DC>
  static void score_rows(const float* qs, int64_t Dk, const std::byte* kb, int64_t kstride,
                         int64_t n, float* s, const StreamAhead* pf) {
    constexpr int NK = keys_per_block(NR);
    auto pre = [pf](int64_t j) {
      if (pf) pf->at(j);
    };
    int64_t j = 0;
#if KVCACHE_ATTN_AVX512
    if constexpr (DC != 0) {  // 8 keys per block (16 for one row: 8 accumulator chains)
      constexpr int NK2 = NR == 1 ? 16 : 8;
      for (; j + NK2 <= n; j += NK2) {
        const T* kr[NK2];
        for (int c = 0; c < NK2; ++c) kr[c] = reinterpret_cast<const T*>(kb + (j + c) * kstride);
        // The block's prefetches spread over its steps where both ranges are contiguous rows
        // of DC elements; else issued row by row before it (a run's last rows). Spread, not
        // issued together before the block: against the 8 rows' lines in one burst, 1.18x
        // streaming and 1.16x in cache (`BM_DecodeAttention/f16/16384`, `.../Hot/f16/4096`,
        // medians of 6 alternated runs, Zen 5 VM), and fewer instructions than a test per row.
        constexpr int64_t kRow = DC * int64_t{sizeof(T)};
        const std::byte* l1 = pf ? pf->cur.range(j + kAheadKeys, NK2, kRow) : nullptr;
        const std::byte* l2 = l1 ? pf->far.range(j, NK2, kRow) : nullptr;
        if (!l2) {
          l1 = nullptr;
          for (int c = 0; c < NK2; ++c) pre(j + c);
        }
        score_block_x2<NR, NK2, DC>(qs, kr, s + j, l1, l2);
      }
    }  // the rest (fewer than NK2 keys) as below
#endif
    // Whole blocks of NK keys, but no lone key after them where it can be avoided (decode
    // tiles are 64 keys = 21 x 3 + 1, and a 4 x 1 block runs 4 latency-bound chains plus 4
    // horizontal sums): with a remainder of 1 the last NK + 1 keys go as blocks of 2 (NK = 3:
    // two of them).
    const int64_t rest = n - j;
    const int64_t n_main = NK > 2 && rest % NK == 1 && rest > NK ? n - NK - 1 : n;
    for (; j + NK <= n_main; j += NK) {
      const T* kr[NK];
      for (int c = 0; c < NK; ++c) {
        pre(j + c);
        kr[c] = reinterpret_cast<const T*>(kb + (j + c) * kstride);
      }
      score_block<NR, NK, DC>(qs, Dk, kr, s + j);
    }
    for (; j + 2 <= n; j += 2) {
      const T* kr[2];
      for (int c = 0; c < 2; ++c) {
        pre(j + c);
        kr[c] = reinterpret_cast<const T*>(kb + (j + c) * kstride);
      }
      score_block<NR, 2, DC>(qs, Dk, kr, s + j);
    }
    for (; j < n; ++j) {
      pre(j);
      const T* kr[1] = {reinterpret_cast<const T*>(kb + j * kstride)};
      score_block<NR, 1, DC>(qs, Dk, kr, s + j);
    }
  }

  template <int DC>
  static void scores_d(const float* qs, int64_t R, int64_t Dk, const std::byte* kb, int64_t kstride,
                       int64_t n, float* s, const StreamAhead& pf) {
    // Written out rather than through by_row_blocks: GCC compiles the decode loops (this one
    // and pv below) into slower code through its lambda.
    int64_t r = 0;
    const StreamAhead* p = &pf;  // prefetch during the first row block only
    for (; r + 4 <= R; r += 4, p = nullptr)
      score_rows<4, DC>(qs + r * Dk, Dk, kb, kstride, n, s + r * kTk, p);
    switch (R - r) {
      case 3:
        score_rows<3, DC>(qs + r * Dk, Dk, kb, kstride, n, s + r * kTk, p);
        break;
      case 2:
        score_rows<2, DC>(qs + r * Dk, Dk, kb, kstride, n, s + r * kTk, p);
        break;
      case 1:
        score_rows<1, DC>(qs + r * Dk, Dk, kb, kstride, n, s + r * kTk, p);
        break;
      default:
        break;
    }
  }

  static void scores(const float* qs, int64_t R, int64_t Dk, const std::byte* kb, int64_t kstride,
                     int64_t n, float* s, const StreamAhead& pf) {
    switch (Dk) {  // the common head dims get a fully known loop
      case 64:
        scores_d<64>(qs, R, Dk, kb, kstride, n, s, pf);
        break;
      case 128:
        scores_d<128>(qs, R, Dk, kb, kstride, n, s, pf);
        break;
      default:
        scores_d<0>(qs, R, Dk, kb, kstride, n, s, pf);
    }
  }

  // ---- Scores of many rows (prefill): the tile's keys transposed once, then a GEMM-shaped
  // kernel. The dot-product form above pays a horizontal sum per (row, key) pair — as many
  // shuffle uops as FMAs at D = 64 — which dominates when R rows reuse the same keys. Here
  // K^T [D, kTk] (f32) is built once per tile and shared by all R rows; a block of NR rows x 16
  // keys keeps one accumulator per (row, 8 keys) and broadcasts q elements (sgemm's outer
  // product). Same arithmetic as score_block, bit for bit: score_block's lane l accumulates
  // q[d] k[d] for d = l, l + 8, ... in that order with FMAs from 0, then hsum1 adds the 8
  // lanes as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)). Here "lane" l becomes a pass over
  // d = l, l + 8, ... with per-key accumulators, and the 8 passes are added with the same
  // tree. So a prefill row still equals its decode row, and paged still equals dense.

  // kt[d * kTk + c] = k_c[d] for keys c in [0, n), d in [0, Dk) (Dk % 8 == 0). Also prefetches
  // the V rows of these keys, which pv() reads next.
  static void pack_keys_t(const std::byte* kb, int64_t kstride, int64_t n, int64_t Dk, float* kt,
                          const Prefetch& pf) {
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
      const T* kr[8];
      for (int i = 0; i < 8; ++i) {
        kr[i] = reinterpret_cast<const T*>(kb + (c + i) * kstride);
        prefetch_row(pf.v, pf.vstride, c + i, pf.v_row_bytes);
        if (pf.k_next) prefetch_row(pf.k_next, pf.kstride, c + i, pf.k_row_bytes);
      }
      for (int64_t d = 0; d < Dk; d += 8) {
        // 8 keys x 8 dims -> 8 dims x 8 keys (the usual unpack / shuffle / permute transpose).
        const __m256 r0 = load8<KD>(kr[0] + d), r1 = load8<KD>(kr[1] + d);
        const __m256 r2 = load8<KD>(kr[2] + d), r3 = load8<KD>(kr[3] + d);
        const __m256 r4 = load8<KD>(kr[4] + d), r5 = load8<KD>(kr[5] + d);
        const __m256 r6 = load8<KD>(kr[6] + d), r7 = load8<KD>(kr[7] + d);
        const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
        const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
        const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
        const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
        const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
        const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        float* o = kt + d * kTk + c;
        _mm256_storeu_ps(o + 0 * kTk, _mm256_permute2f128_ps(u0, u4, 0x20));
        _mm256_storeu_ps(o + 1 * kTk, _mm256_permute2f128_ps(u1, u5, 0x20));
        _mm256_storeu_ps(o + 2 * kTk, _mm256_permute2f128_ps(u2, u6, 0x20));
        _mm256_storeu_ps(o + 3 * kTk, _mm256_permute2f128_ps(u3, u7, 0x20));
        _mm256_storeu_ps(o + 4 * kTk, _mm256_permute2f128_ps(u0, u4, 0x31));
        _mm256_storeu_ps(o + 5 * kTk, _mm256_permute2f128_ps(u1, u5, 0x31));
        _mm256_storeu_ps(o + 6 * kTk, _mm256_permute2f128_ps(u2, u6, 0x31));
        _mm256_storeu_ps(o + 7 * kTk, _mm256_permute2f128_ps(u3, u7, 0x31));
      }
    }
    for (; c < n; ++c) {
      prefetch_row(pf.v, pf.vstride, c, pf.v_row_bytes);
      if (pf.k_next) prefetch_row(pf.k_next, pf.kstride, c, pf.k_row_bytes);
      const T* kr = reinterpret_cast<const T*>(kb + c * kstride);
      for (int64_t d = 0; d < Dk; ++d) kt[d * kTk + c] = Elem<KD>::get(kr[d]);
    }
  }

  // Folds pass l's sums into the lane tree ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))
  // (z0..z2 hold the partial sums); after pass 7 the total is in z0 and it returns true.
  template <class V, class Add>
  __attribute__((always_inline)) static bool lane_tree(int l, V a, V& z0, V& z1, V& z2, Add add) {
    switch (l) {
      case 0:
        z0 = a;
        return false;
      case 1:
        z0 = add(z0, a);
        return false;
      case 2:
        z1 = a;
        return false;
      case 3:
        z0 = add(z0, add(z1, a));
        return false;
      case 4:
        z1 = a;
        return false;
      case 5:
        z1 = add(z1, a);
        return false;
      case 6:
        z2 = a;
        return false;
      default:
        z1 = add(z1, add(z2, a));
        z0 = add(z0, z1);
        return true;
    }
  }

  // s[r * kTk + c] for NR rows and the 16 keys at kt + c0 (columns c0 .. c0 + 15 of K^T).
  template <int NR, int DC>
  static void score_t_block(const float* qs, int64_t dk, const float* kt, float* s) {
    const int64_t Dk = DC ? DC : dk;
    __m256 p0[NR][2], p1[NR][2], p2[NR][2];  // partial sums of the lane tree
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      __m256 a[NR][2];
      for (int r = 0; r < NR; ++r) a[r][0] = a[r][1] = _mm256_setzero_ps();
#pragma GCC unroll 16
      for (int64_t d = l; d < Dk; d += 8) {
        const __m256 k0 = _mm256_loadu_ps(kt + d * kTk), k1 = _mm256_loadu_ps(kt + d * kTk + 8);
        for (int r = 0; r < NR; ++r) {
          const __m256 q = _mm256_broadcast_ss(qs + r * Dk + d);
          a[r][0] = _mm256_fmadd_ps(q, k0, a[r][0]);
          a[r][1] = _mm256_fmadd_ps(q, k1, a[r][1]);
        }
      }
      for (int r = 0; r < NR; ++r)
        for (int h = 0; h < 2; ++h)
          if (lane_tree(l, a[r][h], p0[r][h], p1[r][h], p2[r][h],
                        [](__m256 x, __m256 y) { return _mm256_add_ps(x, y); }))
            _mm256_storeu_ps(s + r * kTk + 8 * h, p0[r][h]);
    }
  }

#if KVCACHE_ATTN_AVX512
  // score_t_block with AVX-512: NR rows x NV zmm registers of 16 keys (columns c0 .. c0 + 16 NV
  // - 1 of K^T). Every lane (key) runs the same passes and lane tree as the AVX2 version, so the
  // same bits. Two registers per row halve the broadcasts of q per FMA. To fit 4 rows x 2
  // registers in the 32 registers, the first half's partial sum is parked in the output row
  // after pass 3 and taken back for pass 7.
  template <int NR, int NV, int DC>
  static void score_t_block16(const float* qs, int64_t dk, const float* kt, float* s) {
    const int64_t Dk = DC ? DC : dk;
    const auto add = [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); };
    __m512 z0[NR][NV], z1[NR][NV], z2[NR][NV];  // partial sums of the lane tree
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      __m512 a[NR][NV];
      for (int r = 0; r < NR; ++r)
        for (int h = 0; h < NV; ++h) a[r][h] = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int64_t d = l; d < Dk; d += 8) {
        __m512 k[NV];
        for (int h = 0; h < NV; ++h) {
          k[h] = _mm512_loadu_ps(kt + d * kTk + 16 * h);
          pin(k[h]);  // one load per key vector, not one per row's FMA
        }
        for (int r = 0; r < NR; ++r) {
          const __m512 q = _mm512_set1_ps(qs[r * Dk + d]);
          for (int h = 0; h < NV; ++h) a[r][h] = _mm512_fmadd_ps(q, k[h], a[r][h]);
        }
      }
      for (int r = 0; r < NR; ++r)
        for (int h = 0; h < NV; ++h) {
          float* o = s + r * kTk + 16 * h;
          if (l == 7) z0[r][h] = _mm512_loadu_ps(o);
          if (lane_tree(l, a[r][h], z0[r][h], z1[r][h], z2[r][h], add))
            _mm512_storeu_ps(o, z0[r][h]);
          else if (l == 3)
            _mm512_storeu_ps(o, z0[r][h]);
        }
    }
  }

  // Columns [0, 16 NV) of kt for all R rows.
  template <int NV, int DC>
  static void scores_t_cols16(const float* qs, int64_t R, int64_t Dk, const float* kt, float* s) {
    static_assert(kScoreRows == 4, "by_row_blocks takes 4 rows at a time");
    by_row_blocks(R, [&]<int NR>(int64_t r) {
      score_t_block16<NR, NV, DC>(qs + r * Dk, Dk, kt, s + r * kTk);
    });
  }
#endif

  template <int DC>
  static void scores_t_d(const float* qs, int64_t R, int64_t Dk, const float* kt, int64_t n,
                         float* s) {
#if KVCACHE_ATTN_AVX512
    // 32 keys per block, then 16 for the rest of round16(n).
    const int64_t n16 = (n + 15) / 16 * 16;
    int64_t c0 = 0;
    for (; c0 + 32 <= n16; c0 += 32) scores_t_cols16<2, DC>(qs, R, Dk, kt + c0, s + c0);
    if (c0 < n16) scores_t_cols16<1, DC>(qs, R, Dk, kt + c0, s + c0);
#else
    for (int64_t c = 0; c < n; c += 16) {
      int64_t r = 0;
      for (; r + kScoreRows <= R; r += kScoreRows)
        score_t_block<kScoreRows, DC>(qs + r * Dk, Dk, kt + c, s + r * kTk + c);
      const float* q = qs + r * Dk;
      float* o = s + r * kTk + c;
      switch (R - r) {
        case 4:
          score_t_block<4, DC>(q, Dk, kt + c, o);
          break;
        case 3:
          score_t_block<3, DC>(q, Dk, kt + c, o);
          break;
        case 2:
          score_t_block<2, DC>(q, Dk, kt + c, o);
          break;
        case 1:
          score_t_block<1, DC>(q, Dk, kt + c, o);
          break;
        default:
          break;
      }
    }
#endif
  }

  // Scores of R rows against the n keys packed in kt (columns [n, round16(n)) must be
  // readable; their scores land in s's spare columns and are ignored). Dk % 8 == 0.
  static void scores_t(const float* qs, int64_t R, int64_t Dk, const float* kt, int64_t n,
                       float* s) {
    switch (Dk) {
      case 64:
        scores_t_d<64>(qs, R, Dk, kt, n, s);
        break;
      case 128:
        scores_t_d<128>(qs, R, Dk, kt, n, s);
        break;
      default:
        scores_t_d<0>(qs, R, Dk, kt, n, s);
    }
  }

  // s[j] = c * tanh(s[j] / c) on whole vectors (the row buffer has kTk columns). tanh|t| =
  // (1 - e) / (1 + e) with e = exp(-2|t|); below |t| = 0.125 that difference cancels, so the
  // odd Taylor series t - t^3/3 + 2t^5/15 - 17t^7/315 is used instead (next term < 2e-9 t).
  // Error <= ~3e-7 relative to c * tanh: logits move by far less than the kernels' 1e-5 bound,
  // and a libm tanh per logit would cost more than the dot product that produced it.
  static void softcap(float* s, int64_t n, float c) {
    const __m256 vc = _mm256_set1_ps(c), inv = _mm256_set1_ps(1.0f / c);
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    // Whole vectors up to round8(n) (the row has kTk columns): a logit gets the same formula
    // wherever it sits in its tile, so a decode row still equals the prefill's row.
    for (int64_t j = 0; j < n; j += 8) {
      const __m256 t = _mm256_mul_ps(_mm256_loadu_ps(s + j), inv);
      const __m256 a = _mm256_andnot_ps(sign, t);  // |t|
      const __m256 e = exp256(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
      const __m256 big = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
      const __m256 a2 = _mm256_mul_ps(a, a);
      __m256 p = _mm256_set1_ps(-17.0f / 315);
      p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(2.0f / 15));
      p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1.0f / 3));
      p = _mm256_fmadd_ps(_mm256_mul_ps(p, a2), a, a);
      const __m256 small = _mm256_cmp_ps(a, _mm256_set1_ps(0.125f), _CMP_LT_OQ);
      const __m256 th = _mm256_blendv_ps(big, p, small);
      _mm256_storeu_ps(s + j, _mm256_mul_ps(vc, _mm256_or_ps(th, _mm256_and_ps(t, sign))));
    }
  }

  // NR rows: acc[r, d] += sum_j p[r, j] v_j[d], 16 output columns per pass held in registers.
  // `ahead` (or null) is followed along the keys during the first pass, the one that reads
  // each V row first.
  template <int NR>
  static void pv_rows(const float* p, const std::byte* vb, int64_t vstride, int64_t n, int64_t Dv,
                      float* acc, const StreamAhead* ahead = nullptr) {
    int64_t d = 0;
#if KVCACHE_ATTN_AVX512
    // 64 columns per pass in zmm registers (NR x 4 accumulators): every element takes the same
    // FMAs in the same order as below, so the same bits in half the instructions.
    for (; d + 64 <= Dv; d += 64) {
      __m512 a[NR][4];
      for (int r = 0; r < NR; ++r)
        for (int i = 0; i < 4; ++i) a[r][i] = _mm512_loadu_ps(acc + r * Dv + d + 16 * i);
      for (int64_t j = 0; j < n; ++j) {
        if (ahead) ahead->at(j);
        const T* vr = reinterpret_cast<const T*>(vb + j * vstride) + d;
        __m512 v[4];
        for (int i = 0; i < 4; ++i) {
          v[i] = load16<KD>(vr + 16 * i);
          if constexpr (KD == DType::kF32) pin(v[i]);
        }
        pv_step64<NR>(p + j, kTk, v, a);
      }
      for (int r = 0; r < NR; ++r)
        for (int i = 0; i < 4; ++i) _mm512_storeu_ps(acc + r * Dv + d + 16 * i, a[r][i]);
      ahead = nullptr;
    }
#endif
    for (; d + 16 <= Dv; d += 16) {
      __m256 a[NR][2];
      for (int r = 0; r < NR; ++r) {
        a[r][0] = _mm256_loadu_ps(acc + r * Dv + d);
        a[r][1] = _mm256_loadu_ps(acc + r * Dv + d + 8);
      }
      for (int64_t j = 0; j < n; ++j) {
        if (ahead) ahead->at(j);
        const T* vr = reinterpret_cast<const T*>(vb + j * vstride) + d;
        const __m256 v0 = load8<KD>(vr), v1 = load8<KD>(vr + 8);
        for (int r = 0; r < NR; ++r) {
          const __m256 pj = _mm256_broadcast_ss(p + r * kTk + j);
          a[r][0] = _mm256_fmadd_ps(pj, v0, a[r][0]);
          a[r][1] = _mm256_fmadd_ps(pj, v1, a[r][1]);
        }
      }
      for (int r = 0; r < NR; ++r) {
        _mm256_storeu_ps(acc + r * Dv + d, a[r][0]);
        _mm256_storeu_ps(acc + r * Dv + d + 8, a[r][1]);
      }
      ahead = nullptr;
    }
    if (d + 8 <= Dv) {
      __m256 a[NR];
      for (int r = 0; r < NR; ++r) a[r] = _mm256_loadu_ps(acc + r * Dv + d);
      for (int64_t j = 0; j < n; ++j) {
        const __m256 v0 = load8<KD>(reinterpret_cast<const T*>(vb + j * vstride) + d);
        for (int r = 0; r < NR; ++r)
          a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r * kTk + j), v0, a[r]);
      }
      for (int r = 0; r < NR; ++r) _mm256_storeu_ps(acc + r * Dv + d, a[r]);
      d += 8;
    }
    for (; d < Dv; ++d)
      for (int64_t j = 0; j < n; ++j) {
        const float x = Elem<KD>::get(reinterpret_cast<const T*>(vb + j * vstride)[d]);
        for (int r = 0; r < NR; ++r) acc[r * Dv + d] = std::fma(p[r * kTk + j], x, acc[r * Dv + d]);
      }
  }

  // out[c * Dv + d] = v_c[d] as f32 for rows c in [0, n) (exact). Inline F16C/shift loads, not
  // a convert_n call per row: its dtype dispatch and call stay out of every prefill tile.
  static void widen_rows(const std::byte* vb, int64_t vstride, int64_t n, int64_t Dv, float* out) {
    for (int64_t c = 0; c < n; ++c) {
      const T* vr = reinterpret_cast<const T*>(vb + c * vstride);
      float* o = out + c * Dv;
      int64_t d = 0;
      for (; d + 8 <= Dv; d += 8) _mm256_storeu_ps(o + d, load8<KD>(vr + d));
      for (; d < Dv; ++d) o[d] = Elem<KD>::get(vr[d]);
    }
  }

  // pv() over f32 values (a tile widened once for many rows), 6 rows per register block.
  static void pv_f32(const float* p, int64_t R, const std::byte* vb, int64_t vstride, int64_t n,
                     int64_t Dv, float* acc) {
    int64_t r = 0;
    for (; r + 6 <= R; r += 6)
      SimdOps<DType::kF32>::template pv_rows<6>(p + r * kTk, vb, vstride, n, Dv, acc + r * Dv);
    SimdOps<DType::kF32>::pv(p + r * kTk, R - r, vb, vstride, n, Dv, acc + r * Dv);
  }

  // `ahead`: followed during the first row block only (see pv_rows).
  static void pv(const float* p, int64_t R, const std::byte* vb, int64_t vstride, int64_t n,
                 int64_t Dv, float* acc, const StreamAhead* ahead = nullptr) {
    int64_t r = 0;
    for (; r + 4 <= R; r += 4, ahead = nullptr)
      pv_rows<4>(p + r * kTk, vb, vstride, n, Dv, acc + r * Dv, ahead);
    switch (R - r) {
      case 3:
        pv_rows<3>(p + r * kTk, vb, vstride, n, Dv, acc + r * Dv, ahead);
        break;
      case 2:
        pv_rows<2>(p + r * kTk, vb, vstride, n, Dv, acc + r * Dv, ahead);
        break;
      case 1:
        pv_rows<1>(p + r * kTk, vb, vstride, n, Dv, acc + r * Dv, ahead);
        break;
      default:
        break;
    }
  }
};
#endif  // KVCACHE_ATTN_AVX2

// ---------------------------------------------------------------------------------------------
// The fused kernel in the skeleton (attention_skeleton.h): 64-key tiles aligned to key 0, K/V
// rows dense or through a page table.

constexpr QueryTiling kTiling{kRowsPerTask, true, kScoreRows, kMinTransposedRows};

struct FusedParams {
  TensorView k, v;                 // dense: [B, H_kv, S_kv, D] views
  const PagedKV* paged = nullptr;  // non-null: K/V read through this page table instead
  int64_t Dk = 0, Dv = 0;

  // ---- tile geometry (plan_tasks, for_each_tile) ----
  int64_t n_tiles(const SeqPlan& s) const { return (s.Skv + kTk - 1) / kTk; }
  // A partition of `keys` keys starts on a tile boundary: keys rounded up to whole tiles.
  int64_t tiles_per_split(const SeqPlan&, int64_t keys) const { return (keys + kTk - 1) / kTk; }
  std::pair<int64_t, int64_t> tile_keys(const SeqPlan& s, int64_t t) const {
    return {t * kTk, std::min(t * kTk + kTk, s.Skv)};
  }
  int64_t tile_at(const SeqPlan&, int64_t key) const { return key / kTk; }
  std::pair<int64_t, int64_t> partition_keys(const Task& t) const {
    return {t.t_begin * kTk, std::min(t.seq->Skv, t.t_end * kTk)};
  }

  // ---- scratch ----
  static constexpr bool with_vis = true;  // user masks (flex) keep per-key bits
  int64_t acc_cols() const { return Dv; }
  int64_t s_cols() const { return kTk; }
  struct Extra {
    float* kt = nullptr;  // [D_k, kTk] this tile's keys transposed (many-row tasks)
    float* vt = nullptr;  // [kTk, D_v] this tile's values widened to f32 (idem)
  };
  Extra carve_extra(Arena& a, int64_t, int64_t) const {
    Extra e;
    e.kt = a.take<float>(Dk * kTk);
    e.vt = a.take<float>(kTk * Dv);
    return e;
  }
};

// One task's tile work: where its K/V rows are, the logits and P.V of a tile, and what decode
// prefetches along them. The skeleton's TaskRows and for_each_tile do the rest.
template <typename Ops>
class FusedTiles {
 public:
  using Params = FusedParams;
  static constexpr bool kSimd = Ops::kSimd, kRowTerms = false;

  FusedTiles(const Params& kp, TaskRows& rows, Arena& arena);
  // The skeleton's tile loop: logits, softmax, P.V, tile after tile. Many-row tasks transpose
  // each tile's keys and widen its values; tasks of fewer rows (decode) read them in place with
  // the decode prefetch (StreamAhead).
  void run(TaskRows& rows) { for_each_tile(rows, kp_, *this); }
  void fold(TaskRows&) {}
  void softcap(float* s, int64_t n, float c) const { Ops::softcap(s, n, c); }
  void rescale_row(int64_t, float) {}
  // Logits of the tile's keys [t0, t1) into sb ([R, kTk], column j - t0 for key j).
  void logits(int64_t tile, int64_t t0, int64_t t1, float* sb);
  // P.V of the tile's probabilities in sb.
  void pv(int64_t tile, int64_t t0, int64_t t1, const float* sb);

 private:
  const std::byte* k_row(int64_t j) const;  // K row of key j
  const std::byte* v_row(int64_t j) const;  // V row of key j
  // Calls fn(j, n, k_rows, v_rows) for the runs of contiguous rows covering keys [t0, t1): one
  // run for a dense call, one per page touched for a paged one. Runs split a tile's key
  // columns, not its arithmetic: scores are per pair and P.V accumulates in key order, so a
  // paged call computes what the dense call on the gathered K/V computes, bit for bit.
  template <typename Fn>
  void for_runs(int64_t t0, int64_t t1, Fn&& fn) const;
  void logits_transposed(int64_t t0, int64_t t1, float* sb);
  // Rows of keys [j, e) of K (k_side) or V: as many as are contiguous (up to the end of j's page
  // in a paged call); none when j >= e.
  RowRun rows_at(bool k_side, int64_t j, int64_t e) const;

  const Params& kp_;
  TaskRows& rows_;
  const Params::Extra x_;
  const int64_t R_, Dk_, Dv_, hk_;
  const float* qs_;
  float* acc_;
  // K/V rows of (b, hk): key j of a dense call at base + j * stride; a paged call finds the
  // page of key j in the sequence's page table and the row in the page.
  const TensorView& kv_k_;
  const TensorView& kv_v_;
  int64_t kstride_, vstride_, k_row_bytes_, v_row_bytes_;
  const std::byte* kbase_ = nullptr;
  const std::byte* vbase_ = nullptr;
  const int32_t* table_ = nullptr;
  int64_t ps_ = 0;  // tokens per page (PagedKV::block_tokens)
  int64_t j_end_;   // end of the partition's keys
  bool transposed_, widen_v_;
};

template <typename Ops>
FusedTiles<Ops>::FusedTiles(const Params& kp, TaskRows& rows, Arena& arena)
    : kp_(kp),
      rows_(rows),
      x_(kp.carve_extra(arena, rows.P.max_rows, rows.P.tq)),
      R_(rows.t.R),
      Dk_(kp.Dk),
      Dv_(kp.Dv),
      hk_(rows.t.hk),
      qs_(rows.rs.qs),
      acc_(rows.rs.acc),
      kv_k_(kp.paged ? kp.paged->k_pages : kp.k),
      kv_v_(kp.paged ? kp.paged->v_pages : kp.v) {
  kstride_ = kv_k_.byte_offset(0, 0, 1);
  vstride_ = kv_v_.byte_offset(0, 0, 1);
  k_row_bytes_ = kv_k_.byte_offset(0, 0, 0, Dk_);
  v_row_bytes_ = kv_v_.byte_offset(0, 0, 0, Dv_);
  const int64_t b = rows.t.b;
  if (kp.paged) {
    table_ = kp.paged->indices + kp.paged->indptr[b];
    ps_ = kp.paged->block_tokens;
  } else {
    kbase_ = static_cast<const std::byte*>(kp.k.ptr(b, hk_));
    vbase_ = static_cast<const std::byte*>(kp.v.ptr(b, hk_));
  }
  j_end_ = kp.partition_keys(rows.t).second;
  // Many rows share each key tile (prefill): transpose the tile once and run the GEMM-shaped
  // score kernel (same bits as the per-pair one, see SimdOps::scores_t). Decode rows (R = G)
  // keep the per-pair kernel, which reads each key once without the transpose.
  transposed_ = Ops::kTransposedScores && R_ >= kMinTransposedRows && Dk_ % 8 == 0;
  widen_v_ = Ops::kTransposedScores && R_ >= kMinTransposedRows && kv_v_.dtype() != DType::kF32;
}

template <typename Ops>
const std::byte* FusedTiles<Ops>::k_row(int64_t j) const {
  if (!table_) return kbase_ + j * kstride_;
  const int64_t pi = j / ps_;
  return static_cast<const std::byte*>(kv_k_.ptr(table_[pi], hk_, j - pi * ps_));
}

template <typename Ops>
const std::byte* FusedTiles<Ops>::v_row(int64_t j) const {
  if (!table_) return vbase_ + j * vstride_;
  const int64_t pi = j / ps_;
  return static_cast<const std::byte*>(kv_v_.ptr(table_[pi], hk_, j - pi * ps_));
}

template <typename Ops>
template <typename Fn>
void FusedTiles<Ops>::for_runs(int64_t t0, int64_t t1, Fn&& fn) const {
  if (!table_) {
    fn(t0, t1 - t0, kbase_ + t0 * kstride_, vbase_ + t0 * vstride_);
    return;
  }
  for (int64_t j = t0; j < t1;) {
    const int64_t pi = j / ps_, off = j - pi * ps_, n = std::min(t1 - j, ps_ - off);
    const int64_t page = table_[pi];
    fn(j, n, static_cast<const std::byte*>(kv_k_.ptr(page, hk_, off)),
       static_cast<const std::byte*>(kv_v_.ptr(page, hk_, off)));
    j += n;
  }
}

template <typename Ops>
void FusedTiles<Ops>::logits_transposed(int64_t t0, int64_t t1, float* sb) {
  if constexpr (Ops::kTransposedScores) {
    Prefetch pf;  // per run: this run's V rows, and the K rows one tile ahead
    pf.vstride = vstride_;
    pf.v_row_bytes = v_row_bytes_;
    pf.kstride = kstride_;
    pf.k_row_bytes = k_row_bytes_;
    float* kt = x_.kt;
    const int64_t jhi = rows_.jhi;
    for_runs(t0, t1, [&](int64_t j, int64_t len, const std::byte* kr, const std::byte* vr) {
      pf.v = vr;
      pf.k_next = j + kTk < jhi ? k_row(j + kTk) : nullptr;
      Ops::pack_keys_t(kr, kstride_, len, Dk_, kt + (j - t0), pf);
    });
    // Whole 16-key blocks: zero the spare columns.
    const int64_t n = t1 - t0, n16 = (n + 15) / 16 * 16;
    if (n16 != n)
      for (int64_t d = 0; d < Dk_; ++d) std::fill(kt + d * kTk + n, kt + d * kTk + n16, 0.0f);
    Ops::scores_t(qs_, R_, Dk_, kt, n, sb);
  }
}

template <typename Ops>
void FusedTiles<Ops>::logits(int64_t, int64_t t0, int64_t t1, float* sb) {
  if (transposed_) {
    logits_transposed(t0, t1, sb);
    return;
  }
  for_runs(t0, t1, [&](int64_t j, int64_t len, const std::byte* kr, const std::byte* vr) {
    // then: the tile's next run of K rows, after the last one its first V rows; far: the V
    // rows of these keys, which P.V reads after the softmax
    const RowRun then = j + len < t1 ? rows_at(true, j + len, t1) : rows_at(false, t0, t1);
    const StreamAhead ahead{
        {kr, kstride_, len, k_row_bytes_}, then, {vr, vstride_, len, v_row_bytes_}};
    Ops::scores(qs_, R_, Dk_, kr, kstride_, len, sb + (j - t0), ahead);
  });
}

template <typename Ops>
void FusedTiles<Ops>::pv(int64_t, int64_t t0, int64_t t1, const float* sb) {
  if (widen_v_) {
    // Widen the tile's values once for all R rows (f16 -> f32 is exact: same products), then
    // one pass over the tile's keys in order, as the per-run passes make.
    if constexpr (Ops::kTransposedScores) {
      float* vw = x_.vt;
      for_runs(t0, t1, [&](int64_t j, int64_t len, const std::byte*, const std::byte* vr) {
        Ops::widen_rows(vr, vstride_, len, Dv_, vw + (j - t0) * Dv_);
      });
      Ops::pv_f32(sb, R_, reinterpret_cast<const std::byte*>(vw), Dv_ * int64_t{sizeof(float)},
                  t1 - t0, Dv_, acc_);
    }
    return;
  }
  if (transposed_) {  // f32 values; the transposed path's key packing prefetched these rows
    for_runs(t0, t1, [&](int64_t j, int64_t len, const std::byte*, const std::byte* vr) {
      Ops::pv(sb + (j - t0), R_, vr, vstride_, len, Dv_, acc_);
    });
    return;
  }
  // Decode: the streams go on to the K rows of the next tile, keys [n0, n1) (none past the
  // task's keys; a next tile the masks leave empty is prefetched for nothing).
  const int64_t n0 = t1, n1 = t1 < rows_.jhi ? std::min(t1 + kTk, j_end_) : t1;
  for_runs(t0, t1, [&](int64_t j, int64_t len, const std::byte*, const std::byte* vr) {
    // then: the tile's next run of V rows, after the last one the next tile's first K rows;
    // far: the next tile's K rows at these rows' offsets in the tile
    const RowRun then = j + len < t1 ? rows_at(false, j + len, t1) : rows_at(true, n0, n1);
    RowRun far = rows_at(true, n0 + (j - t0), n1);
    far.n = std::min(far.n, len);
    const StreamAhead ahead{{vr, vstride_, len, v_row_bytes_}, then, far};
    Ops::pv(sb + (j - t0), R_, vr, vstride_, len, Dv_, acc_, &ahead);
  });
}

template <typename Ops>
RowRun FusedTiles<Ops>::rows_at(bool k_side, int64_t j, int64_t e) const {
  if (j >= e) return {};
  const int64_t n = table_ ? std::min(e - j, ps_ - j % ps_) : e - j;
  if (k_side) return {k_row(j), kstride_, n, k_row_bytes_};
  return {v_row(j), vstride_, n, v_row_bytes_};
}

template <template <DType> class Ops>
void run_tiles(const CallPlan& P, const FusedParams& kp, DType kv_dtype) {
  switch (kv_dtype) {
    case DType::kF32:
      run_call<FusedTiles<Ops<DType::kF32>>>(P, kp);
      break;
    case DType::kF16:
      run_call<FusedTiles<Ops<DType::kF16>>>(P, kp);
      break;
    case DType::kBF16:
      run_call<FusedTiles<Ops<DType::kBF16>>>(P, kp);
      break;
    default:
      KV_CHECK(false, "dtype validated by the caller");
  }
}

// attention_workspace_bytes of the fused kernels.
size_t fused_bytes(const AttentionShape& s, int64_t n_threads) {
  FusedParams kp;
  kp.Dk = s.head_dim_k;
  kp.Dv = s.head_dim_v;
  return shape_bytes(kp, s, kTiling, n_threads);
}

template <template <DType> class Ops>
void run_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const AttentionOptions& o) {
  validate_attention_args(q, k, v, out, o);
  CallPlan P;
  init_call(P, q, out, q.dim(0), k.dim(1), v.dim(3), o);
  const int64_t Sq = q.dim(2), Skv = k.dim(2);
  if (P.B == 0 || P.Hq == 0 || Sq == 0 || P.Dv == 0) return;
  const MaskGeometry geo = make_geometry(P.B, P.Hq, Sq, Skv, o.q_offset, o.kv_offset);
  P.kv_offset = geo.kv_offset;
  // Use 3 of the mask module, when it is cheap to decide (built-in intervals only).
  P.mask_free = !P.spec.fn && !P.spec.doc_ids && mask_is_all_visible(P.spec, geo);
  FusedParams kp;
  kp.k = k;
  kp.v = v;
  kp.Dk = P.Dk;
  kp.Dv = P.Dv;
  KVSpan span;
  span.k = k;
  span.v = v;
  const AttentionShape shape = attention_shape(q, span, o);
  const CallWorkspace ws(o.workspace, [&](int64_t threads) { return fused_bytes(shape, threads); });
  P.seqs = carve_seqs(ws.span(), P.B);
  set_dense_seqs(P, Sq, Skv, geo.q_offset);
  plan_call(P, kp, kTiling, o.kv_split, ws.span());
  run_tiles<Ops>(P, kp, k.dtype());
}

template <template <DType> class Ops>
void run_paged(const TensorView& q, const PagedKV& kv, const int32_t* cu_seqlens_q,
               const TensorView& out, const AttentionOptions& o) {
  CallPlan P;
  init_call(P, q, out, kv.batch, kv.k_pages.dim(1), out.dim(2), o);
  if (P.B == 0 || P.Hq == 0 || P.Dv == 0) return;
  P.kv_offset = o.kv_offset;
  FusedParams kp;
  kp.paged = &kv;
  kp.Dk = P.Dk;
  kp.Dv = P.Dv;
  if (q.dim(0) == 0) return;
  KVSpan span;
  span.kind = KVSpanKind::kPaged;
  span.paged = kv;
  const AttentionShape shape = attention_shape(q, span, o);
  const CallWorkspace ws(o.workspace, [&](int64_t threads) { return fused_bytes(shape, threads); });
  P.seqs = carve_seqs(ws.span(), P.B);
  // Bottom-right aligned per sequence; a plain causal decode of every sequence needs no mask.
  bool all_decode = true;
  for (int64_t b = 0; b < P.B; ++b) {
    SeqPlan& x = P.seqs[b];
    x.q_row0 = cu_seqlens_q[b];
    x.Sq = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    x.Skv = kv.seq_len(b);
    x.q_offset = o.kv_offset + x.Skv - x.Sq;
    all_decode &= x.Sq <= 1;
  }
  P.mask_free = all_decode && P.spec.causal && P.spec.sliding_window == 0 &&
                P.spec.chunk_size == 0 && !P.spec.fn && !P.spec.doc_ids && !P.spec.kv_begin &&
                !P.spec.kv_end;
  plan_call(P, kp, kTiling, o.kv_split, ws.span());
  run_tiles<Ops>(P, kp, kv.k_pages.dtype());
}

}  // namespace

size_t fused_workspace_bytes(const AttentionShape& shape, int64_t n_threads) {
  return fused_bytes(shape, n_threads);
}

void fused_attention_scalar(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& out, const AttentionOptions& o) {
  run_attention<ScalarOps>(q, k, v, out, o);
}

void fused_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const AttentionOptions& o) {
#if KVCACHE_ATTN_AVX2
  run_attention<SimdOps>(q, k, v, out, o);
#else
  run_attention<ScalarOps>(q, k, v, out, o);
#endif
}

// flex = the fused kernel; mask_mod / score_mod arrive through options.mask / options.score and
// are evaluated per tile (empty tiles skipped, full tiles unmasked) by the skeleton's TaskRows.
void flex_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView& out, const AttentionOptions& o) {
  fused_attention(q, k, v, out, o);
}

void fused_paged_attention(const TensorView& q, const PagedKV& kv, const int32_t* cu_seqlens_q,
                           const TensorView& out, const AttentionOptions& o) {
#if KVCACHE_ATTN_AVX2
  run_paged<SimdOps>(q, kv, cu_seqlens_q, out, o);
#else
  run_paged<ScalarOps>(q, kv, cu_seqlens_q, out, o);
#endif
}

void fused_paged_attention_scalar(const TensorView& q, const PagedKV& kv,
                                  const int32_t* cu_seqlens_q, const TensorView& out,
                                  const AttentionOptions& o) {
  run_paged<ScalarOps>(q, kv, cu_seqlens_q, out, o);
}

}  // namespace kvcache::detail
