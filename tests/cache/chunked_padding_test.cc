// A chunked window layer under left padding: a padded row counts its chunks from its first real
// token (transformers v5 chunked_overlay with left_padding), so its chunk can start before
// floor(p / C) * C. The layer must return (and keep) every key such a chunk needs: attention
// over the layer's spans, step by step, equals attention over the whole history.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>

#include "cache/cache.h"
#include "cache/window_layer.h"
#include "cache_test_util.h"
#include "kernels/attention.h"
#include "kernels/mask.h"

namespace kvcache {
namespace {

using testing_util::History;
using testing_util::random_tensor;

class ChunkedPadding : public ::testing::TestWithParam<std::string> {};

TEST_P(ChunkedPadding, SpansHoldEveryKeyOfAPaddedRowsChunk) {
  constexpr int64_t B = 3, H = 2, D = 5, C = 4;
  const int64_t pads[B] = {0, 3, 1};  // row b's first real token
  CacheConfig cfg;
  cfg.options.implementation = GetParam();
  cfg.attention_chunk_size = C;
  std::unique_ptr<CacheLayer> layer =
      LayerRegistry::create(GetParam(), "chunked_attention", cfg, 0);
  std::mt19937 rng(45);
  History hist(DType::kF32);
  const MaskFn v5 =
      and_masks({causal_mask(), chunked_overlay(C, pads), padding_mask(pads, nullptr)});
  int64_t cum = 0;
  for (int64_t n : {6, 1, 1, 1, 1, 3, 1, 1, 2, 5, 1, 1, 1}) {
    Tensor k = random_tensor(DType::kF32, {B, H, n, D}, rng);
    Tensor v = random_tensor(DType::kF32, {B, H, n, D}, rng);
    Tensor q = random_tensor(DType::kF32, {B, H, n, D}, rng);
    const KVSpan span = layer->update(k.view(), v.view());
    hist.append(k.view(), v.view());
    cum += n;
    // The kernel over the layer's span with the padded chunk mask...
    AttentionOptions o;
    o.chunk_size = C;
    o.chunk_offset = pads;
    o.kv_valid_begin = pads;
    o.kv_offset = span.kv_offset;
    Tensor got = Tensor::zeros(DType::kF32, {B, H, n, D});
    get_attention_kernel("fused")(q.view(), span.k, span.v, got.view(), o);
    // ...equals eager over every key ever written with v5's mask function.
    AttentionOptions full;
    full.mask = &v5;
    Tensor want = Tensor::zeros(DType::kF32, {B, H, n, D});
    get_attention_kernel("eager")(q.view(), hist.k(0, cum), hist.v(0, cum), want.view(), full);
    double worst = 0;
    for (int64_t i = 0; i < want.numel(); ++i)
      worst = std::max(worst, static_cast<double>(
                                  std::fabs(got.data_as<float>()[i] - want.data_as<float>()[i])));
    EXPECT_LE(worst, 2e-5) << "after " << cum << " tokens (span from " << span.kv_offset << ")";
    // The span starts C-1 keys back (a row padded by 1..C-1 may be mid-chunk there).
    EXPECT_EQ(span.kv_offset, std::max<int64_t>(cum - n - C + 1, 0));
  }
}

INSTANTIATE_TEST_SUITE_P(Containers, ChunkedPadding, ::testing::Values("dynamic", "static"));

}  // namespace
}  // namespace kvcache
