// Masks from model inputs, against transformers v5's documented behaviour (masking_utils.py):
// packed-sequence ids from position ids, the flash-attention form of a padding mask, the SDPA
// skip rule, create_masks_for_generate (one mask per pattern, layer -> mask, errors), and
// attention with a left-padded chunked mask equal to eager on the v5 mask function.
#include "kernels/mask_builder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/attention_reference.h"
#include "kernels/paged_attention.h"

namespace kvcache {
namespace {

TEST(PackedSequences, PositionResetsAndJumpsStartSequences) {
  // v5's docstring: 3 sequences of 2, 3 and 1 tokens packed in one row.
  const int64_t pos[6] = {0, 1, 0, 1, 2, 0};
  const auto ids = find_packed_sequence_indices(pos, 1, 6);
  ASSERT_TRUE(ids.has_value());
  EXPECT_EQ(*ids, (std::vector<int32_t>{0, 0, 1, 1, 1, 2}));
  // Any step other than +1 starts a sequence (diff != 1), not only a reset to 0; a row that
  // starts anywhere but runs consecutively is one sequence. Ids count per row.
  const int64_t two[10] = {5, 6, 7, 2, 3, /**/ 9, 10, 11, 12, 13};
  const auto ids2 = find_packed_sequence_indices(two, 2, 5);
  ASSERT_TRUE(ids2.has_value());
  EXPECT_EQ(*ids2, (std::vector<int32_t>{0, 0, 0, 1, 1, 0, 0, 0, 0, 0}));
  // A repeated position is a new sequence too.
  const int64_t rep[3] = {4, 4, 5};
  EXPECT_EQ(*find_packed_sequence_indices(rep, 1, 3), (std::vector<int32_t>{0, 1, 1}));
  // Every row a single sequence: nothing to mask (v5 returns None).
  const int64_t plain[6] = {0, 1, 2, 7, 8, 9};
  EXPECT_FALSE(find_packed_sequence_indices(plain, 2, 3).has_value());
  EXPECT_THROW(find_packed_sequence_indices(nullptr, 1, 3), Error);
  EXPECT_THROW(find_packed_sequence_indices(pos, 1, 0), Error);
}

TEST(FlashMask, LastKvLengthColumnsOrNone) {
  // Row 0 left-padded by 1, row 1 unpadded; 4 columns.
  const uint8_t m[8] = {0, 1, 1, 1, 1, 1, 1, 1};
  const AttentionMask2D mask{m, 2, 4};
  // A sliding layer whose keys are the last 3 columns sees no padding: no mask.
  EXPECT_FALSE(flash_attention_mask(mask, 3).has_value());
  // All 4 columns: the 2-D mask itself.
  const auto all = flash_attention_mask(mask, 4);
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(*all, (std::vector<uint8_t>{0, 1, 1, 1, 1, 1, 1, 1}));
  // More keys than columns: Python's mask[:, -kv_length:] is the whole mask.
  EXPECT_EQ(*flash_attention_mask(mask, 10), *all);
  // Only the last columns are returned, [B, kv_length].
  const uint8_t r[6] = {1, 1, 0, 1, 1, 1};  // row 0 right-padded
  const auto last2 = flash_attention_mask(AttentionMask2D{r, 2, 3}, 2);
  ASSERT_TRUE(last2.has_value());
  EXPECT_EQ(*last2, (std::vector<uint8_t>{1, 0, 1, 1}));
  EXPECT_FALSE(flash_attention_mask(AttentionMask2D{}, 5).has_value());
  EXPECT_THROW(flash_attention_mask(mask, 0), Error);
}

TEST(SdpaSkip, FollowsIgnoreCausalMaskSdpa) {
  const AttentionMask2D none;
  EXPECT_TRUE(ignore_causal_mask_sdpa(none, 1, 50, 0, 0));  // decode
  EXPECT_TRUE(ignore_causal_mask_sdpa(none, 7, 7, 0, 0));   // prefill, q == kv
  EXPECT_FALSE(ignore_causal_mask_sdpa(none, 3, 7, 0, 0));  // alignments differ
  EXPECT_FALSE(ignore_causal_mask_sdpa(none, 1, 8, 0, 8));  // window reached
  EXPECT_TRUE(ignore_causal_mask_sdpa(none, 1, 7, 0, 8));   // window not reached yet
  const uint8_t m[8] = {0, 1, 1, 1, 1, 1, 1, 1};
  const AttentionMask2D mask{m, 2, 4};
  EXPECT_FALSE(ignore_causal_mask_sdpa(mask, 1, 4, 0, 0));  // padding among the keys
  EXPECT_TRUE(ignore_causal_mask_sdpa(mask, 1, 3, 1, 0));   // keys 1..3: no padding
  EXPECT_FALSE(ignore_causal_mask_sdpa(mask, 1, 4, 1, 0));  // key 4 is past the mask: padding
}

GenerateMaskInputs hybrid_inputs() {
  GenerateMaskInputs in;
  in.layer_types = {"full_attention", "sliding_attention", "chunked_attention", "sliding_attention",
                    "full_attention"};
  in.batch = 2;
  in.q_len = 7;
  in.sliding_window = 4;
  in.attention_chunk_size = 3;
  return in;
}

TEST(GenerateMasks, OneMaskPerPatternAndTheLayerMapping) {
  GenerateMaskInputs in = hybrid_inputs();
  const GenerateMasks g = create_masks_for_generate(in);
  ASSERT_EQ(g.masks.size(), 3u);
  EXPECT_EQ(g.layer_mask, (std::vector<int>{0, 1, 2, 1, 0}));
  EXPECT_EQ(g.for_layer(0).pattern, MaskPattern::kFull);
  EXPECT_EQ(g.for_layer(3).pattern, MaskPattern::kSliding);
  EXPECT_EQ(g.for_layer(3).sliding_window, 4);
  EXPECT_EQ(g.for_layer(2).pattern, MaskPattern::kChunked);
  EXPECT_EQ(g.for_layer(2).chunk_size, 3);
  EXPECT_EQ(g.for_layer(0).geometry.kv_len, 7);
  EXPECT_FALSE(g.for_layer(0).all_visible);  // a causal prefill needs its mask
  // A single type: one mask for every layer (v5 returns the mask itself).
  in.layer_types = {"sliding_attention", "compressed_sparse_attention", "sliding_attention"};
  const GenerateMasks one = create_masks_for_generate(in);
  EXPECT_EQ(one.masks.size(), 1u);
  EXPECT_EQ(one.layer_mask, (std::vector<int>{0, 0, 0}));
  // Same pattern, different cache extents (e.g. a full layer beside a sliding one whose cache
  // is a different stretch): separate masks.
  in.layer_types = {"full_attention", "deepseek_sparse_attention"};
  in.past_len = 10;
  in.q_len = 1;
  in.kv_extents = {{11, 0}, {5, 6}};
  const GenerateMasks two = create_masks_for_generate(in);
  EXPECT_EQ(two.masks.size(), 2u);
  EXPECT_TRUE(two.masks[0].all_visible);  // decode: the last query sees every key
  EXPECT_EQ(two.masks[1].geometry.kv_offset, 6);
  EXPECT_EQ(two.masks[1].geometry.q_offset, 10);
}

TEST(GenerateMasks, ErrorsNameTheLayer) {
  GenerateMaskInputs in = hybrid_inputs();
  in.layer_types[3] = "linear_attention";
  try {
    create_masks_for_generate(in);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("layer 3"), std::string::npos) << w;
    EXPECT_NE(w.find("'linear_attention'"), std::string::npos) << w;
  }
  in = hybrid_inputs();
  in.sliding_window = 0;
  try {
    create_masks_for_generate(in);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sliding_window"), std::string::npos) << e.what();
  }
  in = hybrid_inputs();
  in.attention_chunk_size = 0;
  EXPECT_THROW(create_masks_for_generate(in), Error);
  in = hybrid_inputs();
  in.kv_extents = {{7, 0}};  // not one per layer
  EXPECT_THROW(create_masks_for_generate(in), Error);
  in = hybrid_inputs();
  const uint8_t gap[14] = {1, 1, 0, 1, 1, 1, 1, /**/ 1, 1, 1, 1, 1, 1, 1};
  in.attention_mask = AttentionMask2D{gap, 2, 7};
  try {
    create_masks_for_generate(in);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 0"), std::string::npos) << e.what();
  }
}

// Visible pairs of a built mask, as '#' / '.' strings per query.
std::vector<std::string> grid(const PatternMask& m, int64_t b) {
  const Tensor t = m.materialize();
  const MaskGeometry& g = m.geometry;
  std::vector<std::string> rows;
  for (int64_t i = 0; i < g.q_len; ++i) {
    std::string r;
    for (int64_t j = 0; j < g.kv_len; ++j)
      r += t.data_as<float>()[(b * g.q_len + i) * g.kv_len + j] == 0.0f ? '#' : '.';
    rows.push_back(r);
  }
  return rows;
}

TEST(GenerateMasks, LeftPaddedChunksInPrefillAndDecode) {
  // Row 1 is left-padded by 2 (v5: left_padding_tokens = leading zeros of the 2-D mask).
  GenerateMaskInputs in = hybrid_inputs();
  const uint8_t m[14] = {1, 1, 1, 1, 1, 1, 1, /**/ 0, 0, 1, 1, 1, 1, 1};
  in.attention_mask = AttentionMask2D{m, 2, 7};
  const GenerateMasks g = create_masks_for_generate(in);
  const PatternMask& chunked = g.for_layer(2);
  EXPECT_EQ(chunked.chunk_offset, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(grid(chunked, 1), (std::vector<std::string>{".......", ".......", "..#....", "..##...",
                                                        "..###..", ".....#.", ".....##"}));
  EXPECT_EQ(grid(chunked, 0), (std::vector<std::string>{"#......", "##.....", "###....", "...#...",
                                                        "...##..", "...###.", "......#"}));
  // Full and sliding masks hide the padding but have no chunk offset.
  EXPECT_TRUE(g.for_layer(0).chunk_offset.empty());
  EXPECT_EQ(grid(g.for_layer(1), 1)[6], "...####");
  EXPECT_EQ(grid(g.for_layer(0), 1)[6], "..#####");

  // Decode at position 7 with a cache (the chunked layer's keys are positions 5..7, as a
  // window layer of C = 3 reports them; the full layer's 0..7).
  const uint8_t m8[16] = {1, 1, 1, 1, 1, 1, 1, 1, /**/ 0, 0, 1, 1, 1, 1, 1, 1};
  in.attention_mask = AttentionMask2D{m8, 2, 8};
  in.q_len = 1;
  in.past_len = 7;
  in.kv_extents = {{8, 0}, {4, 4}, {3, 5}, {4, 4}, {8, 0}};
  const GenerateMasks d = create_masks_for_generate(in);
  const PatternMask& dc = d.for_layer(2);
  EXPECT_EQ(dc.chunk_offset, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(grid(dc, 1)[0], "###");  // row 1's chunk is [5, 8)
  EXPECT_EQ(grid(dc, 0)[0], ".##");  // row 0's is [6, 9)
  EXPECT_FALSE(dc.all_visible);
  // The sliding layer's keys 4..7 hold no padding: it needs no padding intervals.
  EXPECT_TRUE(d.for_layer(1).kv_begin.empty());
  EXPECT_TRUE(d.for_layer(1).all_visible);
  EXPECT_FALSE(d.for_layer(0).kv_begin.empty());
  EXPECT_FALSE(d.for_layer(0).all_visible);
}

TEST(GenerateMasks, PackedSequencesFromPositionIds) {
  GenerateMaskInputs in;
  in.layer_types = {"full_attention"};
  in.batch = 2;
  in.q_len = 6;
  const int64_t pos[6] = {0, 1, 0, 1, 2, 0};  // one row, broadcast to both
  in.position_ids = pos;
  const GenerateMasks g = create_masks_for_generate(in);
  const PatternMask& m = g.for_layer(0);
  ASSERT_EQ(m.doc_ids.size(), 12u);
  EXPECT_EQ(grid(m, 1),
            (std::vector<std::string>{"#.....", "##....", "..#...", "..##..", "..###.", ".....#"}));
  // With an attention mask or a cache, v5 does not look for packed sequences.
  const uint8_t ones[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  in.attention_mask = AttentionMask2D{ones, 2, 6};
  EXPECT_TRUE(create_masks_for_generate(in).for_layer(0).doc_ids.empty());
  in.position_ids_batch = 3;
  in.attention_mask = AttentionMask2D{};
  EXPECT_THROW(create_masks_for_generate(in), Error);
}

// ---- kernels: a padded chunked mask, fused/flex/scalar vs eager on the v5 mask function ----

Tensor randn(const Shape& s, std::mt19937& rng) {
  Tensor t = Tensor::empty(DType::kF32, s);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = d(rng);
  return t;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a.data_as<float>()[i]) -
                                      static_cast<double>(b.data_as<float>()[i])));
  return worst;
}

TEST(PaddedChunkedAttention, KernelsEqualEagerOnTheMaterialisedMask) {
  std::mt19937 rng(44);
  constexpr int64_t B = 3, Hq = 6, Hkv = 2, D = 13, C = 5;
  // Row paddings 0, 3 and 7: a 37-token prefill, a 3-token step over keys 31..39 and a decode
  // step over keys 36..40 (cache spans that start before the padded rows' chunks).
  struct Geo {
    int64_t Sq, Skv, kv_offset;
  };
  for (const Geo& geo : {Geo{37, 37, 0}, Geo{3, 9, 31}, Geo{1, 5, 36}}) {
    const int64_t total = geo.kv_offset + geo.Skv;
    std::vector<uint8_t> am(static_cast<size_t>(B * total), 1);
    const int64_t pads[B] = {0, 3, 7};
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < pads[b]; ++j) am[static_cast<size_t>(b * total + j)] = 0;
    GenerateMaskInputs in;
    in.layer_types = {"chunked_attention"};
    in.batch = B;
    in.q_len = geo.Sq;
    in.attention_chunk_size = C;
    in.attention_mask = AttentionMask2D{am.data(), B, total};
    if (geo.kv_offset > 0 || geo.Sq != geo.Skv) {
      in.past_len = total - geo.Sq;
      in.kv_extents = {{geo.Skv, geo.kv_offset}};
    }
    const GenerateMasks g = create_masks_for_generate(in);
    const PatternMask& pm = g.for_layer(0);
    ASSERT_EQ(pm.chunk_offset, (std::vector<int64_t>{0, 3, 7}));

    const Tensor q = randn({B, Hq, geo.Sq, D}, rng);
    const Tensor k = randn({B, Hkv, geo.Skv, D}, rng);
    const Tensor v = randn({B, Hkv, geo.Skv, D + 2}, rng);
    // Eager on the v5 mask function itself (causal & chunked_overlay(C, left padding) &
    // padding), no built-in chunking: the materialised mask the kernels must reproduce.
    const int64_t* lp = pm.chunk_offset.data();
    std::vector<int64_t> kv_begin(pads, pads + B);
    const MaskFn v5 =
        and_masks({causal_mask(), chunked_overlay(C, lp), padding_mask(kv_begin.data(), nullptr)});
    AttentionOptions eo;
    eo.kv_offset = geo.kv_offset;
    eo.mask = &v5;
    Tensor want = Tensor::zeros(DType::kF32, {B, Hq, geo.Sq, D + 2});
    get_attention_kernel("eager")(q.view(), k.view(), v.view(), want.view(), eo);

    AttentionOptions o;
    pm.apply(&o);
    EXPECT_EQ(o.kv_offset, geo.kv_offset);
    for (const char* name : {"eager", "fused", "flex", "fused_scalar"}) {
      Tensor got = Tensor::zeros(DType::kF32, {B, Hq, geo.Sq, D + 2});
      get_attention_kernel(name)(q.view(), k.view(), v.view(), got.view(), o);
      EXPECT_LE(max_abs_diff(got, want), 2e-5) << name << " Sq " << geo.Sq;
    }
    // The double reference reads chunk_offset from the options too.
    const ReferenceResult ref = attention_reference(q.view(), k.view(), v.view(), o);
    double worst = 0;
    for (int64_t i = 0; i < want.numel(); ++i)
      worst = std::max(worst, std::fabs(ref.out[static_cast<size_t>(i)] -
                                        static_cast<double>(want.data_as<float>()[i])));
    EXPECT_LE(worst, 1e-5) << "reference, Sq " << geo.Sq;
    // Without the offsets the padded rows would differ: the test can fail.
    AttentionOptions wrong = o;
    wrong.chunk_offset = nullptr;
    Tensor bad = Tensor::zeros(DType::kF32, {B, Hq, geo.Sq, D + 2});
    get_attention_kernel("fused")(q.view(), k.view(), v.view(), bad.view(), wrong);
    EXPECT_GT(max_abs_diff(bad, want), 1e-3) << "Sq " << geo.Sq;
  }
}

// Paged kernels read chunk offsets through the same key_range: equal to dense eager.
TEST(PaddedChunkedAttention, PagedKernelsHonourChunkOffsets) {
  std::mt19937 rng(46);
  constexpr int64_t B = 2, Hq = 4, Hkv = 2, D = 7, S = 11, Sq = 2, P = 4, C = 3;
  const int64_t pads[B] = {0, 2};
  const Tensor q = randn({B, Hq, Sq, D}, rng);
  const Tensor k = randn({B, Hkv, S, D}, rng);
  const Tensor v = randn({B, Hkv, S, D}, rng);
  AttentionOptions o;
  o.chunk_size = C;
  o.chunk_offset = pads;
  Tensor want = Tensor::zeros(DType::kF32, {B, Hq, Sq, D});
  get_attention_kernel("eager")(q.view(), k.view(), v.view(), want.view(), o);
  // Pages of P tokens: sequence b owns pages 3b .. 3b + 2 (the last holds 3 tokens).
  constexpr int64_t kPages = (S + P - 1) / P;
  Tensor kp = Tensor::zeros(DType::kF32, {B * kPages, Hkv, P, D});
  Tensor vp = Tensor::zeros(DType::kF32, {B * kPages, Hkv, P, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t pg = 0; pg < kPages; ++pg) {
      const int64_t t0 = pg * P, t1 = std::min(S, t0 + P);
      copy_view(k.view().slice(0, b, b + 1).slice(2, t0, t1),
                kp.view().slice(0, b * kPages + pg, b * kPages + pg + 1).slice(2, 0, t1 - t0));
      copy_view(v.view().slice(0, b, b + 1).slice(2, t0, t1),
                vp.view().slice(0, b * kPages + pg, b * kPages + pg + 1).slice(2, 0, t1 - t0));
    }
  const int32_t indptr[B + 1] = {0, 3, 6}, indices[6] = {0, 1, 2, 3, 4, 5}, last[B] = {3, 3};
  const int32_t cu[B + 1] = {0, 2, 4};
  Tensor qp = Tensor::empty(DType::kF32, {B * Sq, Hq, D});
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Sq; ++i)
        std::copy(q.view().ptr_as<const float>(b, h, i), q.view().ptr_as<const float>(b, h, i) + D,
                  qp.view().ptr_as<float>(b * Sq + i, h));
  PagedAttentionArgs a;
  a.q = qp.view();
  a.kv.k_pages = kp.view();
  a.kv.v_pages = vp.view();
  a.kv.batch = B;
  a.kv.block_tokens = P;
  a.kv.indptr = indptr;
  a.kv.indices = indices;
  a.kv.last_page_len = last;
  a.cu_seqlens_q = cu;
  for (const char* name : {"eager", "fused"}) {
    Tensor out = Tensor::zeros(DType::kF32, {B * Sq, Hq, D});
    a.out = out.view();
    paged_attention(name, a, o);
    double worst = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < Sq; ++i)
          for (int64_t d = 0; d < D; ++d)
            worst = std::max(worst, static_cast<double>(
                                        std::fabs(out.view().ptr_as<const float>(b * Sq + i, h)[d] -
                                                  want.view().ptr_as<const float>(b, h, i)[d])));
    EXPECT_LE(worst, 2e-5) << name;
  }
}

}  // namespace
}  // namespace kvcache
