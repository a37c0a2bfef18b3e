#include "core/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"

namespace kvcache {
namespace {

float from_bits(uint32_t b) {
  return std::bit_cast<float>(b);
}

TEST(F16, ExactValuesRoundTrip) {
  for (float f : {0.0f, -0.0f, 1.0f, -2.0f, 0.5f, 65504.0f, -65504.0f, 6.103515625e-05f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(f)), f) << f;
  }
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
}

TEST(F16, Subnormals) {
  EXPECT_EQ(f32_to_f16(5.9604644775390625e-08f), 0x0001);  // 2^-24, smallest subnormal
  EXPECT_EQ(f16_to_f32(0x0001), 5.9604644775390625e-08f);
  EXPECT_EQ(f32_to_f16(6.097555160522461e-05f), 0x03ff);  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x03ff), 6.097555160522461e-05f);
  // Half of the smallest subnormal is a tie between 0 and 1: rounds to even (0).
  EXPECT_EQ(f32_to_f16(2.98023223876953125e-08f), 0x0000);
  // Just above the tie rounds up.
  EXPECT_EQ(f32_to_f16(from_bits(0x33000001u)), 0x0001);
  // 1.5 * 2^-24 is a tie between 1 and 2 units: rounds to even (2).
  EXPECT_EQ(f32_to_f16(8.940696716308594e-08f), 0x0002);
  // Float subnormals flush to signed zero (far below half's range).
  EXPECT_EQ(f32_to_f16(from_bits(0x00000001u)), 0x0000);
  EXPECT_EQ(f32_to_f16(from_bits(0x80000001u)), 0x8000);
  // Rounding up from the largest subnormal reaches the smallest normal.
  EXPECT_EQ(f32_to_f16(6.1022e-05f), 0x0400);
}

TEST(F16, RoundingTiesToEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: even mantissa (1.0) wins.
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
  // 1 + 3*2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9 (even): rounds up.
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
  // Slightly above the tie rounds up.
  EXPECT_EQ(f32_to_f16(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3c01);
}

TEST(F16, OverflowInfNaN) {
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);  // below the tie with infinity
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // tie rounds to even: infinity
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xfc00);
  const f16_t nan = f32_to_f16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_TRUE(std::isnan(f16_to_f32(nan)));
  // A signalling NaN whose payload sits only in low bits must not become infinity.
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
}

TEST(F16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<f16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(F16, BulkMatchesScalar) {
  std::mt19937 rng(7);
  std::vector<float> src(1031);
  for (size_t i = 0; i < src.size(); ++i) src[i] = from_bits(rng());  // every bit pattern kind
  std::vector<f16_t> bulk(src.size());
  f32_to_f16_n(src.data(), bulk.data(), src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    const f16_t s = f32_to_f16(src[i]);
    if (std::isnan(src[i])) {
      EXPECT_TRUE(std::isnan(f16_to_f32(bulk[i])));
    } else {
      EXPECT_EQ(bulk[i], s) << i;
    }
  }
  std::vector<float> back(src.size());
  f16_to_f32_n(bulk.data(), back.data(), bulk.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (!std::isnan(back[i])) {
      EXPECT_EQ(back[i], f16_to_f32(bulk[i]));
    }
  }
}

TEST(BF16, RoundingAndSpecials) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: even wins.
  EXPECT_EQ(f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds to infinity
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7f800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // Subnormals keep their top bits.
  EXPECT_EQ(f32_to_bf16(from_bits(0x00010000u)), 0x0001);
  EXPECT_EQ(bf16_to_f32(0x0001), from_bits(0x00010000u));
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<bf16_t>(h));
    if (!std::isnan(f)) {
      EXPECT_EQ(f32_to_bf16(f), h);
    }
  }
}

TEST(DType, InfoAndParse) {
  EXPECT_EQ(dtype_bytes(DType::kF32, 3), 12u);
  EXPECT_EQ(dtype_bytes(DType::kBF16, 5), 10u);
  EXPECT_EQ(dtype_bytes(DType::kQ8_0, 64), 68u);
  EXPECT_EQ(parse_dtype("F16"), DType::kF16);
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
  EXPECT_THROW(parse_dtype("f12"), Error);
  try {
    parse_dtype("int4");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f32, f16, bf16"), std::string::npos);
  }
}

TEST(DType, ConvertSameTypeIsBitExact) {
  std::vector<uint16_t> src = {0x7e01, 0x0001, 0xfc00, 0x1234};
  std::vector<uint16_t> dst(4);
  convert_n(src.data(), DType::kF16, dst.data(), DType::kF16, 4);
  EXPECT_EQ(src, dst);
  std::vector<float> f(4);
  convert_n(src.data(), DType::kBF16, f.data(), DType::kF32, 4);
  EXPECT_EQ(f[1], bf16_to_f32(0x0001));
}

}  // namespace
}  // namespace kvcache
