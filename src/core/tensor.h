// Tensor (owning, 64-byte aligned, contiguous) and TensorView (non-owning, strided, <= 4 dims).
// K/V use the logical layout [B, H_kv, S, D]. A view never owns memory and is valid only while
// its owner lives and does not reallocate. Copies are explicit: copy_view() / Tensor::clone().
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace kvcache {

inline constexpr int kMaxDims = 4;
inline constexpr size_t kTensorAlignment = 64;

using Dims = std::array<int64_t, kMaxDims>;

// Shape of up to 4 dims; unused trailing entries are 1 so that numel() is their product.
struct Shape {
  int ndim = 0;
  Dims dims{1, 1, 1, 1};

  Shape() = default;
  Shape(std::initializer_list<int64_t> d);
  int64_t operator[](int i) const { return dims[static_cast<size_t>(i)]; }
  int64_t numel() const;
  bool operator==(const Shape& o) const;
  std::string str() const;  // "[2, 4, 7, 64]"
};

class TensorView {
 public:
  TensorView() = default;
  // Contiguous (row-major) view of `data`.
  TensorView(void* data, DType dtype, const Shape& shape);
  // Strided view; strides count elements (for block dtypes: multiples of the block size except
  // a unit innermost stride).
  TensorView(void* data, DType dtype, const Shape& shape, const Dims& strides);

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return shape_.ndim; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t stride(int i) const { return strides_[static_cast<size_t>(i)]; }
  const Dims& strides() const { return strides_; }
  int64_t numel() const { return shape_.numel(); }
  bool empty() const { return data_ == nullptr && numel() == 0; }
  bool is_contiguous() const;

  // Byte offset of element (i0, i1, i2, i3) from data(); missing indices are 0.
  int64_t byte_offset(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const;
  void* ptr(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return static_cast<std::byte*>(data_) + byte_offset(i0, i1, i2, i3);
  }
  template <typename T>
  T* ptr_as(int64_t i0, int64_t i1 = 0, int64_t i2 = 0, int64_t i3 = 0) const {
    return static_cast<T*>(ptr(i0, i1, i2, i3));
  }

  // Sub-view of indices [begin, end) along `axis`; checked, throws Error on a bad range.
  TensorView slice(int axis, int64_t begin, int64_t end) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Dims strides_{0, 0, 0, 0};
};

// Frees memory from allocate_large (std::free).
struct AlignedFree {
  void operator()(std::byte* p) const;
};
// Storage for large streamed buffers (KV caches, block pools, long activations): at least
// 4 MiB is aligned to 2 MiB and offered for transparent huge pages (see tensor.cc), less is
// aligned to kTensorAlignment. Uninitialised. Null for bytes == 0 or when the allocation fails
// (the caller reports it: no message is built on the success path).
std::unique_ptr<std::byte, AlignedFree> allocate_large(size_t bytes);

// Untyped bytes with allocate_large's placement, zero-filled: packed KV blocks.
class ByteBuffer {
 public:
  ByteBuffer() = default;
  // Throws Error(kOutOfRange) when n bytes cannot be allocated.
  explicit ByteBuffer(size_t n);
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }
  void clear() {
    data_.reset();
    size_ = 0;
  }

 private:
  std::unique_ptr<std::byte, AlignedFree> data_;
  size_t size_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage. Throws Error for negative dims.
  static Tensor empty(DType dtype, const Shape& shape);
  static Tensor zeros(DType dtype, const Shape& shape);

  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;
  Tensor(const Tensor&) = delete;  // copies are explicit: clone()
  Tensor& operator=(const Tensor&) = delete;

  Tensor clone() const;
  TensorView view() const;
  void* data() const { return data_.get(); }
  template <typename T>
  T* data_as() const {
    return reinterpret_cast<T*>(data_.get());
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return shape_.numel(); }
  size_t size_bytes() const { return size_bytes_; }
  bool defined() const { return data_ != nullptr || size_bytes_ == 0; }

 private:
  std::unique_ptr<std::byte, AlignedFree> data_;
  size_t size_bytes_ = 0;
  DType dtype_ = DType::kF32;
  Shape shape_;
};

// Copies src into dst elementwise (same shape required, checked). Same dtype: bit-exact.
// Different float dtypes: converted with round-to-nearest-even. Returns bytes written.
size_t copy_view(const TensorView& src, const TensorView& dst);

}  // namespace kvcache
