// Fused dequantizing attention (see attention_quant.h for the folding of scales and zeros).
//
// Work decomposition, online softmax, masking and the merge of split-KV partitions are the
// attention skeleton's (attention_skeleton.h), shared with the fused kernel: a task is (batch b,
// KV head hk, query tile, KV split); its rows are the H_q / H_kv query heads of the group times
// the tile's query positions, so every packed block is read and its codes widened once per GQA
// group. This file holds the tile geometry — the packed blocks (G tokens each) followed by
// 64-token tiles of the residual — and the logits and P.V of a tile (QuantTiles).
//
// Where the cycles go (decode, 4-bit, D = 128, 4 query heads per KV head). Logits of 2- and
// 4-bit blocks are int8 x code dots (attention_quant.h): per 64 keys and 4 channels, 8 slab
// loads, 6 shifts / masks and 4 byte permutes lay the codes out as 16 keys x 4 channels per
// vector, then one vpdpbusd per row and vector — 4 per key and row over D = 128 where the f32
// path needs 16 FMAs, and no conversions. 8-bit keys take int16 query dots: key blocks are
// channel-major (kv_quant.h), so per 64 keys and 2 channels, two 64-byte column loads and 4
// zero-masked byte permutes give 16 keys x 2 channels as word pairs per vector, then one
// vpdpwssd per row and vector (int16_key_group512): 2 products per lane where the f32 path took a
// conversion and an FMA per product. 4-bit P.V (value groups of whole 32-channel slabs) runs on
// int16 weights: per pair of keys and 32 channels, one vpermb lays both keys' code bytes out as
// word pairs, a mask and a shift split the nibbles, and one vpdpwssd per row and nibble adds 32
// products where an FMA adds 16, with no conversions (int_pv); 8-bit P.V (groups of whole
// 16-channel slabs) the same without the nibble split (int_pv8_pass). Other P.V widens
// 16 vectors of 8 codes per key, each feeding 4 FMAs, as f16 does, with fewer bytes read. Value
// rows are token-major; at 2 bits (and 4 bits whose groups are not whole slabs) P.V widens them
// in the "chunked" channel order (see chunked_channel): a zero-extending load of 8 code bytes,
// then a shift and a mask per vector, instead of a broadcast, variable shift and mask per vector.
#include "kernels/attention_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/prefetch.h"
#include "core/thread_pool.h"
#include "kernels/attention_internal.h"
#include "kernels/attention_simd.h"
#include "kernels/attention_skeleton.h"
#include "kernels/attention_workspace.h"
#include "kernels/int8_dot.h"
#include "kernels/kv_quant.h"
#include "kernels/mask.h"

namespace kvcache {
namespace {

using detail::by_row_blocks;
using detail::Elem;
#if KVCACHE_ATTN_AVX2
using detail::hsum8;
using detail::load8;
#endif
#if KVCACHE_ATTN_AVX512
using detail::load16;
using detail::pin;
using detail::pv_step64;
#endif

// 2- and 4-bit key scores by AVX512-VNNI dots over vpermt2b-interleaved codes (else AVX2's).
#if KVCACHE_ATTN_AVX512 && defined(__AVX512VNNI__) && defined(__AVX512VBMI__)
#define KVCACHE_QK_INT512 1
#else
#define KVCACHE_QK_INT512 0
#endif

constexpr int64_t kResTile = 64;      // residual keys per tile
constexpr int64_t kRowsPerTask = 64;  // target rows (heads x positions) per task
// The most keys of a block whose int16 P.V sums stay in int32: 15 * 32767 * 4368 < 2^31.
constexpr int64_t kIntPvMaxKeys = 4096;
// The next packed block, prefetched while the current one is scored, a slice per group of
// keys: the hardware prefetcher alone leaves the first touch of each block stalled on memory
// (the same finding as the fused kernel's, attention_fused.cc).
struct Ahead {
  const std::byte* k = nullptr;  // the next K block (header and codes)
  const std::byte* v = nullptr;  // the next V block
  int64_t kbytes = 0, vbytes = 0;
  // One group's share: lines [k, k + 64 nk) and [v, v + 64 nv), issued `per` lines of each
  // stream every `step` channels of the group's channel loop.
  struct Slice {
    const std::byte* k = nullptr;
    const std::byte* v = nullptr;
    int64_t nk = 0, nv = 0;
    int64_t per = 0, step = std::numeric_limits<int64_t>::max() / 2;
  };
  // Issues a slice's lines over a channel loop: at(d) for d = 0, 1, ... issues `per` lines of
  // each stream every `step` channels.
  class Issuer {
   public:
    explicit Issuer(const Slice& s) : s_(s) {}
    void at(int64_t d) {
      if (d != next_) return;
      for (int64_t e = line_; e < line_ + s_.per; ++e) {
        if (e < s_.nk) prefetch_l1(s_.k + 64 * e);
        if (e < s_.nv) prefetch_l1(s_.v + 64 * e);
      }
      line_ += s_.per;
      next_ += s_.step;
    }

   private:
    const Slice& s_;
    int64_t next_ = 0, line_ = 0;
  };
  // Deals both blocks' lines out over the n groups of a block, in group order. Every division
  // happens here, once per block, not in each group of 16 keys (several integer divisions per
  // group otherwise).
  class Dealer {
   public:
    Dealer(const Ahead& a, int64_t n, int64_t Dk) : a_(a) {
      const int64_t lk = (a.kbytes + 63) / 64, lv = (a.vbytes + 63) / 64;
      qk_ = lk / n, rk_ = lk % n, qv_ = lv / n, rv_ = lv % n;
      const int64_t lines = std::max(qk_ + (rk_ > 0), qv_ + (rv_ > 0));  // the largest share
      if (lines > 0) {
        per_ = (lines + Dk - 1) / Dk;  // lines per stream and event (1 unless tiny D)
        step_ = std::max<int64_t>(1, Dk / ((lines + per_ - 1) / per_));
      }
    }
    Slice next() {
      Slice s{a_.k + 64 * k_at_, a_.v + 64 * v_at_, qk_ + (i_ < rk_), qv_ + (i_ < rv_)};
      if (per_ > 0) s.per = per_, s.step = step_;
      k_at_ += s.nk;
      v_at_ += s.nv;
      ++i_;
      return s;
    }

   private:
    const Ahead& a_;
    int64_t qk_ = 0, rk_ = 0, qv_ = 0, rv_ = 0, per_ = 0, step_ = 0;
    int64_t i_ = 0, k_at_ = 0, v_at_ = 0;
  };
};

// ---------------------------------------------------------------------------------------------
// The chunked code order (2 and 4 bits, SIMD path). Eight packed code bytes hold
// kChunk = 8 * (8 / BITS) channels; one zero-extending load puts byte i in lane i, and a shift
// by k * BITS plus a mask gives vector k of the chunk, whose lane i is channel
// i * (8 / BITS) + k. That is two or three integer ops and a convert per 8 codes, where
// widening 8 consecutive channels costs a broadcast, a variable shift, a mask and a convert.
// The kernel keeps the queries (times key scales) and the P.V accumulator of packed blocks in
// this order instead; a dot product does not care, and the accumulator is put back in channel
// order once per task.
template <int BITS>
constexpr int64_t chunk_channels() {
  return 8 * (8 / BITS);
}
// Channel held at position p of the chunked order.
template <int BITS>
constexpr int64_t chunked_channel(int64_t p) {
  constexpr int64_t per = 8 / BITS, ch = chunk_channels<BITS>();
  const int64_t w = p % ch;
  return p - w + (w % 8) * per + w / 8;
}

// ---------------------------------------------------------------------------------------------
// The symmetric integer rounding of a row (see attention_quant.h): the int8 rounding of
// q' = q * ks (2- and 4-bit key blocks, L = 127) and the int16 rounding of the value weights
// p * vs (4-bit value blocks, L = 32767). From the row's largest magnitude m come the two
// scales, computed the same way on every path (a max is exact in any order; L / m and m / L are
// single divisions).
struct IntRound {
  float inv = 0, step = 0;  // x * inv rounds to the codes; step * code approximates x
  bool zero = true;         // all codes 0 (tiny or non-finite rows)
};
constexpr int kQueryLevels = 127, kWeightLevels = 32767;
// The int16 levels L of a sum of `terms` products with 8-bit codes (the queries of 8-bit key
// blocks over D_k channels, the weights of 8-bit value blocks over G keys): 32767, or fewer
// where terms x 255 x L could leave int32 (terms > 257).
inline int code8_levels(int64_t terms) {
  return static_cast<int>(
      std::min<int64_t>(32767, 2147483647 / (255 * std::max<int64_t>(terms, 1))));
}
inline IntRound round_from_max(float m, bool finite, int L) {
  IntRound q;
  if (!finite) {
    q.step = std::numeric_limits<float>::quiet_NaN();
  } else if (m >= 0x1p-100f) {
    q.inv = static_cast<float>(L) / m;
    q.step = m / static_cast<float>(L);
    q.zero = false;
  }
  return q;
}
// Folds x[0, n) into the running largest magnitude m and the all-finite flag.
inline void fold_abs_max(const float* x, int64_t n, float& m, bool& finite) {
  for (int64_t d = 0; d < n; ++d) {
    const float a = std::fabs(x[d]);
    finite = finite && a <= std::numeric_limits<float>::max();
    m = std::max(m, a);
  }
}
inline IntRound int_round(const float* x, int64_t n, int L) {
  float m = 0;
  bool finite = true;
  fold_abs_max(x, n, m, finite);
  return round_from_max(m, finite, L);
}

// ---------------------------------------------------------------------------------------------
// Scalar building blocks: the portable path and the reference for the SIMD ones.
struct ScalarOps {
  static constexpr bool kPermute = false;  // no chunked code path (see SimdOps)
  static constexpr bool kSimd = false;     // the skeleton's scalar softmax update
  // Per packed block: qk[r, d] = qs[r, d] * ks[d], qz[r] = qs[r] . kz, from the block's f16
  // key scales ks and zeros kz.
  static void block_query(const float* qs, int64_t R, int64_t Dk, const f16_t* ks, const f16_t* kz,
                          float* qk, float* qz) {
    for (int64_t r = 0; r < R; ++r) {
      float z = 0;
      for (int64_t d = 0; d < Dk; ++d) {
        qk[r * Dk + d] = qs[r * Dk + d] * f16_to_f32(ks[d]);
        z = std::fma(qs[r * Dk + d], f16_to_f32(kz[d]), z);
      }
      qz[r] = z;
    }
  }
  // Per packed block: pg[g, r, j] = p[r, j] * vs[g, j], zs[r, g] = sum_j p[r, j] vz[g, j], from
  // the block's f16 value scales vs and zeros vz ([ng, G] each, group-major).
  static void value_weights(const float* p, int64_t R, int64_t n, const f16_t* vs, const f16_t* vz,
                            int64_t ng, int64_t G, int64_t st, float* pg, float* zs) {
    for (int64_t g = 0; g < ng; ++g)
      for (int64_t r = 0; r < R; ++r) {
        float z = 0;
        for (int64_t j = 0; j < n; ++j) {
          pg[(g * R + r) * st + j] = p[r * st + j] * f16_to_f32(vs[g * G + j]);
          z = std::fma(p[r * st + j], f16_to_f32(vz[g * G + j]), z);
        }
        zs[r * ng + g] = z;
      }
  }
  // Per packed block and row: q' = qk[r] rounded to integers T with one scale per row and L
  // levels (int8 and L = 127 for 2- and 4-bit keys; int16 and L = code8_levels(D_k) for 8-bit
  // keys): sq[r] = max_d |q'_d| / L, qi[r, d] = nearbyint(q'_d * (L / max)) (|qi| <= L),
  // zero-padded to Dkp channels (D_k rounded up to 4, or to 2). A row whose largest |q'| is
  // below 2^-100 (or zero) gets sq = 0; one with a non-finite element gets sq = NaN (its logits
  // are NaN, as float dots would give). Every path computes these with the same float operations.
  template <typename T>
  static void round_rows(const float* qk, int64_t R, int64_t Dk, int64_t Dkp, int L, T* qi,
                         float* sq) {
    for (int64_t r = 0; r < R; ++r) {
      const float* x = qk + r * Dk;
      T* o = qi + r * Dkp;
      const IntRound q = int_round(x, Dk, L);
      for (int64_t d = 0; d < Dk; ++d)
        o[d] = q.zero ? 0 : static_cast<T>(std::nearbyint(x[d] * q.inv));
      for (int64_t d = Dk; d < Dkp; ++d) o[d] = 0;
      sq[r] = q.step;
    }
  }
  // s[r, j] = fma(float(sum_d qi[r, d] code(j, d)), sq[r], qz[r]) for the keys j of a block
  // (int8 queries for 2 and 4 bits, int16 for 8): the integer sum is exact, so every path gives
  // the same bits.
  template <int BITS, typename T>
  static void int_scores(const T* qi, const float* sq, const float* qz, int64_t R, int64_t Dk,
                         int64_t Dkp, const std::byte* codes, int64_t cb, int64_t n, float* s,
                         int64_t st, const Ahead* = nullptr) {
    for (int64_t j = 0; j < n; ++j)
      for (int64_t r = 0; r < R; ++r) {
        int32_t a = 0;
        for (int64_t d = 0; d < Dk; ++d)
          a += qi[r * Dkp + d] * static_cast<int32_t>(kivi_key_code(codes + d * cb, j, BITS));
        s[r * st + j] = std::fma(static_cast<float>(a), sq[r], qz[r]);
      }
  }
  // acc[r, d] += sum_j pg[g(d), r, j] code(j, d)
  template <int BITS>
  static void packed_pv(const float* pg, int64_t R, const std::byte* codes, int64_t rb, int64_t n,
                        int64_t Dv, int64_t vg, int64_t st, float* acc) {
    for (int64_t j = 0; j < n; ++j) {
      const std::byte* row = codes + j * rb;
      for (int64_t d = 0; d < Dv; ++d) {
        const float c = static_cast<float>(kivi_code(row, d, BITS));
        const float* p = pg + (d / vg) * R * st + j;
        for (int64_t r = 0; r < R; ++r) acc[r * Dv + d] = std::fma(p[r * st], c, acc[r * Dv + d]);
      }
    }
  }
  // ---- 4- and 8-bit value blocks: int16 weights, exact int32 sums (see attention_quant.h) ----
  // Per packed block, value group g and row r: the weights w = pg[g, r, 0..n) rounded to int16
  // with one scale per (g, r) and L levels (QuantParams::wlevels), ws[r, g] = max_j |w_j| / L,
  // wq[g, r, j] = nearbyint(w_j * (L / max)); wq[g, r, n] = 0 when n is odd (the SIMD paths take
  // keys in pairs). A max below 2^-100 (or zero) gives ws = 0 and zero weights; a non-finite
  // weight gives ws = NaN.
  static void round_weights(const float* pg, int64_t R, int64_t n, int64_t ng, int64_t st, int L,
                            int16_t* wq, float* ws) {
    for (int64_t g = 0; g < ng; ++g)
      for (int64_t r = 0; r < R; ++r) {
        const float* w = pg + (g * R + r) * st;
        int16_t* o = wq + (g * R + r) * st;
        const IntRound q = int_round(w, n, L);
        for (int64_t j = 0; j < n; ++j)
          o[j] = q.zero ? 0 : static_cast<int16_t>(std::nearbyint(w[j] * q.inv));
        if (n % 2 != 0) o[n] = 0;
        ws[r * ng + g] = q.step;
      }
  }
  // acc[r, d] = fma(float(sum_j wq[g(d), r, j] code(j, d)), ws[r, g(d)], acc[r, d]) for the keys
  // j of a 4- or 8-bit value block (acc row stride lda): the integer sum is exact, so every path
  // gives the same bits.
  template <int BITS>
  static void int_pv(const int16_t* wq, const float* ws, int64_t R, const std::byte* codes,
                     int64_t rb, int64_t n, int64_t Dv, int64_t vg, int64_t st, int64_t ng,
                     float* acc, int64_t lda) {
    for (int64_t r = 0; r < R; ++r)
      for (int64_t d = 0; d < Dv; ++d) {
        const int64_t g = d / vg;
        const int16_t* w = wq + (g * R + r) * st;
        int32_t a = 0;
        for (int64_t j = 0; j < n; ++j)
          a += w[j] * static_cast<int32_t>(kivi_code(codes + j * rb, d, BITS));
        acc[r * lda + d] = std::fma(static_cast<float>(a), ws[r * ng + g], acc[r * lda + d]);
      }
  }
  template <DType KD>
  static void dense_scores(const float* qs, int64_t R, int64_t Dk, const std::byte* kb,
                           int64_t kstride, int64_t n, float* s, int64_t st) {
    using T = typename Elem<KD>::T;
    for (int64_t j = 0; j < n; ++j) {
      const T* kr = reinterpret_cast<const T*>(kb + j * kstride);
      for (int64_t r = 0; r < R; ++r) {
        float a = 0;
        for (int64_t d = 0; d < Dk; ++d) a = std::fma(qs[r * Dk + d], Elem<KD>::get(kr[d]), a);
        s[r * st + j] = a;
      }
    }
  }
  template <DType KD>
  static void dense_pv(const float* p, int64_t R, const std::byte* vb, int64_t vstride, int64_t n,
                       int64_t Dv, int64_t st, float* acc, int64_t lda) {
    using T = typename Elem<KD>::T;
    for (int64_t j = 0; j < n; ++j) {
      const T* vr = reinterpret_cast<const T*>(vb + j * vstride);
      for (int64_t r = 0; r < R; ++r) {
        const float pj = p[r * st + j];
        for (int64_t d = 0; d < Dv; ++d)
          acc[r * lda + d] = std::fma(pj, Elem<KD>::get(vr[d]), acc[r * lda + d]);
      }
    }
  }
};

#if KVCACHE_ATTN_AVX2
// ---------------------------------------------------------------------------------------------
// AVX2 + FMA + F16C building blocks.

// Codes of channels [d, d + 8) of a row as floats (d a multiple of 8). 4 bits: the 8 codes are
// one little-endian u32 (kv_quant.h's packing); broadcast it and shift lane i right by 4 i.
template <int BITS>
inline __m256 unpack8(const std::byte* row, int64_t d) {
  if constexpr (BITS == 8) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d))));
  } else if constexpr (BITS == 4) {
    uint32_t w;
    std::memcpy(&w, row + d / 2, 4);
    const __m256i sh = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w)), sh);
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
  } else {
    uint16_t w;
    std::memcpy(&w, row + d / 4, 2);
    const __m256i sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(w), sh);
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(3)));
  }
}

// Element loaders of the register-blocked micro-kernels below: packed codes of a KIVI row
// (channel order) or a dense f32/f16/bf16 residual row. at(row, d): channels [d, d + 8) as
// floats; one(row, d): channel d.
template <int BITS>
struct CodeLoad {
  static inline __m256 at(const std::byte* row, int64_t d) { return unpack8<BITS>(row, d); }
  static inline float one(const std::byte* row, int64_t d) {
    return static_cast<float>(kivi_code(row, d, BITS));
  }
#if KVCACHE_ATTN_AVX512
  // Channels [d, d + 16) (d a multiple of 8).
  static inline __m512 at16(const std::byte* row, int64_t d) {
    if constexpr (BITS == 8)
      return _mm512_cvtepi32_ps(
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d))));
    return _mm512_insertf32x8(_mm512_castps256_ps512(at(row, d)), at(row, d + 8), 1);
  }
#endif
};
template <DType KD>
struct DenseLoad {
  using T = typename Elem<KD>::T;
  static inline __m256 at(const std::byte* row, int64_t d) {
    return load8<KD>(reinterpret_cast<const T*>(row) + d);
  }
  static inline float one(const std::byte* row, int64_t d) {
    return Elem<KD>::get(reinterpret_cast<const T*>(row)[d]);
  }
#if KVCACHE_ATTN_AVX512
  static inline __m512 at16(const std::byte* row, int64_t d) {
    return load16<KD>(reinterpret_cast<const T*>(row) + d);
  }
#endif
};

#if KVCACHE_QK_INT512
// vpermt2b indices of the slab interleave (int_key_group512): output byte 4 t + c (key t of 16,
// channel c of 4) from sub-vector a's (t < 8) or a + 1's (t >= 8) lane c, byte 8 h + t % 8
// (h: the slab's first or second chunk).
struct QuadIndex {
  alignas(64) uint8_t b[2][64];
};
constexpr QuadIndex make_quad_index() {
  QuadIndex q{};
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < 16; ++t)
      for (int c = 0; c < 4; ++c)
        q.b[h][4 * t + c] = static_cast<uint8_t>((t < 8 ? 0 : 64) + 16 * c + 8 * h + t % 8);
  return q;
}
inline constexpr QuadIndex kQuadIndex = make_quad_index();

// vpermb indices of the value pair interleave (pair_words512): output byte 4 i from byte i (the
// first key's row), byte 4 i + 2 from byte 16 + i (the second key's); the odd bytes are zeroed by
// the mask, so 32-bit lane i holds the two keys' code bytes i as 16-bit words.
struct PairIndex {
  alignas(64) uint8_t b[64];
};
constexpr PairIndex make_pair_index() {
  PairIndex x{};
  for (int i = 0; i < 16; ++i) {
    x.b[4 * i] = static_cast<uint8_t>(i);
    x.b[4 * i + 2] = static_cast<uint8_t>(16 + i);
  }
  return x;
}
inline constexpr PairIndex kPairIndex = make_pair_index();

// vpermt2b indices of the 8-bit key interleave (int16_key_group512), per vector o of 16 keys:
// output byte 4 t from column d's byte 16 o + t (the first source), byte 4 t + 2 from column
// d + 1's (the second); the odd bytes are zeroed by the mask, so 32-bit lane t holds key
// 16 o + t's codes of the two channels as 16-bit words.
struct WordPairIndex {
  alignas(64) uint8_t b[4][64];
};
constexpr WordPairIndex make_word_pair_index() {
  WordPairIndex x{};
  for (int o = 0; o < 4; ++o)
    for (int t = 0; t < 16; ++t) {
      x.b[o][4 * t] = static_cast<uint8_t>(16 * o + t);
      x.b[o][4 * t + 2] = static_cast<uint8_t>(64 + 16 * o + t);
    }
  return x;
}
inline constexpr WordPairIndex kWordPairIndex = make_word_pair_index();
#endif

inline float hsum(__m256 x) {
  const __m128 a = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(b, _mm_movehdup_ps(b)));
}

struct SimdOps {
  // ScalarOps::block_query with the scales read as f16 directly, converted once per 16 channels
  // for a block of up to 4 rows. The dot product takes 16 channels per step as two 8-lane halves
  // added before the lane sum, so the AVX2 and AVX-512 paths give the same bits.
  // (A function of its own, not a by_row_blocks lambda: through the lambda's captured
  // references GCC reloaded Dk and the pointers after every store.)
  template <int NR>
  static void block_query_rows(const float* __restrict q, int64_t Dk, const f16_t* __restrict ks,
                               const f16_t* __restrict kz, float* __restrict o,
                               float* __restrict qz) {
    __m256 z[NR];
    int64_t d = 0;
#if KVCACHE_ATTN_AVX512
    __m512 z16[NR];
    for (int r = 0; r < NR; ++r) z16[r] = _mm512_setzero_ps();
    for (; d + 16 <= Dk; d += 16) {
      const __m512 ksv = load16<DType::kF16>(ks + d), kzv = load16<DType::kF16>(kz + d);
      for (int r = 0; r < NR; ++r) {
        const __m512 qv = _mm512_loadu_ps(q + r * Dk + d);
        _mm512_storeu_ps(o + r * Dk + d, _mm512_mul_ps(qv, ksv));
        z16[r] = _mm512_fmadd_ps(qv, kzv, z16[r]);
      }
    }
    for (int r = 0; r < NR; ++r)
      z[r] = _mm256_add_ps(_mm512_castps512_ps256(z16[r]), _mm512_extractf32x8_ps(z16[r], 1));
#else
    __m256 za[NR], zb[NR];
    for (int r = 0; r < NR; ++r) za[r] = zb[r] = _mm256_setzero_ps();
    for (; d + 16 <= Dk; d += 16) {
      const __m256 ka = load8<DType::kF16>(ks + d), kb = load8<DType::kF16>(ks + d + 8);
      const __m256 zka = load8<DType::kF16>(kz + d), zkb = load8<DType::kF16>(kz + d + 8);
      for (int r = 0; r < NR; ++r) {
        const __m256 qa = _mm256_loadu_ps(q + r * Dk + d);
        const __m256 qb = _mm256_loadu_ps(q + r * Dk + d + 8);
        _mm256_storeu_ps(o + r * Dk + d, _mm256_mul_ps(qa, ka));
        _mm256_storeu_ps(o + r * Dk + d + 8, _mm256_mul_ps(qb, kb));
        za[r] = _mm256_fmadd_ps(qa, zka, za[r]);
        zb[r] = _mm256_fmadd_ps(qb, zkb, zb[r]);
      }
    }
    for (int r = 0; r < NR; ++r) z[r] = _mm256_add_ps(za[r], zb[r]);
#endif
    for (; d + 8 <= Dk; d += 8) {
      const __m256 ksv = load8<DType::kF16>(ks + d), kzv = load8<DType::kF16>(kz + d);
      for (int r = 0; r < NR; ++r) {
        const __m256 qv = _mm256_loadu_ps(q + r * Dk + d);
        _mm256_storeu_ps(o + r * Dk + d, _mm256_mul_ps(qv, ksv));
        z[r] = _mm256_fmadd_ps(qv, kzv, z[r]);
      }
    }
    for (int r = 0; r < NR; ++r) {
      float zz = hsum(z[r]);
      for (int64_t e = d; e < Dk; ++e) {
        o[r * Dk + e] = q[r * Dk + e] * f16_to_f32(ks[e]);
        zz = std::fma(q[r * Dk + e], f16_to_f32(kz[e]), zz);
      }
      qz[r] = zz;
    }
  }
  static void block_query(const float* qs, int64_t R, int64_t Dk, const f16_t* ks, const f16_t* kz,
                          float* qk, float* qz) {
    by_row_blocks(R, [&]<int NR>(int64_t r) {
      block_query_rows<NR>(qs + r * Dk, Dk, ks, kz, qk + r * Dk, qz + r);
    });
  }
  // ScalarOps::value_weights with the block's f16 scales and zeros read directly (no converted
  // copy). The zero term runs two 8-lane FMA chains, over the even and the odd 8-key chunks (one
  // 16-lane chain on AVX-512), added before the lane sum: the same bits on both paths. p is
  // zero-padded to a multiple of 8 keys (softmax_update); a last partial chunk of scales is read
  // through a zero-padded copy, so no lane multiplies bytes past the block's scales.
  static void value_weights(const float* p, int64_t R, int64_t n, const f16_t* vs, const f16_t* vz,
                            int64_t ng, int64_t G, int64_t st, float* pg, float* zs) {
    const int64_t n8 = (n + 7) & ~int64_t{7}, full = n & ~int64_t{7};
    for (int64_t g = 0; g < ng; ++g) {
      const f16_t* sg = vs + g * G;
      const f16_t* zg = vz + g * G;
      f16_t ts[8] = {}, tz[8] = {};  // the last partial chunk, zero-padded
      for (int64_t j = full; j < n; ++j) ts[j - full] = sg[j], tz[j - full] = zg[j];
      for (int64_t r = 0; r < R; ++r) {
        const float* pr = p + r * st;
        float* o = pg + (g * R + r) * st;
        __m256 za = _mm256_setzero_ps(), zb = _mm256_setzero_ps();
        int64_t j = 0;
#if KVCACHE_ATTN_AVX512
        __m512 z16 = _mm512_setzero_ps();
        for (; j + 16 <= full; j += 16) {
          const __m512 pv = _mm512_loadu_ps(pr + j);
          _mm512_storeu_ps(o + j, _mm512_mul_ps(pv, load16<DType::kF16>(sg + j)));
          z16 = _mm512_fmadd_ps(pv, load16<DType::kF16>(zg + j), z16);
        }
        za = _mm512_castps512_ps256(z16);
        zb = _mm512_extractf32x8_ps(z16, 1);
#endif
        for (; j < n8; j += 8) {
          const __m256 pv = _mm256_loadu_ps(pr + j);
          _mm256_storeu_ps(o + j, _mm256_mul_ps(pv, load8<DType::kF16>(j < full ? sg + j : ts)));
          __m256& zc = (j / 8) % 2 == 0 ? za : zb;
          zc = _mm256_fmadd_ps(pv, load8<DType::kF16>(j < full ? zg + j : tz), zc);
        }
        zs[r * ng + g] = hsum(_mm256_add_ps(za, zb));
      }
    }
  }
  // NR rows x NK keys of dot products, accumulators in registers; qz (per-row constant added,
  // the KIVI zero term) may be null.
  template <typename Load, int NR, int NK>
  __attribute__((always_inline)) static inline void score_block(const float* qk, const float* qz,
                                                                int64_t Dk,
                                                                const std::byte* const* row,
                                                                float* s, int64_t st) {
    __m256 acc[NR * NK];
    for (int i = 0; i < NR * NK; ++i) acc[i] = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 8 <= Dk; d += 8) {
      __m256 kv[NK];
      for (int c = 0; c < NK; ++c) kv[c] = Load::at(row[c], d);
      for (int r = 0; r < NR; ++r) {
        __m256 qv = _mm256_loadu_ps(qk + r * Dk + d);
        if constexpr (NK > 1) asm("" : "+x"(qv));  // keep q in a register (see fused kernel)
        for (int c = 0; c < NK; ++c) acc[r * NK + c] = _mm256_fmadd_ps(qv, kv[c], acc[r * NK + c]);
      }
    }
    alignas(32) float res[NR * NK];
    if constexpr (NR * NK == 8) {
      _mm256_store_ps(res, hsum8(acc));  // one transposing reduction instead of 8 scalar ones
    } else {
      for (int i = 0; i < NR * NK; ++i) res[i] = hsum(acc[i]);
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < NK; ++c) {
        float x = res[r * NK + c];
        for (int64_t dd = d; dd < Dk; ++dd) x = std::fma(qk[r * Dk + dd], Load::one(row[c], dd), x);
        s[r * st + c] = qz ? x + qz[r] : x;
      }
  }
  // Dense rows (the residual, per-token scratch): dot products of NR rows x 2 keys.
  template <typename Load, int NR>
  static void score_rows(const float* qk, int64_t Dk, const std::byte* kb, int64_t kstride,
                         int64_t n, float* s, int64_t st) {
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
      const std::byte* rows[2] = {kb + j * kstride, kb + (j + 1) * kstride};
      score_block<Load, NR, 2>(qk, nullptr, Dk, rows, s + j, st);
    }
    if (j < n) {
      const std::byte* rows[1] = {kb + j * kstride};
      score_block<Load, NR, 1>(qk, nullptr, Dk, rows, s + j, st);
    }
  }

#if KVCACHE_ATTN_AVX512
  // ---- AVX-512: two neighbouring chunks per load (chunked P.V) ----
  // One zero-extending load puts the bytes of chunks c and c + 1 in lanes 0-7 and 8-15. Vector
  // K of that (a shift by K * BITS, a mask, a conversion) holds extract's vector K of chunk c in
  // lanes 0-7 and of chunk c + 1 in lanes 8-15: each lane the same code. (Not a
  // vpermps of the table i -> i & mask, which masks and converts in one op: it competes with the
  // FMAs for their execution units, where the and + cvtdq2ps pairs barely do.)
  static inline __m512i load_chunks2(const std::byte* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  template <int BITS, int K>
  static inline __m512 extract2(__m512i x) {
    constexpr int per = 8 / BITS;
    if constexpr (K > 0) x = _mm512_srli_epi32(x, K * BITS);
    if constexpr (K + 1 < per) x = _mm512_and_si512(x, _mm512_set1_epi32((1 << BITS) - 1));
    return _mm512_cvtepi32_ps(x);
  }
  // Vectors I... of the chunks from p on: vector i = l * per + K is vector K of load l (chunks
  // 2l and 2l + 1). Its lanes 0-7 are the 8 codes of AVX2 vector pair_lo(i) (extract's
  // numbering from p), lanes 8-15 those of vector pair_lo(i) + per.
  template <int BITS>
  static constexpr int pair_lo(int i) {
    constexpr int per = 8 / BITS;
    return 2 * (i / per) * per + i % per;
  }
  template <int BITS, int... I>
  __attribute__((always_inline)) static inline void pair_vectors(const std::byte* p, __m512* v,
                                                                 std::integer_sequence<int, I...>) {
    constexpr int per = 8 / BITS, L = sizeof...(I) / per;
    static_assert(sizeof...(I) % per == 0, "whole loads");
    __m512i x[L];
    for (int l = 0; l < L; ++l) x[l] = load_chunks2(p + 16 * l);
    ((v[I] = extract2<BITS, I % per>(x[I / per])), ...);
  }
#endif
  // int_round (the largest magnitude and the all-finite flag) in vectors: a max is exact in
  // any order, so the same scales as the scalar path.
  static IntRound simd_int_round(const float* x, int64_t n, int L) {
    const __m256 sign = _mm256_set1_ps(-0.0f), big = _mm256_set1_ps(3.4028235e38f);
    __m256 mv = _mm256_setzero_ps(), badv = _mm256_setzero_ps();
    int64_t d = 0;
#if KVCACHE_ATTN_AVX512
    __m512 mv16 = _mm512_setzero_ps();
    __mmask16 bad16 = 0;
    for (; d + 16 <= n; d += 16) {
      const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + d));
      mv16 = _mm512_max_ps(mv16, a);
      bad16 |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.4028235e38f), _CMP_NLE_UQ);
    }
    mv = _mm256_max_ps(_mm512_castps512_ps256(mv16), _mm512_extractf32x8_ps(mv16, 1));
    if (bad16) badv = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
#endif
    for (; d + 8 <= n; d += 8) {
      const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + d));
      mv = _mm256_max_ps(mv, a);
      badv = _mm256_or_ps(badv, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));  // inf or NaN
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mv), _mm256_extractf128_ps(mv, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    float m = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));  // a tree: no chain of 8 maxss
    bool finite = _mm256_movemask_ps(badv) == 0;
    fold_abs_max(x + d, n - d, m, finite);
    return round_from_max(m, finite, L);
  }

  // ---- key blocks: int8 (2, 4 bits) or int16 (8 bits) queries, exact int32 dots ----
  // ScalarOps::round_rows, the max and the conversions in vectors: the same floats, the same
  // round-to-nearest-even (the default MXCSR mode, as std::nearbyint's default).
  template <typename T>
  static void round_rows(const float* qk, int64_t R, int64_t Dk, int64_t Dkp, int L, T* qi,
                         float* sq) {
    for (int64_t r = 0; r < R; ++r) {
      const float* x = qk + r * Dk;
      T* o = qi + r * Dkp;
      const IntRound q = simd_int_round(x, Dk, L);
      sq[r] = q.step;
      int64_t d = 0;
      if (!q.zero) {
        const __m256 iv = _mm256_set1_ps(q.inv);
#if KVCACHE_ATTN_AVX512
        for (; d + 16 <= Dk; d += 16) {
          const __m512i c =
              _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + d), _mm512_set1_ps(q.inv)));
          if constexpr (sizeof(T) == 1)
            _mm_storeu_si128(reinterpret_cast<__m128i*>(o + d), _mm512_cvtepi32_epi8(c));
          else
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + d), _mm512_cvtepi32_epi16(c));
        }
#endif
        for (; d + 16 <= Dk; d += 16) {
          const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + d), iv));
          const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + d + 8), iv));
          // int32 -> int16 (|codes| <= L <= 32767: no saturation), lanes back in order
          const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
          if constexpr (sizeof(T) == 1) {
            const __m256i c = _mm256_permute4x64_epi64(_mm256_packs_epi16(w, w), 0x08);
            _mm_storeu_si128(reinterpret_cast<__m128i*>(o + d), _mm256_castsi256_si128(c));
          } else {
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + d), w);
          }
        }
        for (; d < Dk; ++d) o[d] = static_cast<T>(std::nearbyint(x[d] * q.inv));
      }
      for (; d < Dkp; ++d) o[d] = 0;
    }
  }
  // ---- 8-bit key blocks: int16 queries, two channels per 32-bit lane ----
  // A key column holds the block's codes of one channel, token-consecutive (kv_quant.h). Lane t
  // of a vector holds key t's codes of channels d and d + 1 as two 16-bit words, which one
  // vpdpwssd (vpmaddwd + vpaddd on AVX2) multiplies by the two channels' query words and adds
  // to key t's int32 sum: 2 products per lane and instruction where the f32 path took one FMA
  // and a conversion per product. With |qi| <= code8_levels(D_k), the sum stays in int32.
#if KVCACHE_QK_INT512
  // 16 keys x 2 channels per zmm: columns d and d + 1 (64 keys each, one zmm apiece) go through
  // one zero-masked two-source byte permute per 16 keys (kWordPairIndex): key t's two codes land
  // in bytes 4t and 4t + 2, the odd bytes zeroed.
  template <int NR, bool FULL>
  static void int16_key_group512(const int16_t* qw, const float* sq, const float* qz, int64_t Dk,
                                 int64_t Dk2, const std::byte* codes, int64_t cb, int64_t k0,
                                 int64_t nk, float* s, int64_t st, const Ahead::Slice& pf) {
    constexpr int NO = 4;  // 64 keys
    __m512i acc[NR * NO];
#pragma GCC unroll 16
    for (int i = 0; i < NR * NO; ++i) acc[i] = _mm512_setzero_si512();
    __m512i idx[NO];
#pragma GCC unroll 4
    for (int o = 0; o < NO; ++o) idx[o] = _mm512_load_si512(kWordPairIndex.b[o]);
    constexpr __mmask64 kWords = 0x5555555555555555ull;
    const __mmask64 lm = FULL ? ~__mmask64{0} : (__mmask64{1} << nk) - 1;  // nk < 64 unless FULL
    auto load = [lm](const std::byte* p) {
      if constexpr (FULL) return _mm512_loadu_si512(p);
      return _mm512_maskz_loadu_epi8(lm, p);
    };
    Ahead::Issuer issue(pf);
    const std::byte* p = codes + k0;
    const int64_t pairs = Dk / 2;
    for (int64_t i = 0; i < Dk2 / 2; ++i, p += 2 * cb) {
      issue.at(i);
      const __m512i a = load(p), b = i < pairs ? load(p + cb) : _mm512_setzero_si512();
      __m512i x[NO];
#pragma GCC unroll 4
      for (int o = 0; o < NO; ++o) x[o] = _mm512_maskz_permutex2var_epi8(kWords, a, idx[o], b);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        int32_t w;
        std::memcpy(&w, qw + r * Dk2 + 2 * i, 4);
        const __m512i qb = _mm512_set1_epi32(w);
#pragma GCC unroll 4
        for (int o = 0; o < NO; ++o)
          acc[r * NO + o] = _mm512_dpwssd_epi32(acc[r * NO + o], x[o], qb);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 sv = _mm512_set1_ps(sq[r]), zv = _mm512_set1_ps(qz[r]);
#pragma GCC unroll 4
      for (int o = 0; o < NO; ++o)
        _mm512_storeu_ps(s + r * st + k0 + 16 * o,
                         _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r * NO + o]), sv, zv));
    }
  }
  template <int NR>
  static void int16_key_rows(const int16_t* qw, const float* sq, const float* qz, int64_t Dk,
                             int64_t Dk2, const std::byte* codes, int64_t cb, int64_t n, float* s,
                             int64_t st, const Ahead* ah) {
    const int64_t groups = (n + 63) / 64, full = cb / 64;  // full: 64 bytes in the column
    std::optional<Ahead::Dealer> deal;
    if (ah) deal.emplace(*ah, groups, Dk2 / 2);
    for (int64_t g = 0; g < groups; ++g) {
      const Ahead::Slice sl = deal ? deal->next() : Ahead::Slice{};
      if (g < full)
        int16_key_group512<NR, true>(qw, sq, qz, Dk, Dk2, codes, cb, 64 * g, 64, s, st, sl);
      else  // the column's last bytes: never read past it
        int16_key_group512<NR, false>(qw, sq, qz, Dk, Dk2, codes, cb, 64 * g,
                                      std::min<int64_t>(64, cb - 64 * g), s, st, sl);
    }
  }
#else
  // 8 keys x 2 channels per ymm: 8 code bytes of columns d and d + 1 interleaved (punpcklbw)
  // and zero-extended to words. NV vectors per group within AVX2's 16 registers.
  template <int NR, int NV>
  static void int16_key_group256(const int16_t* qw, const float* sq, const float* qz, int64_t Dk,
                                 int64_t Dk2, const std::byte* codes, int64_t cb, int64_t c0,
                                 float* s, int64_t st, const Ahead::Slice& pf) {
    __m256i acc[NR * NV];
    for (int i = 0; i < NR * NV; ++i) acc[i] = _mm256_setzero_si256();
    Ahead::Issuer issue(pf);
    const std::byte* p = codes + 8 * c0;
    const int64_t pairs = Dk / 2;
    for (int64_t i = 0; i < Dk2 / 2; ++i, p += 2 * cb) {
      issue.at(i);
      __m256i x[NV];
      for (int v = 0; v < NV; ++v) {
        const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * v));
        const __m128i b = i < pairs
                              ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + cb + 8 * v))
                              : _mm_setzero_si128();
        x[v] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b));
      }
      for (int r = 0; r < NR; ++r) {
        int32_t w;
        std::memcpy(&w, qw + r * Dk2 + 2 * i, 4);
        const __m256i qb = _mm256_set1_epi32(w);
        for (int v = 0; v < NV; ++v)
          acc[r * NV + v] = _mm256_add_epi32(acc[r * NV + v], _mm256_madd_epi16(x[v], qb));
      }
    }
    for (int r = 0; r < NR; ++r) {
      const __m256 sv = _mm256_set1_ps(sq[r]), zv = _mm256_set1_ps(qz[r]);
      for (int v = 0; v < NV; ++v)
        _mm256_storeu_ps(s + r * st + 8 * (c0 + v),
                         _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r * NV + v]), sv, zv));
    }
  }
  template <int NR>
  static void int16_key_rows(const int16_t* qw, const float* sq, const float* qz, int64_t Dk,
                             int64_t Dk2, const std::byte* codes, int64_t cb, int64_t n, float* s,
                             int64_t st, const Ahead* ah) {
    constexpr int NV = NR <= 2 ? 4 : 2;
    const int64_t chunks = (n + 7) / 8, groups = chunks / NV, tail = chunks - groups * NV;
    std::optional<Ahead::Dealer> deal;
    if (ah) deal.emplace(*ah, groups + tail, Dk2 / 2);
    for (int64_t g = 0; g < groups; ++g)
      int16_key_group256<NR, NV>(qw, sq, qz, Dk, Dk2, codes, cb, g * NV, s, st,
                                 deal ? deal->next() : Ahead::Slice{});
    for (int64_t c = groups * NV; c < chunks; ++c)
      int16_key_group256<NR, 1>(qw, sq, qz, Dk, Dk2, codes, cb, c, s, st,
                                deal ? deal->next() : Ahead::Slice{});
  }
#endif
#if KVCACHE_QK_INT512
  // AVX512-VNNI + VBMI: 16 keys x 4 channels per vector. A "slab" is 16 bytes of each of 4
  // key columns (two chunks: 2 * 8 * (8 / BITS) tokens), one column per 128-bit lane. A shift
  // and a mask give each chunk's sub-vector k (tokens 8k .. 8k + 7 in bytes 0-7, the second
  // chunk's in bytes 8-15); one two-source byte permute (quad_index) interleaves two of them
  // into 16 consecutive keys x 4 channels, what vpdpbusd sums against 4 query bytes.
  template <bool HALF>
  static inline __m128i slab_column(const std::byte* p) {
    if constexpr (HALF) return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }
  template <bool HALF>
  static inline __m512i load_slab(const std::byte* p, int64_t cb) {
    __m512i z = _mm512_castsi128_si512(slab_column<HALF>(p));
    z = _mm512_inserti32x4(z, slab_column<HALF>(p + cb), 1);
    z = _mm512_inserti32x4(z, slab_column<HALF>(p + 2 * cb), 2);
    return _mm512_inserti32x4(z, slab_column<HALF>(p + 3 * cb), 3);
  }
  // The last channel quad when D_k % 4 != 0: nc < 4 columns, the rest zero (never read).
  static __m512i load_slab_part(const std::byte* p, int64_t cb, int64_t nc, size_t bytes) {
    alignas(64) std::byte t[64] = {};
    for (int64_t c = 0; c < nc; ++c) std::memcpy(t + 16 * c, p + c * cb, bytes);
    return _mm512_load_si512(t);
  }
  // One channel quad of int_key_group512 (PART: the last quad when D_k % 4 != 0, read through a
  // zero-padded copy, outside the main loop).
  template <int BITS, int NR, int NS, bool HALF, bool PART>
  __attribute__((always_inline)) static inline void int_key_quad(__m512i* acc, const int8_t* qi,
                                                                 int64_t Dk4, int64_t d,
                                                                 const std::byte* p, int64_t cb,
                                                                 int64_t nc) {
    constexpr int per = 8 / BITS, NO = NS * per;
    const __m512i mask = _mm512_set1_epi8(static_cast<char>((1 << BITS) - 1));
    __m512i x[NO];
#pragma GCC unroll 2
    for (int l = 0; l < NS; ++l) {
      __m512i z;
      if constexpr (PART)
        z = load_slab_part(p + 16 * l, cb, nc, HALF ? 8 : 16);
      else
        z = load_slab<HALF>(p + 16 * l, cb);
      __m512i e[per];
      e[0] = _mm512_and_si512(z, mask);
#pragma GCC unroll 4
      for (int k = 1; k < per; ++k) e[k] = _mm512_and_si512(_mm512_srli_epi16(z, k * BITS), mask);
#pragma GCC unroll 4
      for (int o = 0; o < per; ++o) {
        const int a = 2 * (o % (per / 2)), h = o / (per / 2);
        x[l * per + o] =
            _mm512_permutex2var_epi8(e[a], _mm512_load_si512(kQuadIndex.b[h]), e[a + 1]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      int32_t w;
      std::memcpy(&w, qi + r * Dk4 + d, 4);
      const __m512i qb = _mm512_set1_epi32(w);
#pragma GCC unroll 8
      for (int o = 0; o < NO; ++o) acc[r * NO + o] = _mm512_dpbusd_epi32(acc[r * NO + o], x[o], qb);
    }
  }
  // NS slabs (NS * 8 / BITS vectors of 16 keys) from slab sl0 on, NR rows, accumulators in
  // registers over the channel quads. HALF: the column's last chunk alone (bytes 8-15 zero).
  template <int BITS, int NR, int NS, bool HALF>
  static void int_key_group512(const int8_t* qi, const float* sq, const float* qz, int64_t Dk,
                               int64_t Dk4, const std::byte* codes, int64_t cb, int64_t sl0,
                               float* s, int64_t st, const Ahead::Slice& pf) {
    constexpr int per = 8 / BITS, NO = NS * per;
    __m512i acc[NR * NO];
#pragma GCC unroll 32
    for (int i = 0; i < NR * NO; ++i) acc[i] = _mm512_setzero_si512();
    Ahead::Issuer issue(pf);
    const std::byte* p = codes + 16 * sl0;
    const int64_t full = Dk & ~int64_t{3};
    int64_t d = 0;
    for (; d < full; d += 4, p += 4 * cb) {
      issue.at(d / 4);  // the dealer spreads the lines over the channel quads
      int_key_quad<BITS, NR, NS, HALF, false>(acc, qi, Dk4, d, p, cb, 4);
      // Pinned to registers once per quad: without this GCC 12 copied every accumulator to a
      // second register and back and kept four on the stack, each quad (1.05-1.08x in cache).
#pragma GCC unroll 32
      for (int i = 0; i < NR * NO; ++i) asm("" : "+v"(acc[i]));
    }
    if (d < Dk) {
      issue.at(d / 4);
      int_key_quad<BITS, NR, NS, HALF, true>(acc, qi, Dk4, d, p, cb, Dk - d);
    }
    float* s0 = s + 16 * per * sl0;
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 sv = _mm512_set1_ps(sq[r]), zv = _mm512_set1_ps(qz[r]);
#pragma GCC unroll 8
      for (int o = 0; o < NO; ++o)
        _mm512_storeu_ps(s0 + r * st + 16 * o,
                         _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r * NO + o]), sv, zv));
    }
  }
  template <int BITS, int NR>
  static void int_key_rows(const int8_t* qi, const float* sq, const float* qz, int64_t Dk,
                           int64_t Dk4, const std::byte* codes, int64_t cb, int64_t n, float* s,
                           int64_t st, const Ahead* ah) {
    constexpr int64_t T = 8 * (8 / BITS);  // tokens per chunk
    constexpr int NS = BITS == 4 ? 2 : 1;  // slabs per group: 4 vectors of 16 keys
    const int64_t chunks = (n + T - 1) / T, slabs = chunks / 2, groups = slabs / NS;
    const int64_t rest = slabs - groups * NS, half = chunks % 2;
    std::optional<Ahead::Dealer> deal;
    if (ah) deal.emplace(*ah, groups + rest + half, Dk4 / 4);
    int64_t sl = 0;
    for (int64_t g = 0; g < groups; ++g, sl += NS)
      int_key_group512<BITS, NR, NS, false>(qi, sq, qz, Dk, Dk4, codes, cb, sl, s, st,
                                            deal ? deal->next() : Ahead::Slice{});
    for (int64_t g = 0; g < rest; ++g, ++sl)
      int_key_group512<BITS, NR, 1, false>(qi, sq, qz, Dk, Dk4, codes, cb, sl, s, st,
                                           deal ? deal->next() : Ahead::Slice{});
    if (half)
      int_key_group512<BITS, NR, 1, true>(qi, sq, qz, Dk, Dk4, codes, cb, sl, s, st,
                                          deal ? deal->next() : Ahead::Slice{});
  }
  static constexpr int kIntRows = 4;  // rows per pass (both widths: 4 x 4 zmm accumulators)
#else
  // AVX2: 8 keys x 4 channels per vector. Per chunk, 8 bytes of each of 4 key columns; a dword
  // permute groups each column's tokens 0-3 in the low lane and 4-7 in the high lane, and a byte
  // shuffle transposes each lane's 4 x 4 bytes. maddubs pairs stay within int16 (2 * 15 * 127).
  template <int BITS, int NR>
  static void int_key_chunk256(const int8_t* qi, const float* sq, const float* qz, int64_t Dk,
                               int64_t Dk4, const std::byte* codes, int64_t cb, int64_t c, float* s,
                               int64_t st, const Ahead::Slice& pf) {
    constexpr int per = 8 / BITS;
    __m256i acc[NR * per];
    for (int i = 0; i < NR * per; ++i) acc[i] = _mm256_setzero_si256();
    const __m256i mask = _mm256_set1_epi8(static_cast<char>((1 << BITS) - 1));
    const __m256i perm = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4,
                                        8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    Ahead::Issuer issue(pf);
    const std::byte* p = codes + 8 * c;
    for (int64_t d = 0; d < Dk4; d += 4, p += 4 * cb) {
      issue.at(d / 4);  // the dealer spreads the lines over the channel quads
      int64_t w[4] = {};
      for (int64_t k = 0; k < std::min<int64_t>(4, Dk - d); ++k) std::memcpy(&w[k], p + k * cb, 8);
      const __m256i z =
          _mm256_permutevar8x32_epi32(_mm256_set_epi64x(w[3], w[2], w[1], w[0]), perm);
      __m256i qb[NR];
      for (int r = 0; r < NR; ++r) {
        int32_t q4;
        std::memcpy(&q4, qi + r * Dk4 + d, 4);
        qb[r] = _mm256_set1_epi32(q4);
      }
      for (int k = 0; k < per; ++k) {
        const __m256i e = k == 0 ? _mm256_and_si256(z, mask)
                                 : _mm256_and_si256(_mm256_srli_epi16(z, k * BITS), mask);
        const __m256i x = _mm256_shuffle_epi8(e, tr);
        for (int r = 0; r < NR; ++r) acc[r * per + k] = dot_u8x32(acc[r * per + k], x, qb[r]);
      }
    }
    for (int r = 0; r < NR; ++r) {
      const __m256 sv = _mm256_set1_ps(sq[r]), zv = _mm256_set1_ps(qz[r]);
      for (int k = 0; k < per; ++k)
        _mm256_storeu_ps(s + r * st + c * 8 * per + 8 * k,
                         _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r * per + k]), sv, zv));
    }
  }
  template <int BITS, int NR>
  static void int_key_rows(const int8_t* qi, const float* sq, const float* qz, int64_t Dk,
                           int64_t Dk4, const std::byte* codes, int64_t cb, int64_t n, float* s,
                           int64_t st, const Ahead* ah) {
    constexpr int64_t T = 8 * (8 / BITS);
    const int64_t chunks = (n + T - 1) / T;
    std::optional<Ahead::Dealer> deal;
    if (ah) deal.emplace(*ah, chunks, Dk4 / 4);
    for (int64_t c = 0; c < chunks; ++c)
      int_key_chunk256<BITS, NR>(qi, sq, qz, Dk, Dk4, codes, cb, c, s, st,
                                 deal ? deal->next() : Ahead::Slice{});
  }
  static constexpr int kIntRows = 2;  // 2 bits: 4 vectors per chunk, so 2 rows at a time
#endif
  // s[r * st + j] for the keys of a block (columns up to the next 8 / 32 / 64 keys get the
  // zero padding's scores: st has room for them).
  template <int BITS, typename T>
  static void int_scores(const T* qi, const float* sq, const float* qz, int64_t R, int64_t Dk,
                         int64_t Dkp, const std::byte* codes, int64_t cb, int64_t n, float* s,
                         int64_t st, const Ahead* ah = nullptr) {
    static_assert((BITS == 8) == (sizeof(T) == 2), "int16 queries for 8-bit keys, else int8");
    by_row_blocks(R, [&]<int NR>(int64_t r) {  // the first row block prefetches
      const Ahead* a = r == 0 ? ah : nullptr;
      if constexpr (BITS == 8) {
        int16_key_rows<NR>(qi + r * Dkp, sq + r, qz + r, Dk, Dkp, codes, cb, n, s + r * st, st, a);
      } else if constexpr (BITS == 2 && NR > kIntRows) {
        int_key_rows<BITS, kIntRows>(qi + r * Dkp, sq + r, qz + r, Dk, Dkp, codes, cb, n,
                                     s + r * st, st, a);
        int_key_rows<BITS, NR - kIntRows>(qi + (r + kIntRows) * Dkp, sq + r + kIntRows,
                                          qz + r + kIntRows, Dk, Dkp, codes, cb, n,
                                          s + (r + kIntRows) * st, st, nullptr);
      } else {
        int_key_rows<BITS, NR>(qi + r * Dkp, sq + r, qz + r, Dk, Dkp, codes, cb, n, s + r * st, st,
                               a);
      }
    });
  }

  // NR rows, channels [d0, d1) (d1 - d0 a multiple of 8): 16 columns per pass held in
  // registers, row j widened once for all NR rows.
  template <typename Load, int NR>
  static void pv_rows(const float* pg, int64_t R, const std::byte* codes, int64_t rb, int64_t n,
                      int64_t d0, int64_t d1, int64_t Dv, int64_t st, float* acc) {
    int64_t d = d0;
#if KVCACHE_ATTN_AVX512
    // 64 columns per pass in zmm registers: every column takes the same FMAs in the same
    // order as below (the same bits), in half the instructions.
    for (; d + 64 <= d1; d += 64) {
      __m512 a[NR][4];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) a[r][i] = _mm512_loadu_ps(acc + r * Dv + d + 16 * i);
      for (int64_t j = 0; j < n; ++j) {
        const std::byte* row = codes + j * rb;
        __m512 v[4];
        for (int i = 0; i < 4; ++i) {
          v[i] = Load::at16(row, d + 16 * i);
          if constexpr (std::is_same_v<Load, DenseLoad<DType::kF32>>) pin(v[i]);
        }
        pv_step64<NR>(pg + j, st, v, a);
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) _mm512_storeu_ps(acc + r * Dv + d + 16 * i, a[r][i]);
    }
#endif
    for (; d + 16 <= d1; d += 16) {
      __m256 a[NR][2];
      for (int r = 0; r < NR; ++r) {
        a[r][0] = _mm256_loadu_ps(acc + r * Dv + d);
        a[r][1] = _mm256_loadu_ps(acc + r * Dv + d + 8);
      }
      for (int64_t j = 0; j < n; ++j) {
        const std::byte* row = codes + j * rb;
        const __m256 v0 = Load::at(row, d), v1 = Load::at(row, d + 8);
        for (int r = 0; r < NR; ++r) {
          const __m256 pj = _mm256_broadcast_ss(pg + r * st + j);
          a[r][0] = _mm256_fmadd_ps(pj, v0, a[r][0]);
          a[r][1] = _mm256_fmadd_ps(pj, v1, a[r][1]);
        }
      }
      for (int r = 0; r < NR; ++r) {
        _mm256_storeu_ps(acc + r * Dv + d, a[r][0]);
        _mm256_storeu_ps(acc + r * Dv + d + 8, a[r][1]);
      }
    }
    if (d + 8 <= d1) {
      __m256 a[NR];
      for (int r = 0; r < NR; ++r) a[r] = _mm256_loadu_ps(acc + r * Dv + d);
      for (int64_t j = 0; j < n; ++j) {
        const __m256 v0 = Load::at(codes + j * rb, d);
        for (int r = 0; r < NR; ++r)
          a[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(pg + r * st + j), v0, a[r]);
      }
      for (int r = 0; r < NR; ++r) _mm256_storeu_ps(acc + r * Dv + d, a[r]);
    }
    (void)R;
  }
  template <int BITS>
  static void packed_pv(const float* pg, int64_t R, const std::byte* codes, int64_t rb, int64_t n,
                        int64_t Dv, int64_t vg, int64_t st, float* acc) {
    if (vg % 8 != 0) {  // odd value groups: the scalar loop (tiny head dims only)
      ScalarOps::packed_pv<BITS>(pg, R, codes, rb, n, Dv, vg, st, acc);
      return;
    }
    for (int64_t g = 0; g < Dv / vg; ++g) {
      const int64_t d0 = g * vg, d1 = d0 + vg;
      const float* pgg = pg + g * R * st;
      by_row_blocks(R, [&]<int NR>(int64_t r) {
        pv_rows<CodeLoad<BITS>, NR>(pgg + r * st, R, codes, rb, n, d0, d1, Dv, st, acc + r * Dv);
      });
    }
  }

  // ---- chunked code order (see chunked_channel): 2 and 4 bits ----
  static constexpr bool kPermute = true;
  static constexpr bool kSimd = true;
  static inline __m256i load_chunk(const std::byte* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  // Vector K of a chunk: lane i = code of channel i * (8 / BITS) + K.
  template <int BITS, int K>
  static inline __m256 extract(__m256i x) {
    constexpr int per = 8 / BITS;
    __m256i v = x;
    if constexpr (K > 0) v = _mm256_srli_epi32(v, K * BITS);
    if constexpr (K + 1 < per) v = _mm256_and_si256(v, _mm256_set1_epi32((1 << BITS) - 1));
    return _mm256_cvtepi32_ps(v);
  }
  // NR rows, vectors K0 and K0 + 1 of chunk c: 16 accumulator columns (chunked order) in
  // registers over the n keys of the block.
  template <int BITS, int NR, int K0>
  static void chunked_pv_pass(const float* pg, const std::byte* codes, int64_t rb, int64_t n,
                              int64_t c, int64_t lda, int64_t st, float* acc) {
    constexpr int64_t CH = chunk_channels<BITS>();
    float* a0 = acc + c * CH + 8 * K0;
    __m256 a[NR][2];
    for (int r = 0; r < NR; ++r) {
      a[r][0] = _mm256_loadu_ps(a0 + r * lda);
      a[r][1] = _mm256_loadu_ps(a0 + r * lda + 8);
    }
    for (int64_t j = 0; j < n; ++j) {
      const __m256i x = load_chunk(codes + j * rb + 8 * c);
      const __m256 v0 = extract<BITS, K0>(x), v1 = extract<BITS, K0 + 1>(x);
      for (int r = 0; r < NR; ++r) {
        const __m256 pj = _mm256_broadcast_ss(pg + r * st + j);
        a[r][0] = _mm256_fmadd_ps(pj, v0, a[r][0]);
        a[r][1] = _mm256_fmadd_ps(pj, v1, a[r][1]);
      }
    }
    for (int r = 0; r < NR; ++r) {
      _mm256_storeu_ps(a0 + r * lda, a[r][0]);
      _mm256_storeu_ps(a0 + r * lda + 8, a[r][1]);
    }
  }
#if KVCACHE_ATTN_AVX512
  // chunked_pv_pass over the 64 accumulator columns [c0 * CH, c0 * CH + 64) (AVX2 vectors 0-7
  // from there) in NR x 4 zmm registers, loaded as pair_vectors lays the codes out: every column
  // takes the same FMAs in the same order, so the same bits.
  template <int BITS, int NR>
  static void chunked_pv_pass16(const float* pg, const std::byte* codes, int64_t rb, int64_t n,
                                int64_t c0, int64_t lda, int64_t st, float* acc) {
    constexpr int64_t CH = chunk_channels<BITS>();
    constexpr int per = 8 / BITS;
    float* a0 = acc + c0 * CH;
    __m512 a[NR][4];
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const float* lo = a0 + r * lda + 8 * pair_lo<BITS>(i);
        a[r][i] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(lo)),
                                     _mm256_loadu_ps(lo + 8 * per), 1);
      }
    for (int64_t j = 0; j < n; ++j) {
      __m512 v[4];
      pair_vectors<BITS>(codes + j * rb + 8 * c0, v, std::make_integer_sequence<int, 4>{});
      pv_step64<NR>(pg + j, st, v, a);
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        float* lo = a0 + r * lda + 8 * pair_lo<BITS>(i);
        _mm256_storeu_ps(lo, _mm512_castps512_ps256(a[r][i]));
        _mm256_storeu_ps(lo + 8 * per, _mm512_extractf32x8_ps(a[r][i], 1));
      }
  }
#endif
  template <int BITS, int NR>
  static void chunked_pv_rows(const float* pg, const std::byte* codes, int64_t rb, int64_t n,
                              int64_t d0, int64_t d1, int64_t lda, int64_t st, float* acc) {
    constexpr int64_t CH = chunk_channels<BITS>();
    int64_t c = d0 / CH;
#if KVCACHE_ATTN_AVX512
    for (; (c + 64 / CH) * CH <= d1; c += 64 / CH)
      chunked_pv_pass16<BITS, NR>(pg, codes, rb, n, c, lda, st, acc);
#endif
    for (; c < d1 / CH; ++c) {
      chunked_pv_pass<BITS, NR, 0>(pg, codes, rb, n, c, lda, st, acc);
      if constexpr (BITS == 2) chunked_pv_pass<BITS, NR, 2>(pg, codes, rb, n, c, lda, st, acc);
    }
  }
  // acc (row stride lda) in chunked order; vg a multiple of the chunk.
  template <int BITS>
  static void chunked_pv(const float* pg, int64_t R, const std::byte* codes, int64_t rb, int64_t n,
                         int64_t Dv, int64_t vg, int64_t st, float* acc, int64_t lda) {
    for (int64_t g = 0; g < Dv / vg; ++g) {
      const int64_t d0 = g * vg, d1 = d0 + vg;
      const float* pgg = pg + g * R * st;
      by_row_blocks(R, [&]<int NR>(int64_t r) {
        chunked_pv_rows<BITS, NR>(pgg + r * st, codes, rb, n, d0, d1, lda, st, acc + r * lda);
      });
    }
  }

  // ---- 4- and 8-bit value blocks: int16 weights, exact int32 sums (ScalarOps::round_weights
  // / int_pv) ----
  // The rounding of each (group, row) weight run, the max and the conversions in vectors: the
  // same floats and the same round-to-nearest-even as the scalar path.
  static void round_weights(const float* pg, int64_t R, int64_t n, int64_t ng, int64_t st, int L,
                            int16_t* wq, float* ws) {
    for (int64_t g = 0; g < ng; ++g)
      for (int64_t r = 0; r < R; ++r) {
        const float* w = pg + (g * R + r) * st;
        int16_t* o = wq + (g * R + r) * st;
        const IntRound q = simd_int_round(w, n, L);
        ws[r * ng + g] = q.step;
        int64_t j = 0;
        if (!q.zero) {
          const __m256 iv = _mm256_set1_ps(q.inv);
#if KVCACHE_ATTN_AVX512
          for (; j + 16 <= n; j += 16)  // |w * inv| <= L: vpmovdw's truncation is packs' result
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + j),
                                _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(
                                    _mm512_mul_ps(_mm512_loadu_ps(w + j), _mm512_set1_ps(q.inv)))));
#endif
          for (; j + 8 <= n; j += 8) {
            const __m256i i32 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(w + j), iv));
            const __m128i i16 =
                _mm_packs_epi32(_mm256_castsi256_si128(i32), _mm256_extracti128_si256(i32, 1));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(o + j), i16);
          }
          for (; j < n; ++j) o[j] = static_cast<int16_t>(std::nearbyint(w[j] * q.inv));
        }
        for (; j < n; ++j) o[j] = 0;
        if (n % 2 != 0) o[n] = 0;
      }
  }
  // Two keys' weights (wq[j], wq[j + 1]) as one 32-bit lane value.
  static int32_t weight_pair(const int16_t* w) {
    int32_t x;
    std::memcpy(&x, w, 4);
    return x;
  }
#if KVCACHE_QK_INT512
  // acc += the pairwise int16 products of x and w, summed per 32-bit lane (vpdpwssd), in place:
  // written as the intrinsic, GCC 12 computes each sum in a second register and copies it back
  // every step, pinned or not.
  __attribute__((always_inline)) static inline void dpwssd(__m512i& acc, __m512i x, __m512i w) {
    asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(x), "v"(w));
  }
  // The code bytes [0, 16) of two value rows as 16-bit words paired per 32-bit lane: lane i =
  // (a[i], b[i]).
  static inline __m512i pair_words512(const std::byte* a, const std::byte* b) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    return _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, _mm512_load_si512(kPairIndex.b),
                                         _mm512_castsi256_si512(t));
  }
  // 8-bit int_pv over channels [c0, c0 + 16 S) of one value group for NR rows: per pair of
  // keys and slab of 16 channels, one vpermb lays out both keys' 16 code bytes as word pairs
  // (lane i: channel c0 + i) and one vpdpwssd per row adds both keys' products.
  template <int NR, int S>
  static void int_pv8_pass(const int16_t* wq, int64_t st, const std::byte* codes, int64_t rb,
                           int64_t n, int64_t c0, const float* ws, int64_t ng, float* acc,
                           int64_t lda) {
    alignas(16) static const std::byte kZeroRow[16 * S] = {};  // the last key's missing partner
    __m512i a[NR * S];
#pragma GCC unroll 16
    for (int i = 0; i < NR * S; ++i) a[i] = _mm512_setzero_si512();
    const std::byte* p = codes + c0;
    for (int64_t j = 0; j < n; j += 2, p += 2 * rb) {
      const std::byte* b = j + 1 < n ? p + rb : kZeroRow;
      __m512i x[S];
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) x[s] = pair_words512(p + 16 * s, b + 16 * s);
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const __m512i w = _mm512_set1_epi32(weight_pair(wq + r * st + j));
#pragma GCC unroll 4
        for (int s = 0; s < S; ++s) dpwssd(a[r * S + s], x[s], w);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) {
      const __m512 sc = _mm512_set1_ps(ws[r * ng]);
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s) {
        float* o = acc + r * lda + c0 + 16 * s;
        _mm512_storeu_ps(o,
                         _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r * S + s]), sc, _mm512_loadu_ps(o)));
      }
    }
  }
  static constexpr int64_t kPv8Slab = 16, kPv8Pass = 64;
  // int_pv over channels [c0, c0 + 32 S) of one value group for NR rows: per pair of keys and
  // slab of 32 channels, one vpermb lays out both keys' 16 code bytes as word pairs, a mask and
  // a shift give the low and high nibbles (even and odd channels), and one vpdpwssd per row and
  // nibble adds both keys' products.
  template <int NR, int S>
  static void int_pv_pass(const int16_t* wq, int64_t st, const std::byte* codes, int64_t rb,
                          int64_t n, int64_t c0, const float* ws, int64_t ng, float* acc,
                          int64_t lda) {
    alignas(16) static const std::byte kZeroRow[16 * S] = {};  // the last key's missing partner
    __m512i a[NR * S * 2];                                     // [row][slab][low, high nibbles]
#pragma GCC unroll 16
    for (int i = 0; i < NR * S * 2; ++i) a[i] = _mm512_setzero_si512();
    const __m512i nib = _mm512_set1_epi16(0x000F);
    const std::byte* p = codes + c0 / 2;
    for (int64_t j = 0; j < n; j += 2, p += 2 * rb) {
      const std::byte* b = j + 1 < n ? p + rb : kZeroRow;
      __m512i lo[S], hi[S];
#pragma GCC unroll 2
      for (int s = 0; s < S; ++s) {
        const __m512i x = pair_words512(p + 16 * s, b + 16 * s);
        lo[s] = _mm512_and_si512(x, nib);
        hi[s] = _mm512_srli_epi16(x, 4);
      }
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const __m512i w = _mm512_set1_epi32(weight_pair(wq + r * st + j));
#pragma GCC unroll 2
        for (int s = 0; s < S; ++s) {
          dpwssd(a[(r * S + s) * 2], lo[s], w);
          dpwssd(a[(r * S + s) * 2 + 1], hi[s], w);
        }
      }
    }
    // Lane i of the low / high sums is channel 2 i / 2 i + 1 of the slab.
    const __m512i first = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i second =
        _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
#pragma GCC unroll 4  // every loop over the sums unrolled, or they live in memory
    for (int r = 0; r < NR; ++r) {
      const __m512 sc = _mm512_set1_ps(ws[r * ng]);
#pragma GCC unroll 2
      for (int s = 0; s < S; ++s) {
        const __m512 fl = _mm512_cvtepi32_ps(a[(r * S + s) * 2]);
        const __m512 fh = _mm512_cvtepi32_ps(a[(r * S + s) * 2 + 1]);
        float* o = acc + r * lda + c0 + 32 * s;
        _mm512_storeu_ps(
            o, _mm512_fmadd_ps(_mm512_permutex2var_ps(fl, first, fh), sc, _mm512_loadu_ps(o)));
        _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(_mm512_permutex2var_ps(fl, second, fh), sc,
                                                 _mm512_loadu_ps(o + 16)));
      }
    }
  }
  static constexpr int64_t kPvSlab = 32, kPvPass = 64;  // channels per vpermb / per pass
#else
  // The AVX2 forms: pairs by unpack + zero-extend, vpmaddwd + add. 8 bits: slabs of 8 channels
  // (8 code bytes per key), lane i channel c0 + i.
  template <int NR, int S>
  static void int_pv8_pass(const int16_t* wq, int64_t st, const std::byte* codes, int64_t rb,
                           int64_t n, int64_t c0, const float* ws, int64_t ng, float* acc,
                           int64_t lda) {
    __m256i a[NR][S];
    for (int r = 0; r < NR; ++r)
      for (int s = 0; s < S; ++s) a[r][s] = _mm256_setzero_si256();
    const std::byte* p = codes + c0;
    for (int64_t j = 0; j < n; j += 2, p += 2 * rb) {
      __m256i x[S];
      for (int s = 0; s < S; ++s) {
        const __m128i x0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * s));
        const __m128i x1 = j + 1 < n
                               ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + rb + 8 * s))
                               : _mm_setzero_si128();
        x[s] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(x0, x1));
      }
      for (int r = 0; r < NR; ++r) {
        const __m256i w = _mm256_set1_epi32(weight_pair(wq + r * st + j));
        for (int s = 0; s < S; ++s) a[r][s] = _mm256_add_epi32(a[r][s], _mm256_madd_epi16(x[s], w));
      }
    }
    for (int r = 0; r < NR; ++r) {
      const __m256 sc = _mm256_set1_ps(ws[r * ng]);
      for (int s = 0; s < S; ++s) {
        float* o = acc + r * lda + c0 + 8 * s;
        _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[r][s]), sc, _mm256_loadu_ps(o)));
      }
    }
  }
  static constexpr int64_t kPv8Slab = 8, kPv8Pass = 16;
  // 4 bits: slabs of 16 channels (8 code bytes per key).
  template <int NR, int S>
  static void int_pv_pass(const int16_t* wq, int64_t st, const std::byte* codes, int64_t rb,
                          int64_t n, int64_t c0, const float* ws, int64_t ng, float* acc,
                          int64_t lda) {
    __m256i a[NR][S][2];
    for (int r = 0; r < NR; ++r)
      for (int s = 0; s < S; ++s) a[r][s][0] = a[r][s][1] = _mm256_setzero_si256();
    const __m256i nib = _mm256_set1_epi16(0x000F);
    const std::byte* p = codes + c0 / 2;
    for (int64_t j = 0; j < n; j += 2, p += 2 * rb) {
      __m256i lo[S], hi[S];
      for (int s = 0; s < S; ++s) {
        const __m128i x0 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * s));
        const __m128i x1 = j + 1 < n
                               ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + rb + 8 * s))
                               : _mm_setzero_si128();
        const __m256i x = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(x0, x1));
        lo[s] = _mm256_and_si256(x, nib);
        hi[s] = _mm256_srli_epi16(x, 4);
      }
      for (int r = 0; r < NR; ++r) {
        const __m256i w = _mm256_set1_epi32(weight_pair(wq + r * st + j));
        for (int s = 0; s < S; ++s) {
          a[r][s][0] = _mm256_add_epi32(a[r][s][0], _mm256_madd_epi16(lo[s], w));
          a[r][s][1] = _mm256_add_epi32(a[r][s][1], _mm256_madd_epi16(hi[s], w));
        }
      }
    }
    for (int r = 0; r < NR; ++r) {
      const __m256 sc = _mm256_set1_ps(ws[r * ng]);
      for (int s = 0; s < S; ++s) {
        const __m256 fl = _mm256_cvtepi32_ps(a[r][s][0]), fh = _mm256_cvtepi32_ps(a[r][s][1]);
        const __m256 u0 = _mm256_unpacklo_ps(fl, fh), u1 = _mm256_unpackhi_ps(fl, fh);
        float* o = acc + r * lda + c0 + 16 * s;
        _mm256_storeu_ps(
            o, _mm256_fmadd_ps(_mm256_permute2f128_ps(u0, u1, 0x20), sc, _mm256_loadu_ps(o)));
        _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_permute2f128_ps(u0, u1, 0x31), sc,
                                                _mm256_loadu_ps(o + 8)));
      }
    }
  }
  static constexpr int64_t kPvSlab = 16, kPvPass = 16;
#endif
  // Value groups are whole slabs (QuantParams::int_v).
  template <int BITS>
  static void int_pv(const int16_t* wq, const float* ws, int64_t R, const std::byte* codes,
                     int64_t rb, int64_t n, int64_t Dv, int64_t vg, int64_t st, int64_t ng,
                     float* acc, int64_t lda) {
    static_assert(BITS == 4 || BITS == 8, "int16 weights serve 4- and 8-bit values");
    for (int64_t g = 0; g < Dv / vg; ++g)
      by_row_blocks(R, [&]<int NR>(int64_t r) {
        const int16_t* w = wq + (g * R + r) * st;
        const float* sc = ws + r * ng + g;
        float* a = acc + r * lda;
        int64_t c = g * vg;
        if constexpr (BITS == 8) {
          for (; c + kPv8Pass <= (g + 1) * vg; c += kPv8Pass)
            int_pv8_pass<NR, kPv8Pass / kPv8Slab>(w, st, codes, rb, n, c, sc, ng, a, lda);
          for (; c < (g + 1) * vg; c += kPv8Slab)
            int_pv8_pass<NR, 1>(w, st, codes, rb, n, c, sc, ng, a, lda);
        } else {
          for (; c + kPvPass <= (g + 1) * vg; c += kPvPass)
            int_pv_pass<NR, kPvPass / kPvSlab>(w, st, codes, rb, n, c, sc, ng, a, lda);
          for (; c < (g + 1) * vg; c += kPvSlab)
            int_pv_pass<NR, 1>(w, st, codes, rb, n, c, sc, ng, a, lda);
        }
      });
  }

  // Residual (and per-token scratch) rows: the same register-blocked micro-kernels as the
  // packed codes, reading f32/f16/bf16.
  template <DType KD>
  static void dense_scores(const float* qs, int64_t R, int64_t Dk, const std::byte* kb,
                           int64_t kstride, int64_t n, float* s, int64_t st) {
    by_row_blocks(R, [&]<int NR>(int64_t r) {
      score_rows<DenseLoad<KD>, NR>(qs + r * Dk, Dk, kb, kstride, n, s + r * st, st);
    });
  }
  template <DType KD>
  static void dense_pv(const float* p, int64_t R, const std::byte* vb, int64_t vstride, int64_t n,
                       int64_t Dv, int64_t st, float* acc, int64_t lda) {
    const int64_t d8 = Dv & ~int64_t{7};
    by_row_blocks(R, [&]<int NR>(int64_t r) {
      pv_rows<DenseLoad<KD>, NR>(p + r * st, R, vb, vstride, n, 0, d8, lda, st, acc + r * lda);
    });
    if (d8 < Dv)  // head dims that are not a multiple of 8: the last channels one by one
      for (int64_t j = 0; j < n; ++j)
        for (int64_t r = 0; r < R; ++r)
          for (int64_t d = d8; d < Dv; ++d)
            acc[r * lda + d] =
                std::fma(p[r * st + j], DenseLoad<KD>::one(vb + j * vstride, d), acc[r * lda + d]);
  }
};
#endif  // KVCACHE_ATTN_AVX2

// ---------------------------------------------------------------------------------------------
// The quantized kernel in the skeleton (attention_skeleton.h): tiles are the packed blocks (G
// tokens each), then 64-key tiles of the residual.

using detail::Arena;
using detail::CallPlan;
using detail::SeqPlan;
using detail::Task;
using detail::TaskRows;

constexpr detail::QueryTiling kTiling{kRowsPerTask};

struct QuantParams {
  const QuantKV* kv = nullptr;
  int64_t G = 0, n_blocks = 0, packed = 0;  // tokens per block, blocks, packed tokens
  int64_t Dk = 0, Dv = 0;
  int64_t dk4 = 0;           // D_k rounded up to 4: int8 query rows (2/4-bit key blocks)
  int64_t dk2 = 0;           // D_k rounded up to 2: int16 query rows (8-bit key blocks)
  int levels16 = 0;          // and their levels, code8_levels(D_k)
  int64_t vg = 0, ng = 0;    // value channels per group, groups per token
  int64_t cbk = 0, rbv = 0;  // bytes of a key code column (G tokens), of a value code row
  int64_t st = 0;            // row stride of the score buffer: round64(max(G, kResTile))
  KVBlockFormat fmt;         // the packed blocks' format (kv_quant.h)
  bool per_token = false;    // q8_0 / q4_0: blocks dequantized tile by tile into scratch
  // Packed P.V accumulates in the chunked code order into a second half of each accumulator row
  // ([R, 2 D_v]: channel order | chunked order), folded back at the end (SIMD, 2/4 bits, value
  // groups of whole chunks).
  bool chunk_v = false;
  // P.V by int16 weights (round_weights / int_pv), on every path: 4-bit value blocks whose
  // groups are whole 32-channel slabs, G <= kIntPvMaxKeys, and 8-bit ones whose groups are whole
  // 16-channel slabs.
  bool int_v = false;
  int wlevels = 0;  // their levels: 32767, or fewer where G codes times L could leave int32

  // ---- tile geometry (plan_tasks, for_each_tile) ----
  int64_t n_tiles(const SeqPlan& s) const {
    return n_blocks + (s.Skv - packed + kResTile - 1) / kResTile;
  }
  // Partitions of about `keys` keys, as even as whole tiles allow.
  int64_t tiles_per_split(const SeqPlan& s, int64_t keys) const {
    const int64_t nt = std::max<int64_t>(n_tiles(s), 1);
    const int64_t n = std::clamp<int64_t>((s.Skv + keys - 1) / keys, 1, nt);
    return (nt + n - 1) / n;
  }
  std::pair<int64_t, int64_t> tile_keys(const SeqPlan& s, int64_t t) const {
    if (t < n_blocks) return {t * G, t * G + G};
    const int64_t k0 = packed + (t - n_blocks) * kResTile;
    return {k0, std::min(s.Skv, k0 + kResTile)};
  }
  int64_t tile_at(const SeqPlan&, int64_t key) const {
    return key < packed ? key / G : n_blocks + (key - packed) / kResTile;
  }
  std::pair<int64_t, int64_t> partition_keys(const Task& t) const {
    return {tile_keys(*t.seq, t.t_begin).first, tile_keys(*t.seq, t.t_end - 1).second};
  }

  // ---- scratch ----
  static constexpr bool with_vis = false;  // no user masks on quantized spans
  int64_t acc_cols() const { return chunk_v ? 2 * Dv : Dv; }
  int64_t s_cols() const { return st; }
  struct Extra {
    float* qk = nullptr;    // [R, D_k] queries times the block's key scales
    float* qz = nullptr;    // [R] queries . the block's key zeros
    int8_t* qi = nullptr;   // [R, dk4] qk rounded to int8 (2/4-bit keys)
    int16_t* qw = nullptr;  // [R, dk2] or to int16 (8-bit keys)
    float* sq = nullptr;    // [R] and the rounding's scales
    float* pg = nullptr;    // [ng, R, st] probabilities times value scales
    int16_t* wq = nullptr;  // [ng, R, st] pg rounded to int16 (int_v)
    float* ws = nullptr;    // [R, ng] and the rounding's scales
    float* zs = nullptr;    // [R, ng] probabilities . value zeros
    float* za = nullptr;    // [R, ng] zs summed over the blocks (rescaled with the rows)
    float* kt = nullptr;    // per-token schemes: one block's K [G, D_k] in f32
    float* vt = nullptr;    // and V [G, D_v]
  };
  Extra carve_extra(Arena& a, int64_t R, int64_t) const {
    Extra e;
    e.qk = a.take<float>(R * Dk);
    e.qz = a.take<float>(R);
    e.qi = a.take<int8_t>(R * dk4);
    e.qw = a.take<int16_t>(R * dk2);
    e.sq = a.take<float>(R);
    e.pg = a.take<float>(ng * R * st);
    e.wq = a.take<int16_t>(ng * R * st);
    e.ws = a.take<float>(R * ng);
    e.zs = a.take<float>(R * ng);
    e.za = a.take<float>(R * ng);
    if (per_token) {
      e.kt = a.take<float>(G * Dk);
      e.vt = a.take<float>(G * Dv);
    }
    return e;
  }
};

// One task's tile work on packed blocks and residual tiles: logits, P.V, and the KIVI value zero
// terms sum_j p_j z_j per row and value group, kept apart (rescaled with the rows) and added to
// the group's channels once at the end rather than into every channel after every block.
template <typename Ops, int BITS, DType RD>
class QuantTiles {
 public:
  using Params = QuantParams;
  static constexpr bool kSimd = Ops::kSimd, kRowTerms = true;
  // Chunked code order (SIMD, 2/4 bits) for the value codes when a value group is whole chunks.
  static constexpr bool kChunked = Ops::kPermute && BITS != 8;

  QuantTiles(const Params& kp, TaskRows& rows, Arena& arena)
      : kp_(kp),
        kv_(*kp.kv),
        x_(kp.carve_extra(arena, rows.P.max_rows, rows.P.tq)),
        b_(rows.t.b),
        hk_(rows.t.hk),
        R_(rows.t.R),
        t_end_(rows.t.t_end),
        qs_(rows.rs.qs),
        acc_(rows.rs.acc),
        lda_(rows.rs.acc_cols) {
    std::fill(x_.za, x_.za + R_ * kp.ng, 0.0f);
    if (kp.packed < rows.t.seq->Skv) {
      rkstride_ = kv_.k_residual.byte_offset(0, 0, 1);
      rvstride_ = kv_.v_residual.byte_offset(0, 0, 1);
    }
  }
  void run(TaskRows& rows) { for_each_tile(rows, kp_, *this); }
  void softcap(float* s, int64_t n, float c) const { detail::softcap_scalar(s, n, c); }
  void rescale_row(int64_t r, float alpha) {
    for (int64_t g = 0; g < kp_.ng; ++g) x_.za[r * kp_.ng + g] *= alpha;
  }
  void logits(int64_t tile, int64_t k0, int64_t k1, float* s);
  void pv(int64_t tile, int64_t k0, int64_t k1, const float* s);
  // The chunked accumulator half back in channel order, and the value zero terms, into acc.
  void fold(TaskRows&);

 private:
  const Params& kp_;
  const QuantKV& kv_;
  const Params::Extra x_;
  const int64_t b_, hk_, R_, t_end_;
  const float* qs_;
  float* acc_;
  const int64_t lda_;
  int64_t rkstride_ = 0, rvstride_ = 0;
};

template <typename Ops, int BITS, DType RD>
void QuantTiles<Ops, BITS, RD>::logits(int64_t tile, int64_t k0, int64_t k1, float* s) {
  const int64_t n = k1 - k0, Dk = kp_.Dk, st = kp_.st;
  if (tile >= kp_.n_blocks) {
    Ops::template dense_scores<RD>(
        qs_, R_, Dk, static_cast<const std::byte*>(kv_.k_residual.ptr(b_, hk_, k0 - kp_.packed)),
        rkstride_, n, s, st);
    return;
  }
  const std::byte* kb = kv_.k_block(b_, hk_, tile);
  if (kp_.per_token) {
    // llama.cpp-style per-token blocks: one tile's K widened into an L1/L2-resident scratch
    // (never the cache), then the residual's dense dot products.
    kv_dequantize_k_block(kp_.fmt, kb, x_.kt, Dk);
    Ops::template dense_scores<DType::kF32>(qs_, R_, Dk, reinterpret_cast<const std::byte*>(x_.kt),
                                            Dk * 4, n, s, st);
    return;
  }
  Ahead ahead;
  const Ahead* ah = nullptr;
  if (tile + 1 < std::min(t_end_, kp_.n_blocks)) {
    ahead = Ahead{kv_.k_block(b_, hk_, tile + 1), kv_.v_block(b_, hk_, tile + 1), kv_.k_block_bytes,
                  kv_.v_block_bytes};
    ah = &ahead;
  }
  const auto* kp = reinterpret_cast<const f16_t*>(kb);
  Ops::block_query(qs_, R_, Dk, kp, kp + Dk, x_.qk, x_.qz);
  if constexpr (BITS == 8) {
    Ops::round_rows(x_.qk, R_, Dk, kp_.dk2, kp_.levels16, x_.qw, x_.sq);
    Ops::template int_scores<BITS>(x_.qw, x_.sq, x_.qz, R_, Dk, kp_.dk2, kb + 4 * Dk, kp_.cbk, n, s,
                                   st, ah);
  } else {
    Ops::round_rows(x_.qk, R_, Dk, kp_.dk4, kQueryLevels, x_.qi, x_.sq);
    Ops::template int_scores<BITS>(x_.qi, x_.sq, x_.qz, R_, Dk, kp_.dk4, kb + 4 * Dk, kp_.cbk, n, s,
                                   st, ah);
  }
}

template <typename Ops, int BITS, DType RD>
void QuantTiles<Ops, BITS, RD>::pv(int64_t tile, int64_t k0, int64_t k1, const float* s) {
  const int64_t n = k1 - k0, Dv = kp_.Dv, st = kp_.st, ng = kp_.ng;
  if (tile >= kp_.n_blocks) {
    Ops::template dense_pv<RD>(
        s, R_, static_cast<const std::byte*>(kv_.v_residual.ptr(b_, hk_, k0 - kp_.packed)),
        rvstride_, n, Dv, st, acc_, lda_);
    return;
  }
  const std::byte* vb = kv_.v_block(b_, hk_, tile);
  if (kp_.per_token) {
    kv_dequantize_v_block(kp_.fmt, vb, x_.vt, Dv);
    Ops::template dense_pv<DType::kF32>(s, R_, reinterpret_cast<const std::byte*>(x_.vt), Dv * 4, n,
                                        Dv, st, acc_, lda_);
    return;
  }
  const auto* vp = reinterpret_cast<const f16_t*>(vb);
  Ops::value_weights(s, R_, n, vp, vp + ng * kp_.G, ng, kp_.G, st, x_.pg, x_.zs);
  bool done = false;
  if constexpr (BITS == 4 || BITS == 8) {
    if (kp_.int_v) {
      Ops::round_weights(x_.pg, R_, n, ng, st, kp_.wlevels, x_.wq, x_.ws);
      Ops::template int_pv<BITS>(x_.wq, x_.ws, R_, vb + 4 * kp_.G * ng, kp_.rbv, n, Dv, kp_.vg, st,
                                 ng, acc_, lda_);
      done = true;
    }
  }
  // Chunked order stays inside a value group, so the group's zero term lands on the same
  // channels in either order.
  if constexpr (kChunked) {
    if (!done && kp_.chunk_v) {
      Ops::template chunked_pv<BITS>(x_.pg, R_, vb + 4 * kp_.G * ng, kp_.rbv, n, Dv, kp_.vg, st,
                                     acc_ + Dv, lda_);
      done = true;
    }
  }
  if (!done)
    Ops::template packed_pv<BITS>(x_.pg, R_, vb + 4 * kp_.G * ng, kp_.rbv, n, Dv, kp_.vg, st, acc_);
  for (int64_t i = 0; i < R_ * ng; ++i) x_.za[i] += x_.zs[i];
}

template <typename Ops, int BITS, DType RD>
void QuantTiles<Ops, BITS, RD>::fold(TaskRows&) {
  const int64_t Dv = kp_.Dv, ng = kp_.ng;
  if constexpr (kChunked) {
    if (kp_.chunk_v)
      for (int64_t r = 0; r < R_; ++r) {
        float* a = acc_ + r * lda_;
        for (int64_t p = 0; p < Dv; ++p) a[chunked_channel<BITS>(p)] += a[Dv + p];
      }
  }
  for (int64_t r = 0; r < R_; ++r)
    for (int64_t g = 0; g < ng; ++g) {
      const float z = x_.za[r * ng + g];
      float* a = acc_ + r * lda_ + g * kp_.vg;
      for (int64_t c = 0; c < kp_.vg; ++c) a[c] += z;
    }
}

template <typename Ops, int BITS>
void run_bits(const CallPlan& P, const QuantParams& kp, DType rd) {
  switch (rd) {
    case DType::kF32:
      detail::run_call<QuantTiles<Ops, BITS, DType::kF32>>(P, kp);
      break;
    case DType::kF16:
      detail::run_call<QuantTiles<Ops, BITS, DType::kF16>>(P, kp);
      break;
    case DType::kBF16:
      detail::run_call<QuantTiles<Ops, BITS, DType::kBF16>>(P, kp);
      break;
    default:
      KV_CHECK(false, "residual dtype validated");
  }
}

// The span's geometry and formats (chunk_v is the caller's: it depends on the SIMD path).
QuantParams quant_params(int64_t G, int64_t n_blocks, int64_t v_group, KVQuantScheme scheme,
                         int bits, int64_t Dk, int64_t Dv) {
  QuantParams kp;
  kp.G = G;
  kp.n_blocks = n_blocks;
  kp.packed = n_blocks * G;
  kp.Dk = Dk;
  kp.Dv = Dv;
  kp.dk4 = (Dk + 3) / 4 * 4;
  kp.dk2 = (Dk + 1) / 2 * 2;
  kp.levels16 = code8_levels(Dk);
  kp.per_token = kv_quant_per_token(scheme);
  kp.fmt = make_kv_block_format(scheme, bits, G, Dk, Dv);
  kp.vg = v_group;
  if (!kp.per_token) kp.fmt.v_group = v_group;  // the span's, as validated
  if (kp.per_token) kp.vg = Dv;                 // no value groups: one "group" spans the row
  kp.ng = kp.vg > 0 ? Dv / kp.vg : 0;
  kp.cbk = kivi_col_bytes(G, bits);
  kp.rbv = kivi_row_bytes(Dv, bits);
  kp.st = (std::max(G, kResTile) + 63) / 64 * 64;  // int_scores writes whole chunks
  kp.int_v =
      !kp.per_token && kp.vg > 0 &&
      ((bits == 4 && kp.vg % 32 == 0 && G <= kIntPvMaxKeys) || (bits == 8 && kp.vg % 16 == 0));
  kp.wlevels = bits == 8 ? code8_levels(G) : kWeightLevels;
  return kp;
}

// attention_workspace_bytes of the quantized kernels.
size_t quant_bytes(const AttentionShape& s, int64_t n_threads) {
  // v_group unknown: the most value groups, one per channel.
  QuantParams kp =
      quant_params(s.quant_group, 0, s.quant_v_group > 0 ? s.quant_v_group : 1, s.quant_scheme,
                   kv_quant_per_token(s.quant_scheme) ? 8 : 4, s.head_dim_k, s.head_dim_v);
  kp.chunk_v = true;  // the wider accumulator rows
  return detail::shape_bytes(kp, s, kTiling, n_threads);
}

template <typename Ops>
void run_quantized(const TensorView& q, const QuantKV& kv, const TensorView& out,
                   const AttentionOptions& o) {
  validate_quantized_attention_args(q, kv, out, o);
  CallPlan P;
  detail::init_call(P, q, out, q.dim(0), kv.heads, kv.head_dim_v, o);
  const int64_t Sq = q.dim(2), Skv = kv.seq_len();
  if (P.B == 0 || P.Hq == 0 || Sq == 0 || P.Dv == 0) return;
  const MaskGeometry geo = make_geometry(P.B, P.Hq, Sq, Skv, o.q_offset, o.kv_offset);
  P.kv_offset = geo.kv_offset;
  P.mask_free = mask_is_all_visible(P.spec, geo);
  QuantParams kp = quant_params(kv.group, kv.n_blocks, kv.v_group, kv.scheme, kv.bits, P.Dk, P.Dv);
  kp.kv = &kv;
  const int bits = kp.per_token ? 8 : kv.bits;  // per-token tiles take the BITS-free branch
  const int64_t chunk = bits == 2 ? chunk_channels<2>() : chunk_channels<4>();
  kp.chunk_v = Ops::kPermute && bits != 8 && kp.vg % chunk == 0 && !kp.int_v;
  KVSpan span;
  span.kind = KVSpanKind::kQuantized;
  span.quant = kv;
  const AttentionShape shape = attention_shape(q, span, o);
  const detail::CallWorkspace ws(o.workspace,
                                 [&](int64_t threads) { return quant_bytes(shape, threads); });
  P.seqs = detail::carve_seqs(ws.span(), P.B);
  detail::set_dense_seqs(P, Sq, Skv, geo.q_offset);
  detail::plan_call(P, kp, kTiling, o.kv_split, ws.span());
  const DType rd = kv.residual_len() > 0 ? kv.k_residual.dtype() : DType::kF32;
  switch (bits) {
    case 2:
      run_bits<Ops, 2>(P, kp, rd);
      break;
    case 4:
      run_bits<Ops, 4>(P, kp, rd);
      break;
    default:
      run_bits<Ops, 8>(P, kp, rd);
      break;
  }
}

[[noreturn]] void bad(const std::string& msg, ErrorKind kind = ErrorKind::kInvalidArgument) {
  throw Error(kind, "quantized_attention: " + msg);
}

}  // namespace

void validate_quantized_attention_args(const TensorView& q, const QuantKV& kv,
                                       const TensorView& out, const AttentionOptions& o) {
  if (kv.scheme == KVQuantScheme::kKivi) {
    if (kv.bits != 2 && kv.bits != 4 && kv.bits != 8)
      bad("bits must be 2, 4 or 8, got " + std::to_string(kv.bits), ErrorKind::kUnsupported);
  } else if (kv.scheme == KVQuantScheme::kQ8_0 || kv.scheme == KVQuantScheme::kQ4_0) {
    if (kv.bits != (kv.scheme == KVQuantScheme::kQ8_0 ? 8 : 4))
      bad(std::string(kv_quant_scheme_name(kv.scheme)) + " spans carry " +
          (kv.scheme == KVQuantScheme::kQ8_0 ? "8" : "4") + "-bit codes, got bits " +
          std::to_string(kv.bits));
    if (kv.head_dim_k % 32 != 0 || kv.head_dim_v % 32 != 0)
      bad("per-token blocks need head dims that are multiples of 32");
  } else {
    bad("unknown quantization scheme", ErrorKind::kUnsupported);
  }
  if (q.ndim() != 4 || out.ndim() != 4) bad("q and out must be 4-d [B, H, S, D]");
  if (q.dtype() != DType::kF32 || out.dtype() != DType::kF32) bad("q and out must be f32");
  if (kv.heads < 1 || q.dim(1) % kv.heads != 0)
    bad("H_q (" + std::to_string(q.dim(1)) + ") must be a multiple of H_kv (" +
        std::to_string(kv.heads) + ")");
  if (q.dim(0) != kv.batch || out.dim(0) != kv.batch) bad("batch sizes differ");
  if (q.dim(3) != kv.head_dim_k) bad("q's head dim differs from the cache's D_k");
  if (out.dim(1) != q.dim(1) || out.dim(2) != q.dim(2) || out.dim(3) != kv.head_dim_v)
    bad("out must be [B, H_q, S_q, D_v], got " + out.shape().str());
  if ((q.dim(3) > 1 && q.stride(3) != 1) || (out.dim(3) > 1 && out.stride(3) != 1))
    bad("q and out need a unit innermost stride");
  if (kv.group < 1 || kv.n_blocks < 0) bad("group must be >= 1 and n_blocks >= 0");
  if (kv.scheme == KVQuantScheme::kKivi && (kv.v_group < 1 || kv.head_dim_v % kv.v_group != 0))
    bad("v_group must divide D_v");
  if (kv.n_blocks > 0 && (!kv.k_blocks || !kv.v_blocks)) bad("packed blocks missing");
  if (kv.residual_len() > 0) {
    const TensorView& rk = kv.k_residual;
    const TensorView& rv = kv.v_residual;
    if (rv.ndim() != 4 || rk.dim(0) != kv.batch || rk.dim(1) != kv.heads ||
        rk.dim(3) != kv.head_dim_k || rv.dim(0) != kv.batch || rv.dim(1) != kv.heads ||
        rv.dim(2) != rk.dim(2) || rv.dim(3) != kv.head_dim_v)
      bad("residual k/v must be [B, H_kv, n_res, D_k] / [B, H_kv, n_res, D_v]");
    const DType t = rk.dtype();
    if ((t != DType::kF32 && t != DType::kF16 && t != DType::kBF16) || rv.dtype() != t)
      bad("residual k and v must share one float dtype (f32, f16, bf16)", ErrorKind::kUnsupported);
    if (rk.stride(3) != 1 || rv.stride(3) != 1) bad("the residual needs a unit innermost stride");
  }
  if (o.mask || o.block_mask || o.score || o.doc_ids || o.kv_valid_begin || o.kv_valid_end ||
      o.weights_out)
    bad("mask, block_mask, score, doc_ids, kv_valid_* and weights_out are not supported on "
        "quantized spans",
        ErrorKind::kUnsupported);
  if (!(o.scale >= 0) || !std::isfinite(o.scale) || !(o.softcap >= 0) || !std::isfinite(o.softcap))
    bad("scale and softcap must be finite and >= 0");
  if (o.sliding_window < 0 || o.chunk_size < 0 || o.kv_offset < 0 || o.q_offset < -1)
    bad("sliding_window, chunk_size, kv_offset must be >= 0 and q_offset >= -1");
}

namespace detail {
size_t quantized_workspace_bytes(const AttentionShape& shape, int64_t n_threads) {
  return quant_bytes(shape, n_threads);
}
}  // namespace detail

void quantized_attention_scalar(const TensorView& q, const QuantKV& kv, const TensorView& out,
                                const AttentionOptions& o) {
  run_quantized<ScalarOps>(q, kv, out, o);
}

void quantized_attention(const TensorView& q, const QuantKV& kv, const TensorView& out,
                         const AttentionOptions& o) {
#if KVCACHE_ATTN_AVX2
  run_quantized<SimdOps>(q, kv, out, o);
#else
  run_quantized<ScalarOps>(q, kv, out, o);
#endif
}

void dequantize_quant_kv(const QuantKV& kv, Tensor* k, Tensor* v) {
  const int64_t S = kv.seq_len(), P = kv.packed_len(), G = kv.group;
  *k = Tensor::empty(DType::kF32, {kv.batch, kv.heads, S, kv.head_dim_k});
  *v = Tensor::empty(DType::kF32, {kv.batch, kv.heads, S, kv.head_dim_v});
  KVBlockFormat f = make_kv_block_format(kv.scheme, kv.bits, G, kv.head_dim_k, kv.head_dim_v);
  if (!kv_quant_per_token(kv.scheme)) f.v_group = kv.v_group;
  const TensorView kd = k->view(), vd = v->view();
  for (int64_t b = 0; b < kv.batch; ++b)
    for (int64_t h = 0; h < kv.heads; ++h) {
      for (int64_t i = 0; i < kv.n_blocks; ++i) {
        kv_dequantize_k_block(f, kv.k_block(b, h, i), kd.ptr_as<float>(b, h, i * G), f.dk);
        kv_dequantize_v_block(f, kv.v_block(b, h, i), vd.ptr_as<float>(b, h, i * G), f.dv);
      }
      if (S > P) {
        copy_view(kv.k_residual.slice(0, b, b + 1).slice(1, h, h + 1),
                  kd.slice(0, b, b + 1).slice(1, h, h + 1).slice(2, P, S));
        copy_view(kv.v_residual.slice(0, b, b + 1).slice(1, h, h + 1),
                  vd.slice(0, b, b + 1).slice(1, h, h + 1).slice(2, P, S));
      }
    }
}

}  // namespace kvcache
