// Helpers for the cache tests: seeded random K/V, an exact (bitwise) view comparison, and a
// naive reference history that concatenates every update (what transformers' torch.cat does)
// so that any container's returned span can be checked against the slice it must equal.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/paged_store.h"
#include "core/tensor.h"

namespace kvcache::testing_util {

inline Tensor random_tensor(DType dt, const Shape& shape, std::mt19937& rng) {
  Tensor f = Tensor::empty(DType::kF32, shape);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] = dist(rng);
  if (dt == DType::kF32) return f;
  Tensor t = Tensor::empty(dt, shape);
  copy_view(f.view(), t.view());
  return t;
}

// Bitwise equality of two views of the same shape and dtype, element by element.
inline ::testing::AssertionResult views_equal(const TensorView& a, const TensorView& b) {
  if (!(a.shape() == b.shape()))
    return ::testing::AssertionFailure()
           << "shapes " << a.shape().str() << " vs " << b.shape().str();
  if (a.dtype() != b.dtype())
    return ::testing::AssertionFailure()
           << "dtypes " << dtype_name(a.dtype()) << " vs " << dtype_name(b.dtype());
  const size_t es = dtype_elem_size(a.dtype());
  for (int64_t i0 = 0; i0 < a.dim(0); ++i0)
    for (int64_t i1 = 0; i1 < a.dim(1); ++i1)
      for (int64_t i2 = 0; i2 < a.dim(2); ++i2)
        for (int64_t i3 = 0; i3 < a.dim(3); ++i3)
          if (std::memcmp(a.ptr(i0, i1, i2, i3), b.ptr(i0, i1, i2, i3), es) != 0)
            return ::testing::AssertionFailure()
                   << "differ at [" << i0 << ", " << i1 << ", " << i2 << ", " << i3 << "]";
  return ::testing::AssertionSuccess();
}

// Every token ever appended, [B, H, S, D] in the storage dtype, rebuilt on each append.
class History {
 public:
  explicit History(DType dtype) : dtype_(dtype) {}
  void append(const TensorView& k, const TensorView& v) {
    k_ = cat(k_, k);
    v_ = cat(v_, v);
  }
  int64_t length() const { return k_.shape().ndim == 0 ? 0 : k_.dim(2); }
  TensorView k(int64_t from, int64_t to) const { return k_.view().slice(2, from, to); }
  TensorView v(int64_t from, int64_t to) const { return v_.view().slice(2, from, to); }
  // Row i becomes old row rows[i].
  void gather(const std::vector<int64_t>& rows) {
    k_ = gather_rows(k_, rows);
    v_ = gather_rows(v_, rows);
  }
  void crop(int64_t to) {
    k_ = copy_of(k_.view().slice(2, 0, to));
    v_ = copy_of(v_.view().slice(2, 0, to));
  }

 private:
  Tensor copy_of(const TensorView& src) const {
    Tensor t = Tensor::empty(dtype_, src.shape());
    copy_view(src, t.view());
    return t;
  }
  Tensor gather_rows(const Tensor& t, const std::vector<int64_t>& rows) const {
    Tensor out =
        Tensor::empty(dtype_, {static_cast<int64_t>(rows.size()), t.dim(1), t.dim(2), t.dim(3)});
    for (size_t i = 0; i < rows.size(); ++i)
      copy_view(t.view().slice(0, rows[i], rows[i] + 1),
                out.view().slice(0, static_cast<int64_t>(i), static_cast<int64_t>(i) + 1));
    return out;
  }
  Tensor cat(const Tensor& old, const TensorView& add) const {
    const int64_t s0 = old.shape().ndim == 0 ? 0 : old.dim(2);
    Tensor t = Tensor::empty(dtype_, {add.dim(0), add.dim(1), s0 + add.dim(2), add.dim(3)});
    if (s0 > 0) copy_view(old.view(), t.view().slice(2, 0, s0));
    copy_view(add, t.view().slice(2, s0, s0 + add.dim(2)));
    return t;
  }
  DType dtype_;
  Tensor k_, v_;
};

// A "paged" cache config whose layers all write into `store` (its layer types, window, block
// size and compressed shape); the caller adds what else the model dictates (linear shape, ...).
inline CacheConfig paged_config_over(const std::shared_ptr<PagedKVStore>& store) {
  const PagedStoreConfig& sc = store->config();
  CacheConfig cc;
  cc.options.implementation = "paged";
  cc.options.paged.block_tokens = sc.block_tokens;
  cc.options.paged.store = store;
  cc.layer_types = sc.layer_types;
  cc.sliding_window = sc.sliding_window;
  cc.compressed = sc.compressed;
  return cc;
}

}  // namespace kvcache::testing_util
