// Causal depthwise conv1d with a carried window (see causal_conv.h).
#include "kernels/causal_conv.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/attention_simd.h"
#include "kernels/view_checks.h"

namespace kvcache {
namespace {

constexpr const char* kWho = "causal_conv1d";
[[noreturn]] void fail(const std::string& msg) {
  view_checks::fail(kWho, msg);
}
void require_2d(const char* name, const TensorView& t) {
  view_checks::require_f32_rows(kWho, name, t, 2);
}

// [first, last) bytes a 2-d f32 view touches (empty: {0, 0}).
struct ByteRange {
  uintptr_t first = 0, last = 0;
};
ByteRange span_of(const TensorView& t) {
  if (t.numel() == 0) return {};
  const auto p = reinterpret_cast<uintptr_t>(t.data());
  return {p, p + static_cast<uintptr_t>(((t.dim(0) - 1) * t.stride(0) + t.dim(1)) * 4)};
}
bool overlap(const TensorView& a, const TensorView& b) {
  const ByteRange x = span_of(a), y = span_of(b);
  return x.first < y.last && y.first < x.last;
}

constexpr int64_t kBlock = 16;  // channels per block: two 8-lane vectors

// Rows of the inputs as the convolution sees them: index s < 0 is state row K - 1 + s.
struct Window {
  const float* x;
  int64_t ldx;
  const float* state;
  int64_t lds;
  int64_t K;
  const float* row(int64_t s) const { return s >= 0 ? x + s * ldx : state + (K - 1 + s) * lds; }
};

#if KVCACHE_ATTN_AVX2
inline __m256i lane_mask(int64_t n) {  // lanes [0, n) set, n clamped to [0, 8]
  const int32_t c = static_cast<int32_t>(std::clamp<int64_t>(n, 0, 8));
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// x * (1 / (1 + exp(-x))), swiglu8's order (activation.cc).
inline __m256 silu8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = detail::exp256(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_mul_ps(x, _mm256_div_ps(one, _mm256_add_ps(one, e)));
}
#endif

// Channels [c0, c0 + nc), nc <= kBlock, every token; then their window in state.
void conv_block(const CausalConv1dParams& p, int64_t T, int64_t K, int64_t c0, int64_t nc) {
  const float* w = p.weight.data_as<const float>() + c0;
  const int64_t ldw = p.weight.stride(0);
  const float* bias = p.bias.data() != nullptr ? p.bias.data_as<const float>() + c0 : nullptr;
  float* state = K > 1 ? p.state.data_as<float>() + c0 : nullptr;  // K = 1: no window at all
  const int64_t lds = K > 1 ? p.state.stride(0) : 0;
  const Window in{p.x.data_as<const float>() + c0, p.x.stride(0), state, lds, K};
  float next[kMaxConvKernel - 1][kBlock];  // the new window, saved before y is written
  for (int64_t r = 0; r + 1 < K; ++r) std::copy_n(in.row(T - (K - 1) + r), nc, next[r]);

  float* y = p.y.data_as<float>() + c0;
  const int64_t ldy = p.y.stride(0);
#if KVCACHE_ATTN_AVX2
  const bool full = nc == kBlock;
  const __m256i m0 = lane_mask(nc), m1 = lane_mask(nc - 8);
  auto load = [&](const float* src, __m256* v) {
    v[0] = full ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, m0);
    v[1] = full ? _mm256_loadu_ps(src + 8) : _mm256_maskload_ps(src + 8, m1);
  };
  __m256 wv[kMaxConvKernel][2], b[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t j = 0; j < K; ++j) load(w + j * ldw, wv[j]);
  if (bias) load(bias, b);
  for (int64_t t = T - 1; t >= 0; --t) {
    __m256 a0 = b[0], a1 = b[1];
    for (int64_t j = 0; j < K; ++j) {
      __m256 x[2];
      load(in.row(t - (K - 1) + j), x);
      a0 = _mm256_fmadd_ps(wv[j][0], x[0], a0);
      a1 = _mm256_fmadd_ps(wv[j][1], x[1], a1);
    }
    if (p.silu) {
      a0 = silu8(a0);
      a1 = silu8(a1);
    }
    float* dst = y + t * ldy;
    if (full) {
      _mm256_storeu_ps(dst, a0);
      _mm256_storeu_ps(dst + 8, a1);
    } else {
      _mm256_maskstore_ps(dst, m0, a0);
      _mm256_maskstore_ps(dst + 8, m1, a1);
    }
  }
#else
  for (int64_t t = T - 1; t >= 0; --t) {
    float acc[kBlock];
    for (int64_t l = 0; l < nc; ++l) acc[l] = bias ? bias[l] : 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      const float* src = in.row(t - (K - 1) + j);
      for (int64_t l = 0; l < nc; ++l) acc[l] = std::fma(w[j * ldw + l], src[l], acc[l]);
    }
    float* dst = y + t * ldy;
    for (int64_t l = 0; l < nc; ++l)
      dst[l] = p.silu ? acc[l] * (1.0f / (1.0f + std::exp(-acc[l]))) : acc[l];
  }
#endif
  for (int64_t r = 0; r + 1 < K; ++r) std::copy_n(next[r], nc, state + r * lds);
}

}  // namespace

void causal_conv1d(const CausalConv1dParams& p) {
  require_2d("x", p.x);
  require_2d("y", p.y);
  require_2d("weight", p.weight);
  require_2d("state", p.state);
  const int64_t T = p.x.dim(0), C = p.x.dim(1), K = p.weight.dim(0);
  if (K < 1 || K > kMaxConvKernel) {
    fail("kernel size K (weight's dim 0) must be in [1, " + std::to_string(kMaxConvKernel) +
         "], got " + std::to_string(K));
  }
  if (!(p.y.shape() == p.x.shape()))
    fail("y must be " + p.x.shape().str() + " like x, got " + p.y.shape().str());
  if (p.weight.dim(1) != C) {
    fail("weight must be [K, C] = [K, " + std::to_string(C) +
         "] (HF's [C, 1, K] transposed), got " + p.weight.shape().str());
  }
  if (!(p.state.shape() == Shape{K - 1, C})) {
    fail("state must be [K - 1, C] = " + Shape{K - 1, C}.str() + " (the last K - 1 inputs), got " +
         p.state.shape().str());
  }
  if (p.bias.data() != nullptr) {
    if (!(p.bias.shape() == Shape{C}) || p.bias.dtype() != DType::kF32) {
      fail("bias must be an f32 [C] = [" + std::to_string(C) + "] or a view without data, got " +
           p.bias.shape().str());
    }
  }
  const bool in_place = p.y.data() == p.x.data() && p.y.stride(0) == p.x.stride(0);
  if (!in_place && overlap(p.x, p.y))
    fail("y overlaps x (allowed only as x itself, same data and strides)");
  if (overlap(p.state, p.x) || overlap(p.state, p.y)) fail("state overlaps x or y");
  if (T == 0 || C == 0) return;

  const int64_t n_blocks = (C + kBlock - 1) / kBlock;
  auto run = [&](int64_t b) { conv_block(p, T, K, b * kBlock, std::min(kBlock, C - b * kBlock)); };
  // Threads only where the work is worth a loop on the pool (a decode step is a few thousand
  // multiply-adds); blocks are independent, so the split never changes a result.
  if (T * C * K < (int64_t{1} << 16)) {
    for (int64_t b = 0; b < n_blocks; ++b) run(b);
  } else {
    ThreadPool& pool = p.pool ? *p.pool : default_pool();
    pool.parallel_for(n_blocks, run);
  }
}

}  // namespace kvcache
