#include "core/tensor.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"

namespace kvcache {
namespace {

TEST(Tensor, AlignedAndSized) {
  Tensor t = Tensor::empty(DType::kF16, {2, 3, 5, 7});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % kTensorAlignment, 0u);
  EXPECT_EQ(t.size_bytes(), 2u * 3 * 5 * 7 * 2);
  EXPECT_EQ(t.numel(), 210);
  Tensor z = Tensor::zeros(DType::kF32, {3});
  EXPECT_EQ(z.data_as<float>()[2], 0.0f);
  EXPECT_THROW(Tensor::empty(DType::kF32, {2, -1}), Error);
  EXPECT_THROW(Tensor::empty(DType::kF32, {1, 2, 3, 4, 5}), Error);
}

TEST(Tensor, CloneIsDeepAndExplicit) {
  Tensor a = Tensor::empty(DType::kF32, {4});
  std::iota(a.data_as<float>(), a.data_as<float>() + 4, 1.0f);
  Tensor b = a.clone();
  EXPECT_NE(a.data(), b.data());
  b.data_as<float>()[0] = 9;
  EXPECT_EQ(a.data_as<float>()[0], 1.0f);
  static_assert(!std::is_copy_constructible_v<Tensor>);
}

TEST(TensorView, StridesSliceAndOffsets) {
  Tensor t = Tensor::empty(DType::kF32, {2, 3, 4, 5});
  float* p = t.data_as<float>();
  std::iota(p, p + t.numel(), 0.0f);
  TensorView v = t.view();
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(*v.ptr_as<float>(1, 2, 3, 4), 119.0f);
  TensorView s = v.slice(2, 1, 3);  // [2, 3, 2, 5]
  EXPECT_EQ(s.shape(), Shape({2, 3, 2, 5}));
  EXPECT_FALSE(s.is_contiguous());
  EXPECT_EQ(*s.ptr_as<float>(0, 0, 0, 0), 5.0f);
  EXPECT_EQ(*s.ptr_as<float>(1, 1, 1, 2), 60.0f + 20 + 10 + 2);
  EXPECT_THROW(v.slice(2, 3, 5), Error);
  EXPECT_THROW(v.slice(4, 0, 1), Error);
}

TEST(TensorView, CopyViewExactAndConverting) {
  Tensor a = Tensor::empty(DType::kF32, {2, 3, 4, 5});
  float* p = a.data_as<float>();
  for (int64_t i = 0; i < a.numel(); ++i) p[i] = static_cast<float>(i) * 0.37f - 7.0f;
  Tensor b = Tensor::zeros(DType::kF32, {2, 3, 2, 5});
  EXPECT_EQ(copy_view(a.view().slice(2, 2, 4), b.view()), b.size_bytes());
  EXPECT_EQ(*b.view().ptr_as<float>(1, 2, 1, 4), *a.view().ptr_as<float>(1, 2, 3, 4));
  Tensor h = Tensor::zeros(DType::kF16, {2, 3, 4, 5});
  copy_view(a.view(), h.view());
  EXPECT_EQ(*h.view().ptr_as<f16_t>(1, 1, 1, 1), f32_to_f16(*a.view().ptr_as<float>(1, 1, 1, 1)));
  EXPECT_THROW(copy_view(a.view(), b.view()), Error);
}

TEST(ThreadPool, RunsEveryTaskOnce) {
  ThreadPool pool(3);
  std::vector<int> hits(1000, 0);
  for (int rep = 0; rep < 20; ++rep) pool.parallel_for(1000, [&](int64_t t) { hits[t]++; });
  for (int h : hits) EXPECT_EQ(h, 20);
}

}  // namespace
}  // namespace kvcache
