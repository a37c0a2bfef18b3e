// Linear-attention state layers ("dynamic" / "static" linear_attention): the conv window and the
// recurrent state stored and returned as transformers v5's LinearAttentionLayer does, stable
// addresses, reset in place, batch-row operations, the Cache-level has_previous_state and
// lengths of a hybrid cache, and crop with past recording and snapshots.
#include "cache/linear_state_layer.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache_test_util.h"
#include "core/error.h"

namespace kvcache {
namespace {

using testing_util::random_tensor;

constexpr int64_t kK = 4;  // conv taps: the window keeps 3 inputs
constexpr int64_t kC = 5;  // conv channels
constexpr int64_t kHv = 2, kDk = 3, kDv = 4;

LinearStateShape test_shape() {
  return {.conv_kernel = kK, .conv_dim = kC, .heads_v = kHv, .head_dim_k = kDk, .head_dim_v = kDv};
}

CacheConfig hybrid_config(const std::string& implementation) {
  CacheConfig cfg;
  cfg.options.implementation = implementation;
  cfg.options.max_cache_len = 32;
  cfg.layer_types = {"linear_attention", "linear_attention", "linear_attention", "full_attention"};
  cfg.linear = test_shape();
  return cfg;
}

std::unique_ptr<LinearStateLayer> make_layer(bool fixed, int64_t max_batch = 0) {
  return std::make_unique<LinearStateLayer>(
      LinearStateParams{.name = fixed ? "static/linear_attention" : "dynamic/linear_attention",
                        .layer_index = 7,
                        .shape = test_shape(),
                        .max_batch_size = max_batch,
                        .fixed_rows = fixed});
}

// Every conv input per row ([row][token][channel]): the window at any position is its last
// K-1 tokens, zeros before the first.
struct ConvHistory {
  std::vector<std::vector<std::vector<float>>> rows;
  void append(const TensorView& x) {
    rows.resize(static_cast<size_t>(x.dim(0)));
    for (int64_t b = 0; b < x.dim(0); ++b)
      for (int64_t t = 0; t < x.dim(1); ++t) {
        std::vector<float> v(kC);
        for (int64_t c = 0; c < kC; ++c) v[static_cast<size_t>(c)] = *x.ptr_as<float>(b, t, c);
        rows[static_cast<size_t>(b)].push_back(v);
      }
  }
  float window_at(int64_t b, int64_t pos, int64_t i, int64_t c) const {
    const int64_t t = pos - (kK - 1) + i;
    return t < 0 ? 0.0f
                 : rows[static_cast<size_t>(b)][static_cast<size_t>(t)][static_cast<size_t>(c)];
  }
};

::testing::AssertionResult window_is(const TensorView& st, const ConvHistory& h, int64_t pos) {
  for (int64_t b = 0; b < st.dim(0); ++b)
    for (int64_t i = 0; i < kK - 1; ++i)
      for (int64_t c = 0; c < kC; ++c)
        if (*st.ptr_as<float>(b, i, c) != h.window_at(b, pos, i, c))
          return ::testing::AssertionFailure() << "row " << b << " slot " << i << " channel " << c
                                               << " differs from the window at " << pos;
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult all_zero(const TensorView& v) {
  const auto* p = static_cast<const float*>(v.data());
  for (int64_t i = 0; i < v.numel(); ++i)
    if (p[i] != 0.0f) return ::testing::AssertionFailure() << "element " << i << " is " << p[i];
  return ::testing::AssertionSuccess();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool has(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

TEST(LinearStateLayer, RegisteredForDynamicStaticRecomputeAndPaged) {
  EXPECT_TRUE(LayerRegistry::contains("dynamic", "linear_attention"));
  EXPECT_TRUE(LayerRegistry::contains("static", "linear_attention"));
  EXPECT_TRUE(LayerRegistry::contains("recompute", "linear_attention"));
  // The paged one needs the shared store (tests/cache/paged_linear_test.cc).
  EXPECT_TRUE(LayerRegistry::contains("paged", "linear_attention"));
  const std::string paged = error_of([&] { Cache c(hybrid_config("paged")); });
  EXPECT_TRUE(has(paged, "layer 0 (paged/linear_attention)") && has(paged, "paged.store")) << paged;
  for (const char* impl : {"quantized"}) {
    const std::string msg = error_of([&] { Cache c(hybrid_config(impl)); });
    EXPECT_TRUE(has(msg, "layer 0 (quantized/linear_attention)") && has(msg, "use --cache dynamic"))
        << impl << ": " << msg;
  }
}

TEST(LinearStateLayer, MissingShapeIsAnErrorNamingTheConfigField) {
  CacheConfig cfg = hybrid_config("dynamic");
  cfg.linear = {};
  const std::string msg = error_of([&] { Cache c(cfg); });
  EXPECT_TRUE(has(msg, "layer 0 (dynamic/linear_attention)") && has(msg, "CacheConfig::linear"))
      << msg;
}

TEST(LinearStateLayer, HybridCacheForDynamicAndStatic) {
  std::mt19937 rng(1);
  for (const char* impl : {"dynamic", "static"}) {
    Cache cache(hybrid_config(impl));
    ASSERT_EQ(cache.num_layers(), 4);
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(cache.is_linear(i)) << i;
    EXPECT_FALSE(cache.is_linear(3));
    const Tensor x = random_tensor(DType::kF32, {1, 5, kC}, rng);
    const Tensor s = random_tensor(DType::kF32, {1, kHv, kDk, kDv}, rng);
    const Tensor k = random_tensor(DType::kF32, {1, 2, 5, 8}, rng);
    for (int i = 0; i < 3; ++i) {
      cache.update_conv_state(i, x.view());
      cache.update_recurrent_state(i, s.view());
    }
    cache.update(3, k.view(), k.view());
    // The lengths with no layer come from the attention layer; a linear layer has no capacity.
    EXPECT_EQ(cache.seq_length(), 5);
    EXPECT_EQ(cache.max_length(), std::string(impl) == "static" ? 32 : -1) << impl;
    EXPECT_EQ(cache.max_length(0), -1);
    EXPECT_EQ(cache.seq_length(1), 5);  // tokens given to its conv
    EXPECT_EQ(cache.linear_layer(2).name(), std::string(impl) + "/linear_attention");
    EXPECT_GT(cache.bytes(),
              3 * sizeof(float) * static_cast<size_t>((kK - 1) * kC + kHv * kDk * kDv));
  }
}

TEST(LinearStateLayer, ConvStateKeepsTheLastInputsAndReturnsThePreviousWindow) {
  std::mt19937 rng(2);
  auto layer = make_layer(false);
  ConvHistory h;
  int64_t pos = 0;
  const void* address = nullptr;
  for (int64_t t : {2, 1, 5, 1, 3}) {
    const Tensor x = random_tensor(DType::kF32, {2, t, kC}, rng);
    const ConvStateUpdate u = layer->update_conv_state(x.view());
    EXPECT_TRUE(window_is(u.previous, h, pos)) << "previous, before " << pos + t;
    h.append(x.view());
    pos += t;
    EXPECT_TRUE(window_is(u.state, h, pos)) << "state at " << pos;
    EXPECT_TRUE(window_is(layer->conv_state(), h, pos));
    EXPECT_EQ(layer->seq_length(), pos);
    if (address != nullptr) {
      EXPECT_EQ(u.state.data(), address) << "the stored window moved";
    }
    address = u.state.data();
  }
  // Any float dtype is converted; a wrong channel count is an error naming the expected shape.
  const Tensor half = random_tensor(DType::kF16, {2, 1, kC}, rng);
  layer->update_conv_state(half.view());
  const Tensor bad = random_tensor(DType::kF32, {2, 1, kC + 1}, rng);
  const std::string msg = error_of([&] { layer->update_conv_state(bad.view()); });
  EXPECT_TRUE(has(msg, "layer 7") && has(msg, "[B, T, 5]")) << msg;
  const Tensor other_batch = random_tensor(DType::kF32, {3, 1, kC}, rng);
  EXPECT_TRUE(has(error_of([&] { layer->update_conv_state(other_batch.view()); }), "batch 3"));
}

// recompute/linear_attention (the no-cache forward): each update_conv_state is a new sequence
// from the zero state, of any batch; the recurrent state is zeroed with it.
TEST(LinearStateLayer, RecomputeStartsEveryCallFromTheZeroState) {
  std::mt19937 rng(12);
  CacheConfig cfg = hybrid_config("recompute");
  Cache cache(cfg);
  ASSERT_TRUE(cache.is_linear(0));
  EXPECT_EQ(cache.linear_layer(0).name(), "recompute/linear_attention");
  for (int64_t batch : {2, 1, 3}) {
    const Tensor x = random_tensor(DType::kF32, {batch, 2, kC}, rng);
    const ConvStateUpdate u = cache.update_conv_state(0, x.view());
    for (int64_t i = 0; i < u.previous.numel(); ++i)
      EXPECT_EQ(u.previous.data_as<float>()[i], 0.0f) << "batch " << batch;
    const TensorView rec = cache.linear_layer(0).recurrent_state();
    for (int64_t i = 0; i < rec.numel(); ++i)
      ASSERT_EQ(rec.data_as<float>()[i], 0.0f) << "batch " << batch;
    EXPECT_EQ(cache.seq_length(0), 2);
    // What a kernel would leave in the state: the next call must not see it.
    rec.data_as<float>()[0] = 3.0f;
    cache.update_recurrent_state(0, rec);
  }
}

TEST(LinearStateLayer, RecurrentStateIsCopiedIntoAStableStore) {
  std::mt19937 rng(3);
  auto layer = make_layer(true, 2);
  ASSERT_TRUE(layer->is_initialized());  // max_batch_size: allocated at construction
  const Tensor s = random_tensor(DType::kF32, {2, kHv, kDk, kDv}, rng);
  const TensorView stored = layer->update_recurrent_state(s.view());
  const void* address = stored.data();
  EXPECT_NE(address, s.data());
  EXPECT_TRUE(testing_util::views_equal(stored, s.view()));
  // The kernel's in-place path: write the stored state, hand it back (no copy, same view).
  stored.data_as<float>()[0] = 42.0f;
  const TensorView again = layer->update_recurrent_state(layer->recurrent_state());
  EXPECT_EQ(again.data(), address);
  EXPECT_EQ(again.data_as<float>()[0], 42.0f);
  const Tensor bad = random_tensor(DType::kF32, {2, kHv, kDk + 1, kDv}, rng);
  const std::string msg = error_of([&] { layer->update_recurrent_state(bad.view()); });
  EXPECT_TRUE(has(msg, "layer 7 (static/linear_attention)") && has(msg, "[B, 2, 3, 4]")) << msg;
}

TEST(LinearStateLayer, AttentionCallsAreErrorsNamingTheLayerType) {
  std::mt19937 rng(4);
  auto layer = make_layer(false);
  const Tensor k = random_tensor(DType::kF32, {1, 1, 1, 4}, rng);
  std::string msg = error_of([&] { layer->update(k.view(), k.view()); });
  EXPECT_TRUE(has(msg, "layer 7") && has(msg, "linear_attention") && has(msg, "update_conv_state"))
      << msg;
  EXPECT_TRUE(has(error_of([&] { layer->mask_sizes(1); }), "no attention mask"));
  EXPECT_EQ(layer->max_length(), -1);
  Cache cache(hybrid_config("dynamic"));
  const Tensor x = random_tensor(DType::kF32, {1, 1, kC}, rng);
  msg = error_of([&] { cache.update_conv_state(3, x.view()); });
  EXPECT_TRUE(has(msg, "layer 3 is a 'full_attention' layer") && has(msg, "0, 1, 2")) << msg;
}

TEST(LinearStateLayer, HasPreviousStateDefaultsToTheLastLinearLayer) {
  std::mt19937 rng(5);
  Cache cache(hybrid_config("static"));
  EXPECT_FALSE(cache.has_previous_state());
  const Tensor x = random_tensor(DType::kF32, {1, 2, kC}, rng);
  cache.update_conv_state(0, x.view());
  EXPECT_TRUE(cache.has_previous_state(0));
  EXPECT_FALSE(cache.has_previous_state());  // layer 2, the last linear layer
  cache.update_conv_state(2, x.view());
  EXPECT_TRUE(cache.has_previous_state());
  std::string msg = error_of([&] { (void)cache.has_previous_state(3); });
  EXPECT_TRUE(has(msg, "layer 3") && has(msg, "full_attention")) << msg;
  CacheConfig attention_only;
  attention_only.layer_types = {"full_attention"};
  Cache plain(attention_only);
  msg = error_of([&] { (void)plain.has_previous_state(); });
  EXPECT_TRUE(has(msg, "has none")) << msg;
  cache.reset();
  EXPECT_FALSE(cache.has_previous_state(0));
}

TEST(LinearStateLayer, ResetZeroesInPlace) {
  std::mt19937 rng(6);
  for (bool fixed : {false, true}) {
    auto layer = make_layer(fixed);
    const Tensor x = random_tensor(DType::kF32, {2, 3, kC}, rng);
    const Tensor s = random_tensor(DType::kF32, {2, kHv, kDk, kDv}, rng);
    const void* conv = layer->update_conv_state(x.view()).state.data();
    const void* rec = layer->update_recurrent_state(s.view()).data();
    ASSERT_FALSE(all_zero(layer->conv_state()));
    layer->reset();
    EXPECT_EQ(layer->conv_state().data(), conv);
    EXPECT_EQ(layer->recurrent_state().data(), rec);
    EXPECT_TRUE(all_zero(layer->conv_state()));
    EXPECT_TRUE(all_zero(layer->recurrent_state()));
    EXPECT_EQ(layer->seq_length(), 0);
    EXPECT_FALSE(layer->has_previous_state());
  }
}

// Row r of both states holds r + 1 everywhere (distinct rows).
void fill_rows(LinearStateLayer& layer, int64_t batch) {
  Tensor x = Tensor::empty(DType::kF32, {batch, kK - 1, kC});
  Tensor s = Tensor::empty(DType::kF32, {batch, kHv, kDk, kDv});
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < (kK - 1) * kC; ++i)
      x.data_as<float>()[b * (kK - 1) * kC + i] = static_cast<float>(b + 1);
    for (int64_t i = 0; i < kHv * kDk * kDv; ++i)
      s.data_as<float>()[b * kHv * kDk * kDv + i] = static_cast<float>(b + 1);
  }
  layer.update_conv_state(x.view());
  layer.update_recurrent_state(s.view());
}

// Every element of row b of both states equals want[b].
::testing::AssertionResult rows_are(const LinearStateLayer& layer, const std::vector<float>& want) {
  if (layer.batch() != static_cast<int64_t>(want.size()))
    return ::testing::AssertionFailure() << "batch " << layer.batch() << ", want " << want.size();
  for (const TensorView& v : {layer.conv_state(), layer.recurrent_state()}) {
    const int64_t per_row = v.numel() / v.dim(0);
    for (int64_t b = 0; b < v.dim(0); ++b)
      for (int64_t i = 0; i < per_row; ++i)
        if (static_cast<const float*>(v.data())[b * per_row + i] != want[static_cast<size_t>(b)])
          return ::testing::AssertionFailure() << "row " << b << " element " << i;
  }
  return ::testing::AssertionSuccess();
}

TEST(LinearStateLayer, ReorderSelectRepeatActOnRows) {
  for (bool fixed : {false, true}) {
    auto layer = make_layer(fixed, fixed ? 6 : 0);
    fill_rows(*layer, 3);
    const void* address = layer->recurrent_state().data();
    const std::vector<int64_t> beams = {2, 0, 0};
    layer->reorder(beams);
    EXPECT_TRUE(rows_are(*layer, {3, 1, 1})) << fixed;
    const std::vector<int64_t> keep = {0, 1};
    layer->select(keep);
    EXPECT_TRUE(rows_are(*layer, {3, 1})) << fixed;
    layer->repeat_interleave(3);
    EXPECT_TRUE(rows_are(*layer, {3, 3, 3, 1, 1, 1})) << fixed;
    if (fixed) {
      EXPECT_EQ(layer->recurrent_state().data(), address) << "a static state moved";
    }
    const std::vector<int64_t> wrong = {0, 9};
    EXPECT_TRUE(has(error_of([&] { layer->select(wrong); }), "row 9 outside the batch [0, 6)"));
    EXPECT_TRUE(has(error_of([&] { layer->reorder(wrong); }), "2 beam indices for a batch of 6"));
  }
  // A static state never grows past its rows.
  auto layer = make_layer(true, 2);
  fill_rows(*layer, 2);
  const std::string msg = error_of([&] { layer->repeat_interleave(2); });
  EXPECT_TRUE(has(msg, "static state never moves") && has(msg, "max_batch_size")) << msg;
  EXPECT_TRUE(rows_are(*layer, {1, 2}));
}

TEST(LinearStateLayer, CropWithoutRecordingIsRefusedExceptToZeroOrTheEnd) {
  std::mt19937 rng(7);
  auto layer = make_layer(false);
  const Tensor x = random_tensor(DType::kF32, {1, 4, kC}, rng);
  layer->update_conv_state(x.view());
  const std::string msg = error_of([&] { layer->crop(-1); });
  EXPECT_TRUE(has(msg, "layer 7") && has(msg, "crop to 3 of 4") &&
              has(msg, "activate_past_recording()"))
      << msg;
  EXPECT_EQ(layer->seq_length(), 4);
  layer->crop(4);  // no-op
  layer->crop(10);
  EXPECT_EQ(layer->seq_length(), 4);
  layer->crop(0);  // v5: removes nothing
  EXPECT_EQ(layer->seq_length(), 4);
  layer->crop(-4);  // the zero state is always known
  EXPECT_EQ(layer->seq_length(), 0);
  EXPECT_TRUE(all_zero(layer->conv_state()));
  EXPECT_FALSE(layer->has_previous_state());
}

TEST(LinearStateLayer, CropRestoresConvWindowAndSnapshottedRecurrentState) {
  std::mt19937 rng(8);
  for (bool fixed : {false, true}) {
    auto layer = make_layer(fixed, 2);
    ConvHistory h;
    std::vector<Tensor> states;  // recurrent state after each step
    auto step = [&](int64_t t) {
      const Tensor x = random_tensor(DType::kF32, {2, t, kC}, rng);
      layer->update_conv_state(x.view());
      h.append(x.view());
      states.push_back(random_tensor(DType::kF32, {2, kHv, kDk, kDv}, rng));
      layer->update_recurrent_state(states.back().view());
    };
    step(3);                           // position 3
    layer->activate_past_recording();  // snapshot at 3
    step(2);                           // 5
    layer->snapshot();                 // snapshot at 5
    step(1);                           // 6
    step(2);                           // 8
    EXPECT_EQ(layer->snapshot_positions(), (std::vector<int64_t>{3, 5}));
    // Position 6 has a conv window (recorded inputs) but no recurrent snapshot: refused.
    std::string msg = error_of([&] { layer->crop(6); });
    EXPECT_TRUE(has(msg, "crop to 6 of 8") && has(msg, "snapshots at: 3, 5")) << msg;
    msg = error_of([&] { layer->crop(2); });
    EXPECT_TRUE(has(msg, "conv inputs start at position 3")) << msg;
    EXPECT_EQ(layer->seq_length(), 8);  // refusals change nothing
    layer->crop(-3);                    // back to 5
    EXPECT_EQ(layer->seq_length(), 5);
    EXPECT_TRUE(window_is(layer->conv_state(), h, 5));
    EXPECT_TRUE(testing_util::views_equal(layer->recurrent_state(), states[1].view()));
    EXPECT_TRUE(layer->has_previous_state());
    // v5's crop also restricts the layer to its working size: recording restarts at 5 and the
    // snapshot at 3 is gone (a later crop returns at most to 5).
    EXPECT_EQ(layer->snapshot_positions(), (std::vector<int64_t>{5}));
    // Continue from 5 (the inputs after 5 are forgotten), then back to the snapshot at 5.
    h.rows[0].resize(5);
    h.rows[1].resize(5);
    step(4);  // 9
    EXPECT_TRUE(window_is(layer->conv_state(), h, 9));
    msg = error_of([&] { layer->crop(-6); });
    EXPECT_TRUE(has(msg, "conv inputs start at position 5")) << msg;
    layer->crop(-4);
    EXPECT_TRUE(window_is(layer->conv_state(), h, 5));
    EXPECT_TRUE(testing_util::views_equal(layer->recurrent_state(), states[1].view()));
    EXPECT_EQ(layer->snapshot_positions(), (std::vector<int64_t>{5}));
  }
}

TEST(LinearStateLayer, AutoSnapshotsKeepTheNewestForwardBoundaries) {
  std::mt19937 rng(12);
  CacheConfig cfg = hybrid_config("dynamic");
  cfg.layer_types = {"linear_attention"};
  cfg.options.linear_state.auto_snapshots = 2;
  Cache cache(cfg);
  auto& layer = dynamic_cast<LinearStateLayer&>(cache.linear_layer(0));
  cache.activate_past_recording();
  ConvHistory h;
  std::vector<Tensor> states;
  for (int64_t t : {2, 1, 3}) {  // forward boundaries 2, 3, 6
    const Tensor x = random_tensor(DType::kF32, {1, t, kC}, rng);
    cache.update_conv_state(0, x.view());
    h.append(x.view());
    states.push_back(random_tensor(DType::kF32, {1, kHv, kDk, kDv}, rng));
    cache.update_recurrent_state(0, states.back().view());
  }
  EXPECT_EQ(layer.snapshot_positions(), (std::vector<int64_t>{3, 6}));
  // The inputs before the oldest snapshot's window are gone: position 2 cannot come back.
  const std::string msg = error_of([&] { cache.crop(2); });
  EXPECT_TRUE(has(msg, "conv inputs start at position 3")) << msg;
  const size_t before = layer.bytes();
  cache.crop(-3);
  EXPECT_EQ(cache.seq_length(), 3);
  EXPECT_TRUE(window_is(layer.conv_state(), h, 3));
  EXPECT_TRUE(testing_util::views_equal(layer.recurrent_state(), states[1].view()));
  EXPECT_LE(layer.bytes(), before);
  cfg.options.linear_state.auto_snapshots = -1;
  EXPECT_TRUE(has(error_of([&] { Cache c(cfg); }), "auto_snapshots must be >= 0"));
}

TEST(LinearStateLayer, CropFollowsRowOperations) {
  std::mt19937 rng(9);
  auto layer = make_layer(false);
  layer->activate_past_recording();  // from position 0
  fill_rows(*layer, 2);              // position 3, rows 1 and 2
  layer->snapshot();
  const Tensor x = random_tensor(DType::kF32, {2, 2, kC}, rng);
  layer->update_conv_state(x.view());
  const std::vector<int64_t> beams = {1, 1};
  layer->reorder(beams);
  layer->crop(3);
  EXPECT_TRUE(rows_are(*layer, {2, 2}));
}

TEST(LinearStateLayer, CacheCropChecksLinearLayersBeforeChangingAny) {
  std::mt19937 rng(10);
  // The attention layer first: a refusal found while cropping layer by layer would come after
  // it had been cropped.
  CacheConfig cfg = hybrid_config("dynamic");
  cfg.layer_types = {"full_attention", "linear_attention", "linear_attention"};
  Cache cache(cfg);
  const Tensor x = random_tensor(DType::kF32, {1, 4, kC}, rng);
  const Tensor k = random_tensor(DType::kF32, {1, 2, 4, 8}, rng);
  auto step = [&] {
    cache.update(0, k.view(), k.view());
    for (int i = 1; i < 3; ++i) cache.update_conv_state(i, x.view());
  };
  step();
  const std::string msg = error_of([&] { cache.crop(-2); });
  EXPECT_TRUE(has(msg, "layer 1 (dynamic/linear_attention)")) << msg;
  EXPECT_EQ(cache.seq_length(0), 4) << "the attention layer was cropped before the refusal";
  // With recording and a snapshot there, the whole cache goes back together.
  cache.activate_past_recording();
  cache.snapshot_linear_states();
  step();
  cache.crop(4);
  EXPECT_EQ(cache.seq_length(), 4);
  EXPECT_EQ(cache.seq_length(1), 4);
  EXPECT_EQ(cache.seq_length(2), 4);
}

TEST(LinearStateLayer, SharedLinearLayersAreRefused) {
  CacheConfig cfg = hybrid_config("dynamic");
  cfg.layer_types = {"linear_attention", "full_attention", "linear_attention"};
  cfg.num_kv_shared_layers = 1;
  const std::string msg = error_of([&] { Cache c(cfg); });
  EXPECT_TRUE(has(msg, "layer 2") && has(msg, "own state")) << msg;
}

TEST(LinearStateLayer, StaticBatchBeyondMaxBatchSizeIsAnError) {
  std::mt19937 rng(11);
  auto layer = make_layer(true, 2);
  const Tensor x = random_tensor(DType::kF32, {3, 1, kC}, rng);
  const std::string msg = error_of([&] { layer->update_conv_state(x.view()); });
  EXPECT_TRUE(has(msg, "batch 3 exceeds max_batch_size 2")) << msg;
}

}  // namespace
}  // namespace kvcache
