// The "fused" / "flex" attention kernel: online softmax over 64-key tiles of K/V read in place
// (FlashAttention-2's recurrence, Dao 2023: running max m, denominator l, unnormalised
// accumulator acc, rescaled by exp(m_old - m_new) when the max grows), never an S x S buffer.
//
// Work decomposition. A task is (batch b, kv head hk, query tile, kv split). Its rows are the
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
#include <bit>
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

namespace kvcache::detail {
namespace {

constexpr int64_t kTk = 64;           // keys per tile (a 64-key f16 tile of D=128 is 16 KiB)
// Pipelined decode (run_task's run_pipelined): bytes of K (and of V) rows per alternation.
constexpr int64_t kChunkBytes = 2048;
// Target rows (heads x positions) per task. A task packs (transposes, widens) every key tile it
// reads once for all its rows, so rows per task divide that work: 192 against 64 took prefill
// attention of llama-125m's shape (12 over 4 heads, D = 64, f16 K/V) from 6.3 to 5.8 ms at
// 208 x 2,000 and 13.2 to 12.1 ms at 464 x 2,000 (2 threads, Intel host, 3 alternations;
// 128: half of that, 256-384: no better). The per-thread workspace stays in L2 (s, acc and
// qs: 48 KiB each at D = 64).
constexpr int64_t kRowsPerTask = 192;
constexpr int64_t kMinTransposedRows = 8;  // rows per task from which key tiles are transposed
// Rows per register block of the transposed score kernel (x 16 keys: 10 accumulators). 6 rows
// (12 accumulators) measured ~10 % slower per score on Zen 3 (66 rows x 64 keys, D = 64,
// L1-resident tile): the lane tree keeps 3 partial sums per accumulator, which spill either
// way, and 6-row blocks spill more of them. With AVX-512: 4 rows x 32 keys (two zmm registers
// per row), see SimdOps::score_t_block16.
constexpr int64_t kScoreRows = KVCACHE_ATTN_AVX512 ? 4 : 5;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

enum class RowKind : uint8_t { kEmpty, kPartial, kFull };

// What the transposed (many-row) score path prefetches while it packs a tile's keys: this
// tile's V rows, and the K rows one tile (kTk keys) ahead.
struct Prefetch {
  const std::byte* v = nullptr;  // V row 0 of the current run
  int64_t vstride = 0, v_row_bytes = 0;
  const std::byte* k_next = nullptr;  // K row of key (run start + kTk), null past the end
  int64_t kstride = 0, k_row_bytes = 0;
};

// Decode prefetch. A decode task reads K and V rows in one stream, alternating between them a
// chunk at a time (run_task's run_pipelined). The score loop and P.V's first column pass each
// prefetch the row kAheadKeys ahead of the one they reach, continuing into what the kernel reads
// next (`then`). Short on purpose: an L1 miss, load or software prefetch alike, holds one of
// the core's few line fill buffers until its line arrives, so lines prefetched a tile ahead
// (an earlier scheme: a whole V tile during the scores, the next K tile during P.V, 16 KiB
// ahead) held them for a full DRAM latency and starved both the demand loads and the hardware
// prefetcher's refills. f16 decode, 32 x 8 heads, D = 128, 2 threads, K/V from memory (Intel,
// 48 KiB L1, 2 MiB L2): 4 keys ahead 8-10% faster than that scheme at 1K-64K keys, 8-16 keys
// in between, 32 keys slower than both; equal with K/V in L2. (A "page lead", the first lines
// of the row one 4 KiB page ahead, gained 3 % while K and V went a 16 KiB tile at a time; with
// 2 KiB chunks the row a page ahead lies past the stream's next chunk, so it went.)
constexpr int64_t kAheadKeys = 4;

struct StreamAhead {
  const std::byte* rows = nullptr;  // row 0 of what the loop reads
  int64_t stride = 0, n = 0, row_bytes = 0;
  const std::byte* then = nullptr;  // row 0 of what the kernel reads after it, or null
  int64_t then_stride = 0, then_n = 0, then_row_bytes = 0;
  // The loop reads row j now.
  void at(int64_t j) const {
    const int64_t r = j + kAheadKeys;
    if (const std::byte* p = row(r)) lines(p, r < n ? row_bytes : then_row_bytes);
  }
  // Row r of the stream (past n: of `then`), or null past both.
  const std::byte* row(int64_t r) const {
    if (r < n) return rows + r * stride;
    return r - n < then_n ? then + (r - n) * then_stride : nullptr;
  }
  static void lines(const std::byte* p, int64_t bytes) {
    for (int64_t off = 0; off < bytes; off += 64) prefetch_l1(p + off);
  }
};

// One sequence of the call. Dense calls have B identical sequences; paged calls are varlen.
struct SeqPlan {
  int64_t q_row0 = 0;                     // paged: first row of the sequence in q / out
  int64_t Sq = 0, Skv = 0, q_offset = 0;  // q_offset: absolute position of query 0
  int64_t n_qt = 0, n_split = 1, split_len = 0;
  int64_t task0 = 0, group0 = 0;  // first task / (KV head, query tile) group
};

// Everything a task needs, resolved once per call.
struct Plan {
  TensorView q, k, v, out;         // dense: [B, H, S, D] views; paged: q / out [total_q, H, D]
  const PagedKV* paged = nullptr;  // non-null: K/V read through this page table
  int64_t B = 0, Hq = 0, Hkv = 0, G = 0, Dk = 0, Dv = 0;
  float scale = 1, softcap = 0;
  const float* sinks = nullptr;           // [H_q] or null
  const ScoreFn* score = nullptr;         // or null
  const BlockMask* block_mask = nullptr;  // user mask as bits (then spec.fn is its fn())
  MaskSpec spec;
  bool mask_free = false;  // every pair visible: no classification, no masking
  int64_t kv_offset = 0;
  int64_t tq = 1;
  int64_t max_rows = 0;           // G * tq
  const SeqPlan* seqs = nullptr;  // [B]
  int64_t n_tasks = 0, n_groups = 0;
  float* partial = nullptr;  // [n_tasks, max_rows, D_v + 2]: acc, m, l per row (split tasks)

  const float* q_row(const SeqPlan& sq, int64_t b, int64_t h, int64_t i) const {
    return paged ? q.ptr_as<const float>(sq.q_row0 + i, h) : q.ptr_as<const float>(b, h, i);
  }
  float* out_row(const SeqPlan& sq, int64_t b, int64_t h, int64_t i) const {
    return paged ? out.ptr_as<float>(sq.q_row0 + i, h) : out.ptr_as<float>(b, h, i);
  }
};

// The sequence owning task (or group) index x, given each sequence's first index.
template <typename Field>
int64_t find_seq(const Plan& P, int64_t x, Field field) {
  int64_t lo = 0, hi = P.B;  // last b with field(seqs[b]) <= x
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (field(P.seqs[mid]) <= x)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// Per-thread scratch, grown on demand and reused across calls (no allocation in steady state).
struct Workspace {
  std::vector<float> qs;        // [R, D_k] scaled queries
  std::vector<float> acc;       // [R, D_v]
  std::vector<float> s;         // [R, kTk] logits, then probabilities
  std::vector<float> s2;        // [R, kTk] the next tile's logits (pipelined decode)
  std::vector<float> m, l;      // [R]
  std::vector<int64_t> lo, hi;  // [n_q] visible key interval per query position, kv index space
  std::vector<RowKind> kind;    // [R] this tile
  std::vector<uint8_t> fn_vis;  // [R, kTk] user mask values of partial rows
  std::vector<float> kt;        // [D_k, kTk] this tile's keys transposed (many-row tasks)
  std::vector<float> vt;        // [kTk, D_v] this tile's values widened to f32 (idem)
  void ensure(int64_t R, int64_t nq, int64_t Dk, int64_t Dv) {
    auto grow = [](auto& vec, int64_t n) {
      if (static_cast<int64_t>(vec.size()) < n) vec.resize(static_cast<size_t>(n));
    };
    grow(qs, R * Dk);
    grow(acc, R * Dv);
    grow(s, R * kTk);
    grow(s2, R * kTk);
    grow(m, R);
    grow(l, R);
    grow(lo, nq);
    grow(hi, nq);
    grow(kind, R);
    grow(fn_vis, R * kTk);
    grow(kt, Dk * kTk);
    grow(vt, kTk * Dv);
  }
};

Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

// ---------------------------------------------------------------------------------------------
// Scalar building blocks (the portable fallback, and the reference for the SIMD ones).
template <DType KD>
struct ScalarOps {
  using T = typename Elem<KD>::T;
  static constexpr bool kTransposedScores = false;  // no pack_keys_t / scores_t
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
  // s[j] = c * tanh(s[j] / c), Gemma-2's attention logit softcap.
  static void softcap(float* s, int64_t n, float c) {
    for (int64_t j = 0; j < n; ++j) s[j] = c * std::tanh(s[j] / c);
  }
  // Turns logits s[0, n) into exp(s - m_new) in place; returns the row's new state.
  static bool softmax_update(float* s, int64_t n, float& m, float& l, float* acc, int64_t Dv) {
    float mt = kNegInf;
    for (int64_t j = 0; j < n; ++j) mt = std::max(mt, s[j]);
    if (mt == kNegInf) {
      std::fill(s, s + n, 0.0f);
      return false;
    }
    const float m_new = std::max(m, mt);
    const float alpha = m_new == m ? 1.0f : std::exp(m - m_new);  // exp(0) = 1 exactly
    float sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - m_new);
      sum += s[j];
    }
    l = l * alpha + sum;
    if (alpha != 1.0f)
      for (int64_t d = 0; d < Dv; ++d) acc[d] *= alpha;
    m = m_new;
    return true;
  }
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
  template <int NR, int NK, int DC>
  static void score_block_x2(const float* qs, const T* const* kr, float* s) {
    static_assert(NK % 2 == 0 && DC > 0 && DC % 8 == 0 && NR * NK % 8 == 0);
    constexpr int NP = NK / 2;
    __m512 acc[NR * NP];
    for (__m512& a : acc) a = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int d = 0; d < DC; d += 8) {
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
    // shuffles and without extracting the halves (4 x 8 block: 42 instructions instead of 100;
    // ~15% of the score loop in L1).
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
  // Dk / 8 FMAs long, so more chains hide the FMA latency and the horizontal-sum epilogue
  // (decode, G = 4: 3 keys measured ~10 % faster than 2 on Zen 3).
  static constexpr int keys_per_block(int NR) {
    return NR >= 3 ? 3 : NR == 2 ? 4 : 6;
  }

  // pf: null, or the stream to prefetch along the keys (see StreamAhead). Without software
  // prefetch the first load of every K row stalled on memory (perf, decode f16: half the score
  // loop's samples on it, Zen 3).
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
        for (int c = 0; c < NK2; ++c) {
          pre(j + c);
          kr[c] = reinterpret_cast<const T*>(kb + (j + c) * kstride);
        }
        score_block_x2<NR, NK2, DC>(qs, kr, s + j);
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
    // Written out rather than through by_row_blocks: the decode loops (this one and pv below)
    // compiled through its lambda ran ~5% slower (f16 decode at 16K keys, 6 alternations).
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
  // same bits. Two registers per row halve the broadcasts of q per FMA: in isolation (L1, D =
  // 64, Zen 5) 1.78 FMAs per cycle against 1.61 with one register per row (16 keys, 5 rows)
  // and 0.97 (zmm units) for the AVX2 block. To fit 4 rows x 2 registers in the 32 registers,
  // the first half's partial sum is parked in the output row after pass 3 and taken back for
  // pass 7.
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
  static void scores_t_d(const float* qs, int64_t R, int64_t Dk, const float* kt, int64_t n, float* s) {
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
        case 4: score_t_block<4, DC>(q, Dk, kt + c, o); break;
        case 3: score_t_block<3, DC>(q, Dk, kt + c, o); break;
        case 2: score_t_block<2, DC>(q, Dk, kt + c, o); break;
        case 1: score_t_block<1, DC>(q, Dk, kt + c, o); break;
        default: break;
      }
    }
#endif
  }

  // Scores of R rows against the n keys packed in kt (columns [n, round16(n)) must be
  // readable; their scores land in s's spare columns and are ignored). Dk % 8 == 0.
  static void scores_t(const float* qs, int64_t R, int64_t Dk, const float* kt, int64_t n, float* s) {
    switch (Dk) {
      case 64: scores_t_d<64>(qs, R, Dk, kt, n, s); break;
      case 128: scores_t_d<128>(qs, R, Dk, kt, n, s); break;
      default: scores_t_d<0>(qs, R, Dk, kt, n, s);
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

  // The row buffer has kTk columns (the update rounds n up to whole vectors).
  static bool softmax_update(float* s, int64_t n, float& m, float& l, float* acc, int64_t Dv) {
    return detail::softmax_update(s, n, m, l, acc, Dv);
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

  // out[c * Dv + d] = v_c[d] as f32 for rows c in [0, n) (exact). Inline F16C/shift loads: a
  // convert_n call per row (dtype dispatch, no inlining) cost ~5 % of a prefill tile.
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
    for (; r + 6 <= R; r += 6) SimdOps<DType::kF32>::template pv_rows<6>(p + r * kTk, vb, vstride, n, Dv, acc + r * Dv);
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

template <typename Ops>
void run_task(const Plan& P, int64_t task) {
  const int64_t b = find_seq(P, task, [](const SeqPlan& x) { return x.task0; });
  const SeqPlan& SP = P.seqs[b];
  int64_t t = task - SP.task0;
  const int64_t sp = t % SP.n_split;
  t /= SP.n_split;
  const int64_t qt = t % SP.n_qt, hk = t / SP.n_qt;
  const int64_t Skv = SP.Skv, q_offset = SP.q_offset;
  const int64_t q0 = qt * P.tq, nq = std::min(SP.Sq, q0 + P.tq) - q0, R = P.G * nq;
  const int64_t j_begin = sp * SP.split_len, j_end = std::min(Skv, j_begin + SP.split_len);
  const int64_t Dk = P.Dk, Dv = P.Dv;

  Workspace& ws = workspace();
  ws.ensure(R, nq, Dk, Dv);
  float* qs = ws.qs.data();
  float* acc = ws.acc.data();
  float* s = ws.s.data();
  // Row r = g * nq + i: query head hk * G + g at query index q0 + i.
  for (int64_t r = 0; r < R; ++r) {
    const float* qr = P.q_row(SP, b, hk * P.G + r / nq, q0 + r % nq);
    for (int64_t d = 0; d < Dk; ++d) qs[r * Dk + d] = qr[d] * P.scale;
    ws.m[static_cast<size_t>(r)] = kNegInf;
    ws.l[static_cast<size_t>(r)] = 0;
  }
  std::fill(acc, acc + R * Dv, 0.0f);

  // Visible key interval of each query position (kv index space) and their union.
  int64_t jlo = j_end, jhi = j_begin;
  for (int64_t i = 0; i < nq; ++i) {
    int64_t lo = 0, hi = Skv;
    if (!P.mask_free) {
      const KeyRange kr = key_range(P.spec, b, q_offset + q0 + i);
      lo = std::clamp(kr.lo - P.kv_offset, int64_t{0}, Skv);
      hi = std::clamp(kr.hi - P.kv_offset, int64_t{0}, Skv);
    }
    ws.lo[static_cast<size_t>(i)] = lo;
    ws.hi[static_cast<size_t>(i)] = hi;
    if (lo < hi) {
      jlo = std::min(jlo, lo);
      jhi = std::max(jhi, hi);
    }
  }
  jlo = std::max(jlo, j_begin);
  jhi = std::min(jhi, j_end);

  // K/V rows of (b, hk): key j of a dense call at base + j * stride; a paged call finds the
  // page of key j in the sequence's page table and the row in the page.
  const TensorView& kt = P.paged ? P.paged->k_pages : P.k;
  const TensorView& vt = P.paged ? P.paged->v_pages : P.v;
  const int64_t kstride = kt.byte_offset(0, 0, 1), vstride = vt.byte_offset(0, 0, 1);
  const int64_t v_row_bytes = vt.byte_offset(0, 0, 0, Dv);
  const std::byte* kbase = P.paged ? nullptr : static_cast<const std::byte*>(P.k.ptr(b, hk));
  const std::byte* vbase = P.paged ? nullptr : static_cast<const std::byte*>(P.v.ptr(b, hk));
  const int32_t* table = P.paged ? P.paged->indices + P.paged->indptr[b] : nullptr;
  const int64_t ps = P.paged ? P.paged->page_size : 0;
  // Calls fn(j, n, k_rows, v_rows) for the runs of contiguous rows covering keys [t0, t1):
  // one run for a dense call, one per page touched for a paged one. Runs split a tile's key
  // columns, not its arithmetic: scores are per pair and P.V accumulates in key order, so a
  // paged call computes what the dense call on the gathered K/V computes, bit for bit.
  const int64_t k_row_bytes = kt.byte_offset(0, 0, 0, Dk);
  auto k_row = [&](int64_t j) {  // K row of key j
    if (!table) return kbase + j * kstride;
    const int64_t pi = j / ps;
    return static_cast<const std::byte*>(kt.ptr(table[pi], hk, j - pi * ps));
  };
  auto for_runs = [&](int64_t t0, int64_t t1, auto&& fn) {
    if (!table) {
      fn(t0, t1 - t0, kbase + t0 * kstride, vbase + t0 * vstride);
      return;
    }
    for (int64_t j = t0; j < t1;) {
      const int64_t pi = j / ps, off = j - pi * ps, n = std::min(t1 - j, ps - off);
      const int64_t page = table[pi];
      fn(j, n, static_cast<const std::byte*>(kt.ptr(page, hk, off)),
         static_cast<const std::byte*>(vt.ptr(page, hk, off)));
      j += n;
    }
  };
  const MaskSpec& spec = P.spec;
  RowKind* kind = ws.kind.data();
  // Many rows share each key tile (prefill): transpose the tile once and run the GEMM-shaped
  // score kernel (same bits as the per-pair one, see SimdOps::scores_t). Decode rows (R = G)
  // keep the per-pair kernel, which reads each key once without the transpose.
  const bool transposed = Ops::kTransposedScores && R >= kMinTransposedRows && Dk % 8 == 0;
  const DType vt_dtype = vt.dtype();
  const bool widen_v = Ops::kTransposedScores && R >= kMinTransposedRows && vt_dtype != DType::kF32;

  // ---- one tile [t0, t1): classify its rows, logits, mask, online softmax, P.V ----
  // Classifies each row for the tile into `kind` (and fn_vis); false when every row is empty.
  auto classify = [&](int64_t t0, int64_t t1) -> bool {
    const int64_t n = t1 - t0;
    bool any = false;
    if (P.mask_free) {
      std::fill(kind, kind + R, RowKind::kFull);
      any = true;
    } else {
      int32_t dmin = 0, dmax = -1;
      if (spec.doc_ids) {
        dmin = std::numeric_limits<int32_t>::max();
        dmax = std::numeric_limits<int32_t>::min();
        for (int64_t j = t0; j < t1; ++j) {
          const int32_t d = doc_id(spec, b, P.kv_offset + j);
          dmin = std::min(dmin, d);
          dmax = std::max(dmax, d);
        }
      }
      for (int64_t i = 0; i < nq; ++i) {
        const int64_t lo = std::max(ws.lo[static_cast<size_t>(i)], t0);
        const int64_t hi = std::min(ws.hi[static_cast<size_t>(i)], t1);
        RowKind k = lo >= hi                 ? RowKind::kEmpty
                    : (lo == t0 && hi == t1) ? RowKind::kFull
                                             : RowKind::kPartial;
        if (k != RowKind::kEmpty && spec.doc_ids) {
          const int32_t dq = doc_id(spec, b, q_offset + q0 + i);
          if (dq < dmin || dq > dmax)
            k = RowKind::kEmpty;
          else if (dmin != dmax)
            k = RowKind::kPartial;
        }
        for (int64_t g = 0; g < P.G; ++g) kind[g * nq + i] = k;
      }
      if (P.block_mask) {  // user mask as bits: classify by word, never call a function
        const BlockMask& bm = *P.block_mask;
        const uint64_t all = n == kTk ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
        for (int64_t r = 0; r < R; ++r) {
          if (kind[r] == RowKind::kEmpty) continue;
          const int64_t i = r % nq, h = hk * P.G + r / nq;
          const uint64_t w = bm.word(b, h, q0 + i, t0 / kTk);
          if (w == 0) {
            kind[r] = RowKind::kEmpty;
          } else if (w != all || kind[r] == RowKind::kPartial) {
            const int64_t qp = q_offset + q0 + i;
            const int64_t lo = std::max(ws.lo[static_cast<size_t>(i)], t0);
            const int64_t hi = std::min(ws.hi[static_cast<size_t>(i)], t1);
            uint8_t* vis = ws.fn_vis.data() + (r * kTk);
            int64_t count = 0;
            for (int64_t j = t0; j < t1; ++j) {
              const bool v = ((w >> (j - t0)) & 1) && j >= lo && j < hi &&
                             (!spec.doc_ids || builtin_visible(spec, b, qp, P.kv_offset + j));
              vis[j - t0] = v;
              count += v;
            }
            kind[r] = count == 0   ? RowKind::kEmpty
                      : count == n ? RowKind::kFull
                                   : RowKind::kPartial;
          }  // else: every key visible to the function and to the built-ins: stays full
        }
      } else if (spec.fn) {  // user mask: evaluate where the built-ins leave keys visible
        for (int64_t r = 0; r < R; ++r) {
          if (kind[r] == RowKind::kEmpty) continue;
          const int64_t i = r % nq, h = hk * P.G + r / nq, qp = q_offset + q0 + i;
          const int64_t lo = std::max(ws.lo[static_cast<size_t>(i)], t0);
          const int64_t hi = std::min(ws.hi[static_cast<size_t>(i)], t1);
          uint8_t* vis = ws.fn_vis.data() + (r * kTk);
          int64_t count = 0;
          for (int64_t j = t0; j < t1; ++j) {
            const int64_t kp = P.kv_offset + j;
            const bool v =
                j >= lo && j < hi && builtin_visible(spec, b, qp, kp) && (*spec.fn)(b, h, qp, kp);
            vis[j - t0] = v;
            count += v;
          }
          kind[r] = count == 0 ? RowKind::kEmpty : count == n ? RowKind::kFull : RowKind::kPartial;
        }
      }
      for (int64_t r = 0; r < R && !any; ++r) any = kind[r] != RowKind::kEmpty;
    }
    return any;
  };
  // Logits of the tile's keys into sb ([R, kTk], column j - t0 for key j).
  auto logits = [&](int64_t t0, int64_t t1, float* sb) {
    const int64_t n = t1 - t0;
    if constexpr (Ops::kTransposedScores) {
      if (transposed) {
        Prefetch pf;  // per run: this run's V rows, and the K rows one tile ahead
        pf.vstride = vstride;
        pf.v_row_bytes = v_row_bytes;
        pf.kstride = kstride;
        pf.k_row_bytes = k_row_bytes;
        float* kt = ws.kt.data();
        for_runs(t0, t1, [&](int64_t j, int64_t len, const std::byte* kr, const std::byte* vr) {
          pf.v = vr;
          pf.k_next = j + kTk < jhi ? k_row(j + kTk) : nullptr;
          Ops::pack_keys_t(kr, kstride, len, Dk, kt + (j - t0), pf);
        });
        const int64_t n16 = (n + 15) / 16 * 16;  // whole 16-key blocks: zero the spare columns
        if (n16 != n)
          for (int64_t d = 0; d < Dk; ++d) std::fill(kt + d * kTk + n, kt + d * kTk + n16, 0.0f);
        Ops::scores_t(qs, R, Dk, kt, n, sb);
      }
    }
    if (!transposed) {  // prefetch along this run's K rows, then its V rows
      for_runs(t0, t1, [&](int64_t j, int64_t len, const std::byte* kr, const std::byte* vr) {
        const StreamAhead ahead{kr, kstride, len, k_row_bytes, vr, vstride, len, v_row_bytes};
        Ops::scores(qs, R, Dk, kr, kstride, len, sb + (j - t0), ahead);
      });
    }
    (void)n;
  };
  // Softcap, score_mod and mask on the tile's logits in sb, then the online softmax update.
  auto finish = [&](int64_t t0, int64_t t1, float* sb) {
    const int64_t n = t1 - t0;
    for (int64_t r = 0; r < R; ++r) {
      float* sr = sb + r * kTk;
      if (kind[r] == RowKind::kEmpty) {
        std::fill(sr, sr + n, kNegInf);
        continue;
      }
      if (P.softcap > 0) Ops::softcap(sr, n, P.softcap);
      if (!P.score && kind[r] != RowKind::kPartial) continue;  // a full row: nothing to mask
      const int64_t i = r % nq, qp = q_offset + q0 + i;
      if (P.score) {
        const int64_t h = hk * P.G + r / nq;
        for (int64_t j = 0; j < n; ++j) sr[j] = (*P.score)(sr[j], b, h, qp, P.kv_offset + t0 + j);
      }
      if (kind[r] == RowKind::kPartial) {
        const int64_t lo = ws.lo[static_cast<size_t>(i)], hi = ws.hi[static_cast<size_t>(i)];
        if (!spec.doc_ids && !spec.fn) {  // an interval only (causal, window, chunk): two fills
          std::fill(sr, sr + std::clamp(lo - t0, int64_t{0}, n), kNegInf);
          std::fill(sr + std::clamp(hi - t0, int64_t{0}, n), sr + n, kNegInf);
          continue;
        }
        const int32_t dq = spec.doc_ids ? doc_id(spec, b, qp) : 0;
        const uint8_t* vis = ws.fn_vis.data() + (r * kTk);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t jj = t0 + j;
          bool v = jj >= lo && jj < hi;
          if (v && spec.doc_ids) v = doc_id(spec, b, P.kv_offset + jj) == dq;
          if (v && spec.fn) v = vis[j] != 0;
          if (!v) sr[j] = kNegInf;
        }
      }
    }
    // ---- online softmax and P.V ----
    for (int64_t r = 0; r < R; ++r)
      Ops::softmax_update(sb + r * kTk, n, ws.m[static_cast<size_t>(r)],
                          ws.l[static_cast<size_t>(r)], acc + r * Dv, Dv);
  };
  // P.V of the tile's probabilities in sb (many-row tasks; decode goes through pv_keys).
  auto pv_tile = [&](int64_t t0, int64_t t1, float* sb) {
    const int64_t n = t1 - t0;
    if (widen_v) {
      // Widen the tile's values once for all R rows (f16 -> f32 is exact: same products),
      // then one pass over the tile's keys in order, as the per-run passes make.
      if constexpr (Ops::kTransposedScores) {
        float* vw = ws.vt.data();
        for_runs(t0, t1, [&](int64_t j, int64_t len, const std::byte*, const std::byte* vr) {
          Ops::widen_rows(vr, vstride, len, Dv, vw + (j - t0) * Dv);
        });
        Ops::pv_f32(sb, R, reinterpret_cast<const std::byte*>(vw), Dv * int64_t{sizeof(float)}, n,
                    Dv, acc);
      }
    } else {  // f32 values; the transposed path's key packing prefetched these rows
      for_runs(t0, t1, [&](int64_t j, int64_t len, const std::byte*, const std::byte* vr) {
        Ops::pv(sb + (j - t0), R, vr, vstride, len, Dv, acc);
      });
    }
    (void)n;
  };

  // ---- decode: the next tile's logits interleaved with this tile's P.V ----
  // The tile loop reads K tile t, then V tile t, then K tile t + 1...: a 16 KiB run of each in
  // turn (64 keys, f16, D = 128), each stream idle while the other runs. Here P.V of tile t and
  // the logits of the next non-empty tile go a chunk (kChunkBytes of rows) at a time,
  // alternately, so both streams advance together. The arithmetic is the tile loop's: logits
  // are per pair, P.V accumulates each element in key order (a chunk stores acc, the next
  // reloads it), and the softmax still takes whole kTk tiles, so the bits equal the plain
  // loop's and a prefill row's. f16 decode, 32 x 8 heads, D = 128, 2 threads, 16K and 64K keys,
  // side by side (docs/benchmarks.md): 0.82-0.83 of BM_ReadBandwidth with the tile loop,
  // 1.04-1.08 with 2 KiB chunks; 4 KiB chunks ~0.95-1.00, 1 KiB ~0.90. (16-key tiles in the
  // tile loop also alternate 4 KiB at a time: 0.91-0.97, but prefill lost 8-25 % to them.)
  // Keys per chunk: kChunkBytes of the wider row, a power of two in [4, kTk] so chunks tile a tile.
  const int64_t chunk = std::clamp(
      static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(
          std::max<int64_t>(1, kChunkBytes / std::max(k_row_bytes, v_row_bytes))))),
      int64_t{4}, kTk);
  auto v_row = [&](int64_t j) {  // V row of key j
    if (!table) return vbase + j * vstride;
    const int64_t pi = j / ps;
    return static_cast<const std::byte*>(vt.ptr(table[pi], hk, j - pi * ps));
  };
  // The stream `ahead` continues with keys [j, e) of K (or V), as far as they are contiguous.
  auto continue_with = [&](StreamAhead& ahead, bool k_side, int64_t j, int64_t e) {
    if (j >= e) return;
    ahead.then = k_side ? k_row(j) : v_row(j);
    ahead.then_stride = k_side ? kstride : vstride;
    ahead.then_n = std::min(chunk, e - j);
    if (table) ahead.then_n = std::min(ahead.then_n, ps - j % ps);
    ahead.then_row_bytes = k_side ? k_row_bytes : v_row_bytes;
  };
  // Logits of keys [a, e) of the tile at t0 into sb; the stream then goes on to V keys [va, ve).
  auto logits_keys = [&](int64_t t0, int64_t a, int64_t e, float* sb, int64_t va, int64_t ve) {
    for_runs(a, e, [&](int64_t j, int64_t len, const std::byte* kr, const std::byte*) {
      StreamAhead ahead{kr, kstride, len, k_row_bytes};
      continue_with(ahead, false, va, ve);
      Ops::scores(qs, R, Dk, kr, kstride, len, sb + (j - t0), ahead);
    });
  };
  // P.V of keys [a, e) of the tile at t0 from sb; the stream then goes on to K keys [ka, ke).
  auto pv_keys = [&](int64_t t0, int64_t a, int64_t e, const float* sb, int64_t ka, int64_t ke) {
    for_runs(a, e, [&](int64_t j, int64_t len, const std::byte*, const std::byte* vr) {
      StreamAhead ahead{vr, vstride, len, v_row_bytes};
      continue_with(ahead, true, ka, ke);
      Ops::pv(sb + (j - t0), R, vr, vstride, len, Dv, acc, &ahead);
    });
  };
  auto next_tile = [&](int64_t t0) {  // the first tile from t0 with a row to compute, or jhi
    for (; t0 < jhi; t0 += kTk)
      if (classify(t0, std::min(t0 + kTk, j_end))) return t0;
    return jhi;
  };
  auto run_pipelined = [&](int64_t from, float* sc, float* sn) {
    int64_t cur = next_tile(from);
    if (cur >= jhi) return;
    int64_t cur_end = std::min(cur + kTk, j_end);
    logits_keys(cur, cur, cur_end, sc, cur, std::min(cur + chunk, cur_end));
    for (;;) {
      finish(cur, cur_end, sc);  // uses this tile's classification: before the next one's
      const int64_t nxt = next_tile(cur + kTk);
      if (nxt >= jhi) {
        pv_keys(cur, cur, cur_end, sc, 0, 0);
        return;
      }
      const int64_t nxt_end = std::min(nxt + kTk, j_end);
      for (int64_t c = 0; c < kTk; c += chunk) {
        const int64_t a = cur + c, an = nxt + c;
        if (a < cur_end)
          pv_keys(cur, a, std::min(a + chunk, cur_end), sc, an,
                  std::min(an + chunk, nxt_end));
        if (an < nxt_end) {
          const int64_t va = a + chunk < cur_end ? a + chunk : nxt;
          logits_keys(nxt, an, std::min(an + chunk, nxt_end), sn, va,
                      std::min(va + chunk, a + chunk < cur_end ? cur_end : nxt_end));
        }
      }
      std::swap(sc, sn);
      cur = nxt;
      cur_end = nxt_end;
    }
  };

  // Tiles aligned to multiples of kTk in absolute key index (j_begin is such a multiple).
  const int64_t first = jlo < jhi ? jlo - jlo % kTk : jhi;
  if (transposed || widen_v) {
    for (int64_t t0 = first; t0 < jhi; t0 += kTk) {
      const int64_t t1 = std::min(t0 + kTk, j_end);
      if (!classify(t0, t1)) continue;
      logits(t0, t1, s);
      finish(t0, t1, s);
      pv_tile(t0, t1, s);
    }
  } else {
    run_pipelined(first, s, ws.s2.data());
  }

  // ---- write the result, or this partition's partial state ----
  for (int64_t r = 0; r < R; ++r) {
    const int64_t h = hk * P.G + r / nq, i = q0 + r % nq;
    const float m = ws.m[static_cast<size_t>(r)], l = ws.l[static_cast<size_t>(r)];
    if (SP.n_split == 1) {
      finalize_row(m, l, acc + r * Dv, P.sinks ? P.sinks + h : nullptr, Dv, P.out_row(SP, b, h, i));
    } else {
      float* dst = P.partial + (task * P.max_rows + r) * (Dv + 2);
      std::memcpy(dst, acc + r * Dv, static_cast<size_t>(Dv) * sizeof(float));
      dst[Dv] = m;
      dst[Dv + 1] = l;
    }
  }
}

// Merges the n_split partial states of one group (b, hk, query tile) and writes its rows.
void merge_group(const Plan& P, int64_t group, std::vector<float>& tmp) {
  const int64_t b = find_seq(P, group, [](const SeqPlan& x) { return x.group0; });
  const SeqPlan& SP = P.seqs[b];
  if (SP.n_split == 1) return;  // run_task wrote the rows
  const int64_t gl = group - SP.group0, qt = gl % SP.n_qt, hk = gl / SP.n_qt;
  const int64_t q0 = qt * P.tq, nq = std::min(SP.Sq, q0 + P.tq) - q0, R = P.G * nq;
  const int64_t Dv = P.Dv, rec = Dv + 2, task0 = SP.task0 + gl * SP.n_split;
  tmp.resize(static_cast<size_t>(Dv));
  for (int64_t r = 0; r < R; ++r) {
    const float* first = P.partial + (task0 * P.max_rows + r) * rec;
    float M = kNegInf;
    for (int64_t sp = 0; sp < SP.n_split; ++sp) M = std::max(M, first[sp * P.max_rows * rec + Dv]);
    float L = 0;
    std::fill(tmp.begin(), tmp.end(), 0.0f);
    if (M != kNegInf) {
      for (int64_t sp = 0; sp < SP.n_split; ++sp) {
        const float* part = first + sp * P.max_rows * rec;
        if (part[Dv] == kNegInf) continue;
        const float w = std::exp(part[Dv] - M);
        L += part[Dv + 1] * w;
        for (int64_t d = 0; d < Dv; ++d) tmp[static_cast<size_t>(d)] += part[d] * w;
      }
    }
    const int64_t h = hk * P.G + r / nq;
    finalize_row(M, L, tmp.data(), P.sinks ? P.sinks + h : nullptr, Dv,
                 P.out_row(SP, b, h, q0 + r % nq));
  }
}

// Plans the tasks of sequences whose Sq / Skv / q_offset are set, then runs them. split is
// AttentionOptions::kv_split (0 automatic, -1 never, > 0 keys per partition).
template <template <DType> class Ops>
void execute(Plan& P, std::vector<SeqPlan>& seqs, int64_t split_opt, DType kv_dtype) {
  int64_t max_sq = 0;
  for (const SeqPlan& x : seqs) max_sq = std::max(max_sq, x.Sq);
  if (max_sq == 0 || P.Dv == 0) return;
  P.tq = std::min(max_sq, std::max<int64_t>(1, kRowsPerTask / P.G));
  // Tiles of equal size, as many as max_sq holds kRowsPerTask rows to the nearest: every task
  // packs each key tile it reads once for all its rows, so a last tile of a few positions (200
  // positions at G = 3: 64, 64, 64 and 8) paid a whole packing of the keys for 24 rows. Now
  // 67, 67, 66 (then rounded up below to whole register blocks: 68, 68, 64).
  if (P.tq < max_sq) {
    const int64_t n_tiles = std::max<int64_t>(1, (2 * max_sq + P.tq) / (2 * P.tq));
    P.tq = (max_sq + n_tiles - 1) / n_tiles;
  }
  // Many-row tasks: whole register blocks of the transposed score kernel (G = 3: 25
  // positions, 75 rows, instead of 21 and a 3-row tail). Rows are independent: the split of
  // positions into tasks never changes a row's arithmetic.
  while (P.tq > 1 && P.tq < max_sq && P.G * P.tq >= kMinTransposedRows &&
         (P.G * P.tq) % kScoreRows != 0)
    ++P.tq;
  P.max_rows = P.G * P.tq;
  for (SeqPlan& x : seqs) x.n_qt = (x.Sq + P.tq - 1) / P.tq;
  ThreadPool& pool = default_pool();
  // Flash-decoding split: a sequence with a single query tile (decode, short verification
  // steps) and a long cache has its keys cut into partitions (auto_split_keys), so B x H_kv
  // tasks never leave threads idle. The rule looks at the sequence only — not at the batch, the
  // thread count or the machine — so a sequence's output does not depend on what it is batched
  // with (batch invariance: continuous batching returns what a lone request would).
  bool any_split = false;
  for (SeqPlan& x : seqs) {
    int64_t split = split_opt;
    if (split == 0)
      split = x.Sq * P.G <= kRowsPerTask && auto_split_keys(x.Skv) > 0 ? auto_split_keys(x.Skv) : -1;
    if (split < 0 || split >= x.Skv) {
      x.n_split = 1;
      x.split_len = std::max<int64_t>(x.Skv, 1);
    } else {
      x.split_len = (split + kTk - 1) / kTk * kTk;  // partitions start on tile boundaries
      x.n_split = (x.Skv + x.split_len - 1) / x.split_len;
      if (x.n_split == 1) x.split_len = std::max<int64_t>(x.Skv, 1);
    }
    any_split |= x.n_split > 1;
  }
  int64_t tasks = 0, groups = 0;
  for (SeqPlan& x : seqs) {
    x.task0 = tasks;
    x.group0 = groups;
    groups += P.Hkv * x.n_qt;
    tasks += P.Hkv * x.n_qt * x.n_split;
  }
  P.seqs = seqs.data();
  P.n_tasks = tasks;
  P.n_groups = groups;

  thread_local std::vector<float> partial;  // reused by the calling thread across calls
  if (any_split) {
    partial.resize(static_cast<size_t>(P.n_tasks * P.max_rows * (P.Dv + 2)));
    P.partial = partial.data();
  }
  auto launch = [&](auto task_fn) {
    pool.parallel_for(P.n_tasks, [&](int64_t t) { task_fn(P, t); });
  };
  switch (kv_dtype) {
    case DType::kF32:
      launch(run_task<Ops<DType::kF32>>);
      break;
    case DType::kF16:
      launch(run_task<Ops<DType::kF16>>);
      break;
    case DType::kBF16:
      launch(run_task<Ops<DType::kBF16>>);
      break;
    default:
      KV_CHECK(false, "dtype validated by the caller");
  }
  if (any_split) {
    pool.parallel_for(P.n_groups, [&](int64_t g) {
      thread_local std::vector<float> tmp;
      merge_group(P, g, tmp);
    });
  }
}

void fill_common(Plan& P, const AttentionOptions& o) {
  P.G = P.Hq / P.Hkv;
  P.scale = o.scale > 0 ? o.scale : 1.0f / std::sqrt(static_cast<float>(P.Dk));
  P.softcap = o.softcap;
  P.sinks = o.sinks;
  P.score = o.score;
  P.block_mask = o.block_mask;
  P.spec = attention_mask_spec(o);
}

template <template <DType> class Ops>
void run_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& out, const AttentionOptions& o) {
  validate_attention_args(q, k, v, out, o);
  Plan P;
  P.q = q;
  P.k = k;
  P.v = v;
  P.out = out;
  P.B = q.dim(0);
  P.Hq = q.dim(1);
  P.Dk = q.dim(3);
  P.Hkv = k.dim(1);
  P.Dv = v.dim(3);
  const int64_t Sq = q.dim(2), Skv = k.dim(2);
  if (P.B == 0 || P.Hq == 0 || Sq == 0 || P.Dv == 0) return;
  fill_common(P, o);
  const MaskGeometry geo = make_geometry(P.B, P.Hq, Sq, Skv, o.q_offset, o.kv_offset);
  P.kv_offset = geo.kv_offset;
  // Use 3 of the mask module, when it is cheap to decide (built-in intervals only).
  P.mask_free = !P.spec.fn && !P.spec.doc_ids && mask_is_all_visible(P.spec, geo);
  thread_local std::vector<SeqPlan> seqs;
  seqs.assign(static_cast<size_t>(P.B), SeqPlan{});
  for (SeqPlan& x : seqs) {
    x.Sq = Sq;
    x.Skv = Skv;
    x.q_offset = geo.q_offset;
  }
  execute<Ops>(P, seqs, o.kv_split, k.dtype());
}

template <template <DType> class Ops>
void run_paged(const TensorView& q, const PagedKV& kv, const int32_t* cu_seqlens_q,
               const TensorView& out, const AttentionOptions& o) {
  Plan P;
  P.q = q;
  P.out = out;
  P.paged = &kv;
  P.B = kv.batch;
  P.Hq = q.dim(1);
  P.Dk = q.dim(2);
  P.Hkv = kv.k_pages.dim(1);
  P.Dv = out.dim(2);
  if (P.B == 0 || P.Hq == 0) return;
  fill_common(P, o);
  P.kv_offset = o.kv_offset;
  // Bottom-right aligned per sequence; a plain causal decode of every sequence needs no mask.
  bool all_decode = true;
  thread_local std::vector<SeqPlan> seqs;
  seqs.assign(static_cast<size_t>(P.B), SeqPlan{});
  for (int64_t b = 0; b < P.B; ++b) {
    SeqPlan& x = seqs[static_cast<size_t>(b)];
    x.q_row0 = cu_seqlens_q[b];
    x.Sq = cu_seqlens_q[b + 1] - cu_seqlens_q[b];
    x.Skv = kv.seq_len(b);
    x.q_offset = o.kv_offset + x.Skv - x.Sq;
    all_decode &= x.Sq <= 1;
  }
  P.mask_free = all_decode && P.spec.causal && P.spec.sliding_window == 0 &&
                P.spec.chunk_size == 0 && !P.spec.fn && !P.spec.doc_ids && !P.spec.kv_begin &&
                !P.spec.kv_end;
  execute<Ops>(P, seqs, o.kv_split, kv.k_pages.dtype());
}

}  // namespace

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
// are evaluated per tile (empty tiles skipped, full tiles unmasked) by run_task.
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
