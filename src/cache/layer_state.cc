#include "cache/layer_state.h"

#include "core/error.h"

namespace kvcache {

namespace {
// Calls fn(pointer, bytes) for each innermost row of v in row-major order.
template <typename Fn>
void for_each_row(const TensorView& v, Fn fn) {
  KV_CHECK(dtype_is_float(v.dtype()), "layer state: only float views are walked");
  const int nd = v.ndim();
  KV_CHECK(nd >= 1 && nd <= 4, "layer state: views of 1-4 dims");
  KV_CHECK(v.stride(nd - 1) == 1 || v.dim(nd - 1) <= 1, "layer state: inner dim not contiguous");
  const size_t row = dtype_bytes(v.dtype(), v.dim(nd - 1));
  int64_t outer[3] = {1, 1, 1};
  for (int i = 0; i < nd - 1; ++i) outer[3 - (nd - 1) + i] = v.dim(i);
  for (int64_t a = 0; a < outer[0]; ++a)
    for (int64_t b = 0; b < outer[1]; ++b)
      for (int64_t c = 0; c < outer[2]; ++c) {
        int64_t idx[4] = {0, 0, 0, 0};
        const int64_t o[3] = {a, b, c};
        for (int i = 0; i < nd - 1; ++i) idx[i] = o[3 - (nd - 1) + i];
        fn(v.ptr(idx[0], idx[1], idx[2], idx[3]), row);
      }
}
}  // namespace

void StateWriter::u32(uint32_t v) {
  uint8_t b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  write(b, sizeof(b));
}

void StateWriter::i64(int64_t v) {
  const auto u = static_cast<uint64_t>(v);
  uint8_t b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(u >> (8 * i));
  write(b, sizeof(b));
}

void StateWriter::str(std::string_view s) {
  u32(static_cast<uint32_t>(s.size()));
  write(s.data(), s.size());
}

void StateWriter::view(const TensorView& v) {
  if (v.numel() == 0) return;
  for_each_row(v, [&](const void* p, size_t n) { write(p, n); });
}

uint32_t StateReader::u32() {
  uint8_t b[4];
  read(b, sizeof(b));
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(b[i]) << (8 * i);
  return v;
}

int64_t StateReader::i64() {
  uint8_t b[8];
  read(b, sizeof(b));
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(b[i]) << (8 * i);
  return static_cast<int64_t>(v);
}

std::string StateReader::str(size_t max_len) {
  const uint32_t n = u32();
  if (n > max_len) {
    throw Error(ErrorKind::kFormat, "state string of " + std::to_string(n) +
                                        " bytes is longer than the " + std::to_string(max_len) +
                                        " allowed (damaged file?)");
  }
  std::string s(n, '\0');
  read(s.data(), n);
  return s;
}

void StateReader::view(const TensorView& v) {
  if (v.numel() == 0) return;
  for_each_row(v, [&](void* p, size_t n) { read(p, n); });
}

}  // namespace kvcache
