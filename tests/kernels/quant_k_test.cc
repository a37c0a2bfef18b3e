// The k-quants (kernels/quant_k.cc): the references against hand-made blocks, the SIMD
// dequantize bit for bit against the reference, the fused dot and matmul against the f32 math
// on the reference values, and the quantizer's round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/matmul.h"
#include "kernels/quant_types.h"

namespace kvcache {
namespace {

using testing_util::make_weights;
using testing_util::randn;

// Byte offsets of the f16 super-block factors (ggml-common.h, block_q2_K ... block_q6_K); -1:
// the type has no dmin.
struct Layout {
  DType t;
  size_t bytes;
  int d, dmin;
};
constexpr Layout kLayouts[] = {{DType::kQ2_K, 84, 80, 82},
                               {DType::kQ3_K, 110, 108, -1},
                               {DType::kQ4_K, 144, 0, 2},
                               {DType::kQ5_K, 176, 0, 2},
                               {DType::kQ6_K, 210, 208, -1}};

const QuantKernels& kernels(DType t) {
  const QuantKernels* q = quant_kernels(t);
  EXPECT_NE(q, nullptr) << dtype_name(t);
  return *q;
}

void put_f16(std::vector<uint8_t>& b, size_t at, float v) {
  const f16_t h = f32_to_f16(v);
  std::memcpy(b.data() + at, &h, sizeof(h));
}

// n super-blocks of random bytes, with finite f16 d (and dmin) in [-2, 2].
std::vector<uint8_t> random_blocks(const Layout& l, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> f(-2.0f, 2.0f);
  std::vector<uint8_t> b(l.bytes * static_cast<size_t>(n));
  for (uint8_t& v : b) v = static_cast<uint8_t>(byte(rng));
  for (int i = 0; i < n; ++i) {
    put_f16(b, l.bytes * i + l.d, f(rng));
    if (l.dmin >= 0) put_f16(b, l.bytes * i + l.dmin, f(rng));
  }
  return b;
}

TEST(QuantK, BlockSizesMatchGgml) {
  for (const Layout& l : kLayouts) {
    EXPECT_EQ(dtype_info(l.t).block_elems, 256) << dtype_name(l.t);
    EXPECT_EQ(dtype_bytes(l.t, 256), l.bytes) << dtype_name(l.t);
  }
}

TEST(QuantK, SimdDequantizeEqualsReferenceBitForBit) {
  constexpr int kBlocks = 200;
  for (const Layout& l : kLayouts) {
    const QuantKernels& q = kernels(l.t);
    // Offset by one byte: GGUF tensors are not aligned.
    std::vector<uint8_t> raw = random_blocks(l, kBlocks, 11 + static_cast<uint32_t>(l.bytes));
    raw.insert(raw.begin(), 0);
    std::vector<float> ref(256 * kBlocks), simd(256 * kBlocks, -1.0f);
    q.dequantize_ref(raw.data() + 1, ref.data(), kBlocks);
    q.dequantize(raw.data() + 1, simd.data(), kBlocks);
    ASSERT_EQ(std::memcmp(ref.data(), simd.data(), ref.size() * sizeof(float)), 0)
        << dtype_name(l.t);
    for (float v : ref) ASSERT_TRUE(std::isfinite(v)) << dtype_name(l.t);
  }
}

TEST(QuantK, DotWithinToleranceOfReferenceValues) {
  for (const Layout& l : kLayouts) {
    const QuantKernels& q = kernels(l.t);
    for (int n : {1, 3, 16, 64}) {
      const std::vector<uint8_t> b = random_blocks(l, n, 7 + static_cast<uint32_t>(n));
      const std::vector<float> x = randn(256 * static_cast<size_t>(n), 5);
      std::vector<float> w(x.size());
      q.dequantize_ref(b.data(), w.data(), n);
      float ref = 0.0f;
      double mag = 0.0;
      for (size_t j = 0; j < x.size(); ++j) {
        ref += w[j] * x[j];
        mag += std::fabs(w[j] * x[j]);
      }
      EXPECT_NEAR(q.dot(b.data(), x.data(), n), ref, kQuantDotTolerance * mag + 1e-6)
          << dtype_name(l.t) << " blocks " << n;
    }
  }
}

// The integer dot (x rounded to int8 per 256, BlockQ8K) against the f32 dot of the reference
// values with the rounded x' = d * q: within kQuantDotTolerance (only float scaling and
// summation order differ). Odd block counts, blocks offset by one byte (GGUF is unaligned), and
// rows of x with very different magnitudes per super-block.
TEST(QuantK, IntegerDotWithinToleranceOfReferenceOnRoundedX) {
  for (const Layout& l : kLayouts) {
    const QuantKernels& q = kernels(l.t);
    if (q.dot_q8k == nullptr) GTEST_SKIP() << "no integer dots in this build (no AVX2)";
    for (int n : {1, 3, 7, 33}) {
      std::vector<uint8_t> b = random_blocks(l, n, 70 + static_cast<uint32_t>(n));
      b.insert(b.begin(), 0);
      std::vector<float> x = randn(256 * static_cast<size_t>(n), 50 + static_cast<uint32_t>(n));
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < 256; ++j) x[256 * i + j] *= std::ldexp(1.0f, 3 * (i % 5) - 6);
      std::vector<BlockQ8K> xq(static_cast<size_t>(n));
      quantize_act_q8k(x.data(), xq.data(), n);
      std::vector<float> w(x.size()), xr(x.size());
      q.dequantize_ref(b.data() + 1, w.data(), n);
      round_act_q8k(x.data(), xr.data(), static_cast<int64_t>(x.size()));
      float ref = 0.0f;
      double mag = 0.0;
      for (size_t j = 0; j < x.size(); ++j) {
        // The codes and the rounded x agree: x' = d * q.
        const BlockQ8K& blk = xq[j / 256];
        ASSERT_EQ(xr[j], blk.d * static_cast<float>(blk.qs[j % 256])) << j;
        ref += w[j] * xr[j];
        mag += std::fabs(w[j] * xr[j]);
      }
      EXPECT_NEAR(q.dot_q8k(b.data() + 1, xq.data(), n), ref, kQuantDotTolerance * mag + 1e-6)
          << dtype_name(l.t) << " blocks " << n;
    }
  }
}

// The rounding of x: |x' - x| <= amax / 254 per super-block (+ an ulp of the product d * q),
// codes within [-127, 127], the largest value exact in magnitude, bsums the sums of 16 codes;
// zero blocks give zeros; a block holding an infinity or a NaN gives NaN, not a finite x'.
TEST(QuantK, ActivationRoundingIsBoundedAndCarriesNonFiniteBlocks) {
  const int n = 5;
  std::vector<float> x = randn(256 * n, 9);
  for (int j = 0; j < 256; ++j) x[256 + j] = 0.0f;  // block 1: all zero
  x[2 * 256 + 17] = INFINITY;                       // block 2: an infinity
  x[3 * 256 + 200] = NAN;                           // block 3: a NaN
  std::vector<BlockQ8K> xq(n);
  quantize_act_q8k(x.data(), xq.data(), n);
  std::vector<float> xr(x.size());
  round_act_q8k(x.data(), xr.data(), static_cast<int64_t>(x.size()));
  for (int i : {0, 4}) {
    float amax = 0.0f;
    for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[256 * i + j]));
    EXPECT_FLOAT_EQ(xq[i].d, amax / 127.0f);
    for (int j = 0; j < 256; ++j) {
      const float v = x[256 * i + j];
      EXPECT_LE(std::fabs(xr[256 * i + j] - v), amax / 254.0f * (1.0f + 1e-4f)) << i << " " << j;
      EXPECT_LE(std::abs(static_cast<int>(xq[i].qs[j])), 127);
      if (std::fabs(v) == amax) {
        EXPECT_EQ(std::abs(static_cast<int>(xq[i].qs[j])), 127);
      }
    }
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += xq[i].qs[16 * g + j];
      EXPECT_EQ(xq[i].bsums[g], sum);
    }
  }
  EXPECT_EQ(xq[1].d, 0.0f);
  for (int j = 0; j < 256; ++j) EXPECT_EQ(xr[256 + j], 0.0f);
  for (int i : {2, 3}) {
    EXPECT_TRUE(std::isnan(xq[i].d)) << i;
    for (int j = 0; j < 256; ++j) ASSERT_TRUE(std::isnan(xr[256 * i + j])) << i << " " << j;
  }
  // The products of a non-finite block are NaN on the integer path too.
  const Layout& l = kLayouts[2];  // q4_K
  const QuantKernels& q = kernels(l.t);
  if (q.dot_q8k != nullptr) {
    const std::vector<uint8_t> b = random_blocks(l, 1, 3);
    EXPECT_TRUE(std::isnan(q.dot_q8k(b.data(), &xq[3], 1)));
  }
}

// q4_K, d = 1, dmin = 0, every 6-bit scale 1 and min 0: the values are the nibbles. Element
// 64 j + l is the low nibble of qs[32 j + l] for l < 32, the high nibble of qs[32 j + l - 32]
// otherwise (dequantize_row_q4_K).
TEST(QuantK, Q4KReferenceUnitScalesGiveTheNibbles) {
  std::vector<uint8_t> b(144, 0);
  put_f16(b, 0, 1.0f);
  put_f16(b, 2, 0.0f);
  for (int j = 0; j < 4; ++j) b[4 + j] = 1;      // scales 0..3 (mins 0..3 = bytes 4..7 = 0)
  for (int j = 0; j < 4; ++j) b[4 + 8 + j] = 1;  // scales 4..7: low nibbles of bytes 8..11
  for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>((i * 7 + 3) & 0xFF);
  std::vector<float> y(256);
  kernels(DType::kQ4_K).dequantize_ref(b.data(), y.data(), 1);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 64, l = e % 64;
    const uint8_t byte = b[16 + 32 * j + l % 32];
    const int nib = l < 32 ? (byte & 0x0F) : (byte >> 4);
    ASSERT_EQ(y[e], static_cast<float>(nib)) << "element " << e;
  }
}

// get_scale_min_k4 for the upper four sub-blocks (ggml-quants.c): sub-block 5's scale 45 =
// 0b10'1101 and min 38 = 0b10'0110 keep their low nibbles in byte 4 + 9 (scale low, min high)
// and their top two bits in bits 6..7 of scales[1] (scale) and scales[5] (min), next to
// sub-block 1's own 6-bit scale 9 and min 3.
TEST(QuantK, Q4KReferenceUnpacksUpperScalesAndMins) {
  std::vector<uint8_t> b(144, 0);
  put_f16(b, 0, 1.0f);
  put_f16(b, 2, 0.5f);
  uint8_t* s = b.data() + 4;
  s[1] = static_cast<uint8_t>(9 | (0b10 << 6));
  s[5] = static_cast<uint8_t>(3 | (0b10 << 6));
  s[9] = static_cast<uint8_t>(0xD | (0x6 << 4));
  for (int i = 0; i < 128; ++i) b[16 + i] = static_cast<uint8_t>(i & 0xFF);
  std::vector<float> y(256);
  kernels(DType::kQ4_K).dequantize_ref(b.data(), y.data(), 1);
  for (int l = 0; l < 32; ++l) {
    // Sub-block 1: high nibbles of qs[0..31]; sub-block 5: high nibbles of qs[64..95].
    EXPECT_EQ(y[32 + l], 9.0f * static_cast<float>(l >> 4) - 1.5f) << l;
    EXPECT_EQ(y[160 + l], 45.0f * static_cast<float>((64 + l) >> 4) - 19.0f) << l;
    EXPECT_EQ(y[l], 0.0f);  // sub-block 0: scale 0, min 0
  }
}

// q5_K: the fifth bit of element 64 j + l is bit 2 j (l < 32) or 2 j + 1 of qh[l % 32].
TEST(QuantK, Q5KReferenceAddsTheHighBit) {
  std::vector<uint8_t> b(176, 0);
  put_f16(b, 0, 1.0f);
  put_f16(b, 2, 1.0f);
  for (int j = 0; j < 4; ++j) b[4 + j] = 1;         // scales 0..3 = 1
  for (int j = 0; j < 4; ++j) b[4 + 4 + j] = 2;     // mins 0..3 = 2
  for (int j = 0; j < 4; ++j) b[4 + 8 + j] = 0x21;  // scales/mins 4..7 = 1/2
  for (int l = 0; l < 32; ++l) b[16 + l] = static_cast<uint8_t>(l * 37 + 1);   // qh
  for (int i = 0; i < 128; ++i) b[48 + i] = static_cast<uint8_t>(i * 13 + 5);  // qs
  std::vector<float> y(256);
  kernels(DType::kQ5_K).dequantize_ref(b.data(), y.data(), 1);
  for (int e = 0; e < 256; ++e) {
    const int j = e / 64, l = e % 64;
    const uint8_t byte = b[48 + 32 * j + l % 32];
    const int lo = l < 32 ? (byte & 0x0F) : (byte >> 4);
    const int bit = (b[16 + l % 32] >> (2 * j + (l < 32 ? 0 : 1))) & 1;
    ASSERT_EQ(y[e], static_cast<float>(lo + 16 * bit) - 2.0f) << "element " << e;
  }
}

// q6_K: element 128 n + 32 k + l has its low 4 bits in ql[64 n + 32 (k % 2) + l] (low nibble
// for k < 2), its top 2 bits at bit 2 k of qh[32 n + l], value d * scales[e / 16] * (q - 32).
TEST(QuantK, Q6KReferenceAssemblesSixBitsWithSignedScales) {
  std::vector<uint8_t> b(210, 0);
  for (int i = 0; i < 128; ++i) b[i] = static_cast<uint8_t>(i * 29 + 7);
  for (int i = 0; i < 64; ++i) b[128 + i] = static_cast<uint8_t>(i * 53 + 11);
  for (int g = 0; g < 16; ++g) b[192 + g] = static_cast<uint8_t>(static_cast<int8_t>(g * 9 - 70));
  put_f16(b, 208, 0.25f);
  std::vector<float> y(256);
  kernels(DType::kQ6_K).dequantize_ref(b.data(), y.data(), 1);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, k = (e % 128) / 32, l = e % 32;
    const uint8_t lb = b[64 * n + 32 * (k % 2) + l];
    const int lo = k < 2 ? (lb & 0x0F) : (lb >> 4);
    const int hi = (b[128 + 32 * n + l] >> (2 * k)) & 3;
    const float sc = static_cast<float>(static_cast<int8_t>(b[192 + e / 16]));
    ASSERT_EQ(y[e], 0.25f * sc * static_cast<float>((lo | (hi << 4)) - 32)) << "element " << e;
  }
}

// q3_K's 16 six-bit scales as ggml's dequantize_row_q3_K unpacks them: 32-bit words with
// kmask1 = 0x03030303 and kmask2 = 0x0f0f0f0f (ggml-quants.c), an independent spelling of the
// per-scale rule quant_k.cc uses.
std::vector<int> q3k_scales_kmask(const uint8_t* s12) {
  uint32_t aux[4];
  std::memcpy(aux, s12, 12);
  const uint32_t km1 = 0x03030303u, km2 = 0x0f0f0f0fu, tmp = aux[2];
  aux[2] = ((aux[0] >> 4) & km2) | (((tmp >> 4) & km1) << 4);
  aux[3] = ((aux[1] >> 4) & km2) | (((tmp >> 6) & km1) << 4);
  aux[0] = (aux[0] & km2) | (((tmp >> 0) & km1) << 4);
  aux[1] = (aux[1] & km2) | (((tmp >> 2) & km1) << 4);
  uint8_t bytes[16];
  std::memcpy(bytes, aux, 16);  // little-endian host, as ggml assumes
  return std::vector<int>(bytes, bytes + 16);
}

// q3_K: element 128 n + 32 k + l: 2 low bits at bit 2 k of qs[32 n + l], minus 4 unless bit
// 4 n + k of hmask[l] is set; scale d * (scale6 - 32).
TEST(QuantK, Q3KReferenceMatchesKmaskScalesAndHmask) {
  std::vector<uint8_t> b(110, 0);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<uint8_t>(i * 71 + 3);       // hmask
  for (int i = 0; i < 64; ++i) b[32 + i] = static_cast<uint8_t>(i * 45 + 9);  // qs
  for (int i = 0; i < 12; ++i) b[96 + i] = static_cast<uint8_t>(i * 97 + 17);
  put_f16(b, 108, 0.5f);
  const std::vector<int> sc = q3k_scales_kmask(b.data() + 96);
  std::vector<float> y(256);
  kernels(DType::kQ3_K).dequantize_ref(b.data(), y.data(), 1);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, k = (e % 128) / 32, l = e % 32;
    const int lo = (b[32 + 32 * n + l] >> (2 * k)) & 3;
    const int h = (b[l] >> (4 * n + k)) & 1;
    const float dl = 0.5f * static_cast<float>(sc[e / 16] - 32);
    ASSERT_EQ(y[e], dl * static_cast<float>(lo - (h != 0 ? 0 : 4))) << "element " << e;
  }
}

// q2_K: element 128 n + 32 k + l is bits 2 k of qs[32 n + l]; scales[e / 16] holds the
// scale (low nibble) and min (high nibble).
TEST(QuantK, Q2KReferenceUsesNibbleScalesAndMins) {
  std::vector<uint8_t> b(84, 0);
  for (int g = 0; g < 16; ++g) b[g] = static_cast<uint8_t>(g * 23 + 5);
  for (int i = 0; i < 64; ++i) b[16 + i] = static_cast<uint8_t>(i * 59 + 1);
  put_f16(b, 80, 2.0f);
  put_f16(b, 82, 0.5f);
  std::vector<float> y(256);
  kernels(DType::kQ2_K).dequantize_ref(b.data(), y.data(), 1);
  for (int e = 0; e < 256; ++e) {
    const int n = e / 128, k = (e % 128) / 32, l = e % 32;
    const int q = (b[16 + 32 * n + l] >> (2 * k)) & 3;
    const uint8_t s = b[e / 16];
    ASSERT_EQ(y[e], 2.0f * static_cast<float>(s & 0x0F) * static_cast<float>(q) -
                        0.5f * static_cast<float>(s >> 4))
        << "element " << e;
  }
}

// Round trip of N(0, 1) data: the RMS error relative to the RMS of the data. The bounds are
// about 1.5x the uniform-quantisation error step / sqrt(12) of each type's code range over a
// sub-block's spread (q2_K: 4 levels over 16 values, ..., q6_K: 64 levels), which the simple
// fits reach.
TEST(QuantK, QuantizeRoundTripErrorIsBounded) {
  struct Bound {
    DType t;
    double rel_rms;
  };
  const Bound bounds[] = {{DType::kQ2_K, 0.45},
                          {DType::kQ3_K, 0.25},
                          {DType::kQ4_K, 0.11},
                          {DType::kQ5_K, 0.055},
                          {DType::kQ6_K, 0.03}};
  constexpr int kBlocks = 64;
  const std::vector<float> x = randn(256 * kBlocks, 99);
  for (const Bound& bd : bounds) {
    const QuantKernels& q = kernels(bd.t);
    std::vector<std::byte> blocks(dtype_bytes(bd.t, 256 * kBlocks));
    q.quantize_ref(x.data(), blocks.data(), kBlocks);
    std::vector<float> back(x.size());
    q.dequantize_ref(blocks.data(), back.data(), kBlocks);
    double err = 0.0, sig = 0.0;
    for (size_t j = 0; j < x.size(); ++j) {
      err += (back[j] - x[j]) * (back[j] - x[j]);
      sig += x[j] * x[j];
    }
    const double rel = std::sqrt(err / sig);
    EXPECT_LT(rel, bd.rel_rms) << dtype_name(bd.t);
    // A constant block and a zero block are representable without NaN.
    std::vector<float> flat(256, 0.0f);
    q.quantize_ref(flat.data(), blocks.data(), 1);
    q.dequantize_ref(blocks.data(), back.data(), 1);
    for (int j = 0; j < 256; ++j) ASSERT_EQ(back[j], 0.0f) << dtype_name(bd.t);
  }
}

// matmul() on k-quant weights against matmul_reference (which dequantizes W with
// dequantize_row): the GEMV rows (m = 1, 2, 3, allow_blas = false) and the packed GEMM
// (m = 7, 33), odd n. Tolerance of matmul.h: 1e-5 * sum_j |x_j w_j| + 1e-6 per output.
TEST(QuantK, MatmulMatchesReferenceOnDequantizedWeights) {
  ThreadPool pool(2);
  struct Case {
    int64_t m, n, k;
    bool allow_blas;
  };
  const Case cases[] = {{1, 37, 512, false},
                        {2, 19, 256, false},
                        {3, 41, 768, false},
                        {7, 29, 512, true},
                        {33, 13, 768, true}};
  uint32_t seed = 300;
  for (const Layout& l : kLayouts) {
    for (const Case& c : cases) {
      const int64_t ldx = c.k + 5, ldy = c.n + 3;
      const std::vector<float> x = randn(static_cast<size_t>(c.m * ldx), seed++);
      const std::vector<float> wf = randn(static_cast<size_t>(c.n * c.k), seed++);
      const std::vector<std::byte> w = make_weights(wf, l.t, c.n, c.k);
      MatmulParams p;
      p.x = x.data();
      p.ldx = ldx;
      p.w = w.data();
      p.w_dtype = l.t;
      p.ldy = ldy;
      p.m = c.m;
      p.n = c.n;
      p.k = c.k;
      p.pool = &pool;
      p.allow_blas = c.allow_blas;
      std::vector<float> ref(static_cast<size_t>(c.m * ldy), -7.0f), y(ref.size(), -7.0f);
      // Types with an integer dot multiply x rounded to int8 per 256 on every path, and so
      // does matmul_reference (spelled out there); the bound is on the rounded x'.
      std::vector<float> xr = x;
      if (kernels(l.t).dot_q8k != nullptr)
        for (int64_t i = 0; i < c.m; ++i) round_act_q8k(&x[i * ldx], &xr[i * ldx], c.k);
      p.y = ref.data();
      matmul_reference(p);
      p.y = y.data();
      matmul(p);
      std::vector<float> wrow(static_cast<size_t>(c.k));
      for (int64_t r = 0; r < c.n; ++r) {
        dequantize_row(w.data() + r * dtype_bytes(l.t, c.k), l.t, wrow.data(), c.k);
        for (int64_t i = 0; i < c.m; ++i) {
          double mag = 0.0;
          for (int64_t j = 0; j < c.k; ++j) mag += std::fabs(wrow[j] * xr[i * ldx + j]);
          const size_t at = static_cast<size_t>(i * ldy + r);
          ASSERT_NEAR(y[at], ref[at], 1e-5 * mag + 1e-6)
              << dtype_name(l.t) << " m " << c.m << " row " << i << " col " << r;
        }
      }
      for (int64_t i = 0; i < c.m; ++i)  // padding between rows untouched
        for (int64_t r = c.n; r < ldy; ++r) ASSERT_EQ(y[i * ldy + r], -7.0f);
    }
  }
}

}  // namespace
}  // namespace kvcache
