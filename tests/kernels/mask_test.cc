// Mask module: mask functions against their definitions, tile classification against brute
// force, the materialised additive mask, and no-mask detection (incl. bottom-right alignment).
#include "kernels/mask.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "core/error.h"

namespace kvcache {
namespace {

TEST(Mask, FunctionsFollowTheirDefinitions) {
  const MaskFn causal = causal_mask(), win = sliding_window_overlay(3), chunk = chunked_overlay(4);
  for (int64_t q = -5; q < 12; ++q)
    for (int64_t kv = -5; kv < 12; ++kv) {
      EXPECT_EQ(causal(0, 0, q, kv), kv <= q);
      EXPECT_EQ(win(0, 0, q, kv), kv > q - 3);
      const auto fl = [](int64_t a) { return static_cast<int64_t>(std::floor(a / 4.0)); };
      EXPECT_EQ(chunk(0, 0, q, kv), fl(q) == fl(kv)) << q << " " << kv;
    }
  EXPECT_THROW(sliding_window_overlay(0), Error);
  EXPECT_THROW(chunked_overlay(-1), Error);
}

TEST(Mask, PackedPaddingAndCombinators) {
  // Two rows of 6 positions: row 0 holds documents [0 0 0 1 1 2], row 1 a single document.
  const int32_t docs[12] = {0, 0, 0, 1, 1, 2, 5, 5, 5, 5, 5, 5};
  const MaskFn packed = packed_sequence_mask(docs, 6);
  EXPECT_TRUE(packed(0, 0, 2, 0));
  EXPECT_FALSE(packed(0, 0, 3, 2));
  EXPECT_TRUE(packed(0, 0, 4, 3));
  EXPECT_FALSE(packed(0, 0, 5, 4));
  EXPECT_TRUE(packed(1, 0, 5, 0));
  EXPECT_FALSE(packed(0, 0, 6, 0));  // outside the id array: invisible
  const int64_t begin[2] = {2, 0}, end[2] = {6, 4};
  const MaskFn pad = padding_mask(begin, end);
  EXPECT_FALSE(pad(0, 0, 5, 1));
  EXPECT_TRUE(pad(0, 0, 5, 2));
  EXPECT_FALSE(pad(1, 0, 5, 4));
  const MaskFn both = and_masks({causal_mask(), packed});
  const MaskFn either = or_masks({sliding_window_overlay(1), chunked_overlay(100)});
  EXPECT_FALSE(both(0, 0, 1, 2));
  EXPECT_TRUE(both(0, 0, 2, 1));
  EXPECT_TRUE(either(0, 0, 3, 3));
  EXPECT_TRUE(and_masks({})(0, 0, 1, 2));
  EXPECT_FALSE(or_masks({})(0, 0, 1, 2));
}

TEST(Mask, SpecEqualsComposedFunctions) {
  const int32_t docs[40] = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3,
                            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t begin[2] = {3, 0}, end[2] = {20, 17};
  MaskSpec s;
  s.causal = true;
  s.sliding_window = 7;
  s.chunk_size = 9;
  s.doc_ids = docs;
  s.doc_len = 20;
  s.kv_begin = begin;
  s.kv_end = end;
  const MaskFn composed = and_masks({causal_mask(), sliding_window_overlay(7), chunked_overlay(9),
                                     packed_sequence_mask(docs, 20), padding_mask(begin, end)});
  const MaskFn as_fn = mask_spec_fn(s);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t q = 0; q < 20; ++q)
      for (int64_t kv = 0; kv < 20; ++kv) {
        EXPECT_EQ(mask_visible(s, b, 0, q, kv), composed(b, 0, q, kv));
        EXPECT_EQ(as_fn(b, 0, q, kv), composed(b, 0, q, kv));
      }
}

TileClass brute_classify(const MaskSpec& s, int64_t b, int64_t h, int64_t q0, int64_t q1,
                         int64_t k0, int64_t k1) {
  bool any = false, all = true;
  for (int64_t q = q0; q < q1; ++q)
    for (int64_t kv = k0; kv < k1; ++kv) {
      const bool v = mask_visible(s, b, h, q, kv);
      any |= v;
      all &= v;
    }
  return !any ? TileClass::kEmpty : all ? TileClass::kFull : TileClass::kPartial;
}

TEST(Mask, TileClassificationIsExact) {
  std::mt19937 rng(7);
  std::vector<int32_t> docs(2 * 300);
  for (int64_t b = 0; b < 2; ++b) {
    int32_t d = 0;
    for (int64_t p = 0; p < 300; ++p) {
      if (rng() % 37 == 0) ++d;
      docs[static_cast<size_t>(b * 300 + p)] = d;
    }
  }
  const int64_t begin[2] = {10, 0}, end[2] = {250, 300};
  const MaskFn user = [](int64_t, int64_t h, int64_t q, int64_t kv) {
    return h % 2 == 0 || (q - kv) % 3 != 1;
  };
  int counts[3] = {0, 0, 0};
  for (int iter = 0; iter < 3000; ++iter) {
    MaskSpec s;
    s.causal = rng() % 4 != 0;
    s.sliding_window = rng() % 3 == 0 ? 1 + rng() % 60 : 0;
    s.chunk_size = rng() % 4 == 0 ? 1 + rng() % 50 : 0;
    if (rng() % 4 == 0) {
      s.doc_ids = docs.data();
      s.doc_len = 300;
    }
    if (rng() % 4 == 0) {
      s.kv_begin = begin;
      s.kv_end = end;
    }
    if (rng() % 6 == 0) s.fn = &user;
    const int64_t b = rng() % 2, h = rng() % 2;
    const int64_t q0 = rng() % 280, q1 = q0 + 1 + rng() % 16;
    const int64_t k0 = rng() % 280, k1 = k0 + 1 + rng() % 16;
    const TileClass got = classify_tile(s, b, h, q0, q1, k0, k1);
    ASSERT_EQ(got, brute_classify(s, b, h, q0, q1, k0, k1)) << iter;
    ++counts[static_cast<int>(got)];
  }
  // The random tiles exercise all three classes.
  EXPECT_GT(counts[0], 100);
  EXPECT_GT(counts[1], 100);
  EXPECT_GT(counts[2], 100);
}

TEST(Mask, MaterialisedAdditiveMaskIsBottomRightAligned) {
  MaskSpec s;  // causal
  // 3 queries over 5 cached keys that start at absolute position 10: queries sit at 12..14.
  const MaskGeometry g = make_geometry(1, 4, 3, 5, -1, 10);
  EXPECT_EQ(g.q_offset, 12);
  const Tensor m = materialize_additive_mask(s, g);
  ASSERT_EQ(m.shape(), (Shape{1, 1, 3, 5}));  // no user fn: one plane for all heads
  const float* p = m.data_as<float>();
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      const float want = (10 + j <= 12 + i) ? 0.0f : -INFINITY;
      EXPECT_EQ(p[i * 5 + j], want) << i << " " << j;
    }
  const MaskFn per_head = [](int64_t, int64_t h, int64_t, int64_t kv) { return kv % 2 == h % 2; };
  s.fn = &per_head;
  const Tensor mh = materialize_additive_mask(s, g);
  ASSERT_EQ(mh.shape(), (Shape{1, 4, 3, 5}));
  EXPECT_EQ(mh.data_as<float>()[1 * 15 + 2 * 5 + 0], -INFINITY);  // h = 1 sees odd keys only
  EXPECT_EQ(mh.data_as<float>()[0 * 15 + 2 * 5 + 0], 0.0f);
}

TEST(Mask, NoMaskDetection) {
  MaskSpec causal;
  // Decode: one query at the last position sees the whole cache.
  EXPECT_TRUE(mask_is_all_visible(causal, make_geometry(2, 8, 1, 1000, -1, 0)));
  EXPECT_TRUE(mask_is_all_visible(causal, make_geometry(2, 8, 1, 1000, -1, 77)));
  // Prefill with a causal mask needs one.
  EXPECT_FALSE(mask_is_all_visible(causal, make_geometry(1, 1, 7, 7, -1, 0)));
  // Top-left alignment (q_offset 0 with 1000 keys) would hide keys: the pitfall.
  EXPECT_FALSE(mask_is_all_visible(causal, make_geometry(1, 1, 1, 1000, 0, 0)));
  MaskSpec win;
  win.sliding_window = 128;
  EXPECT_FALSE(mask_is_all_visible(win, make_geometry(1, 1, 1, 1000, -1, 0)));
  EXPECT_TRUE(mask_is_all_visible(win, make_geometry(1, 1, 1, 128, -1, 872)));  // window cache
  MaskSpec none;
  none.causal = false;
  EXPECT_TRUE(mask_is_all_visible(none, make_geometry(1, 1, 50, 60, -1, 0)));
}

// transformers v5 chunked_overlay(chunk_size, left_padding): a left-padded row counts its
// chunks from its first real token. C = 3, 7 positions, row 1 padded by 2 (the docstring's
// chunked grid for row 0, the same grid shifted by the padding for row 1).
TEST(Mask, ChunksOfALeftPaddedRowStartAtItsFirstRealToken) {
  const int64_t lp[2] = {0, 2}, end[2] = {7, 7};
  MaskSpec s;
  s.chunk_size = 3;
  s.chunk_offset = lp;
  s.kv_begin = lp;
  s.kv_end = end;
  const char* want[2][7] = {
      {"#......", "##.....", "###....", "...#...", "...##..", "...###.", "......#"},
      {".......", ".......", "..#....", "..##...", "..###..", ".....#.", ".....##"}};
  const Tensor m = materialize_additive_mask(s, make_geometry(2, 1, 7, 7, -1, 0));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t q = 0; q < 7; ++q) {
      std::string got;
      for (int64_t kv = 0; kv < 7; ++kv)
        got += m.data_as<float>()[(b * 7 + q) * 7 + kv] == 0.0f ? '#' : '.';
      EXPECT_EQ(got, want[b][q]) << "row " << b << " query " << q;
    }
  // Decode with a cache: the query at 7 of row 1 is in chunk [5, 8); of row 0 in [6, 9).
  EXPECT_EQ(key_range(s, 1, 7).lo, 5);
  EXPECT_EQ(key_range(s, 0, 7).lo, 6);
  // The function form agrees (and without padding is the plain overlay).
  const MaskFn f = chunked_overlay(3, lp), plain = chunked_overlay(3);
  EXPECT_TRUE(f(1, 0, 7, 5));
  EXPECT_FALSE(f(0, 0, 7, 5));
  EXPECT_TRUE(f(1, 0, 4, 2));
  EXPECT_FALSE(plain(1, 0, 4, 2));
  EXPECT_THROW(chunked_overlay(0, lp), Error);
}

TEST(Mask, ChunkOffsetsInSpecAndTilesFollowTheOverlay) {
  std::mt19937 rng(11);
  const int64_t lp[3] = {0, 5, 13}, begin[3] = {0, 5, 13}, end[3] = {90, 90, 80};
  int counts[3] = {0, 0, 0};
  for (int iter = 0; iter < 2000; ++iter) {
    MaskSpec s;
    s.causal = rng() % 4 != 0;
    s.chunk_size = 1 + rng() % 17;
    s.chunk_offset = lp;
    if (rng() % 2) {
      s.kv_begin = begin;
      s.kv_end = end;
    }
    const int64_t b = rng() % 3;
    std::vector<MaskFn> parts = {chunked_overlay(s.chunk_size, lp)};
    if (s.causal) parts.push_back(causal_mask());
    if (s.kv_begin) parts.push_back(padding_mask(begin, end));
    const MaskFn composed = and_masks(parts);
    const int64_t q0 = rng() % 80, q1 = q0 + 1 + rng() % 9;
    const int64_t k0 = rng() % 80, k1 = k0 + 1 + rng() % 9;
    for (int64_t q = q0; q < q1; ++q)
      for (int64_t kv = k0; kv < k1; ++kv)
        ASSERT_EQ(mask_visible(s, b, 0, q, kv), composed(b, 0, q, kv)) << iter;
    const TileClass got = classify_tile(s, b, 0, q0, q1, k0, k1);
    ASSERT_EQ(got, brute_classify(s, b, 0, q0, q1, k0, k1)) << iter;
    ++counts[static_cast<int>(got)];
  }
  // The random tiles exercise all three classes.
  EXPECT_GT(counts[0], 20);
  EXPECT_GT(counts[1], 20);
  EXPECT_GT(counts[2], 20);
}

}  // namespace
}  // namespace kvcache
