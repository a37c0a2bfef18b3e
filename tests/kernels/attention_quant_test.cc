// Fused dequantizing attention against the double-precision reference run on the dequantized
// K/V (the expensive copy the kernel avoids): |out - ref| <= 1e-5 on odd sizes, GQA, causal /
// sliding / chunked masks, decode and prefill, split-KV, f32/f16 residuals, 2/4/8 bits, for the
// AVX2 path and the scalar path.
#include "kernels/attention_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/attention_reference.h"
#include "kernels/kv_quant.h"

namespace kvcache {
namespace {

constexpr double kTol = 1e-5;

struct QCase {
  int64_t B = 1, Hq = 4, Hkv = 2, Sq = 1, D = 64, Dv = 0, G = 16, n_blocks = 3, n_res = 5;
  int bits = 4;
  KVQuantScheme scheme = KVQuantScheme::kKivi;
  DType res = DType::kF32;
  bool causal = true, sinks = false;
  float softcap = 0;
  int64_t window = 0, chunk = 0, kv_offset = 0, kv_split = 0;
  std::string str() const {
    std::ostringstream o;
    o << "B" << B << " Hq" << Hq << " Hkv" << Hkv << " Sq" << Sq << " D" << D << " Dv"
      << (Dv ? Dv : D) << " G" << G << " blocks" << n_blocks << " res" << n_res << " bits" << bits
      << " " << dtype_name(res) << " window" << window << " chunk" << chunk << " kv_offset"
      << kv_offset << " split" << kv_split << " " << kv_quant_scheme_name(scheme)
      << (sinks ? " sinks" : "") << " softcap" << softcap;
    return o.str();
  }
};

// A quantized span built directly with the kv_quant functions (the kernels layer knows no
// cache), K/V drawn with per-channel offsets and outliers like real keys.
struct QInputs {
  QCase c;
  int64_t Dv = 0, vg = 0;
  std::vector<std::byte> kb, vb;
  Tensor rk, rv, qbuf, obuf;
  std::vector<float> sinks;
  QuantKV kv;
  explicit QInputs(const QCase& cs) : c(cs) {
    Dv = c.Dv ? c.Dv : c.D;
    const KVBlockFormat f = make_kv_block_format(c.scheme, c.bits, c.G, c.D, Dv);
    vg = kv_quant_per_token(c.scheme) ? Dv : f.v_group;
    std::mt19937 rng(static_cast<uint32_t>(c.D * 1000 + c.n_blocks * 10 + c.bits));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t kbb = kv_k_block_bytes(f);
    const int64_t vbb = kv_v_block_bytes(f);
    kb.resize(static_cast<size_t>(c.B * c.Hkv * c.n_blocks * kbb));
    vb.resize(static_cast<size_t>(c.B * c.Hkv * c.n_blocks * vbb));
    std::vector<float> rows(static_cast<size_t>(c.G * std::max(c.D, Dv)));
    for (int64_t i = 0; i < c.B * c.Hkv * c.n_blocks; ++i) {
      for (int64_t t = 0; t < c.G; ++t)
        for (int64_t d = 0; d < c.D; ++d)
          rows[static_cast<size_t>(t * c.D + d)] = nd(rng) + 0.3f * static_cast<float>(d % 5);
      kv_quantize_k_block(f, rows.data(), c.D, kb.data() + i * kbb);
      for (auto& x : rows) x = nd(rng);
      kv_quantize_v_block(f, rows.data(), Dv, vb.data() + i * vbb);
    }
    rk = Tensor::empty(c.res, {c.B, c.Hkv, c.n_res + 3, c.D});  // spare capacity: strided view
    rv = Tensor::empty(c.res, {c.B, c.Hkv, c.n_res + 3, Dv});
    std::vector<float> tmp(static_cast<size_t>(std::max(rk.numel(), rv.numel())));
    for (auto& x : tmp) x = nd(rng);
    convert_n(tmp.data(), DType::kF32, rk.data(), c.res, static_cast<size_t>(rk.numel()));
    for (auto& x : tmp) x = nd(rng);
    convert_n(tmp.data(), DType::kF32, rv.data(), c.res, static_cast<size_t>(rv.numel()));
    qbuf = Tensor::empty(DType::kF32, {c.B, c.Sq, c.Hq, c.D});  // [B, S, H, D] as the model has
    obuf = Tensor::zeros(DType::kF32, {c.B, c.Sq, c.Hq, Dv});
    for (int64_t i = 0; i < qbuf.numel(); ++i) qbuf.data_as<float>()[i] = nd(rng);
    for (int64_t h = 0; h < c.Hq; ++h) sinks.push_back(nd(rng));

    kv.scheme = c.scheme;
    kv.bits = f.bits;
    kv.group = c.G;
    kv.v_group = vg;
    kv.batch = c.B;
    kv.heads = c.Hkv;
    kv.head_dim_k = c.D;
    kv.head_dim_v = Dv;
    kv.n_blocks = c.n_blocks;
    kv.k_blocks = kb.data();
    kv.v_blocks = vb.data();
    kv.k_block_bytes = kbb;
    kv.v_block_bytes = vbb;
    kv.k_head_stride = c.n_blocks * kbb;
    kv.v_head_stride = c.n_blocks * vbb;
    kv.k_batch_stride = c.Hkv * kv.k_head_stride;
    kv.v_batch_stride = c.Hkv * kv.v_head_stride;
    kv.k_residual = rk.view().slice(2, 0, c.n_res);
    kv.v_residual = rv.view().slice(2, 0, c.n_res);
  }
  TensorView q() const {
    return TensorView(qbuf.data(), DType::kF32, {c.B, c.Hq, c.Sq, c.D},
                      {c.Sq * c.Hq * c.D, c.D, c.Hq * c.D, 1});
  }
  TensorView out() const {
    return TensorView(obuf.data(), DType::kF32, {c.B, c.Hq, c.Sq, Dv},
                      {c.Sq * c.Hq * Dv, Dv, c.Hq * Dv, 1});
  }
  AttentionOptions options() const {
    AttentionOptions o;
    o.causal = c.causal;
    o.sliding_window = c.window;
    o.chunk_size = c.chunk;
    o.kv_offset = c.kv_offset;
    o.softcap = c.softcap;
    o.sinks = c.sinks ? sinks.data() : nullptr;
    o.kv_split = c.kv_split;
    return o;
  }
};

// The kernel's logit dots on KIVI key blocks, restated from attention_quant.h's rule: per block
// and query row, q' = q * ks (f32 products) is rounded to integers with the row's scale m / L
// (m = max |q'|; L = 127 at 2 and 4 bits, min(32767, (2^31 - 1) / (255 D)) at 8), dotted
// exactly with the codes, plus q . kz. `dot` holds it for every (b, h, i, packed key) and
// `bound` the rounding's worst case sq / 2 * sum_d code (the distance to the exact dot over the
// dequantized keys, before the softmax scale).
int code8_levels(int64_t terms) {
  return static_cast<int>(std::min<int64_t>(32767, 2147483647 / (255 * terms)));
}
int query_levels(int bits, int64_t D) {
  return bits == 8 ? code8_levels(D) : 127;
}
struct PackedDots {
  std::vector<double> dot, bound;
  int64_t packed = 0;
  bool used = false;  // KIVI blocks: the rounding applies
};
PackedDots packed_dots(const QInputs& in) {
  PackedDots r;
  const QCase& c = in.c;
  r.packed = in.kv.n_blocks * c.G;
  r.used = c.scheme == KVQuantScheme::kKivi && r.packed > 0;
  if (!r.used) return r;
  const int bits = in.kv.bits;
  const int64_t cb = kivi_col_bytes(c.G, bits);
  r.dot.resize(static_cast<size_t>(c.B * c.Hq * c.Sq * r.packed));
  r.bound.resize(r.dot.size());
  const TensorView q = in.q();
  std::vector<float> qp(static_cast<size_t>(c.D));
  size_t at = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Sq; ++i) {
        const float* qr = q.ptr_as<const float>(b, h, i);
        for (int64_t blk = 0; blk < in.kv.n_blocks; ++blk) {
          const std::byte* kb = in.kv.k_block(b, h / (c.Hq / c.Hkv), blk);
          const auto* ks = reinterpret_cast<const f16_t*>(kb);
          const f16_t* kz = ks + c.D;
          const std::byte* codes = kb + 4 * c.D;
          float m = 0;
          bool finite = true;  // a non-finite row's logits are NaN (sq = NaN in the kernel)
          for (int64_t d = 0; d < c.D; ++d) {
            qp[static_cast<size_t>(d)] = qr[d] * f16_to_f32(ks[d]);
            finite = finite && std::isfinite(qp[static_cast<size_t>(d)]);
            m = std::max(m, std::fabs(qp[static_cast<size_t>(d)]));
          }
          const bool tiny = !(m >= 0x1p-100f);
          const auto L = static_cast<float>(query_levels(bits, c.D));
          const float inv = tiny ? 0.0f : L / m, sq = tiny ? 0.0f : m / L;
          double z = 0;
          for (int64_t d = 0; d < c.D; ++d) z += static_cast<double>(qr[d]) * f16_to_f32(kz[d]);
          for (int64_t t = 0; t < c.G; ++t, ++at) {
            if (!finite) {
              r.dot[at] = std::numeric_limits<double>::quiet_NaN();
              continue;
            }
            int64_t acc = 0, codes_sum = 0;
            for (int64_t d = 0; d < c.D; ++d) {
              const int64_t code = kivi_key_code(codes + d * cb, t, bits);
              acc += static_cast<int64_t>(std::nearbyint(qp[static_cast<size_t>(d)] * inv)) * code;
              codes_sum += code;
            }
            r.dot[at] = static_cast<double>(sq) * static_cast<double>(acc) + z;
            r.bound[at] = 0.5 * static_cast<double>(sq) * static_cast<double>(codes_sum);
          }
        }
      }
  return r;
}

// The reference with packed KIVI logits taken from `dots` (a score transform replacing the
// reference's own dot on those keys; softcap applied the same way).
ReferenceResult rounded_reference(const QInputs& in, const TensorView& kd, const TensorView& vd,
                                  const PackedDots& dots) {
  AttentionOptions o = in.options();
  const double scale = 1.0 / std::sqrt(static_cast<double>(in.c.D));
  const ScoreFn fn = [&](float x, int64_t b, int64_t h, int64_t qp, int64_t kp) {
    const int64_t j = kp - o.kv_offset;
    if (j >= dots.packed) return x;
    const int64_t i = qp - (o.kv_offset + in.kv.seq_len() - in.c.Sq);  // default q_offset
    double y = dots.dot[static_cast<size_t>(((b * in.c.Hq + h) * in.c.Sq + i) * dots.packed + j)];
    y *= scale;
    if (o.softcap > 0) y = o.softcap * std::tanh(y / o.softcap);
    return static_cast<float>(y);
  };
  if (dots.used) o.score = &fn;
  return attention_reference(in.q(), kd, vd, o);
}

// The int16 rounding of the value weights on 4-bit KIVI value blocks whose groups are whole
// 32-channel slabs and 8-bit ones whose groups are whole 16-channel slabs (attention_quant.h):
// per packed block, value group and row, each weight w_j = p_j * vs_j moves by at most half a
// step, max_j |w_j| / 2L (L = 32767, or min(32767, (2^31 - 1) / (255 G)) at 8 bits; the
// reference's normalised probabilities have the kernel's weights' ratios), so output channel d
// moves by at most sum over blocks of that times sum_j code(j, d). Per output element
// ([B, H_q, S_q, D_v] as ReferenceResult::out), 0.51 of a step for the float rounding of
// w * L / max; empty where the rule does not apply.
std::vector<double> weight_bound(const QInputs& in, const ReferenceResult& ref) {
  const QCase& c = in.c;
  const int bits = in.kv.bits;
  if (c.scheme != KVQuantScheme::kKivi ||
      !((bits == 4 && in.vg % 32 == 0) || (bits == 8 && in.vg % 16 == 0)))
    return {};
  const double L = bits == 8 ? code8_levels(c.G) : 32767.0;
  std::vector<double> wb(ref.out.size(), 0.0);
  const int64_t Skv = in.kv.seq_len(), ng = in.Dv / in.vg, rb = kivi_row_bytes(in.Dv, bits);
  size_t at = 0;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t i = 0; i < c.Sq; ++i, at += static_cast<size_t>(in.Dv)) {
        const double* p = ref.probs.data() + ((b * c.Hq + h) * c.Sq + i) * Skv;
        for (int64_t blk = 0; blk < in.kv.n_blocks; ++blk) {
          const std::byte* vb = in.kv.v_block(b, h / (c.Hq / c.Hkv), blk);
          const auto* vs = reinterpret_cast<const f16_t*>(vb);
          const std::byte* codes = vb + 4 * c.G * ng;
          for (int64_t g = 0; g < ng; ++g) {
            double m = 0;
            for (int64_t t = 0; t < c.G; ++t)
              m = std::max(m, p[blk * c.G + t] * f16_to_f32(vs[g * c.G + t]));
            for (int64_t d = g * in.vg; d < (g + 1) * in.vg; ++d) {
              int64_t sum = 0;
              for (int64_t t = 0; t < c.G; ++t) sum += kivi_code(codes + t * rb, d, bits);
              wb[at + static_cast<size_t>(d)] += 0.51 * m / L * static_cast<double>(sum);
            }
          }
        }
      }
  return wb;
}

// Max |out - ref| over every element, less the element's allowance in `allow` (if any).
double max_diff(const QInputs& in, const ReferenceResult& ref,
                const std::vector<double>& allow = {}) {
  double err = 0;
  const TensorView out = in.out();
  size_t idx = 0;
  for (int64_t b = 0; b < in.c.B; ++b)
    for (int64_t h = 0; h < in.c.Hq; ++h)
      for (int64_t i = 0; i < in.c.Sq; ++i)
        for (int64_t d = 0; d < in.Dv; ++d, ++idx)
          err = std::max(err, std::fabs(out.ptr_as<float>(b, h, i)[d] - ref.out[idx]) -
                                  (allow.empty() ? 0.0 : allow[idx]));
  return err;
}
// Against the reference of the kernel's stated arithmetic (the logits restated, the weights'
// rounding within its bound); rows the reference leaves at zero must be exactly zero.
double max_error(const QInputs& in) {
  Tensor kd, vd;
  dequantize_quant_kv(in.kv, &kd, &vd);
  const ReferenceResult ref = rounded_reference(in, kd.view(), vd.view(), packed_dots(in));
  return max_diff(in, ref, weight_bound(in, ref));
}

void check(const QCase& c) {
  for (auto fn : {&quantized_attention, &quantized_attention_scalar}) {
    QInputs in(c);
    fn(in.q(), in.kv, in.out(), in.options());
    const double err = max_error(in);
    EXPECT_LE(err, kTol) << c.str() << (fn == &quantized_attention ? " simd" : " scalar");
  }
}

TEST(QuantizedAttention, DecodeGqaOddSizes) {
  for (int bits : {2, 4, 8}) {
    QCase c;
    c.B = 2;
    c.Hq = 6;
    c.Hkv = 2;
    c.D = 40;  // D % 16 != 0; value groups of 8 (largest divisor of 40 <= 16 is 10: scalar P.V)
    c.G = 16;
    c.n_blocks = 5;
    c.n_res = 7;
    c.bits = bits;
    check(c);
    c.D = 37;  // D % 8 != 0: scalar tails everywhere
    c.Dv = 24;
    check(c);
    c.D = 128;  // the benchmark's shape: SIMD everywhere, value groups of 16
    c.Dv = 0;
    c.Hq = 8;
    check(c);
    c.G = 20;  // blocks that are not whole 8-key chunks: the value weights' zero-padded tail
    check(c);
  }
}

// What the integer rounding of q' (int8 at 2 and 4 bits, int16 at 8) costs against exact float
// attention over the same dequantized keys. Every packed logit is within eps = scale *
// max(bound) of its exact value, so each probability moves by a factor within e^(+-2 eps) and
// |out - exact| <= (e^(2 eps) - 1) max |v| (plus the float tolerance and, at 8 bits, the value
// weights' bound). The rounding must also be visible, or this measures nothing.
TEST(QuantizedAttention, IntQueryRoundingWithinItsBound) {
  for (int bits : {2, 4, 8})
    for (int64_t D : {37, 128}) {
      QCase c;
      c.Hq = 8;
      c.Hkv = 2;
      c.D = D;
      c.G = 64;
      c.n_blocks = 6;
      c.n_res = 9;
      c.bits = bits;
      for (auto fn : {&quantized_attention, &quantized_attention_scalar}) {
        QInputs in(c);
        fn(in.q(), in.kv, in.out(), in.options());
        Tensor kd, vd;
        dequantize_quant_kv(in.kv, &kd, &vd);
        const ReferenceResult exact =
            attention_reference(in.q(), kd.view(), vd.view(), in.options());
        const double err = max_diff(in, exact, weight_bound(in, exact));
        const double raw = max_diff(in, exact);
        double eps = 0, vmax = 0;
        for (double b : packed_dots(in).bound) eps = std::max(eps, b);
        eps /= std::sqrt(static_cast<double>(D));
        for (int64_t i = 0; i < vd.numel(); ++i)
          vmax = std::max(vmax, static_cast<double>(std::fabs(vd.data_as<float>()[i])));
        EXPECT_LE(err, std::expm1(2 * eps) * vmax + kTol) << c.str() << " eps " << eps;
        EXPECT_GT(raw, (bits == 8 ? 1 : 10) * kTol) << c.str();
        EXPECT_LE(max_error(in), kTol) << c.str();
      }
    }
}

// The int16 rounding of the value weights (4-bit value blocks whose groups are whole 32-channel
// slabs): within its bound of the reference on the restated logits, and visible, or this
// measures nothing. Odd G (the SIMD pair loop's unpaired last key) with groups of 32 (passes of
// one slab) over D = 96 and 128, and G = 64 with groups of 64 (passes of two).
TEST(QuantizedAttention, Int16WeightRoundingWithinItsBound) {
  for (auto [D, G] : {std::pair<int64_t, int64_t>{96, 33}, {128, 33}, {128, 64}, {64, 64}}) {
    QCase c;
    c.Hq = 6;
    c.Hkv = 2;
    c.Sq = 3;
    c.D = D;
    c.G = G;
    c.n_blocks = 5;
    c.n_res = 9;
    for (auto fn : {&quantized_attention, &quantized_attention_scalar}) {
      QInputs in(c);
      ASSERT_EQ(in.vg % 32, 0) << c.str();
      fn(in.q(), in.kv, in.out(), in.options());
      Tensor kd, vd;
      dequantize_quant_kv(in.kv, &kd, &vd);
      const ReferenceResult ref = rounded_reference(in, kd.view(), vd.view(), packed_dots(in));
      const std::vector<double> wb = weight_bound(in, ref);
      ASSERT_FALSE(wb.empty()) << c.str();
      EXPECT_LE(max_diff(in, ref, wb), kTol) << c.str();
      const double raw = max_diff(in, ref);
      EXPECT_GT(raw, kTol) << c.str();
    }
  }
}

// 8-bit blocks at the largest integer sums their levels allow: every code 255 but token 0's, and
// every query and weight at the row's largest magnitude, so the int32 sums reach D x 255 x L
// (keys, D = 512: L = 16448) and G x 255 x L (values, G = 300: L = 28070), just below 2^31.
// With 32767 levels either sum would wrap and the output would be far from the reference.
TEST(QuantizedAttention, EightBitSumsAtTheirLargestStayExact) {
  for (auto fn : {&quantized_attention, &quantized_attention_scalar}) {
    QCase c;
    c.Hq = 2;
    c.Hkv = 1;
    c.D = 512;
    c.G = 300;
    c.n_blocks = 2;
    c.n_res = 3;
    c.bits = 8;
    c.causal = false;
    QInputs in(c);
    ASSERT_EQ(in.vg % 16, 0) << c.str();
    const KVBlockFormat f = make_kv_block_format(c.scheme, c.bits, c.G, c.D, c.D);
    std::vector<float> rows(static_cast<size_t>(c.G * c.D), 1.0f);
    std::fill(rows.begin(), rows.begin() + c.D, 0.0f);  // token 0: each channel's minimum
    for (int64_t b = 0; b < c.n_blocks; ++b) {
      kv_quantize_k_block(f, rows.data(), c.D, in.kb.data() + b * in.kv.k_block_bytes);
      kv_quantize_v_block(f, rows.data(), c.D, in.vb.data() + b * in.kv.v_block_bytes);
    }
    ASSERT_EQ(kivi_key_code(in.kb.data() + 4 * c.D + kivi_col_bytes(c.G, 8), 5, 8), 255);
    float* q = in.qbuf.data_as<float>();
    std::fill(q, q + c.Hq * c.D, 1.0f);
    fn(in.q(), in.kv, in.out(), in.options());
    EXPECT_LE(max_error(in), kTol) << (fn == &quantized_attention ? "simd" : "scalar");
  }
}

// Query rows the integer rounding treats specially: all zero (every packed logit is q . kz = 0:
// uniform weights over the packed keys) and non-finite (sq = NaN: the row comes out as 8-bit
// blocks' int16 queries give it, whatever the skeleton makes of NaN logits).
TEST(QuantizedAttention, Int8QueryRoundingEdgeRows) {
  for (auto fn : {&quantized_attention, &quantized_attention_scalar}) {
    QCase c;
    c.Hq = 2;
    c.Hkv = 1;
    c.D = 40;
    c.G = 16;
    c.n_blocks = 3;
    c.n_res = 0;
    c.causal = false;
    QInputs in(c);
    float* q = in.qbuf.data_as<float>();
    std::fill(q, q + c.D, 0.0f);                           // head 0
    q[c.D + 7] = std::numeric_limits<float>::quiet_NaN();  // head 1
    fn(in.q(), in.kv, in.out(), in.options());
    c.bits = 8;
    QInputs f8(c);  // int16 queries, the same rows
    std::memcpy(f8.qbuf.data(), in.qbuf.data(), in.qbuf.size_bytes());
    fn(f8.q(), f8.kv, f8.out(), f8.options());
    Tensor kd, vd;
    dequantize_quant_kv(in.kv, &kd, &vd);
    const float* o = in.obuf.data_as<float>();
    const float* o8 = f8.obuf.data_as<float>();
    for (int64_t d = 0; d < c.D; ++d) {
      double mean = 0;
      for (int64_t j = 0; j < 3 * c.G; ++j) mean += vd.view().ptr_as<float>(0, 0, j)[d];
      mean /= 3.0 * static_cast<double>(c.G);
      EXPECT_NEAR(o[d], mean, kTol) << d;  // D = 40: value groups of 10, float P.V
      const float a = o[c.D + d], b = o8[c.D + d];
      EXPECT_TRUE((std::isnan(a) && std::isnan(b)) || a == b) << d << ": " << a << " " << b;
    }
  }
}

// The SIMD kernel's chunked code order (2/4 bits: queries and packed P.V kept in the order one
// zero-extending load yields) on the cache's default geometry (G = 64, value groups of 64) and
// head dims 64 / 128 / 256 / 80 (80: value groups of 40 are not whole chunks -> channel-order
// P.V, chunked scores), decode and prefill.
TEST(QuantizedAttention, ChunkedCodeOrderDefaultGeometry) {
  for (int bits : {2, 4})
    for (int64_t D : {64, 128, 256, 80}) {
      QCase c;
      c.Hq = 8;
      c.Hkv = 2;
      c.D = D;
      c.G = 64;
      c.n_blocks = 3;
      c.n_res = 70;
      c.bits = bits;
      check(c);
      c.Sq = 20;
      c.res = DType::kF16;
      check(c);
    }
}

// llama.cpp's per-token q8_0 / q4_0 blocks (dequantized tile by tile into scratch): decode with
// split-KV, prefill across blocks and residual, a sliding window with an offset, sinks.
TEST(QuantizedAttention, PerTokenSchemes) {
  for (KVQuantScheme sch : {KVQuantScheme::kQ8_0, KVQuantScheme::kQ4_0}) {
    QCase c;
    c.scheme = sch;
    c.Hq = 6;
    c.Hkv = 2;
    c.D = 64;
    c.Dv = 96;
    c.G = 16;
    c.n_blocks = 9;
    c.n_res = 13;
    check(c);
    c.kv_split = 40;
    c.sinks = true;
    check(c);
    c.kv_split = 0;
    c.sinks = false;
    c.Sq = 30;
    c.res = DType::kF16;
    check(c);
    c.window = 37;
    c.kv_offset = 11;
    check(c);
  }
  QInputs in(QCase{});
  in.kv.scheme = KVQuantScheme::kQ8_0;  // a q8_0 span claiming 4-bit codes
  EXPECT_THROW(quantized_attention(in.q(), in.kv, in.out(), in.options()), Error);
}

TEST(QuantizedAttention, PrefillCausalAcrossBlocksAndResidual) {
  for (DType res : {DType::kF32, DType::kF16, DType::kBF16})
    for (int bits : {2, 4, 8}) {
      QCase c;
      c.Hq = 8;
      c.Hkv = 2;
      c.D = 64;
      c.G = 32;
      c.n_blocks = 4;
      c.n_res = 70;  // two residual tiles, the second partial
      c.Sq = 45;     // queries cover the residual and the last block: partial tiles
      c.res = res;
      c.bits = bits;
      check(c);
    }
}

TEST(QuantizedAttention, SlidingAndChunkedWithOffset) {
  QCase c;
  c.Hq = 3;
  c.Hkv = 1;
  c.D = 48;
  c.G = 16;
  c.n_blocks = 6;
  c.n_res = 19;
  c.Sq = 9;
  c.kv_offset = 35;
  c.window = 50;
  c.bits = 8;
  check(c);
  c.window = 0;
  c.chunk = 40;
  check(c);
  c.chunk = 0;
  c.causal = false;
  c.Sq = 3;
  check(c);
}

TEST(QuantizedAttention, SplitKvSinksSoftcap) {
  QCase c;
  c.Hq = 4;
  c.Hkv = 1;
  c.D = 32;
  c.G = 8;
  c.n_blocks = 40;
  c.n_res = 11;
  c.kv_split = 24;  // partitions of 3 blocks
  check(c);
  c.kv_split = 0;  // automatic
  c.n_blocks = 200;
  c.G = 16;
  check(c);
  c.sinks = true;
  c.softcap = 5.0f;
  c.kv_split = -1;
  check(c);
}

TEST(QuantizedAttention, EmptyPartsAndFullyMaskedRows) {
  QCase c;
  c.n_blocks = 0;  // residual only
  c.n_res = 9;
  check(c);
  c.n_blocks = 4;  // packed only
  c.n_res = 0;
  check(c);
  // Window so narrow that with a large q_offset... rows see only their own key: exercised by
  // window 1 (each query sees itself only).
  c.n_res = 6;
  c.Sq = 6;
  c.window = 1;
  check(c);
}

// A long decode is split into fixed 1,024-key partitions whatever the thread count, so the
// output bits do not depend on it (as for the fused kernel).
TEST(QuantizedAttention, LongDecodeIndependentOfThreadCount) {
  QCase c;
  c.G = 64;
  c.n_blocks = 40;  // 2,560 packed keys + residual: three partitions
  c.n_res = 100;
  QInputs in(c);
  std::vector<Tensor> outs;
  const int before = default_pool().n_threads();
  for (int threads : {1, 3}) {
    set_default_threads(threads);
    quantized_attention(in.q(), in.kv, in.out(), in.options());
    outs.push_back(in.obuf.clone());
  }
  set_default_threads(before);
  EXPECT_EQ(std::memcmp(outs[0].data(), outs[1].data(), outs[0].size_bytes()), 0);
  EXPECT_LE(max_error(in), kTol);
}

// A NaN key or value in a quantized block (a model fault) poisons its group in the codec, and the
// kernel carries the poison to every query row that attends to it: the rows of that KV head's
// group come out NaN, the other heads' rows stay finite. Finite outputs made up from a dropped
// NaN would be a wrong answer delivered as a right one.
TEST(QuantizedAttention, PoisonedBlockGivesNaNRowsOfItsGroupOnly) {
  for (int bits : {2, 4, 8})
    for (bool value : {false, true}) {
      QCase c;
      c.bits = bits;
      c.G = 32;
      c.n_blocks = 3;
      QInputs in(c);
      const KVBlockFormat f = make_kv_block_format(c.scheme, c.bits, c.G, c.D, in.Dv);
      std::vector<float> rows(static_cast<size_t>(c.G * c.D), 0.25f);
      rows[static_cast<size_t>(7 * c.D + 3)] = NAN;  // token 7, channel 3 of block 1, head 0
      if (value)
        kv_quantize_v_block(f, rows.data(), c.D, in.vb.data() + 1 * kv_v_block_bytes(f));
      else
        kv_quantize_k_block(f, rows.data(), c.D, in.kb.data() + 1 * kv_k_block_bytes(f));
      quantized_attention(in.q(), in.kv, in.out(), in.options());
      // A key's NaN reaches every logit of its block, so all of the group's outputs; a value's
      // only the output columns of its value group.
      const int64_t G = c.Hq / c.Hkv, vg = f.v_group;
      for (int64_t h = 0; h < c.Hq; ++h)
        for (int64_t d = 0; d < in.Dv; ++d) {
          const float o = in.obuf.data_as<float>()[h * in.Dv + d];
          EXPECT_EQ(std::isnan(o), h < G && (!value || d / vg == 3 / vg))
              << "bits " << bits << (value ? " value" : " key") << " head " << h << " d " << d;
        }
    }
}

TEST(QuantizedAttention, RefusesUnsupportedOptions) {
  QInputs in(QCase{});
  AttentionOptions o = in.options();
  const MaskFn fn = causal_mask();
  o.mask = &fn;
  EXPECT_THROW(quantized_attention(in.q(), in.kv, in.out(), o), Error);
  QuantKV bad = in.kv;
  bad.bits = 3;
  EXPECT_THROW(quantized_attention(in.q(), bad, in.out(), in.options()), Error);
}

// The digest of the SIMD kernels' outputs on fixed inputs: the fused kernel (f32/f16/bf16 K/V,
// decode and prefill, head dims 64/80/128, G = 1/3/4) and the quantized one (2/4/8-bit KIVI on
// the default geometry, decode and prefill). On an AVX-512 host the same test runs in
// test_kernels and test_kernels_avx2, and tests/simd_digest.cmake checks that both print the
// same digest: the 512-bit branches keep the AVX2 path's arithmetic, bit for bit.
TEST(SimdDigest, FusedAndQuantized) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the output bytes
  auto mix = [&h](const Tensor& t) {
    const auto* p = static_cast<const unsigned char*>(t.data());
    for (size_t i = 0; i < t.size_bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  };
  size_t finite = 0, total = 0;
  auto count = [&](const Tensor& t) {
    for (int64_t i = 0; i < t.numel(); ++i) finite += std::isfinite(t.data_as<float>()[i]);
    total += static_cast<size_t>(t.numel());
  };
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto fill = [&](Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    for (float& x : v) x = nd(rng);
    convert_n(v.data(), DType::kF32, t.data(), t.dtype(), v.size());
  };
  const AttentionFn fused = get_attention_kernel("fused");
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t D : {64, 80, 128})
      for (int64_t Sq : {1, 7, 33})
        for (int64_t G : {1, 3, 4}) {
          const int64_t Hkv = 2, S = 301;
          Tensor k = Tensor::empty(dt, {1, Hkv, S, D}), v = Tensor::empty(dt, {1, Hkv, S, D});
          Tensor q = Tensor::empty(DType::kF32, {1, Hkv * G, Sq, D});
          Tensor o = Tensor::zeros(DType::kF32, {1, Hkv * G, Sq, D});
          fill(k);
          fill(v);
          fill(q);
          fused(q.view(), k.view(), v.view(), o.view(), AttentionOptions{});
          mix(o);
          count(o);
        }
  for (int bits : {2, 4, 8})
    for (int64_t Sq : {1, 5}) {
      const QCase c{.Hq = 8,
                    .Sq = Sq,
                    .D = 128,
                    .G = 64,
                    .n_blocks = 6,
                    .n_res = 40,
                    .bits = bits,
                    .res = DType::kF16};
      QInputs in(c);
      quantized_attention(in.q(), in.kv, in.out(), in.options());
      mix(in.obuf);
      count(in.obuf);
    }
  EXPECT_EQ(finite, total);
  std::printf("simd digest: %016llx\n", static_cast<unsigned long long>(h));
}

}  // namespace
}  // namespace kvcache
