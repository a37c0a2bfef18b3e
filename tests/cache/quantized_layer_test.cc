// The KIVI-style quantized container: residual fill-and-flush cycle, span contents (residual
// bit-exact, packed part within half a step), sliding windows dropping whole groups, crop, batch
// row operations, exact bytes() and the memory ratios against an f16 dynamic cache at 16K
// tokens, and refusal of layer types it cannot serve.
#include "cache/quantized_layer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cache/cache.h"
#include "cache/layer_state.h"
#include "cache_test_util.h"
#include "core/error.h"
#include "kernels/attention_quant.h"
#include "kernels/attention_reference.h"
#include "kernels/kv_quant.h"
#include "kernels/kv_span_rows.h"

namespace kvcache {
namespace {

using testing_util::History;
using testing_util::random_tensor;

CacheConfig quant_config(int bits, int64_t G, int64_t R, DType dt = DType::kF32) {
  CacheConfig c;
  c.options.implementation = "quantized";
  c.layer_types = {"full_attention"};
  c.options.quantized.bits = bits;
  c.options.quantized.group = G;
  c.options.quantized.residual = R;
  c.options.kv_dtype = dt;
  return c;
}

QuantizedLayer& qlayer(Cache& cache, int l = 0) {
  return dynamic_cast<QuantizedLayer&>(cache.layer(l));
}

// The span as f32 [B, H, S, D] (packed part dequantized, residual widened).
void dense_of(const KVSpan& span, Tensor* k, Tensor* v) {
  ASSERT_EQ(span.kind, KVSpanKind::kQuantized);
  dequantize_quant_kv(span.quant, k, v);
}

// Every element of `got` (span rows [from, to)) against `want` (history rows): the residual
// rows exactly, packed rows within half a step of a group of the given bits: for keys the group
// is a channel over G tokens, for values a token over v_group channels — bounded here by the
// group's range / (2^b - 1) / 2 (plus f16 rounding of zero and scale).
void expect_close(const Tensor& got_k, const Tensor& got_v, const History& h, int64_t span_first,
                  int64_t packed_end, int bits, int64_t G, int64_t vg) {
  const TensorView gk = got_k.view(), gv = got_v.view();
  const int64_t B = gk.dim(0), H = gk.dim(1), S = gk.dim(2), D = gk.dim(3), Dv = gv.dim(3);
  const float levels = static_cast<float>((1 << bits) - 1);
  Tensor hk = Tensor::empty(DType::kF32, {B, H, S, D}),
         hv = Tensor::empty(DType::kF32, {B, H, S, Dv});
  copy_view(h.k(span_first, span_first + S), hk.view());
  copy_view(h.v(span_first, span_first + S), hv.view());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t hh = 0; hh < H; ++hh) {
      for (int64_t t = 0; t < S; ++t) {
        const int64_t pos = span_first + t;
        for (int64_t d = 0; d < D; ++d) {
          const float x = hk.view().ptr_as<float>(b, hh, t)[d], y = gk.ptr_as<float>(b, hh, t)[d];
          if (pos >= packed_end) {
            ASSERT_EQ(x, y) << "residual key at " << pos;
            continue;
          }
          const int64_t g0 = t / G * G;
          float lo = x, hi = x;
          for (int64_t u = g0; u < g0 + G; ++u) {
            lo = std::min(lo, hk.view().ptr_as<float>(b, hh, u)[d]);
            hi = std::max(hi, hk.view().ptr_as<float>(b, hh, u)[d]);
          }
          ASSERT_LE(std::fabs(x - y),
                    0.5f * (hi - lo) / levels * 1.01f + 2e-3f * std::fabs(lo) + 1e-6f)
              << "key at " << pos << " channel " << d;
        }
        for (int64_t d = 0; d < Dv; ++d) {
          const float x = hv.view().ptr_as<float>(b, hh, t)[d], y = gv.ptr_as<float>(b, hh, t)[d];
          if (pos >= packed_end) {
            ASSERT_EQ(x, y) << "residual value at " << pos;
            continue;
          }
          const float* row = hv.view().ptr_as<float>(b, hh, t) + d / vg * vg;
          const float lo = *std::min_element(row, row + vg), hi = *std::max_element(row, row + vg);
          ASSERT_LE(std::fabs(x - y),
                    0.5f * (hi - lo) / levels * 1.01f + 2e-3f * std::fabs(lo) + 1e-6f)
              << "value at " << pos << " channel " << d;
        }
      }
    }
}

TEST(QuantizedLayer, ResidualCycleDecode) {
  for (auto [G, R] : {std::pair<int64_t, int64_t>{4, 8}, {4, 4}, {3, 12}}) {
    Cache cache(quant_config(4, G, R));
    std::mt19937 rng(1);
    for (int64_t t = 1; t <= 5 * R + 3; ++t) {
      const Tensor k = random_tensor(DType::kF32, {1, 2, 1, 8}, rng);
      const KVSpan span = cache.update(0, k.view(), k.view());
      const QuantizedLayer& L = qlayer(cache);
      // R a multiple of G: the residual fills to R, then the next update flushes all of it.
      EXPECT_EQ(L.residual_length(), (t - 1) % R + 1) << "G " << G << " R " << R << " t " << t;
      EXPECT_EQ(L.packed_length() + L.residual_length(), t);
      EXPECT_EQ(span.quant.seq_len(), t);
      EXPECT_EQ(span.quant.residual_len(), L.residual_length());
      EXPECT_EQ(span.kv_offset, 0);
    }
  }
}

TEST(QuantizedLayer, ResidualCycleChunks) {
  // G = 4, R = 8, updates of 5, 1, 3, 1, 10, 1, 2 tokens. Before each update a residual of
  // >= max(R, G) tokens flushes its oldest floor(n / G) * G.
  Cache cache(quant_config(8, 4, 8));
  std::mt19937 rng(2);
  const int64_t sizes[] = {5, 1, 3, 1, 10, 1, 2};
  const int64_t want_res[] = {5, 6, 9, 2, 12, 1, 3};
  const int64_t want_packed[] = {0, 0, 0, 8, 8, 20, 20};
  History hist(DType::kF32);
  int64_t seq = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    const Tensor k = random_tensor(DType::kF32, {2, 3, sizes[i], 16}, rng);
    const Tensor v = random_tensor(DType::kF32, {2, 3, sizes[i], 16}, rng);
    hist.append(k.view(), v.view());
    seq += sizes[i];
    const MaskSizes ms = cache.mask_sizes(0, sizes[i]);
    const KVSpan span = cache.update(0, k.view(), v.view());
    const QuantizedLayer& L = qlayer(cache);
    EXPECT_EQ(L.residual_length(), want_res[i]) << "update " << i;
    EXPECT_EQ(L.packed_length(), want_packed[i]) << "update " << i;
    EXPECT_EQ(L.seq_length(), seq);
    EXPECT_EQ(ms.kv_length, seq);
    EXPECT_EQ(ms.kv_offset, 0);
    Tensor dk, dv;
    dense_of(span, &dk, &dv);
    expect_close(dk, dv, hist, 0, want_packed[i], 8, 4, L.value_group());
  }
}

TEST(QuantizedLayer, SpanContentF16Residual2Bit) {
  Cache cache(quant_config(2, 8, 16, DType::kF16));
  std::mt19937 rng(3);
  History hist(DType::kF16);
  for (int step = 0; step < 40; ++step) {
    const int64_t n = step == 0 ? 21 : 1;
    const Tensor k = random_tensor(DType::kF16, {1, 2, n, 24}, rng);
    const Tensor v = random_tensor(DType::kF16, {1, 2, n, 24}, rng);
    hist.append(k.view(), v.view());
    const KVSpan span = cache.update(0, k.view(), v.view());
    EXPECT_EQ(span.quant.k_residual.dtype(), DType::kF16);
    Tensor dk, dv;
    dense_of(span, &dk, &dv);
    expect_close(dk, dv, hist, 0, qlayer(cache).packed_length(), 2, 8, qlayer(cache).value_group());
  }
}

TEST(QuantizedLayer, SlidingWindowDropsWholeGroups) {
  CacheConfig c = quant_config(4, 4, 8);
  c.layer_types = {"sliding_attention"};
  c.sliding_window = 19;
  Cache cache(c);
  std::mt19937 rng(4);
  History hist(DType::kF32);
  for (int64_t p = 0; p < 120; ++p) {
    const Tensor k = random_tensor(DType::kF32, {1, 1, 1, 8}, rng);
    hist.append(k.view(), k.view());
    const MaskSizes ms = cache.mask_sizes(0, 1);
    const KVSpan span = cache.update(0, k.view(), k.view());
    const int64_t first_visible = std::max<int64_t>(p - 19 + 1, 0);
    // The span starts at a group boundary at most G - 1 tokens before the window.
    EXPECT_LE(span.kv_offset, first_visible) << p;
    EXPECT_GT(span.kv_offset + 4, first_visible) << p;
    EXPECT_EQ(ms.kv_offset, span.kv_offset);
    EXPECT_EQ(ms.kv_length, span.quant.seq_len());
    EXPECT_EQ(span.kv_offset + span.quant.seq_len(), p + 1);
    const QuantizedLayer& L = qlayer(cache);
    EXPECT_EQ(L.first_position(), span.kv_offset);
    Tensor dk, dv;
    dense_of(span, &dk, &dv);
    expect_close(dk, dv, hist, span.kv_offset, span.kv_offset + span.quant.packed_len(), 4, 4,
                 L.value_group());
  }
  // Bounded memory: the store never held more than window + G + R tokens' blocks.
  EXPECT_LE(qlayer(cache).packed_length(), 19 + 4 + 8);
}

TEST(QuantizedLayer, CropIntoPackedBlockDequantizesTheKeptPart) {
  Cache cache(quant_config(8, 4, 4));
  std::mt19937 rng(5);
  History hist(DType::kF32);
  for (int i = 0; i < 30; ++i) {
    const Tensor k = random_tensor(DType::kF32, {1, 2, 1, 8}, rng);
    hist.append(k.view(), k.view());
    cache.update(0, k.view(), k.view());
  }
  EXPECT_EQ(qlayer(cache).packed_length(), 28);
  cache.crop(-5);  // keep 25: block 6 cut after 1 token
  EXPECT_EQ(cache.seq_length(), 25);
  EXPECT_EQ(qlayer(cache).packed_length(), 24);
  EXPECT_EQ(qlayer(cache).residual_length(), 1);
  const Tensor k = random_tensor(DType::kF32, {1, 2, 1, 8}, rng);
  const KVSpan span = cache.update(0, k.view(), k.view());
  EXPECT_EQ(span.quant.seq_len(), 26);
  Tensor dk, dv;
  dense_of(span, &dk, &dv);
  // Tokens 0..23 stay packed, 25 is the new residual token (exact), and token 24 came back from
  // its block: within the 8-bit bound of its old group (tokens 24..27 of the history), not exact.
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t d = 0; d < 8; ++d) {
      float lo = 1e30f, hi = -1e30f;
      for (int64_t t = 24; t < 28; ++t) {
        const float x = hist.k(0, 30).ptr_as<float>(0, h, t)[d];
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      const float x = hist.k(0, 30).ptr_as<float>(0, h, 24)[d];
      EXPECT_LE(std::fabs(dk.view().ptr_as<float>(0, h, 24)[d] - x),
                0.5f * (hi - lo) / 255.0f * 1.01f + 2e-3f * std::fabs(lo) + 1e-6f);
      EXPECT_EQ(dk.view().ptr_as<float>(0, h, 25)[d], k.view().ptr_as<float>(0, h, 0)[d]);
    }
  Tensor pk = Tensor::empty(DType::kF32, {1, 2, 24, 8}),
         pv = Tensor::empty(DType::kF32, {1, 2, 24, 8});
  copy_view(dk.view().slice(2, 0, 24), pk.view());
  copy_view(dv.view().slice(2, 0, 24), pv.view());
  expect_close(pk, pv, hist, 0, 24, 8, 4, qlayer(cache).value_group());
  cache.crop(-100);  // more than stored: empties without an error (v5)
  EXPECT_EQ(cache.seq_length(), 0);
}

TEST(QuantizedLayer, SelectAndReorderRows) {
  Cache cache(quant_config(4, 4, 4));
  std::mt19937 rng(6);
  History hist(DType::kF32);
  for (int i = 0; i < 3; ++i) {
    const Tensor k = random_tensor(DType::kF32, {3, 2, 5, 8}, rng);
    const Tensor v = random_tensor(DType::kF32, {3, 2, 5, 8}, rng);
    hist.append(k.view(), v.view());
    cache.update(0, k.view(), v.view());
  }
  const std::vector<int64_t> rows = {2, 0};
  cache.select(rows);
  hist.gather(rows);
  const Tensor k = random_tensor(DType::kF32, {2, 2, 1, 8}, rng);
  hist.append(k.view(), k.view());
  const KVSpan span = cache.update(0, k.view(), k.view());
  Tensor dk, dv;
  dense_of(span, &dk, &dv);
  expect_close(dk, dv, hist, 0, qlayer(cache).packed_length(), 4, 4, qlayer(cache).value_group());
  EXPECT_THROW(cache.reorder(std::vector<int64_t>{0}), Error);
}

TEST(QuantizedLayer, RefusesOtherLayerTypesAndBadOptions) {
  CacheConfig c = quant_config(4, 64, 128);
  // Each refused type says why and what to use instead.
  for (const char* type : {"linear_attention", "compressed_sparse_attention",
                           "heavily_compressed_attention", "deepseek_sparse_attention"}) {
    c.layer_types = {"full_attention", type};
    try {
      Cache cache(c);
      ADD_FAILURE() << type << " must be refused";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << m;
      EXPECT_NE(m.find(std::string("layer 1 (quantized/") + type + ")"), std::string::npos) << m;
      EXPECT_NE(m.find("KIVI"), std::string::npos) << m;  // why
      EXPECT_NE(m.find("use --cache dynamic"), std::string::npos) << m;
    }
    EXPECT_FALSE(LayerRegistry::contains("quantized", type));  // a refusal is not an entry
  }
  // A type nobody declared still gets the registry's list.
  c.layer_types = {"full_attention", "mystery_attention"};
  try {
    Cache cache(c);
    ADD_FAILURE() << "an unknown type must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no cache container"), std::string::npos) << e.what();
  }
  // K == V (DeepSeek-V4) is refused for every attention type, saying why.
  c.layer_types = {"sliding_attention"};
  c.sliding_window = 8;
  c.kv_content = CacheConfig::KVContent::kSharedKV;
  try {
    Cache cache(c);
    ADD_FAILURE() << "K == V must be refused";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer 0 (quantized/sliding_attention)"), std::string::npos) << m;
    EXPECT_NE(m.find("K == V"), std::string::npos) << m;
    EXPECT_NE(m.find("per channel"), std::string::npos) << m;
    EXPECT_NE(m.find("use --cache dynamic or paged"), std::string::npos) << m;
  }
  c.kv_content = CacheConfig::KVContent::kPerHead;
  c.layer_types = {"chunked_attention"};
  c.attention_chunk_size = 0;
  try {
    Cache cache(c);
    ADD_FAILURE() << "a chunked layer without a chunk size must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attention_chunk_size must be >= 1"), std::string::npos)
        << e.what();
  }
  c.layer_types = {"full_attention"};
  c.options.quantized.bits = 3;
  try {
    Cache cache(c);
    FAIL() << "3 bits must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 0 (quantized/full_attention)"), std::string::npos);
  }
  c.options.quantized.bits = 4;
  c.options.kv_dtype = DType::kQ8_0;
  EXPECT_THROW(Cache{c}, Error);
}

// Chunked layers (chunks of C): a decode at p sees [floor(p / C) * C, p]. The span starts at
// the chunk start (G divides C: the groups start at chunk starts) or at most G - 1 tokens
// before it (G does not divide C: a block straddles it), holds every key of the current chunk
// (the dense container holds them too, plus up to C-1 back for left-padded rows), and the fused
// kernel's output equals the reference attention over the chunk's positions with the
// dequantized values (the straddling keys masked out).
TEST(QuantizedLayer, ChunkedKeepsTheCurrentChunkLikeTheDenseContainer) {
  for (auto [C, G, R] : {std::tuple<int64_t, int64_t, int64_t>{12, 4, 8}, {10, 4, 8}, {8, 4, 16}}) {
    // 8 bits: the kernel rounds the query to int16 (attention_quant.h), which moves these
    // outputs by a few 1e-5 from the plain reference on the same values, so 1e-4; what is tested
    // here is which keys the chunk keeps (a key too many or too few moves them by ~0.1).
    CacheConfig qc = quant_config(8, G, R);
    qc.layer_types = {"chunked_attention"};
    qc.attention_chunk_size = C;
    CacheConfig dc = qc;
    dc.options.implementation = "dynamic";
    Cache quant(qc), dense(dc);
    std::mt19937 rng(31);
    History hist(DType::kF32);
    constexpr int64_t kHq = 4, kHkv = 2, kD = 8;
    int64_t p = 0;
    for (int step = 0; step < 50; ++step) {
      const int64_t n = step == 0 ? 17 : step % 9 == 4 ? 3 : 1;  // a prefill, then mostly decode
      const Tensor k = random_tensor(DType::kF32, {1, kHkv, n, kD}, rng);
      const Tensor v = random_tensor(DType::kF32, {1, kHkv, n, kD}, rng);
      const Tensor q = random_tensor(DType::kF32, {1, kHq, n, kD}, rng);
      hist.append(k.view(), v.view());
      const MaskSizes ms = quant.mask_sizes(0, n);
      const KVSpan qs = quant.update(0, k.view(), v.view());
      const KVSpan ds = dense.update(0, k.view(), v.view());
      const std::string at = "C " + std::to_string(C) + " G " + std::to_string(G) + " p " +
                             std::to_string(p) + " n " + std::to_string(n);
      const int64_t chunk0 = p / C * C;
      // The dense container keeps C-1 keys back (transformers v5: left-padded rows count their
      // chunks from their first real token); the current chunk is its suffix from chunk0.
      ASSERT_EQ(ds.kv_offset, std::max<int64_t>(p - C + 1, 0)) << at;
      EXPECT_EQ(ms.kv_offset, qs.kv_offset) << at;
      EXPECT_EQ(ms.kv_length, qs.quant.seq_len()) << at;
      EXPECT_EQ(qs.kv_offset + qs.quant.seq_len(), p + n) << at;
      EXPECT_LE(qs.kv_offset, chunk0) << at;
      EXPECT_GT(qs.kv_offset + G, chunk0) << at;
      if (C % G == 0) {
        EXPECT_EQ(qs.kv_offset, chunk0) << at;
      }
      Tensor qk, qv;
      dense_of(qs, &qk, &qv);
      expect_close(qk, qv, hist, qs.kv_offset, qs.kv_offset + qs.quant.packed_len(), 8, G,
                   qlayer(quant).value_group());
      // The dense container's positions, with the quantized container's values.
      const int64_t skip = chunk0 - qs.kv_offset, len = p + n - chunk0;
      ASSERT_EQ(skip + len, qs.quant.seq_len()) << at;
      AttentionOptions o;
      o.chunk_size = C;
      o.q_offset = p;
      o.kv_offset = qs.kv_offset;
      o.kv_split = -1;
      Tensor out = Tensor::empty(DType::kF32, {1, kHq, n, kD});
      quantized_attention(q.view(), qs.quant, out.view(), o);
      o.kv_offset = chunk0;
      const ReferenceResult ref = attention_reference(
          q.view(), qk.view().slice(2, skip, skip + len), qv.view().slice(2, skip, skip + len), o);
      const float* got = out.view().ptr_as<float>(0, 0, 0);
      for (size_t i = 0; i < ref.out.size(); ++i)
        ASSERT_NEAR(got[i], ref.out[i], 1e-4) << at << " element " << i;
      p += n;
    }
    // Between the chunk start and the end: at most G - 1 straddling tokens beyond the chunk.
    EXPECT_LE(qlayer(quant).packed_length() + qlayer(quant).residual_length(), C + G - 1 + 3);
  }
}

// Decode == prefill on a chunked layer: one update of the whole prompt, or the same tokens one
// at a time. With G dividing C, every chunk start restarts the groups in both, so the packed
// blocks of a position packed in both are the same bytes; once the residual cycles meet (at the
// latest at the next chunk start), the spans — and so the kernel's outputs — are identical.
TEST(QuantizedLayer, ChunkedDecodeEqualsPrefill) {
  // 45 = 32 + 13: the prefill's first decode flushes 32..43 at once, the decode path 32..39 at
  // 40; the cycles meet at the next chunk start, 48.
  constexpr int64_t C = 16, G = 4, R = 8, kPrompt = 45, kEnd = 70, kD = 8;
  CacheConfig qc = quant_config(2, G, R);
  qc.layer_types = {"chunked_attention"};
  qc.attention_chunk_size = C;
  Cache prefill(qc), decode(qc);
  std::mt19937 rng(32);
  const Tensor k = random_tensor(DType::kF32, {1, 2, kEnd, kD}, rng);
  const Tensor v = random_tensor(DType::kF32, {1, 2, kEnd, kD}, rng);
  prefill.update(0, k.view().slice(2, 0, kPrompt), v.view().slice(2, 0, kPrompt));
  for (int64_t p = 0; p < kPrompt; ++p)
    decode.update(0, k.view().slice(2, p, p + 1), v.view().slice(2, p, p + 1));
  int identical = 0;
  for (int64_t p = kPrompt; p < kEnd; ++p) {
    const KVSpan a = prefill.update(0, k.view().slice(2, p, p + 1), v.view().slice(2, p, p + 1));
    const KVSpan b = decode.update(0, k.view().slice(2, p, p + 1), v.view().slice(2, p, p + 1));
    ASSERT_EQ(a.kv_offset, b.kv_offset) << p;
    ASSERT_EQ(a.quant.seq_len(), b.quant.seq_len()) << p;
    Tensor ak, av, bk, bv;
    dense_of(a, &ak, &av);
    dense_of(b, &bk, &bv);
    // Packed in both: the same bytes, so the same values.
    const int64_t both = std::min(a.quant.packed_len(), b.quant.packed_len());
    EXPECT_TRUE(testing_util::views_equal(ak.view().slice(2, 0, both), bk.view().slice(2, 0, both)))
        << p;
    EXPECT_TRUE(testing_util::views_equal(av.view().slice(2, 0, both), bv.view().slice(2, 0, both)))
        << p;
    if (a.quant.packed_len() != b.quant.packed_len()) {
      EXPECT_LT(p, 48) << "the residual cycles meet at chunk start 48";
      continue;
    }
    ++identical;
    EXPECT_TRUE(testing_util::views_equal(ak.view(), bk.view())) << p;
    EXPECT_TRUE(testing_util::views_equal(av.view(), bv.view())) << p;
    const Tensor q = random_tensor(DType::kF32, {1, 2, 1, kD}, rng);
    AttentionOptions o;
    o.chunk_size = C;
    o.q_offset = p;
    o.kv_offset = a.kv_offset;
    o.kv_split = -1;
    Tensor oa = Tensor::empty(DType::kF32, {1, 2, 1, kD}),
           ob = Tensor::empty(DType::kF32, {1, 2, 1, kD});
    quantized_attention(q.view(), a.quant, oa.view(), o);
    quantized_attention(q.view(), b.quant, ob.view(), o);
    EXPECT_TRUE(testing_util::views_equal(oa.view(), ob.view())) << p;
  }
  EXPECT_GE(identical, kEnd - 48);
}

struct StateBytes : StateWriter, StateReader {
  std::vector<uint8_t> data;
  size_t at = 0;
  void write(const void* p, size_t n) override {
    data.insert(data.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  }
  void read(void* p, size_t n) override {
    if (at + n > data.size()) throw Error(ErrorKind::kFormat, "state ends early");
    std::memcpy(p, data.data() + at, n);
    at += n;
  }
};

// A chunked layer saved mid-chunk (packed blocks and residual, the finished chunks dropped)
// and restored into a fresh cache continues exactly as the saved one: same spans, bit for bit.
TEST(QuantizedLayer, ChunkedSaveLoadContinuesAsTheSavedLayer) {
  constexpr int64_t C = 12, G = 4, R = 4;
  CacheConfig qc = quant_config(4, G, R);
  qc.layer_types = {"chunked_attention"};
  qc.attention_chunk_size = C;
  Cache saved(qc);
  std::mt19937 rng(34);
  for (int i = 0; i < 31; ++i) {
    const Tensor k = random_tensor(DType::kF32, {1, 2, 1, 8}, rng);
    saved.update(0, k.view(), k.view());
  }
  ASSERT_GT(qlayer(saved).packed_length(), 0);
  StateBytes file;
  saved.save(file);
  Cache restored(qc);
  restored.load(file);
  EXPECT_EQ(file.at, file.data.size());
  EXPECT_EQ(qlayer(restored).first_position(), qlayer(saved).first_position());
  for (int i = 0; i < 15; ++i) {  // across the chunk start at 36
    const Tensor k = random_tensor(DType::kF32, {1, 2, 1, 8}, rng);
    const KVSpan a = saved.update(0, k.view(), k.view());
    const KVSpan b = restored.update(0, k.view(), k.view());
    ASSERT_EQ(a.kv_offset, b.kv_offset) << i;
    Tensor ak, av, bk, bv;
    dense_of(a, &ak, &av);
    dense_of(b, &bk, &bv);
    EXPECT_TRUE(testing_util::views_equal(ak.view(), bk.view())) << i;
    EXPECT_TRUE(testing_util::views_equal(av.view(), bv.view())) << i;
  }
}

// A chunked layer's crop: back inside the current chunk works; before the chunk start the
// dropped tokens are gone (Error naming what is missing).
TEST(QuantizedLayer, ChunkedCrop) {
  constexpr int64_t C = 8, G = 4, R = 4;
  CacheConfig qc = quant_config(8, G, R);
  qc.layer_types = {"chunked_attention"};
  qc.attention_chunk_size = C;
  Cache cache(qc);
  std::mt19937 rng(33);
  for (int i = 0; i < 21; ++i) {
    const Tensor k = random_tensor(DType::kF32, {1, 1, 1, 8}, rng);
    cache.update(0, k.view(), k.view());
  }
  // 21 tokens: chunk 16..23 holds 16..20.
  EXPECT_EQ(qlayer(cache).first_position(), 16);
  cache.crop(18);
  EXPECT_EQ(cache.seq_length(), 18);
  EXPECT_THROW(cache.crop(15), Error);  // a query at 15 needs chunk 8..15, dropped
  const Tensor k = random_tensor(DType::kF32, {1, 1, 1, 8}, rng);
  const KVSpan span = cache.update(0, k.view(), k.view());
  EXPECT_EQ(span.kv_offset, 16);
  EXPECT_EQ(span.quant.seq_len(), 3);
}
// MLA latents (kMlaLatent): c_kv [B, 1, S, d_c] in the K slot (per channel), k_rot [B, 1, S, d_r]
// in the V slot (per token), mla-tiny's widths. The element bound holds on the latent, and
// read_kv_rows — what the MLA step expands from — gives the span's dequantized rows bit for
// bit, into strided rows, whole or ending inside a block.
TEST(QuantizedLayer, MlaLatentRowsReadDequantized) {
  constexpr int64_t kDc = 32, kDr = 8, G = 4, R = 4;
  CacheConfig c = quant_config(4, G, R);
  c.kv_content = CacheConfig::KVContent::kMlaLatent;
  Cache cache(c);
  std::mt19937 rng(41);
  History hist(DType::kF32);
  KVSpan span;
  for (int step = 0; step < 12; ++step) {
    const int64_t n = step == 0 ? 9 : 1;
    const Tensor lat = random_tensor(DType::kF32, {2, 1, n, kDc}, rng);
    const Tensor rot = random_tensor(DType::kF32, {2, 1, n, kDr}, rng);
    hist.append(lat.view(), rot.view());
    span = cache.update(0, lat.view(), rot.view());
    Tensor dk, dv;
    dense_of(span, &dk, &dv);
    expect_close(dk, dv, hist, 0, span.quant.packed_len(), 4, G, qlayer(cache).value_group());
  }
  ASSERT_GT(span.quant.packed_len(), 0);
  ASSERT_GT(span.quant.residual_len(), 0);
  Tensor dk, dv;
  dense_of(span, &dk, &dv);
  const int64_t S = span.quant.seq_len(), ld = 3 * kDc;  // rows wider than D, as MLA reads k_rot
  for (const int64_t n : {S, span.quant.packed_len() - 1, int64_t{2}}) {
    for (int64_t b = 0; b < 2; ++b) {
      std::vector<float> rows(static_cast<size_t>(S * ld), -7.0f);
      read_kv_rows(span, KVPart::kK, b, 0, n, rows.data(), ld);
      for (int64_t j = 0; j < S; ++j) {
        if (j >= n) {
          EXPECT_EQ(rows[static_cast<size_t>(j * ld)], -7.0f) << "row " << j << " beyond n";
          continue;
        }
        ASSERT_EQ(std::memcmp(rows.data() + j * ld, dk.view().ptr_as<float>(b, 0, j), kDc * 4), 0)
            << "latent row " << j << " of " << n;
        EXPECT_EQ(rows[static_cast<size_t>(j * ld + kDc)], -7.0f) << "wrote past D";
      }
      read_kv_rows(span, KVPart::kV, b, 0, n, rows.data() + kDc, ld);
      for (int64_t j = 0; j < n; ++j)
        ASSERT_EQ(
            std::memcmp(rows.data() + j * ld + kDc, dv.view().ptr_as<float>(b, 0, j), kDr * 4), 0)
            << "k_rot row " << j << " of " << n;
    }
  }
}

// 16K tokens, 8 KV heads, D = 128, filled 64 tokens per update (the flush cycle at steady
// state); f16 residual against an f16 dynamic cache of the same tokens.
TEST(QuantizedLayer, ReserveSizesThePackedStoreOnce) {
  constexpr int64_t G = 16, R = 8, B = 1, H = 2, D = 32;
  std::mt19937 rng(21);
  // Before the first update: the first flush allocates the reserved blocks, and reaching them
  // grows nothing. Then a reserve on a live layer grows once, exactly, keeping the content.
  Cache cache(quant_config(4, G, R));
  cache.reserve(100);  // ceil(100 / 16) = 7 blocks
  KVSpan span;
  for (int i = 0; i < 100; ++i) {
    Tensor k = random_tensor(DType::kF32, {B, H, 1, D}, rng);
    Tensor v = random_tensor(DType::kF32, {B, H, 1, D}, rng);
    span = cache.update(0, k.view(), v.view());
    const int64_t cap = qlayer(cache).packed_capacity_blocks();
    EXPECT_TRUE(cap == 0 || cap == 7) << cap << " blocks after " << i + 1 << " tokens";
  }
  EXPECT_EQ(qlayer(cache).packed_capacity_blocks(), 7);
  const int64_t packed = qlayer(cache).packed_length();
  ASSERT_GT(packed, 0);
  Tensor k0, v0;
  dense_of(span, &k0, &v0);
  cache.reserve(120);  // 8 blocks: exactly, not the doubling's 14
  EXPECT_EQ(qlayer(cache).packed_capacity_blocks(), 8);
  cache.reserve(10);
  EXPECT_EQ(qlayer(cache).packed_capacity_blocks(), 8);
  Tensor k1 = random_tensor(DType::kF32, {B, H, 1, D}, rng);
  Tensor v1 = random_tensor(DType::kF32, {B, H, 1, D}, rng);
  span = cache.update(0, k1.view(), v1.view());
  Tensor k2, v2;
  dense_of(span, &k2, &v2);
  // The packed tokens read back the same after the move.
  EXPECT_TRUE(
      testing_util::views_equal(k2.view().slice(2, 0, packed), k0.view().slice(2, 0, packed)));
  EXPECT_TRUE(
      testing_util::views_equal(v2.view().slice(2, 0, packed), v0.view().slice(2, 0, packed)));
  EXPECT_THROW(cache.reserve(-5), Error);
  // A sliding layer reserves no more than its window (plus the block straddling its start).
  CacheConfig sc = quant_config(4, G, R);
  sc.layer_types = {"sliding_attention"};
  sc.sliding_window = 32;
  Cache sliding(sc);
  sliding.reserve(100000);
  for (int i = 0; i < 16; ++i) {
    Tensor ks = random_tensor(DType::kF32, {B, H, 4, D}, rng);
    Tensor vs = random_tensor(DType::kF32, {B, H, 4, D}, rng);
    sliding.update(0, ks.view(), vs.view());
    EXPECT_LE(qlayer(sliding).packed_capacity_blocks(), 3);  // ceil((32 + 16) / 16)
  }
  EXPECT_EQ(qlayer(sliding).packed_capacity_blocks(), 3);
}

TEST(QuantizedLayer, MemoryAt16KAgainstF16) {
  constexpr int64_t kTokens = 16384, kH = 8, kD = 128, kChunk = 64;
  std::mt19937 rng(7);
  const Tensor k = random_tensor(DType::kF16, {1, kH, kChunk, kD}, rng);
  CacheConfig dyn;
  dyn.layer_types = {"full_attention"};
  dyn.options.kv_dtype = DType::kF16;
  Cache f16(dyn);
  for (int64_t t = 0; t < kTokens; t += kChunk) f16.update(0, k.view(), k.view());
  const double f16_bytes = static_cast<double>(f16.bytes());
  EXPECT_EQ(f16.bytes(), static_cast<size_t>(kTokens * kH * kD * 2 * 2));
  for (auto [bits, limit] : {std::pair<int, double>{4, 0.30}, {2, 0.20}, {8, 0.60}}) {
    Cache q(quant_config(bits, 64, 128, DType::kF16));
    for (int64_t t = 0; t < kTokens; t += kChunk) q.update(0, k.view(), k.view());
    const QuantizedLayer& L = qlayer(q);
    EXPECT_EQ(L.seq_length(), kTokens);
    // Exact: blocks (codes + scales + zeros) at the store's capacity, the residual tensors at
    // theirs, the flush scratch.
    const int64_t blocks = L.packed_capacity_blocks();
    const size_t want = static_cast<size_t>(
        kH * blocks * (kivi_k_block_bytes(64, kD, bits) + kivi_v_block_bytes(64, kD, 64, bits)) +
        2 * kH * L.residual_capacity() * kD * 2 + 64 * kD * 4);
    EXPECT_EQ(L.bytes(), want);
    const double ratio = static_cast<double>(q.bytes()) / f16_bytes;
    std::printf("[quantized q%d] 16K tokens: %zu bytes, %.4f x f16 (%zu bytes)\n", bits, q.bytes(),
                ratio, f16.bytes());
    EXPECT_LE(ratio, limit) << bits << " bits";
  }
}

// llama.cpp's per-token formats through the same container (--kv-quant q8_0 / q4_0): the span's
// packed rows are exactly the codec's round trip of the history, bytes() is exact, the 16K
// ratios against f16 follow from 34 / 64 and 18 / 64 bytes per element pair, and head dims that
// are not multiples of 32 are refused naming the layer.
TEST(QuantizedLayer, PerTokenSchemes) {
  std::mt19937 rng(11);
  for (KVQuantScheme sch : {KVQuantScheme::kQ8_0, KVQuantScheme::kQ4_0}) {
    CacheConfig cfg = quant_config(4, 16, 32);
    cfg.options.quantized.scheme = sch;
    Cache cache(cfg);
    History h(DType::kF32);
    KVSpan span;
    for (int step = 0; step < 7; ++step) {
      const Tensor k = random_tensor(DType::kF32, {2, 3, 9, 64}, rng);
      const Tensor v = random_tensor(DType::kF32, {2, 3, 9, 32}, rng);
      h.append(k.view(), v.view());
      span = cache.update(0, k.view(), v.view());
    }
    const QuantizedLayer& L = qlayer(cache);
    ASSERT_EQ(span.quant.scheme, sch);
    EXPECT_EQ(span.quant.bits, sch == KVQuantScheme::kQ8_0 ? 8 : 4);
    EXPECT_EQ(L.packed_length() + L.residual_length(), 63);
    ASSERT_GT(L.packed_length(), 0);
    Tensor gk, gv;
    dense_of(span, &gk, &gv);
    const KVBlockFormat f = make_kv_block_format(sch, 0, 16, 64, 32);
    std::vector<float> rows(16 * 64), back(16 * 64);
    std::vector<std::byte> blk(static_cast<size_t>(kv_k_block_bytes(f)));
    Tensor hk = Tensor::empty(DType::kF32, {2, 3, 63, 64});
    copy_view(h.k(0, 63), hk.view());
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t hh = 0; hh < 3; ++hh)
        for (int64_t t = 0; t < 63; ++t) {
          const float* want = hk.view().ptr_as<float>(b, hh, t);
          const float* got = gk.view().ptr_as<float>(b, hh, t);
          if (t >= L.packed_length()) {
            ASSERT_EQ(std::memcmp(want, got, 64 * 4), 0) << "residual row " << t;
            continue;
          }
          // Per-token: a row's code depends on that row only, so quantizing the same row alone
          // gives the same bits.
          kv_quantize_k_block(f, want - (t % 16) * 64, 64, blk.data());
          kv_dequantize_k_block(f, blk.data(), back.data(), 64);
          ASSERT_EQ(std::memcmp(back.data() + (t % 16) * 64, got, 64 * 4), 0) << "packed row " << t;
        }
  }
  // 16K tokens, H 8, D 128, f16 residual: exact bytes and the ratio to an f16 dynamic cache.
  constexpr int64_t kTokens = 16384, kH = 8, kD = 128, kChunk = 64;
  const Tensor k = random_tensor(DType::kF16, {1, kH, kChunk, kD}, rng);
  for (auto [sch, limit] : {std::pair<KVQuantScheme, double>{KVQuantScheme::kQ8_0, 0.55},
                            {KVQuantScheme::kQ4_0, 0.30}}) {
    CacheConfig cfg = quant_config(4, 64, 128, DType::kF16);
    cfg.options.quantized.scheme = sch;
    Cache q(cfg);
    for (int64_t t = 0; t < kTokens; t += kChunk) q.update(0, k.view(), k.view());
    const QuantizedLayer& L = qlayer(q);
    const int64_t per32 = sch == KVQuantScheme::kQ8_0 ? 34 : 18;
    const size_t want =
        static_cast<size_t>(kH * L.packed_capacity_blocks() * 2 * 64 * kD / 32 * per32 +
                            2 * kH * L.residual_capacity() * kD * 2 + 64 * kD * 4);
    EXPECT_EQ(L.bytes(), want);
    const double ratio =
        static_cast<double>(q.bytes()) / static_cast<double>(kTokens * kH * kD * 2 * 2);
    std::printf("[quantized %s] 16K tokens: %zu bytes, %.4f x f16\n", kv_quant_scheme_name(sch),
                q.bytes(), ratio);
    EXPECT_LE(ratio, limit);
  }
  CacheConfig bad = quant_config(4, 16, 32);
  bad.options.quantized.scheme = KVQuantScheme::kQ8_0;
  Cache c(bad);
  const Tensor k40 = random_tensor(DType::kF32, {1, 1, 3, 40}, rng);
  try {
    c.update(0, k40.view(), k40.view());
    ADD_FAILURE() << "D 40 accepted by q8_0";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer 0"), std::string::npos) << m;
    EXPECT_NE(m.find("multiples of 32"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace kvcache
