// The dense compressed containers (HCA, CSA: cache/compressed_layer.h). Every fed row encodes
// its batch row, position and channel (code(b, p, c) = 1000 b + 10 p + c for kv, its negation
// for the gate), so buffers, chunks, overlaps and entries are checked against hand-written
// positions: the update sizes 1, 3, 4, 5, 9 as literal tables (HCA rate 4 and 8, CSA
// rate 4 with both streams), then crop / reset / batch-row operations / recompute / bytes.
#include "cache/compressed_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "core/error.h"

namespace kvcache {
namespace {

constexpr int64_t kD = 2;  // sliding K==V head dim
constexpr const char* kHca = "heavily_compressed_attention";
constexpr const char* kCsa = "compressed_sparse_attention";
constexpr CompressedStream kComp = CompressedStream::kCompressor;
constexpr CompressedStream kIdx = CompressedStream::kIndexer;

float code(int64_t b, int64_t p, int64_t c) {
  return static_cast<float>(1000 * b + 10 * p + c);
}

CacheConfig config(int64_t window, int64_t hca_rate, int64_t csa_rate = 4) {
  CacheConfig cfg;
  cfg.layer_types = {kHca};
  cfg.sliding_window = window;
  cfg.compressed.rates = {{kHca, hca_rate}, {kCsa, csa_rate}};
  return cfg;
}

std::unique_ptr<CompressedLayer> make(const std::string& impl, const std::string& type,
                                      int64_t window, int64_t rate) {
  CacheConfig cfg = config(window, rate, rate);
  auto layer = LayerRegistry::create(impl, type, cfg, 2);
  auto* c = dynamic_cast<CompressedLayer*>(layer.get());
  EXPECT_NE(c, nullptr);
  layer.release();
  return std::unique_ptr<CompressedLayer>(c);
}

// Rows of positions [from, from + n) of batch row b: [n, width], sign +1 kv, -1 gate.
Tensor rows(int64_t b, int64_t from, int64_t n, int64_t width, float sign) {
  Tensor t = Tensor::empty(DType::kF32, {n, width});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < width; ++c)
      t.data_as<float>()[i * width + c] = sign * code(b, from + i, c);
  return t;
}

// The sliding branch's tokens [B, 1, n, kD].
Tensor tokens(int64_t batch, int64_t from, int64_t n) {
  Tensor t = Tensor::empty(DType::kF32, {batch, 1, n, kD});
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < kD; ++c)
        t.data_as<float>()[(b * n + i) * kD + c] = code(b, from + i, c);
  return t;
}

// view [n, >= channels] holds sign * code(b, first + i, c) for c < channels.
::testing::AssertionResult holds(const TensorView& v, int64_t b, int64_t first, int64_t n,
                                 int64_t channels, float sign) {
  if (v.ndim() != 2 || v.dim(0) != n || v.dim(1) < channels)
    return ::testing::AssertionFailure()
           << "shape " << v.shape().str() << ", want " << n << " rows of " << channels;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < channels; ++c) {
      const float got = *v.ptr_as<float>(i, c);
      if (got != sign * code(b, first + i, c))
        return ::testing::AssertionFailure()
               << "row " << i << " channel " << c << ": " << got << ", want position " << first + i;
    }
  return ::testing::AssertionSuccess();
}

struct Widths {
  int64_t width;  // kv / gate row width
  int64_t dim;    // entry width
};
Widths widths(const CompressedLayer& l, CompressedStream s) {
  if (!l.has_overlap()) return {4, 4};
  return s == kComp ? Widths{4, 2} : Widths{6, 3};
}

// The model's entries for `windows` windows from `fwp`: each window's mean kv row,
// code(b, window start, c) + 5 (rate - 1), [windows, dim].
Tensor window_means(int64_t b, int64_t fwp, int64_t windows, int64_t rate, int64_t dim) {
  Tensor t = Tensor::empty(DType::kF32, {windows, dim});
  for (int64_t i = 0; i < windows; ++i)
    for (int64_t c = 0; c < dim; ++c)
      t.data_as<float>()[i * dim + c] =
          code(b, fwp + i * rate, c) + 5.0f * static_cast<float>(rate - 1);
  return t;
}

// What a forward step of n tokens at `from` expects of one stream (every row alike).
struct Expect {
  int64_t n;
  int64_t fwp;      // chunk's first_window_position
  int64_t windows;  // chunk's n_windows
  int64_t buf_first;
  int64_t buf_len;
  int64_t entries;  // after the step
  int64_t prior;    // window whose Ca half update_overlap_state returns, -1: none
  int64_t overlap;  // window whose Ca half the overlap holds after the step, -1: none
};

// The model's side of one step: the sliding update, then per stream and row the compressor
// calls, with entries = each window's mean kv row (code(b, window start, c) + 5 (rate - 1)).
// Checks the chunk and the prior against the formulas (chunk = rows from
// first_window_position; prior = Ca half of the window before it); returns nothing else.
void feed(CompressedLayer& l, int64_t batch, int64_t from, int64_t n) {
  const int64_t r = l.compress_rate();
  const MaskSizes ms = l.mask_sizes(n);
  Tensor t = tokens(batch, from, n);
  const KVSpan span = l.update(t.view(), t.view());
  EXPECT_EQ(span.kv_offset, ms.kv_offset);
  EXPECT_EQ(span.k.shape(), Shape({batch, 1, ms.kv_length, kD}));
  EXPECT_EQ(span.v.data(), span.k.data());
  EXPECT_EQ(span.kv_offset + span.k.dim(2), from + n);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < span.k.dim(2); ++i)
      EXPECT_EQ(*span.k.ptr_as<float>(b, 0, i, 1), code(b, span.kv_offset + i, 1));
  for (CompressedStream s : {kComp, kIdx}) {
    if (s == kIdx && !l.has_indexer()) continue;
    const Widths w = widths(l, s);
    for (int64_t b = 0; b < batch; ++b) {
      Tensor kv = rows(b, from, n, w.width, 1.0f);
      Tensor gate = rows(b, from, n, w.width, -1.0f);
      const int64_t count = l.entry_count(s, b);
      const CompressionChunk ch = l.store_compression_weights(s, b, kv.view(), gate.view());
      EXPECT_EQ(ch.first_window_position, count * r);
      EXPECT_TRUE(holds(ch.kv, b, ch.first_window_position, ch.n_windows * r, w.width, 1.0f));
      EXPECT_TRUE(holds(ch.gate, b, ch.first_window_position, ch.n_windows * r, w.width, -1.0f));
      if (l.has_overlap() && ch.n_windows > 0) {
        const OverlapPrior pr = l.update_overlap_state(s, b, ch);
        if (ch.first_window_position == 0) {
          EXPECT_EQ(pr.kv.ndim(), 0);
          EXPECT_EQ(pr.gate.ndim(), 0);
        } else {
          EXPECT_EQ(pr.kv.shape(), Shape({r, w.width / 2}));
          EXPECT_TRUE(holds(pr.kv, b, ch.first_window_position - r, r, w.width / 2, 1.0f));
          EXPECT_TRUE(holds(pr.gate, b, ch.first_window_position - r, r, w.width / 2, -1.0f));
        }
      }
      const Tensor ent = window_means(b, ch.first_window_position, ch.n_windows, r, w.dim);
      l.update_compressor_states(s, b, ent.view());
    }
  }
}

// The state after `length` tokens, whatever the calls: buffer = rows [floor(L/r) r, L),
// entries = floor(L/r) window means at positions i r, overlap = Ca half of the last window.
void expect_state(const CompressedLayer& l, int64_t batch, int64_t length) {
  const int64_t r = l.compress_rate();
  const int64_t w = length / r;
  EXPECT_EQ(l.seq_length(), length);
  for (CompressedStream s : {kComp, kIdx}) {
    if (s == kIdx && !l.has_indexer()) continue;
    const Widths wd = widths(l, s);
    const KVSpan c = l.compressed(s);
    EXPECT_EQ(c.k.shape(), Shape({batch, 1, w, wd.dim}));
    EXPECT_EQ(c.v.data(), c.k.data());
    EXPECT_EQ(c.kv_offset, 0);
    for (int64_t b = 0; b < batch; ++b) {
      EXPECT_EQ(l.entry_count(s, b), w);
      EXPECT_TRUE(holds(l.buffer_kv(s, b), b, w * r, length - w * r, wd.width, 1.0f));
      EXPECT_TRUE(holds(l.buffer_gate(s, b), b, w * r, length - w * r, wd.width, -1.0f));
      for (int64_t i = 0; i < w; ++i)
        for (int64_t ch = 0; ch < wd.dim; ++ch)
          EXPECT_EQ(*c.k.ptr_as<float>(b, 0, i, ch),
                    code(b, i * r, ch) + 5.0f * static_cast<float>(r - 1))
              << "row " << b << " entry " << i;
      if (!l.has_overlap()) continue;
      if (w == 0) {
        EXPECT_EQ(l.overlap_kv(s, b).ndim(), 0);
      } else {
        EXPECT_TRUE(holds(l.overlap_kv(s, b), b, (w - 1) * r, r, wd.width / 2, 1.0f));
        EXPECT_TRUE(holds(l.overlap_gate(s, b), b, (w - 1) * r, r, wd.width / 2, -1.0f));
      }
    }
  }
}

// The literal tables: one step per row of `steps`, every stream and row checked after it.
void run_table(CompressedLayer& l, int64_t batch, const std::vector<Expect>& steps) {
  const int64_t r = l.compress_rate();
  int64_t from = 0;
  for (const Expect& e : steps) {
    SCOPED_TRACE("step of " + std::to_string(e.n) + " at " + std::to_string(from));
    for (CompressedStream s : {kComp, kIdx}) {
      if (s == kIdx && !l.has_indexer()) continue;
      const Widths w = widths(l, s);
      for (int64_t b = 0; b < batch; ++b) {
        Tensor kv = rows(b, from, e.n, w.width, 1.0f);
        Tensor gate = rows(b, from, e.n, w.width, -1.0f);
        if (s == kComp && b == 0) {
          Tensor t = tokens(batch, from, e.n);
          const MaskSizes ms = l.mask_sizes(e.n);
          const KVSpan span = l.update(t.view(), t.view());
          EXPECT_EQ(span.k.dim(2), ms.kv_length);
          EXPECT_EQ(span.kv_offset, ms.kv_offset);
        }
        const CompressionChunk ch = l.store_compression_weights(s, b, kv.view(), gate.view());
        EXPECT_EQ(ch.first_window_position, e.fwp);
        EXPECT_EQ(ch.n_windows, e.windows);
        EXPECT_TRUE(holds(ch.kv, b, e.fwp, e.windows * r, w.width, 1.0f));
        EXPECT_TRUE(holds(ch.gate, b, e.fwp, e.windows * r, w.width, -1.0f));
        if (l.has_overlap() && e.windows > 0) {
          const OverlapPrior pr = l.update_overlap_state(s, b, ch);
          if (e.prior < 0) {
            EXPECT_EQ(pr.kv.ndim(), 0);
          } else {
            EXPECT_TRUE(holds(pr.kv, b, e.prior * r, r, w.width / 2, 1.0f));
            EXPECT_TRUE(holds(pr.gate, b, e.prior * r, r, w.width / 2, -1.0f));
          }
        }
        const Tensor ent = window_means(b, e.fwp, e.windows, r, w.dim);
        l.update_compressor_states(s, b, ent.view());
        EXPECT_TRUE(holds(l.buffer_kv(s, b), b, e.buf_first, e.buf_len, w.width, 1.0f));
        EXPECT_TRUE(holds(l.buffer_gate(s, b), b, e.buf_first, e.buf_len, w.width, -1.0f));
        EXPECT_EQ(l.entry_count(s, b), e.entries);
        if (l.has_overlap()) {
          if (e.overlap < 0) {
            EXPECT_EQ(l.overlap_kv(s, b).ndim(), 0);
          } else {
            EXPECT_TRUE(holds(l.overlap_kv(s, b), b, e.overlap * r, r, w.width / 2, 1.0f));
          }
        }
      }
    }
    from += e.n;
    expect_state(l, batch, from);
  }
}

TEST(CompressedLayer, HcaRate4UpdatesOf1_3_4_5_9) {
  auto l = make("dynamic", kHca, 3, 4);
  EXPECT_FALSE(l->has_overlap());
  EXPECT_FALSE(l->has_indexer());
  EXPECT_EQ(l->compress_rate(), 4);
  //           n  fwp win buf   len ent prior ovl
  run_table(*l, 2,
            {{1, 0, 0, 0, 1, 0, -1, -1},      // [0] buffered
             {3, 0, 1, 4, 0, 1, -1, -1},      // window 0 = [0, 4)
             {4, 4, 1, 8, 0, 2, -1, -1},      // window 1 = [4, 8)
             {5, 8, 1, 12, 1, 3, -1, -1},     // window 2, [12] buffered
             {9, 12, 2, 20, 2, 5, -1, -1}});  // [12] + 13..19 -> windows 3, 4; [20, 22) buffered
}

TEST(CompressedLayer, HcaRate8UpdatesOf1_3_4_5_9) {
  auto l = make("dynamic", kHca, 3, 8);
  run_table(*l, 2,
            {{1, 0, 0, 0, 1, 0, -1, -1},
             {3, 0, 0, 0, 4, 0, -1, -1},
             {4, 0, 1, 8, 0, 1, -1, -1},     // window 0 = [0, 8)
             {5, 8, 0, 8, 5, 1, -1, -1},     // [8, 13) buffered
             {9, 8, 1, 16, 6, 2, -1, -1}});  // window 1 = [8, 16); [16, 22) buffered
}

TEST(CompressedLayer, CsaRate4UpdatesOf1_3_4_5_9WithOverlapAndIndexer) {
  auto l = make("dynamic", kCsa, 3, 4);
  EXPECT_TRUE(l->has_overlap());
  EXPECT_TRUE(l->has_indexer());
  run_table(*l, 2,
            {{1, 0, 0, 0, 1, 0, -1, -1},
             {3, 0, 1, 4, 0, 1, -1, 0},  // first window: no prior; keeps window 0's Ca
             {4, 4, 1, 8, 0, 2, 0, 1},   // prior = window 0's Ca half
             {5, 8, 1, 12, 1, 3, 1, 2},
             {9, 12, 2, 20, 2, 5, 2, 4}});  // two windows: prior 2, keeps the last (4)
}

TEST(CompressedLayer, AnySplitOfTheSequenceGivesTheSameState) {
  for (const char* type : {kHca, kCsa}) {
    for (int64_t rate : {1, 3, 4}) {
      SCOPED_TRACE(std::string(type) + " rate " + std::to_string(rate));
      auto l = make("dynamic", type, 5, rate);
      int64_t pos = 0;
      for (int64_t n : {2, 1, 7, 1, 1, 1, 12, 4, 3}) {
        feed(*l, 3, pos, n);
        pos += n;
        expect_state(*l, 3, pos);
      }
    }
  }
}

TEST(CompressedLayer, SlidingBranchIsAWindowOfKEqualsV) {
  auto l = make("dynamic", kHca, 4, 4);
  int64_t pos = 0;
  for (int64_t n : {6, 1, 1, 5}) {
    const MaskSizes ms = l->mask_sizes(n);
    EXPECT_EQ(ms.kv_offset, std::max<int64_t>(pos - 4 + 1, 0));
    EXPECT_EQ(ms.kv_length, pos + n - ms.kv_offset);
    feed(*l, 1, pos, n);  // checks the span against these sizes
    pos += n;
  }
  EXPECT_EQ(l->max_length(), -1);
  // K==V: the window's storage is one tensor, 2W slots of kD floats.
  EXPECT_EQ(l->sliding().bytes(), static_cast<size_t>(2 * 4 * kD * 4));
}

TEST(CompressedLayer, RecomputeEmitsOnlyEachCallsWholeWindowsWithoutPrior) {
  for (const char* type : {kHca, kCsa}) {
    SCOPED_TRACE(type);
    auto l = make("recompute", type, 3, 4);
    // Each call is the whole sequence from position 0 (the no-cache forward).
    for (int64_t n : {3, 6, 9, 4}) {
      EXPECT_EQ(l->mask_sizes(n).kv_length, n);
      EXPECT_EQ(l->mask_sizes(n).kv_offset, 0);
      feed(*l, 2, 0, n);  // first_window_position 0, no prior on the first window
      expect_state(*l, 2, n);
    }
    // A batch change between calls is a new sequence too.
    feed(*l, 1, 0, 5);
    expect_state(*l, 1, 5);
  }
}

TEST(CompressedLayer, ChunkOverlapAndEntriesRefuseMisuse) {
  auto hca = make("dynamic", kHca, 3, 4);
  Tensor kv = rows(0, 0, 4, 4, 1.0f);
  // Rows before the sliding update set the batch.
  EXPECT_THROW(hca->store_compression_weights(kComp, 0, kv.view(), kv.view()), Error);
  feed(*hca, 1, 0, 1);
  EXPECT_THROW(hca->store_compression_weights(kIdx, 0, kv.view(), kv.view()), Error);
  EXPECT_THROW(hca->compressed(kIdx), Error);
  EXPECT_THROW(hca->store_compression_weights(kComp, 1, kv.view(), kv.view()), Error);
  Tensor wide = rows(0, 1, 4, 6, 1.0f);
  EXPECT_THROW(hca->store_compression_weights(kComp, 0, wide.view(), wide.view()), Error);
  const CompressionChunk ch = hca->store_compression_weights(kComp, 0, kv.view(), kv.view());
  EXPECT_EQ(ch.n_windows, 1);
  EXPECT_THROW(hca->update_overlap_state(kComp, 0, ch), Error);  // HCA: no overlap
  Tensor two = Tensor::zeros(DType::kF32, {2, 4});
  EXPECT_THROW(hca->update_compressor_states(kComp, 0, two.view()), Error);  // 1 window only

  auto csa = make("dynamic", kCsa, 3, 4);
  feed(*csa, 1, 0, 2);
  Tensor k4 = rows(0, 2, 2, 4, 1.0f);
  const CompressionChunk ch2 = csa->store_compression_weights(kComp, 0, k4.view(), k4.view());
  EXPECT_EQ(ch2.n_windows, 1);
  CompressionChunk wrong = ch2;
  wrong.n_windows = 0;
  EXPECT_THROW(csa->update_overlap_state(kComp, 0, wrong), Error);
  Tensor odd = rows(0, 0, 1, 5, 1.0f);
  EXPECT_THROW(csa->store_compression_weights(kIdx, 0, odd.view(), odd.view()), Error);
}

TEST(CompressedLayer, MissingRateNamesTheLayerAndTheConfigKey) {
  CacheConfig cfg = config(3, 4);
  cfg.compressed.rates.erase(kCsa);
  try {
    LayerRegistry::create("dynamic", kCsa, cfg, 7);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layer 7"), std::string::npos) << m;
    EXPECT_NE(m.find("compress_rates"), std::string::npos) << m;
  }
  cfg.compressed.rates[kCsa] = 0;
  EXPECT_THROW(LayerRegistry::create("dynamic", kCsa, cfg, 7), Error);
  // No static container: the registry's error lists the registered ones.
  try {
    LayerRegistry::create("static", kHca, config(3, 4), 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("dynamic/heavily_compressed_attention"), std::string::npos)
        << e.what();
  }
}

TEST(CompressedLayer, CropWithoutRecordingOnlyToZeroOrTheEnd) {
  for (const char* type : {kHca, kCsa}) {
    SCOPED_TRACE(type);
    auto l = make("dynamic", type, 3, 4);
    int64_t pos = 0;
    for (int64_t n : {5, 4, 3}) {
      feed(*l, 2, pos, n);
      pos += n;
    }
    const size_t before = l->bytes();
    l->crop(pos);  // no-op
    l->crop(100);  // no-op
    expect_state(*l, 2, pos);
    for (int64_t to : {11, 10, 8, 1}) {
      try {
        l->crop(to);
        FAIL() << "crop(" << to << ") accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("activate_past_recording"), std::string::npos)
            << e.what();
      }
      expect_state(*l, 2, pos);  // a refused crop changes nothing
    }
    l->crop(0);  // v5: removes nothing
    expect_state(*l, 2, pos);
    l->crop(-13);  // more than stored: empties (v5), always reachable
    expect_state(*l, 2, 0);
    EXPECT_EQ(l->bytes(), before);
    feed(*l, 2, 0, 6);
    expect_state(*l, 2, 6);
  }
}

TEST(CompressedLayer, CropWithRecordingRebuildsBufferEntriesAndOverlap) {
  for (const char* type : {kHca, kCsa}) {
    for (int64_t to : {1, 4, 7, 8, 9, 12, 13, 17, 18}) {
      SCOPED_TRACE(std::string(type) + " crop to " + std::to_string(to));
      auto l = make("dynamic", type, 3, 4);
      l->activate_past_recording();
      EXPECT_TRUE(l->past_recording());
      int64_t pos = 0;
      for (int64_t n : {5, 3, 9, 1, 1}) {
        feed(*l, 2, pos, n);
        pos += n;
      }
      l->crop(to);
      expect_state(*l, 2, to);
      // Decoding on from there folds the right windows with the right priors (feed checks).
      feed(*l, 2, to, 6);
      expect_state(*l, 2, to + 6);
    }
  }
}

TEST(CompressedLayer, CropReachesBackToTheWindowWhereRecordingStarted) {
  auto l = make("dynamic", kCsa, 8, 4);
  feed(*l, 1, 0, 6);  // windows: [0, 4); buffer [4, 6)
  l->activate_past_recording();
  feed(*l, 1, 6, 3);
  feed(*l, 1, 9, 5);  // 14 tokens
  // Recording kept the rows from 4 (the buffer's first) and window 0's overlap.
  for (int64_t to : {3, 2}) {
    try {
      l->crop(to);
      FAIL() << "crop(" << to << ") accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("[4, 14]"), std::string::npos) << e.what();
    }
    expect_state(*l, 1, 14);
  }
  l->crop(5);
  expect_state(*l, 1, 5);
  feed(*l, 1, 5, 4);
  expect_state(*l, 1, 9);
  l->crop(4);  // overlap = the one recorded at activation
  expect_state(*l, 1, 4);
  feed(*l, 1, 4, 8);
  expect_state(*l, 1, 12);
}

TEST(CompressedLayer, RefusedByTheWindowChangesNothing) {
  // Recording from 6: the compressed state can go back to 4 (its window start), but the
  // window of 2 kept keys from 5 only: the window refuses, and nothing changes.
  auto l = make("dynamic", kHca, 2, 4);
  feed(*l, 1, 0, 6);
  l->activate_past_recording();
  feed(*l, 1, 6, 4);
  EXPECT_THROW(l->crop(4), Error);
  expect_state(*l, 1, 10);
  l->crop(6);
  expect_state(*l, 1, 6);
}

TEST(CompressedLayer, ResetForgetsAndKeepsMemory) {
  auto l = make("dynamic", kCsa, 3, 4);
  l->activate_past_recording();
  feed(*l, 2, 0, 9);
  feed(*l, 2, 9, 1);
  l->reset();
  expect_state(*l, 2, 0);
  feed(*l, 2, 0, 7);
  expect_state(*l, 2, 7);
}

TEST(CompressedLayer, ReorderSelectRepeatInterleaveMoveEveryRowState) {
  for (const char* type : {kHca, kCsa}) {
    SCOPED_TRACE(type);
    auto l = make("dynamic", type, 3, 4);
    l->activate_past_recording();
    feed(*l, 3, 0, 6);
    feed(*l, 3, 6, 3);  // 9: 2 entries, buffer [8]
    const std::vector<int64_t> perm = {2, 0, 1};
    l->reorder(perm);
    // Row i now holds old row perm[i]'s values: check against code(perm[i], ...).
    auto check = [&](const std::vector<int64_t>& from, int64_t length) {
      const int64_t r = 4, w = length / r;
      for (CompressedStream s : {kComp, kIdx}) {
        if (s == kIdx && !l->has_indexer()) continue;
        const Widths wd = widths(*l, s);
        const KVSpan c = l->compressed(s);
        ASSERT_EQ(c.k.dim(0), static_cast<int64_t>(from.size()));
        for (size_t i = 0; i < from.size(); ++i) {
          const auto row = static_cast<int64_t>(i);
          EXPECT_EQ(l->entry_count(s, row), w);
          EXPECT_TRUE(holds(l->buffer_kv(s, row), from[i], w * r, length - w * r, wd.width, 1.0f));
          EXPECT_EQ(*c.k.ptr_as<float>(row, 0, 1, 0), code(from[i], 4, 0) + 15.0f);
          if (l->has_overlap()) {
            EXPECT_TRUE(holds(l->overlap_kv(s, row), from[i], 4, 4, wd.width / 2, 1.0f));
          }
        }
      }
    };
    check(perm, 9);
    EXPECT_THROW(l->reorder(std::vector<int64_t>{0, 1}), Error);
    EXPECT_THROW(l->reorder(std::vector<int64_t>{0, 1, 3}), Error);
    check(perm, 9);
    l->select(std::vector<int64_t>{2});  // old row 1
    EXPECT_EQ(l->batch(), 1);
    check({1}, 9);
    l->repeat_interleave(2);
    EXPECT_EQ(l->batch(), 2);
    check({1, 1}, 9);
    // Recorded history moved too: crop back within it.
    l->crop(5);
    for (CompressedStream s : {kComp, kIdx}) {
      if (s == kIdx && !l->has_indexer()) continue;
      for (int64_t row : {0, 1}) {
        EXPECT_EQ(l->entry_count(s, row), 1);
        EXPECT_TRUE(holds(l->buffer_kv(s, row), 1, 4, 1, widths(*l, s).width, 1.0f));
      }
    }
  }
}

TEST(CompressedLayer, RowsAtDifferentPositionsHaveNoDenseSpan) {
  auto l = make("dynamic", kHca, 3, 4);
  Tensor t = tokens(2, 0, 4);
  l->update(t.view(), t.view());
  Tensor kv = rows(0, 0, 4, 4, 1.0f);
  l->store_compression_weights(kComp, 0, kv.view(), kv.view());
  Tensor e = Tensor::zeros(DType::kF32, {1, 4});
  l->update_compressor_states(kComp, 0, e.view());
  EXPECT_THROW(l->compressed(kComp), Error);
}

TEST(CompressedLayer, EntriesStoredInTheCacheDtype) {
  CacheConfig cfg = config(3, 4);
  cfg.options.kv_dtype = DType::kBF16;
  auto layer = LayerRegistry::create("dynamic", kHca, cfg, 0);
  auto& l = dynamic_cast<CompressedLayer&>(*layer);
  Tensor t = tokens(1, 0, 4);
  EXPECT_EQ(l.update(t.view(), t.view()).k.dtype(), DType::kBF16);
  Tensor kv = rows(0, 0, 4, 4, 1.0f);
  l.store_compression_weights(kComp, 0, kv.view(), kv.view());
  Tensor e = rows(0, 0, 1, 4, 1.0f);
  l.update_compressor_states(kComp, 0, e.view());
  const KVSpan c = l.compressed(kComp);
  EXPECT_EQ(c.k.dtype(), DType::kBF16);
  EXPECT_EQ(c.k.shape(), Shape({1, 1, 1, 4}));
}

// bytes(): window (2W slots, K only) + per stream buffers (rate-1 rows), overlap and prior
// (rate rows of width/2), the chunk workspace (its largest chunk) and the entries (reserved
// for the whole sequence), summed by hand; the entries alone are b d S / r per row, the
// notes' b·d·Σ1/r per token.
TEST(CompressedLayer, BytesExactOnALongSequence) {
  constexpr int64_t B = 2, W = 8, S = 512;
  for (const char* type : {kHca, kCsa}) {
    for (int64_t r : {4, 128}) {
      SCOPED_TRACE(std::string(type) + " rate " + std::to_string(r));
      auto l = make("dynamic", type, W, r);
      l->reserve(S);
      for (int64_t p = 0; p < S; ++p) feed(*l, B, p, 1);
      const size_t f = 4;                                     // f32
      size_t want = static_cast<size_t>(B * 2 * W * kD) * f;  // the K==V window
      size_t entries = 0;
      for (CompressedStream s : {kComp, kIdx}) {
        if (s == kIdx && !l->has_indexer()) continue;
        const Widths w = widths(*l, s);
        want += static_cast<size_t>(2 * B * (r - 1) * w.width) * f;  // buffers
        want += static_cast<size_t>(2 * r * w.width) * f;            // chunk: one window
        if (l->has_overlap()) {
          want += static_cast<size_t>(2 * B * r * (w.width / 2)) * f;  // overlaps
          want += static_cast<size_t>(2 * r * (w.width / 2)) * f;      // prior
        }
        entries += static_cast<size_t>(B * (S / r) * w.dim) * f;
      }
      EXPECT_EQ(l->bytes(), want + entries);
      // The notes' formula for the compressor's entries: b·d/r per token and row.
      const Widths wc = widths(*l, kComp);
      const double per_token = 4.0 * static_cast<double>(wc.dim) / static_cast<double>(r);
      EXPECT_EQ(static_cast<double>(l->compressed(kComp).k.numel() * 4),
                per_token * static_cast<double>(B * S));
    }
  }
}

TEST(CompressedLayer, RecordingCountsItsHistory) {
  auto l = make("dynamic", kCsa, 3, 4);
  feed(*l, 1, 0, 4);
  const size_t before = l->bytes();
  l->activate_past_recording();
  feed(*l, 1, 4, 40);
  // Every row fed since (40 per stream, kv and gate) is kept: at least that many bytes more,
  // on top of the window's growth.
  EXPECT_GE(l->bytes(), before + static_cast<size_t>(40 * 2 * (4 + 6)) * 4);
}

TEST(CompressedLayer, CacheCropAsksCompressedLayersFirst) {
  CacheConfig cfg = config(16, 4);
  cfg.layer_types = {"full_attention", kHca};
  Cache cache(cfg);
  auto& hca = dynamic_cast<CompressedLayer&>(cache.compressed_layer(1));
  Tensor kv = Tensor::zeros(DType::kF32, {1, 1, 10, kD});
  cache.update(0, kv.view(), kv.view());
  feed(hca, 1, 0, 10);
  // The window (16) could go back, the compressed state could not: nothing is cropped.
  EXPECT_THROW(hca.check_crop(5), Error);
  EXPECT_THROW(cache.crop(5), Error);
  EXPECT_EQ(cache.seq_length(0), 10);
  expect_state(hca, 1, 10);
  cache.crop(0);  // v5: removes nothing
  EXPECT_EQ(cache.seq_length(0), 10);
  cache.crop(-10);
  EXPECT_EQ(cache.seq_length(0), 0);
  expect_state(hca, 1, 0);
}

TEST(CompressedLayer, CacheGivesTheFaces) {
  CacheConfig cfg = config(3, 4);
  cfg.layer_types = {"sliding_attention", kHca, kCsa, "deepseek_sparse_attention"};
  cfg.kv_content = CacheConfig::KVContent::kSharedKV;
  Cache cache(cfg);
  EXPECT_EQ(cache.compressed_layer(1).compress_rate(), 4);
  EXPECT_TRUE(cache.compressed_layer(2).has_indexer());
  EXPECT_NO_THROW(cache.indexed_layer(3));
  try {
    cache.compressed_layer(0);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("sliding_attention"), std::string::npos) << m;
    EXPECT_NE(m.find("1, 2"), std::string::npos) << m;
  }
  EXPECT_THROW(cache.indexed_layer(1), Error);
}

}  // namespace
}  // namespace kvcache
