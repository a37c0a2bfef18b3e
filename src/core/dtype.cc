#include "core/dtype.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/error.h"

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#define KVCACHE_HAVE_F16C 1
#endif

namespace kvcache {

namespace {
// Block sizes and ggml type ids: ggml-common.h / ggml.h (block_q4_0 = f16 d + 16 bytes, ...).
constexpr DTypeInfo kInfos[] = {
    {"f32", 1, 4, true, 0},        {"f16", 1, 2, true, 1},        {"bf16", 1, 2, true, 30},
    {"q8_0", 32, 34, false, 8},    {"q4_0", 32, 18, false, 2},    {"q4_1", 32, 20, false, 3},
    {"q5_0", 32, 22, false, 6},    {"q5_1", 32, 24, false, 7},    {"iq4_nl", 32, 18, false, 20},
    {"q2_K", 256, 84, false, 10},  {"q3_K", 256, 110, false, 11}, {"q4_K", 256, 144, false, 12},
    {"q5_K", 256, 176, false, 13}, {"q6_K", 256, 210, false, 14},
};
static_assert(std::size(kInfos) == kDTypeCount, "one DTypeInfo per DType");
}  // namespace

const DTypeInfo& dtype_info(DType t) {
  const auto i = static_cast<size_t>(t);
  KV_CHECK(i < std::size(kInfos), "unknown dtype value");
  return kInfos[i];
}

size_t dtype_bytes(DType t, int64_t n) {
  const DTypeInfo& info = dtype_info(t);
  KV_CHECK(n >= 0 && n % info.block_elems == 0, "element count not a multiple of the block size");
  return static_cast<size_t>(n / info.block_elems * info.block_bytes);
}

size_t dtype_elem_size(DType t) {
  const DTypeInfo& info = dtype_info(t);
  KV_CHECK(info.block_elems == 1, "block dtypes have no per-element size");
  return static_cast<size_t>(info.block_bytes);
}

DType parse_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string names;
  for (size_t i = 0; i < std::size(kInfos); ++i) {
    std::string n = kInfos[i].name;
    std::transform(n.begin(), n.end(), n.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower == n) return static_cast<DType>(i);
    names += (i == 0 ? "" : ", ") + std::string(kInfos[i].name);
  }
  throw Error(ErrorKind::kInvalidArgument,
              "unknown dtype '" + std::string(name) + "': expected one of " + names);
}

f16_t f32_to_f16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN: keep the top payload bits, force quiet NaN
    if (abs == 0x7f800000u) return static_cast<f16_t>(sign | 0x7c00u);
    return static_cast<f16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  const int32_t exp = static_cast<int32_t>(abs >> 23) - 127 + 15;  // half's biased exponent
  const uint32_t mant = abs & 0x7fffffu;
  if (exp >= 31) return static_cast<f16_t>(sign | 0x7c00u);  // too large even before rounding
  uint32_t full;  // significand to shift, implicit bit included for normal floats
  int32_t shift;  // right shift that leaves 10 (normal) or fewer (subnormal) mantissa bits
  uint32_t base;  // exponent bits placed above the shifted significand
  if (exp >= 1) {
    full = mant;
    shift = 13;
    base = static_cast<uint32_t>(exp) << 10;
  } else {
    if (abs == 0) return static_cast<f16_t>(sign);
    // float exponent 0 (float subnormals) is far below half's range: the value rounds to 0.
    full = (abs >> 23) == 0 ? 0u : (mant | 0x800000u);
    shift = 14 - exp;
    base = 0;
    if (shift > 24) return static_cast<f16_t>(sign);  // below half of the smallest subnormal
  }
  uint32_t h = full >> shift;
  const uint32_t rem = full & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;  // carry may reach the exponent: correct
  return static_cast<f16_t>(sign | (base + h));
}

float f16_to_f32(f16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // zero or subnormal: mant * 2^-24 is exact in float
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp - 15 + 127) << 23) | (mant << 13));
}

void f32_to_f16_n(const float* src, f16_t* dst, size_t n) {
  size_t i = 0;
#ifdef KVCACHE_HAVE_F16C
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
#endif
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

void f16_to_f32_n(const f16_t* src, float* dst, size_t n) {
  size_t i = 0;
#ifdef KVCACHE_HAVE_F16C
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void f32_to_bf16_n(const float* src, bf16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
}

void bf16_to_f32_n(const bf16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
}

void convert_n(const void* src, DType src_t, void* dst, DType dst_t, size_t n) {
  if (src_t == dst_t) {
    std::memcpy(dst, src, dtype_bytes(src_t, static_cast<int64_t>(n)));
    return;
  }
  if (!dtype_is_float(src_t) || !dtype_is_float(dst_t)) {
    throw Error(ErrorKind::kUnsupported, std::string("no element conversion from ") +
                                             dtype_name(src_t) + " to " + dtype_name(dst_t));
  }
  // Convert through f32 in small stack chunks: no allocation.
  constexpr size_t kChunk = 256;
  float tmp[kChunk];
  const auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  const size_t ss = dtype_elem_size(src_t), ds = dtype_elem_size(dst_t);
  for (size_t off = 0; off < n; off += kChunk) {
    const size_t m = std::min(kChunk, n - off);
    const float* f;
    switch (src_t) {
      case DType::kF32:
        f = reinterpret_cast<const float*>(s + off * ss);
        break;
      case DType::kF16:
        f16_to_f32_n(reinterpret_cast<const f16_t*>(s + off * ss), tmp, m);
        f = tmp;
        break;
      case DType::kBF16:
        bf16_to_f32_n(reinterpret_cast<const bf16_t*>(s + off * ss), tmp, m);
        f = tmp;
        break;
      default:
        KV_CHECK(false, "unreachable");
    }
    switch (dst_t) {
      case DType::kF32:
        std::memcpy(d + off * ds, f, m * sizeof(float));
        break;
      case DType::kF16:
        f32_to_f16_n(f, reinterpret_cast<f16_t*>(d + off * ds), m);
        break;
      case DType::kBF16:
        f32_to_bf16_n(f, reinterpret_cast<bf16_t*>(d + off * ds), m);
        break;
      default:
        KV_CHECK(false, "unreachable");
    }
  }
}

}  // namespace kvcache
