// q4_0, q4_1, q5_0, q5_1, iq4_nl (kernels/quant_legacy.cc): the reference against hand-made
// blocks, the SIMD dequantize against the reference bit for bit, the fused dot, the integer dot
// (x rounded per 32) and matmul against the dequantized values, the rounding of x itself, and
// the quantizer's round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/matmul.h"
#include "kernels/quant_types.h"

namespace kvcache {
namespace {

using testing_util::make_weights;
using testing_util::randn;

const DType kLegacyTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                              DType::kIQ4_NL};

bool has_min(DType t) {
  return t == DType::kQ4_1 || t == DType::kQ5_1;
}

const QuantKernels& kernels(DType t) {
  const QuantKernels* q = legacy_quant_kernels(t);
  EXPECT_NE(q, nullptr) << dtype_name(t);
  return *q;
}

void put_f16(std::vector<uint8_t>& v, size_t at, float f) {
  const f16_t h = f32_to_f16(f);
  std::memcpy(v.data() + at, &h, 2);
}

// n blocks of random bytes whose f16 fields (d, and m for the _1 types) are random finite
// halves: any exponent but the all-ones one (inf / NaN), subnormals and -0 included.
std::vector<uint8_t> random_blocks(DType t, int64_t n, uint32_t seed) {
  const size_t bb = static_cast<size_t>(dtype_info(t).block_bytes);
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(bb * static_cast<size_t>(n));
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  for (int64_t b = 0; b < n; ++b) {
    for (int f = 0; f < (has_min(t) ? 2 : 1); ++f) {
      f16_t h;
      do {
        h = static_cast<f16_t>(rng());
      } while ((h & 0x7C00u) == 0x7C00u);
      std::memcpy(v.data() + b * bb + 2 * f, &h, 2);
    }
  }
  return v;
}

// As random_blocks, with scales of moderate size (normal f16 values around 1e-2) so that
// dot products of many blocks stay far from overflow.
std::vector<uint8_t> random_blocks_moderate(DType t, int64_t n, uint32_t seed) {
  std::vector<uint8_t> v = random_blocks(t, n, seed);
  const size_t bb = static_cast<size_t>(dtype_info(t).block_bytes);
  std::mt19937 rng(seed + 1000);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (int64_t b = 0; b < n; ++b) {
    put_f16(v, static_cast<size_t>(b) * bb, nd(rng));
    if (has_min(t)) put_f16(v, static_cast<size_t>(b) * bb + 2, nd(rng) * 8.0f);
  }
  return v;
}

TEST(QuantLegacy, KernelsExistForTheLegacyTypesOnly) {
  for (DType t : kLegacyTypes) {
    const QuantKernels* q = legacy_quant_kernels(t);
    ASSERT_NE(q, nullptr) << dtype_name(t);
    EXPECT_NE(q->dequantize_ref, nullptr);
    EXPECT_NE(q->dequantize, nullptr);
    EXPECT_NE(q->dot, nullptr);
    EXPECT_NE(q->quantize_ref, nullptr);
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    EXPECT_NE(q->dot_q8_32, nullptr) << dtype_name(t);
#else
    EXPECT_EQ(q->dot_q8_32, nullptr) << dtype_name(t);
#endif
    EXPECT_EQ(q->dot_q8k, nullptr) << dtype_name(t);
    EXPECT_EQ(quant_kernels(t), q);
  }
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_K})
    EXPECT_EQ(legacy_quant_kernels(t), nullptr) << dtype_name(t);
}

// Runs dequantize_ref and dequantize on one block and checks both against `want`.
void expect_block(DType t, const std::vector<uint8_t>& blk, const std::vector<float>& want) {
  ASSERT_EQ(blk.size(), static_cast<size_t>(dtype_info(t).block_bytes));
  std::vector<float> ref(32), simd(32), row(32);
  kernels(t).dequantize_ref(blk.data(), ref.data(), 1);
  kernels(t).dequantize(blk.data(), simd.data(), 1);
  dequantize_row(blk.data(), t, row.data(), 32);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(ref[j], want[j]) << dtype_name(t) << " element " << j;
    EXPECT_EQ(simd[j], want[j]) << dtype_name(t) << " element " << j;
    EXPECT_EQ(row[j], want[j]) << dtype_name(t) << " element " << j;
  }
}

// Hand-made blocks, values written out from ggml-common.h's layouts (see quant_legacy.cc):
// element j < 16 is qs[j]'s low nibble, element j + 16 its high nibble, the fifth bit of
// element j is bit j of qh (little-endian uint32).
TEST(QuantLegacy, HandMadeBlocksGiveTheFormatsValues) {
  {  // q4_0: d = 0.5, qs[j] = j | (15 - j) << 4 -> (j - 8) / 2 and (7 - j) / 2
    std::vector<uint8_t> b(18);
    put_f16(b, 0, 0.5f);
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    std::vector<float> want(32);
    for (int j = 0; j < 16; ++j) {
      want[j] = (j - 8) * 0.5f;
      want[j + 16] = (7 - j) * 0.5f;
    }
    expect_block(DType::kQ4_0, b, want);
  }
  {  // q4_1: d = 0.25, m = -1, same codes -> j / 4 - 1 and (15 - j) / 4 - 1
    std::vector<uint8_t> b(20);
    put_f16(b, 0, 0.25f);
    put_f16(b, 2, -1.0f);
    for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    std::vector<float> want(32);
    for (int j = 0; j < 16; ++j) {
      want[j] = j * 0.25f - 1.0f;
      want[j + 16] = (15 - j) * 0.25f - 1.0f;
    }
    expect_block(DType::kQ4_1, b, want);
  }
  {  // q5_0: d = 2, every qs byte 0x37 (low nibble 7, high 3), qh bytes 01 02 00 80: the
     // fifth bit set for elements 0, 9 and 31.
    std::vector<uint8_t> b(22);
    put_f16(b, 0, 2.0f);
    b[2] = 0x01;
    b[3] = 0x02;
    b[4] = 0x00;
    b[5] = 0x80;
    for (int j = 0; j < 16; ++j) b[6 + j] = 0x37;
    std::vector<float> want(32);
    for (int j = 0; j < 16; ++j) {
      want[j] = (7 - 16) * 2.0f;
      want[j + 16] = (3 - 16) * 2.0f;
    }
    want[0] = (7 + 16 - 16) * 2.0f;
    want[9] = (7 + 16 - 16) * 2.0f;
    want[31] = (3 + 16 - 16) * 2.0f;
    expect_block(DType::kQ5_0, b, want);
  }
  {  // q5_1: d = 0.5, m = 3, qs[j] = j | (15 - j) << 4, qh bytes 00 00 01 40: the fifth
     // bit set for elements 16 and 30.
    std::vector<uint8_t> b(24);
    put_f16(b, 0, 0.5f);
    put_f16(b, 2, 3.0f);
    b[4] = 0x00;
    b[5] = 0x00;
    b[6] = 0x01;
    b[7] = 0x40;
    for (int j = 0; j < 16; ++j) b[8 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    std::vector<float> want(32);
    for (int j = 0; j < 16; ++j) {
      want[j] = j * 0.5f + 3.0f;
      want[j + 16] = (15 - j) * 0.5f + 3.0f;
    }
    want[16] = (15 + 16) * 0.5f + 3.0f;
    want[30] = (1 + 16) * 0.5f + 3.0f;
    expect_block(DType::kQ5_1, b, want);
  }
  {  // iq4_nl: d = 0.5, qs[j] = j | (15 - j) << 4 -> the table (ggml-common.h's
     // kvalues_iq4nl) forwards, then backwards
    const float table[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                             1,    13,   25,  38,  53,  69,  89,  113};
    std::vector<uint8_t> b(18);
    put_f16(b, 0, 0.5f);
    for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    std::vector<float> want(32);
    for (int j = 0; j < 16; ++j) {
      want[j] = table[j] * 0.5f;
      want[j + 16] = table[15 - j] * 0.5f;
    }
    expect_block(DType::kIQ4_NL, b, want);
  }
}

TEST(QuantLegacy, SimdDequantizeEqualsReferenceBitForBit) {
  for (DType t : kLegacyTypes) {
    for (int64_t n : {1, 3, 17, 1001}) {
      const std::vector<uint8_t> blocks = random_blocks(t, n, static_cast<uint32_t>(n) * 7 + 1);
      std::vector<float> ref(static_cast<size_t>(n) * 32, -1.0f), simd(ref.size(), -2.0f);
      kernels(t).dequantize_ref(blocks.data(), ref.data(), n);
      kernels(t).dequantize(blocks.data(), simd.data(), n);
      ASSERT_EQ(std::memcmp(ref.data(), simd.data(), ref.size() * sizeof(float)), 0)
          << dtype_name(t) << " n_blocks " << n;
      for (float v : ref) ASSERT_TRUE(std::isfinite(v)) << dtype_name(t);
    }
  }
}

// |dot - dot_ref| <= kQuantDotTolerance * sum |w x| + 1e-6 (quant_types.h), dot_ref the f32
// dot of dequantize_ref's values in index order.
void expect_dot_close(DType t, const std::vector<uint8_t>& blocks, int64_t n, uint32_t seed) {
  const std::vector<float> x = randn(static_cast<size_t>(n) * 32, seed);
  std::vector<float> w(x.size());
  kernels(t).dequantize_ref(blocks.data(), w.data(), n);
  float ref = 0.0f;
  double mag = 0.0;
  for (size_t j = 0; j < w.size(); ++j) {
    ref += w[j] * x[j];
    mag += std::fabs(static_cast<double>(w[j]) * x[j]);
  }
  const float got = kernels(t).dot(blocks.data(), x.data(), n);
  EXPECT_NEAR(got, ref, kQuantDotTolerance * mag + 1e-6) << dtype_name(t) << " n_blocks " << n;
  // dot_row is the integer dot on x rounded per 32 where the build has one (matmul.h), else
  // this fused f32 dot.
  if (kernels(t).dot_q8_32 != nullptr) {
    std::vector<BlockQ8A32> xq(static_cast<size_t>(n));
    quantize_act_q8_32(x.data(), xq.data(), n);
    EXPECT_EQ(dot_row(blocks.data(), t, x.data(), n * 32),
              kernels(t).dot_q8_32(blocks.data(), xq.data(), n))
        << dtype_name(t);
  } else {
    EXPECT_EQ(dot_row(blocks.data(), t, x.data(), n * 32), got) << dtype_name(t);
  }
}

TEST(QuantLegacy, DotMatchesReferenceOnOddBlockCounts) {
  for (DType t : kLegacyTypes) {
    uint32_t seed = 11;
    for (int64_t n : {1, 3, 7, 33, 129}) {
      expect_dot_close(t, random_blocks_moderate(t, n, seed), n, seed + 1);
      ++seed;
      // Weights as a model has them: the quantizer's blocks of normal values.
      const std::vector<float> wf = randn(static_cast<size_t>(n) * 32, seed + 500);
      std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(t, n * 32)));
      kernels(t).quantize_ref(wf.data(), q.data(), n);
      expect_dot_close(t, q, n, seed + 2);
    }
  }
}

// The integer dot (x rounded to int8 per 32, BlockQ8A32) against the f32 dot of the reference
// values with the rounded x' = d * q: within kQuantDotTolerance (the integer sums are exact;
// only the float scaling and summation order differ, and for the _1 types the split into
// d * sum(q x) + m * sum(x), whose terms are a few times sum |w x'| on these blocks). Odd block
// counts, blocks offset by one byte (GGUF tensors are unaligned), x's blocks of very different
// magnitudes, random codes (every nibble and fifth bit) and the quantizer's blocks.
TEST(QuantLegacy, IntegerDotWithinToleranceOfReferenceOnRoundedX) {
  for (DType t : kLegacyTypes) {
    const QuantKernels& q = kernels(t);
    if (q.dot_q8_32 == nullptr) GTEST_SKIP() << "no integer dots in this build (no AVX2)";
    uint32_t seed = 900;
    for (int64_t n : {1, 3, 7, 33, 129}) {
      for (int kind = 0; kind < 2; ++kind) {
        std::vector<uint8_t> b;
        if (kind == 0) {
          b = random_blocks_moderate(t, n, seed++);
        } else {
          const std::vector<float> wf = randn(static_cast<size_t>(n) * 32, seed++);
          b.resize(static_cast<size_t>(dtype_bytes(t, n * 32)));
          q.quantize_ref(wf.data(), b.data(), n);
        }
        b.insert(b.begin(), 0);
        std::vector<float> x = randn(static_cast<size_t>(n) * 32, seed++);
        for (int64_t i = 0; i < n; ++i)
          for (int j = 0; j < 32; ++j) x[32 * i + j] *= std::ldexp(1.0f, 3 * (i % 5) - 6);
        std::vector<BlockQ8A32> xq(static_cast<size_t>(n));
        quantize_act_q8_32(x.data(), xq.data(), n);
        std::vector<float> w(x.size()), xr(x.size());
        q.dequantize_ref(b.data() + 1, w.data(), n);
        round_act_q8_32(x.data(), xr.data(), static_cast<int64_t>(x.size()));
        float ref = 0.0f;
        double mag = 0.0;
        for (size_t j = 0; j < x.size(); ++j) {
          const BlockQ8A32& blk = xq[j / 32];
          ASSERT_EQ(xr[j], blk.d * static_cast<float>(blk.qs[j % 32])) << j;  // x' = d * q
          ref += w[j] * xr[j];
          mag += std::fabs(static_cast<double>(w[j]) * xr[j]);
        }
        EXPECT_NEAR(q.dot_q8_32(b.data() + 1, xq.data(), n), ref, kQuantDotTolerance * mag + 1e-6)
            << dtype_name(t) << " n_blocks " << n << (kind == 0 ? " random" : " quantized");
      }
    }
  }
}

// The rounding of x per 32 (llama.cpp's quantize_row_q8_0: d = amax / 127 rounded to f16,
// q = nearbyint(x * 127 / amax)): codes in [-127, 127], the largest value maps to +-127, and
// |x' - x| <= amax / 254 (half a step) + 127 |d - amax / 127| (the f16 rounding of d moves
// every x' by up to |q| times it), plus an ulp of the product; s = d * sum(q); zero blocks
// give zeros; a block holding an infinity or a NaN gives NaN (d, s, x' and the integer
// products with it).
TEST(QuantLegacy, ActivationRoundingPer32IsBoundedAndCarriesNonFiniteBlocks) {
  const int n = 7;
  std::vector<float> x = randn(32 * static_cast<size_t>(n), 19);
  for (int j = 0; j < 32; ++j) x[32 + j] = 0.0f;        // block 1: all zero
  x[2 * 32 + 17] = INFINITY;                            // block 2: an infinity
  x[3 * 32 + 5] = NAN;                                  // block 3: a NaN
  for (int j = 0; j < 32; ++j) x[4 * 32 + j] *= 1e-3f;  // small and large magnitudes
  for (int j = 0; j < 32; ++j) x[5 * 32 + j] *= 300.0f;
  x[6 * 32 + 9] = -50.0f;  // the largest value negative
  std::vector<BlockQ8A32> xq(n);
  quantize_act_q8_32(x.data(), xq.data(), n);
  std::vector<float> xr(x.size());
  round_act_q8_32(x.data(), xr.data(), static_cast<int64_t>(x.size()));
  for (int i : {0, 4, 5, 6}) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[32 * i + j]));
    const float d = xq[i].d;
    EXPECT_EQ(d, f16_to_f32(f32_to_f16(amax / 127.0f))) << i;
    const float bound = amax / 254.0f + 127.0f * std::fabs(d - amax / 127.0f);
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += xq[i].qs[j];
    EXPECT_EQ(xq[i].s, d * static_cast<float>(sum)) << i;
    for (int j = 0; j < 32; ++j) {
      const float v = x[32 * i + j];
      const int c = xq[i].qs[j];
      EXPECT_EQ(xr[32 * i + j], d * static_cast<float>(c)) << i << " " << j;
      EXPECT_LE(std::fabs(xr[32 * i + j] - v), bound * (1.0f + 1e-6f)) << i << " " << j;
      EXPECT_LE(std::abs(c), 127);
      if (std::fabs(v) == amax) {
        EXPECT_EQ(c, v > 0 ? 127 : -127) << i << " " << j;
      }
    }
  }
  EXPECT_EQ(xq[1].d, 0.0f);
  EXPECT_EQ(xq[1].s, 0.0f);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(xq[1].qs[j], 0);
    EXPECT_EQ(xr[32 + j], 0.0f);
  }
  for (int i : {2, 3}) {
    EXPECT_TRUE(std::isnan(xq[i].d)) << i;
    EXPECT_TRUE(std::isnan(xq[i].s)) << i;
    for (int j = 0; j < 32; ++j) ASSERT_TRUE(std::isnan(xr[32 * i + j])) << i << " " << j;
  }
  // The products of a non-finite block are NaN on the integer path too, for every type.
  for (DType t : kLegacyTypes) {
    const QuantKernels& q = kernels(t);
    if (q.dot_q8_32 == nullptr) continue;
    const std::vector<uint8_t> b = random_blocks_moderate(t, n, 5);
    EXPECT_TRUE(std::isnan(q.dot_q8_32(b.data(), xq.data(), n))) << dtype_name(t);
    EXPECT_FALSE(std::isnan(q.dot_q8_32(b.data(), xq.data(), 2))) << dtype_name(t);
  }
}

// matmul() against matmul_reference (dequantize, then the plain f32 loop). Tolerance
// (matmul.h): |y - y_ref| <= 1e-5 * sum_j |x_j w_j| + 1e-6 per output, w the dequantized
// weights: both sides use the same dequantized values (the GEMM widens W with dequantize, equal
// to dequantize_ref bit for bit) and the GEMV's dot is within kQuantDotTolerance (1e-5) of them;
// only the summation order (and, for the _1 types, the FMA forming w or the split of the min
// term) differs. Where the build has the integer dot, both sides take x rounded per 32
// (matmul_reference spells the rounding out in scalar code) and the bound is on that x'.
TEST(QuantLegacy, MatmulMatchesDequantizedReference) {
  ThreadPool pool(3);
  struct Case {
    int64_t m, n, k;
    bool allow_blas;
  };
  const Case cases[] = {{1, 37, 96, false},  {2, 61, 32, false}, {3, 129, 160, false},
                        {1, 301, 224, true}, {7, 45, 96, true},  {33, 77, 160, true},
                        {7, 19, 32, false},  {33, 21, 64, false}};
  for (DType t : kLegacyTypes) {
    uint32_t seed = 3;
    for (const Case& c : cases) {
      const int64_t ldx = c.k + 5, ldy = c.n + 3;
      const std::vector<float> x = randn(static_cast<size_t>(c.m * ldx), seed++);
      const std::vector<float> wf = randn(static_cast<size_t>(c.n * c.k), seed++);
      const std::vector<float> bias = randn(static_cast<size_t>(c.n), seed++);
      const std::vector<std::byte> w = make_weights(wf, t, c.n, c.k);
      // The f32 matrix of dequantize_ref's values.
      std::vector<float> wd(static_cast<size_t>(c.n * c.k));
      kernels(t).dequantize_ref(w.data(), wd.data(), c.n * c.k / 32);
      MatmulParams p;
      p.x = x.data();
      p.ldx = ldx;
      p.w = w.data();
      p.w_dtype = t;
      p.bias = c.m % 2 == 1 ? bias.data() : nullptr;
      p.ldy = ldy;
      p.m = c.m;
      p.n = c.n;
      p.k = c.k;
      p.pool = &pool;
      p.allow_blas = c.allow_blas;
      std::vector<float> y(static_cast<size_t>(c.m * ldy), -7.0f), ref(y.size(), -7.0f);
      p.y = y.data();
      matmul(p);
      MatmulParams pr = p;
      pr.y = ref.data();
      matmul_reference(pr);
      std::vector<float> xr = x;
      if (kernels(t).dot_q8_32 != nullptr)
        for (int64_t i = 0; i < c.m; ++i) round_act_q8_32(&x[i * ldx], &xr[i * ldx], c.k);
      for (int64_t i = 0; i < c.m; ++i) {
        for (int64_t r = 0; r < c.n; ++r) {
          double mag = 0.0;
          for (int64_t j = 0; j < c.k; ++j)
            mag += std::fabs(static_cast<double>(wd[r * c.k + j]) * xr[i * ldx + j]);
          const size_t at = static_cast<size_t>(i * ldy + r);
          ASSERT_NEAR(y[at], ref[at], 1e-5 * mag + 1e-6)
              << dtype_name(t) << " m " << c.m << " n " << c.n << " k " << c.k << " row " << i
              << " col " << r;
          if (!takes_gemm(p)) {  // the GEMV's rows are dot_row's bits (matmul.h)
            const float want = dot_row(w.data() + static_cast<size_t>(r) * dtype_bytes(t, c.k), t,
                                       x.data() + i * ldx, c.k) +
                               (p.bias != nullptr ? bias[r] : 0.0f);
            ASSERT_EQ(y[at], want) << dtype_name(t) << " m " << c.m << " row " << i;
          }
        }
        for (int64_t r = c.n; r < ldy; ++r) ASSERT_EQ(y[i * ldy + r], -7.0f);
      }
    }
  }
}

// quantize_ref then dequantize_ref, per block: the error bound of each fit, in units of the
// block's |d| (stored as f16, hence the 2^-10 slack on terms proportional to the values).
//   q4_0 / q5_0: codes round to nearest (<= |d| / 2) except the code past the top, clamped:
//     the value of largest magnitude's opposite maps to 8 d (16 d), one past 7 d (15 d): <= |d|.
//   q4_1 / q5_1: [min, max] onto 0..15 (0..31), nearest: <= d / 2.
//   iq4_nl: nearest level, the widest gap is 89 .. 113 and the top 113 against 127: <= 14 |d|.
TEST(QuantLegacy, QuantizeRoundTripErrorIsBounded) {
  for (DType t : kLegacyTypes) {
    const int64_t n = 257;
    std::vector<float> src = randn(static_cast<size_t>(n) * 32, 77);
    for (size_t j = 0; j < src.size(); ++j) src[j] = src[j] * 0.1f + (j / 32 % 3 == 0 ? 0.5f : 0);
    std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(t, n * 32)));
    std::vector<float> back(src.size());
    kernels(t).quantize_ref(src.data(), q.data(), n);
    kernels(t).dequantize_ref(q.data(), back.data(), n);
    const size_t bb = static_cast<size_t>(dtype_info(t).block_bytes);
    const float bound_in_d = t == DType::kIQ4_NL                        ? 14.0f
                             : (t == DType::kQ4_0 || t == DType::kQ5_0) ? 1.0f
                                                                        : 0.5f;
    double sq = 0.0, sq_d = 0.0;
    for (int64_t b = 0; b < n; ++b) {
      f16_t h;
      std::memcpy(&h, q.data() + b * bb, 2);
      const float d = std::fabs(f16_to_f32(h));
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(src[b * 32 + j]));
      for (int j = 0; j < 32; ++j) {
        const size_t at = static_cast<size_t>(b * 32 + j);
        const float err = std::fabs(back[at] - src[at]);
        ASSERT_LE(err, bound_in_d * d + 2e-3f * amax + 1e-6f)
            << dtype_name(t) << " block " << b << " element " << j;
        sq += static_cast<double>(err) * err;
        sq_d += static_cast<double>(d) * d;
      }
    }
    // On average well inside the bound: rms error below a third of the rms step (uniform
    // rounding error is step / sqrt(12)); iq4_nl's gaps are 11 .. 24 |d| (the wide ones at the
    // outer levels, where the blocks offset by 0.5 sit): below 24 / sqrt(12) ~ 7 |d|.
    const double limit = t == DType::kIQ4_NL ? 7.0 : 1.0 / 3.0;
    EXPECT_LT(std::sqrt(sq / sq_d), limit) << dtype_name(t);
  }
}

TEST(QuantLegacy, QuantizeKeepsZeroBlocksAndTheLargestValue) {
  for (DType t : kLegacyTypes) {
    std::vector<float> src(64, 0.0f);
    for (int j = 0; j < 32; ++j) src[32 + j] = 0.01f * static_cast<float>(j - 9);
    src[32 + 5] = -3.0f;  // the largest magnitude
    std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(t, 64)));
    std::vector<float> back(64);
    kernels(t).quantize_ref(src.data(), q.data(), 2);
    kernels(t).dequantize_ref(q.data(), back.data(), 2);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(back[j], 0.0f) << dtype_name(t) << " element " << j;
    // The linear types reproduce it up to the f16 scale; iq4_nl's refitted scale moves it.
    EXPECT_NEAR(back[32 + 5], -3.0f, t == DType::kIQ4_NL ? 0.3f : 3.0f * 1e-3f) << dtype_name(t);
  }
}

}  // namespace
}  // namespace kvcache
