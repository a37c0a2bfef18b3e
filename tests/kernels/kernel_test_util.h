// Helpers for the kernel tests: seeded normal samples, weight matrices of any dtype built
// from f32 values (the layout matmul and gemm_packed read: one output feature per row), and the
// check of an argument error's kind and message.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/quant_types.h"

namespace kvcache::testing_util {

inline std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// W [n, k] of dtype t from f32 values w (row-major); returns the raw bytes.
inline std::vector<std::byte> make_weights(const std::vector<float>& w, DType t, int64_t n,
                                           int64_t k) {
  std::vector<std::byte> out(dtype_bytes(t, n * k));
  for (int64_t r = 0; r < n; ++r) {
    const float* src = w.data() + r * k;
    std::byte* dst = out.data() + static_cast<size_t>(r) * dtype_bytes(t, k);
    switch (t) {
      case DType::kF32:
        std::memcpy(dst, src, static_cast<size_t>(k) * 4);
        break;
      case DType::kF16:
        f32_to_f16_n(src, reinterpret_cast<f16_t*>(dst), static_cast<size_t>(k));
        break;
      case DType::kBF16:
        f32_to_bf16_n(src, reinterpret_cast<bf16_t*>(dst), static_cast<size_t>(k));
        break;
      case DType::kQ8_0:
        quantize_row_q8_0(src, reinterpret_cast<BlockQ8_0*>(dst), k);
        break;
      default: {  // the GGUF block types: their quantize_ref (kernels/quant_types.h)
        const QuantKernels* q = quant_kernels(t);
        KV_CHECK(q != nullptr && q->quantize_ref != nullptr, "make_weights: no quantizer");
        q->quantize_ref(src, dst, k / dtype_info(t).block_elems);
        break;
      }
    }
  }
  return out;
}

// fn() must throw Error(kInvalidArgument) whose message contains `needle`.
template <typename Fn>
void expect_invalid_argument(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no Error; expected one saying '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace kvcache::testing_util
