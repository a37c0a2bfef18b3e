#include "core/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "core/error.h"

namespace kvcache {

Shape::Shape(std::initializer_list<int64_t> d) {
  if (d.size() > static_cast<size_t>(kMaxDims)) {
    throw Error(ErrorKind::kInvalidArgument,
                "tensor shape has " + std::to_string(d.size()) + " dims; at most 4 are supported");
  }
  ndim = static_cast<int>(d.size());
  size_t i = 0;
  for (int64_t v : d) {
    if (v < 0) throw Error(ErrorKind::kInvalidArgument, "tensor shape has a negative dimension");
    dims[i++] = v;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= dims[static_cast<size_t>(i)];
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (dims[static_cast<size_t>(i)] != o.dims[static_cast<size_t>(i)]) return false;
  return true;
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[static_cast<size_t>(i)]);
  }
  return s + "]";
}

namespace {
Dims contiguous_strides(const Shape& shape) {
  Dims st{0, 0, 0, 0};
  int64_t s = 1;
  for (int i = shape.ndim - 1; i >= 0; --i) {
    st[static_cast<size_t>(i)] = s;
    s *= shape.dims[static_cast<size_t>(i)];
  }
  return st;
}
}  // namespace

TensorView::TensorView(void* data, DType dtype, const Shape& shape)
    : data_(data), dtype_(dtype), shape_(shape), strides_(contiguous_strides(shape)) {}

TensorView::TensorView(void* data, DType dtype, const Shape& shape, const Dims& strides)
    : data_(data), dtype_(dtype), shape_(shape), strides_(strides) {}

bool TensorView::is_contiguous() const {
  const Dims c = contiguous_strides(shape_);
  for (int i = 0; i < shape_.ndim; ++i) {
    const auto u = static_cast<size_t>(i);
    if (shape_.dims[u] != 1 && strides_[u] != c[u]) return false;
  }
  return true;
}

int64_t TensorView::byte_offset(int64_t i0, int64_t i1, int64_t i2, int64_t i3) const {
  const int64_t elem = i0 * strides_[0] + i1 * strides_[1] + i2 * strides_[2] + i3 * strides_[3];
  const DTypeInfo& info = dtype_info(dtype_);
  KV_CHECK(elem % info.block_elems == 0, "element offset inside a quantized block");
  return elem / info.block_elems * info.block_bytes;
}

TensorView TensorView::slice(int axis, int64_t begin, int64_t end) const {
  if (axis < 0 || axis >= shape_.ndim || begin < 0 || end < begin || end > shape_[axis]) {
    throw Error(ErrorKind::kOutOfRange,
                "slice [" + std::to_string(begin) + ", " + std::to_string(end) + ") on axis " +
                    std::to_string(axis) + " of a tensor of shape " + shape_.str());
  }
  Shape s = shape_;
  s.dims[static_cast<size_t>(axis)] = end - begin;
  Dims idx{0, 0, 0, 0};
  idx[static_cast<size_t>(axis)] = begin;
  void* p = shape_.numel() == 0 ? data_ : ptr(idx[0], idx[1], idx[2], idx[3]);
  return TensorView(p, dtype_, s, strides_);
}

void AlignedFree::operator()(std::byte* p) const {
  std::free(p);
}

namespace {
constexpr size_t kHugePageBytes = size_t{2} << 20;
constexpr size_t kHugeMinBytes = size_t{4} << 20;
}  // namespace

// Large buffers (KV storage, block pools, activations of long prompts) are aligned to 2 MiB
// and offered to the kernel for transparent huge pages: a decode step streams the whole cache,
// and with 4 KiB pages every 4 KiB of every K/V stream is a new TLB entry (a page walk per 16
// keys of a D = 128 f16 head); huge pages cut those walks. Rounding up costs < 2 MiB of address
// space per buffer, and only buffers of at least 4 MiB take it.
// Where THP is disabled, madvise fails and nothing changes.
std::unique_ptr<std::byte, AlignedFree> allocate_large(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t align = bytes >= kHugeMinBytes ? kHugePageBytes : kTensorAlignment;
  const size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded);
#if defined(MADV_HUGEPAGE)
  if (p != nullptr && align == kHugePageBytes) (void)madvise(p, rounded, MADV_HUGEPAGE);
#endif
  return std::unique_ptr<std::byte, AlignedFree>(static_cast<std::byte*>(p));
}

ByteBuffer::ByteBuffer(size_t n) : data_(allocate_large(n)), size_(n) {
  if (n > 0 && data_ == nullptr)
    throw Error(ErrorKind::kOutOfRange,
                "cannot allocate a buffer of " + std::to_string(n) + " bytes");
  if (n > 0) std::memset(data_.get(), 0, n);
}

Tensor Tensor::empty(DType dtype, const Shape& shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.size_bytes_ = dtype_bytes(dtype, shape.numel());
  if (t.size_bytes_ > 0) {
    t.data_ = allocate_large(t.size_bytes_);
    if (t.data_ == nullptr) {
      throw Error(ErrorKind::kOutOfRange, "cannot allocate " + std::to_string(t.size_bytes_) +
                                              " bytes for a tensor of shape " + shape.str());
    }
  }
  return t;
}

Tensor Tensor::zeros(DType dtype, const Shape& shape) {
  Tensor t = empty(dtype, shape);
  if (t.size_bytes_ > 0) std::memset(t.data_.get(), 0, t.size_bytes_);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t = empty(dtype_, shape_);
  if (size_bytes_ > 0) std::memcpy(t.data_.get(), data_.get(), size_bytes_);
  return t;
}

TensorView Tensor::view() const {
  return TensorView(data_.get(), dtype_, shape_);
}

size_t copy_view(const TensorView& src, const TensorView& dst) {
  if (!(src.shape() == dst.shape())) {
    throw Error(ErrorKind::kInvalidArgument,
                "copy between shapes " + src.shape().str() + " and " + dst.shape().str());
  }
  if (src.numel() == 0) return 0;
  // Iterate over the outer three dims; the innermost dim is a contiguous run when stride == 1.
  const int nd = src.ndim();
  Dims n{1, 1, 1, 1};
  for (int i = 0; i < nd; ++i) n[static_cast<size_t>(4 - nd + i)] = src.dim(i);
  auto idx4 = [&](const TensorView& v, int64_t a, int64_t b, int64_t c, int64_t d) {
    Dims full{a, b, c, d};
    Dims out{0, 0, 0, 0};
    for (int i = 0; i < nd; ++i)
      out[static_cast<size_t>(i)] = full[static_cast<size_t>(4 - nd + i)];
    return v.ptr(out[0], out[1], out[2], out[3]);
  };
  const bool inner_contig = src.stride(nd - 1) == 1 && dst.stride(nd - 1) == 1;
  size_t written = 0;
  const int64_t inner = n[3];
  for (int64_t a = 0; a < n[0]; ++a)
    for (int64_t b = 0; b < n[1]; ++b)
      for (int64_t c = 0; c < n[2]; ++c) {
        if (inner_contig) {
          convert_n(idx4(src, a, b, c, 0), src.dtype(), idx4(dst, a, b, c, 0), dst.dtype(),
                    static_cast<size_t>(inner));
        } else {
          for (int64_t d = 0; d < inner; ++d)
            convert_n(idx4(src, a, b, c, d), src.dtype(), idx4(dst, a, b, c, d), dst.dtype(), 1);
        }
        written += dtype_bytes(dst.dtype(), inner);
      }
  return written;
}

}  // namespace kvcache
