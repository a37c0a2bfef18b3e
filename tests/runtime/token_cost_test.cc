// The bytes a decode token reads and the FLOPs of a prefill, against hand computations from the
// preset's shapes (model/dummy.cc: dummy:tiny is dim 64, 2 layers, 4 query heads over 2 KV
// heads of 16, FFN 160, vocab 32000, f16 matrices, f32 norms, untied LM head).
#include "runtime/token_cost.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/model_loader.h"

namespace kvcache {
namespace {

const Model& tiny() {
  static const LoadedModel m = load_model("dummy:tiny");
  return *m.model;
}

TEST(TokenCost, WeightBytesOfDummyTinyByHand) {
  // Per layer: 2 norms [64] f32 + wq, wo [64, 64] + wk, wv [32, 64] + w1, w3 [160, 64] +
  // w2 [64, 160], f16.
  const double layer = 2 * 64 * 4 + 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 160 * 64);
  const double head = 32000.0 * 64 * 2;  // output [32000, 64] f16: read whole
  const double embd_row = 64 * 2;        // token_embd: the token's row only
  const double norm = 64 * 4;
  EXPECT_DOUBLE_EQ(decode_weight_bytes(tiny()), 2 * layer + head + embd_row + norm);
}

TEST(TokenCost, KvBytesOfGqaF16AndF32ByHand) {
  CacheOptions c;
  c.kv_dtype = DType::kF16;
  // K and V x 2 layers x 2 KV heads x 16 x 2 bytes = 256 bytes per key.
  EXPECT_DOUBLE_EQ(kv_read_bytes(tiny(), c, 100), 100 * 256.0);
  c.kv_dtype = DType::kF32;
  EXPECT_DOUBLE_EQ(kv_read_bytes(tiny(), c, 100), 100 * 512.0);
  // tg4 at depth 10: keys 11..14, 12.5 on average.
  c.kv_dtype = DType::kF16;
  EXPECT_DOUBLE_EQ(decode_bytes_per_token(tiny(), c, 10, 4),
                   decode_weight_bytes(tiny()) + 12.5 * 256);
  EXPECT_THROW(decode_bytes_per_token(tiny(), c, 10, 0), Error);
}

TEST(TokenCost, QuantizedKiviKvBytesByHand) {
  CacheOptions c;
  c.implementation = "quantized";
  c.kv_dtype = DType::kF16;
  c.quantized.bits = 4;
  c.quantized.group = 64;
  c.quantized.residual = 128;
  // 200 keys: residual ((200 - 1) mod 128) + 1 = 72 tokens in f16 (256 bytes each), 128 packed.
  // Per 64-token block and head (D = 16): K = 16 scales+zeros (4 bytes) + 16 columns of 64
  // 4-bit codes (32 bytes) = 576; V = 64 tokens x (one group of 16: 4 bytes + 8 bytes of codes)
  // = 768. (576 + 768) / 64 = 21 bytes per token and head, x 2 heads x 2 layers.
  EXPECT_DOUBLE_EQ(kv_read_bytes(tiny(), c, 200), 72 * 256.0 + 128 * 21.0 * 2 * 2);
  // Within the residual: all f16.
  EXPECT_DOUBLE_EQ(kv_read_bytes(tiny(), c, 50), 50 * 256.0);
}

TEST(TokenCost, PrefillFlopsOfDummyTinyByHand) {
  // Matrices per token: 2 layers x (2 x 64 x 64 + 2 x 32 x 64 + 3 x 160 x 64) multiply-adds;
  // the LM head once (32000 x 64); attention: 2 layers x 4 heads x (16 + 16) per key, token i
  // of 8 after 4 tokens attends 5 + i keys (5 + ... + 12 = 68).
  const double mats = 2.0 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 160 * 64);
  const double expect = 2 * mats * 8 + 2 * 32000.0 * 64 + 2 * 2 * 4 * 32 * 68.0;
  EXPECT_DOUBLE_EQ(prefill_flops(tiny(), 4, 8), expect);
  EXPECT_THROW(prefill_flops(tiny(), 0, 0), Error);
}

}  // namespace
}  // namespace kvcache
