// StateWriter / StateReader: fields round-trip little-endian, strided views are written in
// row-major order of their shape (not their storage), and reading past the end is an error.
#include "cache/layer_state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace kvcache {
namespace {

class BufferWriter : public StateWriter {
 public:
  void write(const void* data, size_t n) override {
    const auto* p = static_cast<const unsigned char*>(data);
    bytes.insert(bytes.end(), p, p + n);
  }
  std::vector<unsigned char> bytes;
};

class BufferReader : public StateReader {
 public:
  explicit BufferReader(const std::vector<unsigned char>& b) : bytes_(b) {}
  void read(void* data, size_t n) override {
    if (pos_ + n > bytes_.size()) throw Error(ErrorKind::kFormat, "state ends early");
    std::memcpy(data, bytes_.data() + pos_, n);
    pos_ += n;
  }

 private:
  const std::vector<unsigned char>& bytes_;
  size_t pos_ = 0;
};

TEST(LayerState, FieldsRoundTripLittleEndian) {
  BufferWriter w;
  w.u32(0x01020304u);
  w.i64(-5);
  w.str("dynamic/full_attention");
  ASSERT_GE(w.bytes.size(), 4u);
  EXPECT_EQ(w.bytes[0], 0x04);  // little-endian
  BufferReader r(w.bytes);
  EXPECT_EQ(r.u32(), 0x01020304u);
  EXPECT_EQ(r.i64(), -5);
  EXPECT_EQ(r.str(), "dynamic/full_attention");
  EXPECT_THROW(r.u32(), Error);
}

TEST(LayerState, StridedViewIsWrittenInShapeOrder) {
  // A [2, 3, 5] f32 tensor viewed as rows 1..2 of its middle axis: [2, 2, 5], strided.
  Tensor t = Tensor::empty(DType::kF32, Shape{2, 3, 5});
  float* p = t.data_as<float>();
  for (int i = 0; i < 30; ++i) p[i] = static_cast<float>(i);
  const TensorView v = t.view().slice(1, 1, 3);  // [2, 2, 5], rows 1..2 of each outer index
  BufferWriter w;
  w.view(v);
  ASSERT_EQ(w.bytes.size(), 20 * sizeof(float));
  std::vector<float> got(20);
  std::memcpy(got.data(), w.bytes.data(), w.bytes.size());
  const std::vector<float> want = {5,  6,  7,  8,  9,  10, 11, 12, 13, 14,
                                   20, 21, 22, 23, 24, 25, 26, 27, 28, 29};
  EXPECT_EQ(got, want);
  // Read back into another strided view.
  Tensor u = Tensor::zeros(DType::kF32, Shape{2, 3, 5});
  BufferReader r(w.bytes);
  r.view(u.view().slice(1, 1, 3));
  for (int i = 0; i < 30; ++i) {
    const bool inside = (i % 15) >= 5;
    EXPECT_EQ(u.data_as<float>()[i], inside ? static_cast<float>(i) : 0.0f) << i;
  }
}

TEST(LayerState, LongStringIsRefused) {
  BufferWriter w;
  w.u32(1u << 30);
  BufferReader r(w.bytes);
  EXPECT_THROW(r.str(), Error);
}

}  // namespace
}  // namespace kvcache
