// Round trip of the KV quantization formats: every element's error is at most half a step of
// its group (plus float rounding), for KIVI keys (per channel) and values (per token) at 2/4/8
// bits on odd sizes, and for the llama.cpp-like q8_0 / q4_0 per-token blocks.
#include "kernels/kv_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/matmul.h"

namespace kvcache {
namespace {

std::vector<float> random_rows(int64_t n, uint32_t seed, float offset_spread) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  // A few outliers and a per-position offset: KIVI's reason for per-channel keys.
  for (size_t i = 0; i < x.size(); i += 37) x[i] *= 20.0f;
  for (size_t i = 0; i < x.size(); ++i) x[i] += offset_spread * static_cast<float>(i % 7);
  return x;
}

// |x - x'| <= step / 2 plus rounding of the float arithmetic (scale * code + zero, with
// |code| < 256 and |x| bounded): a few ulps of the magnitudes involved.
float slack(float x, float zero, float step) {
  return 4e-7f * (std::fabs(x) + std::fabs(zero) + 256.0f * step) + 1e-30f;
}

TEST(KvQuant, F16DirectedRounding) {
  for (float x :
       {0.0f, 1.0f, -1.0f, 0.1f, -0.1f, 3.14159f, -65000.0f, 65000.0f, 1e-6f, -1e-6f, 6.1e-5f}) {
    const float lo = f16_to_f32(f16_round_down(x)), hi = f16_to_f32(f16_round_up(x));
    EXPECT_LE(lo, x) << x;
    EXPECT_GE(hi, x) << x;
    EXPECT_LT(hi - lo, std::fabs(x) * 2e-3f + 1e-7f) << x;
  }
}

TEST(KvQuant, ValueGroupDividesHeadDim) {
  EXPECT_EQ(kivi_value_group(128, 64), 64);
  EXPECT_EQ(kivi_value_group(8, 64), 8);
  EXPECT_EQ(kivi_value_group(80, 64), 40);
  EXPECT_EQ(kivi_value_group(96, 64), 48);
}

class KiviRoundTrip : public ::testing::TestWithParam<int> {};

TEST_P(KiviRoundTrip, KeysPerChannelWithinHalfStep) {
  const int bits = GetParam();
  for (auto [G, D] : {std::pair<int64_t, int64_t>{64, 128}, {13, 37}, {32, 8}, {7, 5}}) {
    KiviBlockParams p;
    p.group = G;
    p.d = D;
    p.bits = bits;
    const int64_t ld = D + 3;  // strided rows
    const std::vector<float> x = random_rows(G * ld, static_cast<uint32_t>(G * 131 + D), 0.5f);
    std::vector<std::byte> block(static_cast<size_t>(kivi_k_block_bytes(G, D, bits)));
    kivi_quantize_keys(x.data(), ld, p, block.data());
    std::vector<float> y(static_cast<size_t>(G * D));
    kivi_dequantize_keys(block.data(), p, y.data(), D);
    const auto* zeros = reinterpret_cast<const f16_t*>(block.data()) + D;
    for (int64_t c = 0; c < D; ++c) {
      const float step = kivi_key_step(block.data(), p, c);
      // The stored step is no coarser than the ideal (max - min) / (2^b - 1) by more than the
      // f16 rounding of zero and scale.
      float lo = x[static_cast<size_t>(c)], hi = lo;
      for (int64_t t = 0; t < G; ++t) {
        lo = std::min(lo, x[static_cast<size_t>(t * ld + c)]);
        hi = std::max(hi, x[static_cast<size_t>(t * ld + c)]);
      }
      EXPECT_LE(step, (hi - lo) / static_cast<float>((1 << bits) - 1) * 1.002f +
                          std::fabs(lo) * 1e-3f + 1e-7f);
      for (int64_t t = 0; t < G; ++t) {
        const float xv = x[static_cast<size_t>(t * ld + c)], yv = y[static_cast<size_t>(t * D + c)];
        ASSERT_LE(std::fabs(xv - yv), 0.5f * step + slack(xv, f16_to_f32(zeros[c]), step))
            << "bits " << bits << " G " << G << " D " << D << " t " << t << " c " << c;
      }
    }
  }
}

TEST_P(KiviRoundTrip, ValuesPerTokenWithinHalfStep) {
  const int bits = GetParam();
  for (auto [G, D, VG] :
       {std::tuple<int64_t, int64_t, int64_t>{64, 128, 64}, {11, 80, 40}, {5, 8, 8}, {3, 30, 6}}) {
    KiviBlockParams p;
    p.group = G;
    p.d = D;
    p.v_group = VG;
    p.bits = bits;
    const int64_t ld = D + 1;
    const std::vector<float> x = random_rows(G * ld, static_cast<uint32_t>(G * 7 + D), 0.3f);
    std::vector<std::byte> block(static_cast<size_t>(kivi_v_block_bytes(G, D, VG, bits)));
    kivi_quantize_values(x.data(), ld, p, block.data());
    std::vector<float> y(static_cast<size_t>(G * D));
    kivi_dequantize_values(block.data(), p, y.data(), D);
    const auto* zeros = reinterpret_cast<const f16_t*>(block.data()) + G * (D / VG);
    for (int64_t t = 0; t < G; ++t)
      for (int64_t c = 0; c < D; ++c) {
        const float step = kivi_value_step(block.data(), p, t, c);
        const float zero = f16_to_f32(zeros[c / VG * G + t]);
        const float xv = x[static_cast<size_t>(t * ld + c)], yv = y[static_cast<size_t>(t * D + c)];
        ASSERT_LE(std::fabs(xv - yv), 0.5f * step + slack(xv, zero, step))
            << "bits " << bits << " G " << G << " D " << D << " t " << t << " c " << c;
      }
  }
}

TEST_P(KiviRoundTrip, ConstantGroupIsExact) {
  KiviBlockParams p;
  p.group = 9;
  p.d = 16;
  p.v_group = 16;
  p.bits = GetParam();
  std::vector<float> x(9 * 16, 0.375f);  // representable in f16: zero = value, scale = 0
  std::vector<std::byte> kb(static_cast<size_t>(kivi_k_block_bytes(9, 16, p.bits)));
  std::vector<std::byte> vb(static_cast<size_t>(kivi_v_block_bytes(9, 16, 16, p.bits)));
  kivi_quantize_keys(x.data(), 16, p, kb.data());
  kivi_quantize_values(x.data(), 16, p, vb.data());
  std::vector<float> yk(x.size()), yv(x.size());
  kivi_dequantize_keys(kb.data(), p, yk.data(), 16);
  kivi_dequantize_values(vb.data(), p, yv.data(), 16);
  EXPECT_EQ(yk, x);
  EXPECT_EQ(yv, x);
}

INSTANTIATE_TEST_SUITE_P(Bits, KiviRoundTrip, ::testing::Values(2, 4, 8));

// The vector quantizers write the reference's bytes: every scale, zero and code, on odd sizes
// (channel and token tails of every vector width, groups shorter than a vector, a row whose
// value groups straddle two of the vector path's batches of 256 groups), a row stride
// wider than D, constant groups (scale 0), signed zeros, values beyond the f16 range, exact
// midpoints of the codes' steps (round to nearest even), spreads small enough for subnormal
// f16 scales and minima that round to -0 (the zero then steps down to the smallest negative),
// and NaNs and infinities (poisoned groups), first in a group or anywhere after.
TEST(KvQuant, VectorQuantizersEqualTheReferenceByteForByte) {
  struct Case {
    int64_t G, D, vg;
  };
  int checked = 0;
  for (int bits : {2, 4, 8})
    for (const Case c : {Case{64, 64, 64}, Case{64, 128, 64}, Case{13, 37, 37}, Case{7, 5, 5},
                         Case{1, 1, 1}, Case{33, 80, 40}, Case{100, 17, 17}, Case{64, 96, 32},
                         Case{65, 200, 100}, Case{16, 31, 31}, Case{100, 96, 32}}) {
      const int64_t ld = c.D + 3;
      for (int pattern = 0; pattern < 7; ++pattern) {
        std::vector<float> x = random_rows(c.G * ld, static_cast<uint32_t>(bits * 131 + c.D),
                                           pattern == 1 ? 3.0f : 0.0f);
        std::mt19937 rng(static_cast<uint32_t>(pattern + 7 * c.G));
        if (pattern == 2) {  // constant rows and channels, signed zeros
          for (int64_t t = 0; t < c.G; ++t)
            for (int64_t d = 0; d < c.D; ++d)
              x[t * ld + d] = (t % 3 == 0) ? 1.5f : (d % 2 ? -0.0f : 0.0f);
        }
        if (pattern == 3) {  // beyond f16, and integers (code midpoints after scaling)
          for (size_t i = 0; i < x.size(); ++i)
            x[i] = i % 11 == 0 ? (i % 2 ? 1e6f : -1e6f) : static_cast<float>(rng() % 64) * 0.5f;
        }
        if (pattern == 4 || pattern == 5)  // tiny spreads: subnormal f16 scales; -0 minima
          for (auto& v : x) v *= pattern == 4 ? 1e-6f : 1e-9f;
        if (pattern == 6) {  // non-finite elements, the first of the block among them
          const float bad[3] = {NAN, INFINITY, -INFINITY};
          x[0] = NAN;
          for (size_t i = 5; i < x.size(); i += 29 + rng() % 40) x[i] = bad[rng() % 3];
        }
        KiviBlockParams p;
        p.group = c.G;
        p.d = c.D;
        p.v_group = c.vg;
        p.bits = bits;
        const size_t kb = static_cast<size_t>(kivi_k_block_bytes(c.G, c.D, bits));
        const size_t vb = static_cast<size_t>(kivi_v_block_bytes(c.G, c.D, c.vg, bits));
        std::vector<std::byte> k1(kb, std::byte{0x5a}), k2(kb, std::byte{0xa5});
        std::vector<std::byte> v1(vb, std::byte{0x5a}), v2(vb, std::byte{0xa5});
        kivi_quantize_keys(x.data(), ld, p, k1.data());
        kivi_quantize_keys_reference(x.data(), ld, p, k2.data());
        kivi_quantize_values(x.data(), ld, p, v1.data());
        kivi_quantize_values_reference(x.data(), ld, p, v2.data());
        const std::string at = "bits " + std::to_string(bits) + " G " + std::to_string(c.G) +
                               " D " + std::to_string(c.D) + " pattern " + std::to_string(pattern);
        ASSERT_EQ(0, std::memcmp(k1.data(), k2.data(), kb)) << "keys, " << at;
        ASSERT_EQ(0, std::memcmp(v1.data(), v2.data(), vb)) << "values, " << at;
        ++checked;
      }
    }
  EXPECT_EQ(checked, 3 * 11 * 7);
}

// A group holding a NaN or an infinity is poisoned (NaN scale and zero, codes 0), so it
// dequantizes to NaN, and only that group: its neighbours keep their finite round trip. Without
// this a NaN key was dropped by the min / max and its code was a cast of a NaN (undefined), and
// an infinity was clamped to 65504: finite values the inputs never held.
TEST(KvQuant, NonFiniteElementsPoisonTheirGroupOnly) {
  const int64_t G = 64, D = 48, vg = 16;
  const int64_t bad_channel = 5, bad_token = 9;
  for (int bits : {2, 4, 8})
    for (const float bad : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> x = random_rows(G * D, 3, 0.5f);
      x[bad_token * D + bad_channel] = bad;
      KiviBlockParams p;
      p.group = G;
      p.d = D;
      p.v_group = vg;
      p.bits = bits;
      const std::string at = "bits " + std::to_string(bits) + " x " + std::to_string(bad);
      for (bool vector : {true, false}) {
        std::vector<std::byte> kb(static_cast<size_t>(kivi_k_block_bytes(G, D, bits)));
        std::vector<std::byte> vb(static_cast<size_t>(kivi_v_block_bytes(G, D, vg, bits)));
        (vector ? kivi_quantize_keys : kivi_quantize_keys_reference)(x.data(), D, p, kb.data());
        (vector ? kivi_quantize_values : kivi_quantize_values_reference)(x.data(), D, p, vb.data());
        const auto* ks = reinterpret_cast<const f16_t*>(kb.data());
        EXPECT_EQ(ks[bad_channel], f16_t{0x7e00}) << "key scale, " << at;
        EXPECT_EQ(ks[D + bad_channel], f16_t{0x7e00}) << "key zero, " << at;
        const int64_t bad_group = bad_channel / vg, ng = D / vg;
        const auto* vs = reinterpret_cast<const f16_t*>(vb.data());
        EXPECT_EQ(vs[bad_group * G + bad_token], f16_t{0x7e00}) << "value scale, " << at;
        EXPECT_EQ(vs[G * ng + bad_group * G + bad_token], f16_t{0x7e00}) << "value zero, " << at;
        std::vector<float> k(static_cast<size_t>(G * D)), v(static_cast<size_t>(G * D));
        kivi_dequantize_keys(kb.data(), p, k.data(), D);
        kivi_dequantize_values(vb.data(), p, v.data(), D);
        for (int64_t t = 0; t < G; ++t)
          for (int64_t c = 0; c < D; ++c) {
            const size_t i = static_cast<size_t>(t * D + c);
            EXPECT_EQ(!std::isfinite(k[i]), c == bad_channel)
                << "key " << t << "," << c << ", " << at;
            EXPECT_EQ(!std::isfinite(v[i]), t == bad_token && c / vg == bad_group)
                << "value " << t << "," << c << ", " << at;
          }
        // Codes of the poisoned groups are 0.
        for (int64_t t = 0; t < G; ++t) {
          EXPECT_EQ(
              kivi_key_code(kb.data() + 4 * D + bad_channel * kivi_col_bytes(G, bits), t, bits), 0u)
              << at;
        }
      }
    }
}

// The per-token q8_0 / q4_0 blocks follow the same rule: a NaN or an infinity poisons its block
// of 32 (NaN d, codes 0), which dequantizes to NaN; the row's other blocks keep their round
// trip. Before, lround / a float-to-int cast of a NaN code was undefined behaviour.
TEST(KvQuant, PerTokenBlocksPoisonedByNonFiniteValues) {
  for (const float bad : {NAN, INFINITY, -INFINITY}) {
    std::vector<float> x = random_rows(96, 9, 0.0f);
    x[40] = bad;  // block 1 of 3
    std::vector<BlockQ8_0> q8(3);
    std::vector<BlockQ4_0> q4(3);
    quantize_row_q8_0(x.data(), q8.data(), 96);
    quantize_row_q4_0(x.data(), q4.data(), 96);
    EXPECT_EQ(q8[1].d, f16_t{0x7e00});
    EXPECT_EQ(q4[1].d, f16_t{0x7e00});
    std::vector<float> y8(96), y4(96);
    dequantize_row(q8.data(), DType::kQ8_0, y8.data(), 96);
    dequantize_row_q4_0(q4.data(), y4.data(), 96);
    for (int64_t i = 0; i < 96; ++i) {
      EXPECT_EQ(std::isnan(y8[static_cast<size_t>(i)]), i / 32 == 1) << i << " q8_0 " << bad;
      EXPECT_EQ(std::isnan(y4[static_cast<size_t>(i)]), i / 32 == 1) << i << " q4_0 " << bad;
    }
  }
}

TEST(KvQuant, KiviBlockSizes) {
  // 4-bit, G = 64, D = 128: codes 64 x 64 B + 2 x 128 f16 (keys) / 64 x 2 x 2 f16 (values).
  EXPECT_EQ(kivi_k_block_bytes(64, 128, 4), 4096 + 512);
  EXPECT_EQ(kivi_v_block_bytes(64, 128, 64, 4), 4096 + 512);
  EXPECT_EQ(kivi_row_bytes(128, 2), 32);
  EXPECT_EQ(kivi_row_bytes(8, 2), 4);  // rows are whole u32 words
  EXPECT_EQ(kivi_row_bytes(5, 8), 8);
  // Key columns: G codes in 8-byte token chunks of 8 * (8 / bits) tokens.
  EXPECT_EQ(kivi_col_bytes(64, 4), 32);
  EXPECT_EQ(kivi_col_bytes(64, 2), 16);
  EXPECT_EQ(kivi_col_bytes(40, 4), 24);  // 40 tokens: 3 chunks of 16, the last one part-filled
  EXPECT_EQ(kivi_col_bytes(7, 8), 8);
}

// The key layout the attention kernel's vector loads rely on (kv_quant.h): channel c's codes
// start at byte c * col_bytes; token t sits in byte 8 * (t / span) + t % 8 at bit
// (t % span / 8) * bits (span = 8 * (8 / bits) tokens per chunk); unused bits are zero. Keys
// with per-channel minimum 0 and maximum 2^bits - 1 get scale 1 and zero 0, so code = value.
TEST(KvQuant, KiviKeyColumnsAreTokenChunks) {
  for (int bits : {2, 4, 8}) {
    const int64_t G = 40, D = 3, levels = int64_t{1} << bits, span = 8 * (8 / bits);
    std::vector<float> x(static_cast<size_t>(G * D));
    auto value = [&](int64_t t, int64_t c) -> int64_t {
      return t == 0 ? 0 : t == 1 ? levels - 1 : (t * 5 + c) % levels;
    };
    for (int64_t t = 0; t < G; ++t)
      for (int64_t c = 0; c < D; ++c)
        x[static_cast<size_t>(t * D + c)] = static_cast<float>(value(t, c));
    KiviBlockParams p;
    p.group = G;
    p.d = D;
    p.bits = bits;
    std::vector<std::byte> block(static_cast<size_t>(kivi_k_block_bytes(G, D, bits)));
    kivi_quantize_keys(x.data(), D, p, block.data());
    const std::byte* codes = block.data() + 4 * D;
    const int64_t cb = kivi_col_bytes(G, bits);
    for (int64_t c = 0; c < D; ++c) {
      ASSERT_EQ(kivi_key_step(block.data(), p, c), 1.0f) << "bits " << bits;
      for (int64_t t = 0; t < G; ++t) {
        const auto byte = static_cast<uint32_t>(codes[c * cb + 8 * (t / span) + t % 8]);
        EXPECT_EQ((byte >> ((t % span / 8) * bits)) & static_cast<uint32_t>(levels - 1),
                  static_cast<uint32_t>(value(t, c)))
            << "bits " << bits << " channel " << c << " token " << t;
        EXPECT_EQ(kivi_key_code(codes + c * cb, t, bits), static_cast<uint32_t>(value(t, c)));
      }
      for (int64_t t = G; t < cb * 8 / bits; ++t) {  // the padding of the last chunk
        const auto byte = static_cast<uint32_t>(codes[c * cb + 8 * (t / span) + t % 8]);
        EXPECT_EQ((byte >> ((t % span / 8) * bits)) & static_cast<uint32_t>(levels - 1), 0u)
            << "bits " << bits << " padding token " << t;
      }
    }
  }
}

TEST(KvQuant, Q8_0WithinHalfStep) {
  const int64_t k = 96;
  const std::vector<float> x = random_rows(k, 5, 0.0f);
  std::vector<BlockQ8_0> blocks(k / 32);
  quantize_row_q8_0(x.data(), blocks.data(), k);
  std::vector<float> y(k);
  dequantize_row(blocks.data(), DType::kQ8_0, y.data(), k);
  for (int64_t i = 0; i < k; ++i) {
    float amax = 0;
    for (int j = 0; j < 32; ++j)
      amax = std::max(amax, std::fabs(x[static_cast<size_t>(i / 32 * 32 + j)]));
    const float d = amax / 127.0f, d16 = f16_to_f32(blocks[static_cast<size_t>(i / 32)].d);
    // Codes come from the unrounded d (as in ggml), values from the stored f16 d: half a step
    // plus 127 times the scale's rounding.
    EXPECT_LE(std::fabs(x[static_cast<size_t>(i)] - y[static_cast<size_t>(i)]),
              0.5f * d + 127.0f * std::fabs(d - d16) + 1e-6f * amax);
  }
}

TEST(KvQuant, Q4_0WithinHalfStepExceptTopClamp) {
  const int64_t k = 160;
  const std::vector<float> x = random_rows(k, 9, 0.0f);
  std::vector<BlockQ4_0> blocks(k / 32);
  quantize_row_q4_0(x.data(), blocks.data(), k);
  std::vector<float> y(k);
  dequantize_row_q4_0(blocks.data(), y.data(), k);
  for (int64_t i = 0; i < k; ++i) {
    const BlockQ4_0& b = blocks[static_cast<size_t>(i / 32)];
    const float d = std::fabs(f16_to_f32(b.d));
    const int64_t j = i % 32;
    const int code = j < 16 ? (b.qs[j] & 0x0F) : (b.qs[j - 16] >> 4);
    const float err = std::fabs(x[static_cast<size_t>(i)] - y[static_cast<size_t>(i)]);
    // q4_0 is symmetric over [-8d, 7d]: the value of largest magnitude maps to -8 exactly, but
    // values of the other sign beyond 7.5 d clamp at code 15 (ggml's MIN(15, ...)), up to a
    // whole step away.
    if (code == 15)
      EXPECT_LE(err, d * 1.001f + 1e-6f) << i;
    else
      EXPECT_LE(err, 0.5f * d * 1.001f + 1e-6f) << i;
  }
}

// The block codec both the cache and the kernel use: per-token blocks are G rows of llama.cpp
// blocks, bit for bit what the row functions write; KIVI blocks are the kivi_* layouts.
TEST(KvQuant, BlockCodecPerTokenAndKivi) {
  const int64_t G = 5, Dk = 64, Dv = 96;
  const std::vector<float> k = random_rows(G * Dk, 21, 0.0f), v = random_rows(G * Dv, 22, 0.0f);
  for (KVQuantScheme sch : {KVQuantScheme::kQ8_0, KVQuantScheme::kQ4_0}) {
    const KVBlockFormat f = make_kv_block_format(sch, /*bits ignored*/ 2, G, Dk, Dv);
    const int64_t per32 = sch == KVQuantScheme::kQ8_0 ? 34 : 18;
    EXPECT_EQ(f.bits, sch == KVQuantScheme::kQ8_0 ? 8 : 4);
    EXPECT_EQ(kv_k_block_bytes(f), G * Dk / 32 * per32);
    EXPECT_EQ(kv_v_block_bytes(f), G * Dv / 32 * per32);
    std::vector<std::byte> kb(static_cast<size_t>(kv_k_block_bytes(f))),
        vb(static_cast<size_t>(kv_v_block_bytes(f)));
    kv_quantize_k_block(f, k.data(), Dk, kb.data());
    kv_quantize_v_block(f, v.data(), Dv, vb.data());
    std::vector<float> kd(static_cast<size_t>(G * Dk)), vd(static_cast<size_t>(G * Dv)),
        row(static_cast<size_t>(Dv));
    kv_dequantize_k_block(f, kb.data(), kd.data(), Dk);
    kv_dequantize_v_block(f, vb.data(), vd.data(), Dv);
    // Row t of a block is what the row functions write for row t, and reads back the same.
    const auto same_as_rows = [&](const std::vector<float>& x, int64_t D, const std::byte* blk,
                                  const std::vector<float>& deq) {
      const int64_t rb = D / 32 * per32;
      std::vector<std::byte> want(static_cast<size_t>(rb));
      for (int64_t t = 0; t < G; ++t) {
        if (sch == KVQuantScheme::kQ8_0) {
          quantize_row_q8_0(x.data() + t * D, reinterpret_cast<BlockQ8_0*>(want.data()), D);
          dequantize_row(want.data(), DType::kQ8_0, row.data(), D);
        } else {
          quantize_row_q4_0(x.data() + t * D, reinterpret_cast<BlockQ4_0*>(want.data()), D);
          dequantize_row_q4_0(reinterpret_cast<const BlockQ4_0*>(want.data()), row.data(), D);
        }
        EXPECT_EQ(std::memcmp(want.data(), blk + t * rb, want.size()), 0) << t;
        EXPECT_EQ(std::memcmp(row.data(), deq.data() + t * D, static_cast<size_t>(D) * 4), 0) << t;
      }
    };
    same_as_rows(k, Dk, kb.data(), kd);
    same_as_rows(v, Dv, vb.data(), vd);
    try {
      make_kv_block_format(sch, 8, G, 40, 64);
      ADD_FAILURE() << "D_k 40 accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("multiples of 32"), std::string::npos) << e.what();
    }
  }
  const KVBlockFormat kf = make_kv_block_format(KVQuantScheme::kKivi, 4, G, Dk, Dv);
  EXPECT_EQ(kf.v_group, kivi_value_group(Dv, G));
  EXPECT_EQ(kv_k_block_bytes(kf), kivi_k_block_bytes(G, Dk, 4));
  EXPECT_EQ(kv_v_block_bytes(kf), kivi_v_block_bytes(G, Dv, kf.v_group, 4));
  EXPECT_EQ(parse_kv_quant_scheme("q4_0"), KVQuantScheme::kQ4_0);
  EXPECT_FALSE(parse_kv_quant_scheme("q5_1").has_value());
  EXPECT_THROW(make_kv_block_format(KVQuantScheme::kKivi, 3, G, Dk, Dv), Error);
}

}  // namespace
}  // namespace kvcache
