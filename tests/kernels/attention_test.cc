// Attention kernels against the double-precision reference, on random inputs of odd sizes.
//
// Error metric (all tests): for each output row (b, h, i) over its D_v values,
//     err_row = max_d |out - ref| / max_d |ref|,
// and a test reports the max over rows. A row whose reference is exactly zero (it sees no key)
// must be exactly zero. Tolerances (see docs/architecture.md, "Kernels"):
//   - every kernel, f32 K/V:                                err <= 1e-5
//   - every kernel, f16/bf16 K/V vs the reference on the same (rounded) K/V: err <= 1e-5
//   - f16 K/V vs the reference on the unrounded f32 K/V:    err <= 3e-3  (kF16Bound, ~6u)
//   - bf16 K/V vs the reference on the unrounded f32 K/V:   err <= 3e-2  (kBF16Bound, ~8u)
//     (inputs N(0, 1), u = 2^-11 (f16) / 2^-8 (bf16); measured worst: 8e-4 / 9e-3)
//   - decode (q_len = 1) vs the last row of the prefill: bit-identical for eager and for fused
//     without split-KV; err <= 2e-6 with split-KV (the merge reorders sums).
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/attention_reference.h"

namespace kvcache {
namespace {

constexpr double kF32Tol = 1e-5;
constexpr double kF16Bound = 3e-3;
constexpr double kBF16Bound = 3e-2;
const char* const kKernels[] = {"eager", "fused", "flex", "fused_scalar"};

struct Case {
  int64_t B = 1, Hq = 1, Hkv = 1, Sq = 1, Skv = 1, D = 64, Dv = 0;  // Dv 0: = D
  DType kv = DType::kF32;
  bool causal = true, sinks = false, docs = false, padding = false, bshd = false;
  float softcap = 0;
  int64_t window = 0, chunk = 0, kv_offset = 0;
  std::string str() const {
    std::ostringstream o;
    o << "B" << B << " Hq" << Hq << " Hkv" << Hkv << " Sq" << Sq << " Skv" << Skv << " D" << D
      << " Dv" << (Dv ? Dv : D) << " " << dtype_name(kv) << (causal ? " causal" : "")
      << (sinks ? " sinks" : "") << (docs ? " docs" : "") << (padding ? " padding" : "")
      << (bshd ? " bshd" : "") << " softcap" << softcap << " window" << window << " chunk" << chunk
      << " kv_offset" << kv_offset;
    return o.str();
  }
};

// Random inputs laid out like the runtime's: q/out strided views of [B, S, H, D] buffers, K/V
// strided views of a cache buffer with spare capacity ([B, H_kv, cap, D] or [B, cap, H_kv, D]).
struct Inputs {
  Case c;
  Tensor qbuf, obuf, kbuf, vbuf, k32buf, v32buf;
  TensorView q, out, k, v, k32, v32;
  std::vector<float> sinks;
  std::vector<int32_t> docs;
  std::vector<int64_t> begin, end;
  AttentionOptions opts;
};

TensorView bshd_view(const Tensor& t, int64_t B, int64_t H, int64_t S, int64_t D, int64_t cap) {
  return TensorView(t.data(), t.dtype(), {B, H, S, D}, {cap * H * D, D, H * D, 1});
}
TensorView bhsd_view(const Tensor& t, int64_t B, int64_t H, int64_t S, int64_t D, int64_t cap) {
  return TensorView(t.data(), t.dtype(), {B, H, S, D}, {H * cap * D, cap * D, D, 1});
}

std::unique_ptr<Inputs> make_inputs(const Case& c, uint32_t seed) {
  auto in = std::make_unique<Inputs>();
  in->c = c;
  const int64_t Dv = c.Dv ? c.Dv : c.D, cap = c.Skv + 3;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  in->qbuf = Tensor::empty(DType::kF32, {c.B, c.Sq, c.Hq, c.D});
  in->obuf = Tensor::zeros(DType::kF32, {c.B, c.Sq, c.Hq, Dv});
  const float qmul = c.softcap > 0 ? 4.0f : 1.0f;  // make the softcap bite
  for (int64_t i = 0; i < in->qbuf.numel(); ++i) in->qbuf.data_as<float>()[i] = qmul * nd(rng);
  in->q = bshd_view(in->qbuf, c.B, c.Hq, c.Sq, c.D, c.Sq);
  in->out = bshd_view(in->obuf, c.B, c.Hq, c.Sq, Dv, c.Sq);
  auto fill_kv = [&](Tensor& buf, Tensor& buf32, int64_t d) {
    buf32 = Tensor::empty(DType::kF32, {c.B, c.Hkv, cap, d});
    buf = Tensor::empty(c.kv, {c.B, c.Hkv, cap, d});
    for (int64_t i = 0; i < buf32.numel(); ++i) buf32.data_as<float>()[i] = nd(rng);
    convert_n(buf32.data(), DType::kF32, buf.data(), c.kv, static_cast<size_t>(buf32.numel()));
  };
  fill_kv(in->kbuf, in->k32buf, c.D);
  fill_kv(in->vbuf, in->v32buf, Dv);
  auto kv_view = c.bshd ? bshd_view : bhsd_view;
  in->k = kv_view(in->kbuf, c.B, c.Hkv, c.Skv, c.D, cap);
  in->v = kv_view(in->vbuf, c.B, c.Hkv, c.Skv, Dv, cap);
  in->k32 = kv_view(in->k32buf, c.B, c.Hkv, c.Skv, c.D, cap);
  in->v32 = kv_view(in->v32buf, c.B, c.Hkv, c.Skv, Dv, cap);

  AttentionOptions& o = in->opts;
  o.causal = c.causal;
  o.softcap = c.softcap;
  o.sliding_window = c.window;
  o.chunk_size = c.chunk;
  o.kv_offset = c.kv_offset;
  if (c.sinks) {
    for (int64_t h = 0; h < c.Hq; ++h) in->sinks.push_back(2.0f * nd(rng));
    o.sinks = in->sinks.data();
  }
  const int64_t len = c.kv_offset + c.Skv;
  if (c.docs) {
    in->docs.resize(static_cast<size_t>(c.B * len));
    for (int64_t b = 0; b < c.B; ++b) {
      int32_t d = 0;
      for (int64_t p = 0; p < len; ++p) {
        if (rng() % 23 == 0) ++d;
        in->docs[static_cast<size_t>(b * len + p)] = d;
      }
    }
    o.doc_ids = in->docs.data();
    o.doc_len = len;
  }
  if (c.padding) {
    for (int64_t b = 0; b < c.B; ++b) {
      // Left padding (keys before begin) on odd rows, right padding (after end) on even rows.
      const int64_t cut = static_cast<int64_t>(rng() % static_cast<uint32_t>(c.Skv / 3 + 1));
      in->begin.push_back(b % 2 ? c.kv_offset + cut : 0);
      in->end.push_back(b % 2 ? len : len - cut);
    }
    o.kv_valid_begin = in->begin.data();
    o.kv_valid_end = in->end.data();
  }
  return in;
}

// Max over rows of max_d |out - ref| / max_d |ref|; zero reference rows must be exactly zero.
double row_error(const TensorView& out, const std::vector<double>& ref) {
  const int64_t B = out.dim(0), H = out.dim(1), S = out.dim(2), D = out.dim(3);
  double worst = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const double* r = ref.data() + (((b * H + h) * S + i) * D);
        const float* a = out.ptr_as<const float>(b, h, i);
        double diff = 0, mag = 0;
        for (int64_t d = 0; d < D; ++d) {
          diff = std::max(diff, std::abs(static_cast<double>(a[d]) - r[d]));
          mag = std::max(mag, std::abs(r[d]));
        }
        if (mag == 0) {
          if (diff != 0) return INFINITY;
          continue;
        }
        if (!(diff / mag <= worst)) worst = std::isnan(diff) ? INFINITY : diff / mag;
      }
  return worst;
}

std::vector<double> out_as_double(const TensorView& out) {
  std::vector<double> r;
  for (int64_t b = 0; b < out.dim(0); ++b)
    for (int64_t h = 0; h < out.dim(1); ++h)
      for (int64_t i = 0; i < out.dim(2); ++i)
        for (int64_t d = 0; d < out.dim(3); ++d) r.push_back(*out.ptr_as<const float>(b, h, i, d));
  return r;
}

std::vector<Case> reference_cases() {
  std::vector<Case> cs;
  // Head dims x group sizes, small odd lengths, both K/V layouts.
  for (int64_t D : {64, 80, 128, 256})
    for (int64_t G : {1, 2, 8}) {
      Case c;
      c.D = D;
      c.Hkv = G == 8 ? 1 : 2;
      c.Hq = c.Hkv * G;
      c.Sq = 7;
      c.Skv = 7;
      c.bshd = D == 80;
      cs.push_back(c);
    }
  // S = 129 with each mask feature, and q_len < kv_len (bottom-right, with a kv_offset).
  auto add = [&](auto f) {
    Case c;
    c.B = 2;
    c.Hq = 4;
    c.Hkv = 2;
    c.Sq = 129;
    c.Skv = 129;
    c.D = 64;
    f(c);
    cs.push_back(c);
  };
  add([](Case&) {});
  add([](Case& c) { c.causal = false; });
  add([](Case& c) { c.sinks = true; });
  add([](Case& c) {
    c.softcap = 5.0f;
    c.D = 80;
  });
  add([](Case& c) {
    c.window = 33;
    c.kv_offset = 20;
    c.Sq = 40;
  });
  add([](Case& c) {
    c.chunk = 50;
    c.kv_offset = 7;
    c.Sq = 7;
  });
  add([](Case& c) {
    c.docs = true;
    c.bshd = true;
  });
  add([](Case& c) {
    c.padding = true;
    c.sinks = true;
  });
  add([](Case& c) {
    c.docs = true;
    c.padding = true;
    c.window = 40;
    c.Hq = 8;
    c.Hkv = 1;
  });
  add([](Case& c) {
    c.kv = DType::kF16;
    c.window = 64;
    c.sinks = true;
    c.Dv = 48;
  });
  add([](Case& c) {
    c.kv = DType::kBF16;
    c.chunk = 32;
    c.softcap = 3.0f;
    c.D = 128;
  });
  add([](Case& c) {  // MLA after expansion (DeepSeek-V3): D_k = 128 + 64 = 192, D_v = 128
    c.D = 192;
    c.Dv = 128;
    c.Hq = 4;
    c.Hkv = 4;
  });
  add([](Case& c) {  // the same with f16 storage, a window and sinks
    c.kv = DType::kF16;
    c.D = 192;
    c.Dv = 128;
    c.window = 17;
    c.sinks = true;
  });
  add([](Case& c) {
    c.kv = DType::kF16;
    c.docs = true;
    c.D = 256;
    c.Hq = 2;
    c.Hkv = 1;
  });
  // Decode (q_len = 1) of every kind.
  for (int i = 0; i < 6; ++i) {
    Case c;
    c.Hq = 8;
    c.Hkv = 2;
    c.Skv = 129;
    c.D = 128;
    c.kv = i % 3 == 0 ? DType::kF32 : i % 3 == 1 ? DType::kF16 : DType::kBF16;
    c.window = i == 1 ? 50 : 0;
    c.chunk = i == 2 ? 40 : 0;
    c.sinks = i == 3;
    c.padding = i == 4;
    c.B = i == 4 ? 2 : 1;
    c.docs = i == 5;
    c.kv_offset = i * 5;
    cs.push_back(c);
  }
  // Degenerate lengths.
  {
    Case c;  // one key, one query
    c.Hq = 2;
    c.D = 80;
    cs.push_back(c);
    c.Skv = 0;  // empty cache: zeros
    c.sinks = true;
    cs.push_back(c);
  }
  // S = 1000 (a few combos only).
  {
    Case c;
    c.Hq = 2;
    c.Hkv = 1;
    c.Sq = 1000;
    c.Skv = 1000;
    c.D = 64;
    c.window = 300;
    c.sinks = true;
    cs.push_back(c);
    c = Case();
    c.Hq = 8;
    c.Hkv = 1;
    c.Skv = 1000;
    c.D = 128;
    c.kv = DType::kF16;
    cs.push_back(c);
  }
  return cs;
}

TEST(Attention, KernelsMatchDoubleReference) {
  uint32_t seed = 1;
  double worst_f16 = 0, worst_bf16 = 0;
  for (const Case& c : reference_cases()) {
    auto in = make_inputs(c, seed++);
    const ReferenceResult ref = attention_reference(in->q, in->k, in->v, in->opts);
    std::vector<double> eager_out;
    for (const char* name : kKernels) {
      std::fill(in->obuf.data_as<float>(), in->obuf.data_as<float>() + in->obuf.numel(), NAN);
      get_attention_kernel(name)(in->q, in->k, in->v, in->out, in->opts);
      const double err = row_error(in->out, ref.out);
      EXPECT_LE(err, kF32Tol) << name << " on " << c.str();
      if (std::string(name) == "eager") {
        eager_out = out_as_double(in->out);
      } else {
        // Fused and flex agree with eager (both are within 1e-5 of the reference).
        EXPECT_LE(row_error(in->out, eager_out), 2 * kF32Tol) << name << " vs eager, " << c.str();
      }
      if (c.kv != DType::kF32 && std::string(name) == "fused") {
        const ReferenceResult unrounded = attention_reference(in->q, in->k32, in->v32, in->opts);
        const double e = row_error(in->out, unrounded.out);
        const double bound = c.kv == DType::kF16 ? kF16Bound : kBF16Bound;
        EXPECT_LE(e, bound) << "vs unrounded K/V, " << c.str();
        (c.kv == DType::kF16 ? worst_f16 : worst_bf16) =
            std::max(c.kv == DType::kF16 ? worst_f16 : worst_bf16, e);
      }
    }
  }
  RecordProperty("worst_f16_vs_unrounded", std::to_string(worst_f16));
  RecordProperty("worst_bf16_vs_unrounded", std::to_string(worst_bf16));
  std::printf("worst error vs unrounded K/V: f16 %.3g, bf16 %.3g\n", worst_f16, worst_bf16);
}

// Decode (q_len = 1 at the last position) equals the last row of the full prefill.
TEST(Attention, DecodeEqualsLastRowOfPrefill) {
  const MaskFn head_mask = [](int64_t, int64_t h, int64_t q, int64_t kv) {
    return h % 2 == 0 || (q - kv) % 5 != 2;
  };
  const ScoreFn alibi = [](float s, int64_t, int64_t h, int64_t q, int64_t kv) {
    return s - 0.01f * static_cast<float>(h + 1) * static_cast<float>(q - kv);
  };
  for (int kind = 0; kind < 9; ++kind)
    for (int64_t S : {129, 1000}) {
      if (S == 1000 && kind > 1) continue;  // the long case for plain causal and window only
      Case c;
      c.B = S == 1000 ? 1 : 2;
      c.Hq = S == 1000 ? 2 : 8;
      c.Hkv = S == 1000 ? 1 : 2;
      c.Sq = S;
      c.Skv = S;
      c.D = 64;
      c.kv = kind % 2 ? DType::kF16 : DType::kF32;
      c.window = kind == 1 ? 37 : 0;
      c.chunk = kind == 2 ? 45 : 0;
      c.docs = kind == 3;
      c.padding = kind == 4;
      c.sinks = kind == 5;
      c.softcap = kind == 5 ? 3.0f : 0.0f;
      c.kv_offset = kind == 1 ? 60 : 0;
      auto in = make_inputs(c, 100 + static_cast<uint32_t>(kind));
      if (kind == 6) in->opts.mask = &head_mask;
      if (kind == 7) in->opts.score = &alibi;
      if (kind == 8) in->opts.causal = false;
      for (const char* name : {"eager", "fused", "flex"}) {
        AttentionOptions o = in->opts;
        o.kv_split = -1;
        get_attention_kernel(name)(in->q, in->k, in->v, in->out, o);
        const std::vector<double> want = out_as_double(in->out.slice(2, S - 1, S));
        for (int64_t split : {int64_t{-1}, int64_t{128}}) {
          if (split > 0 && std::string(name) == "eager") continue;
          o.kv_split = split;
          Tensor dec_buf = Tensor::zeros(DType::kF32, {c.B, c.Hq, 1, c.D});
          get_attention_kernel(name)(in->q.slice(2, S - 1, S), in->k, in->v, dec_buf.view(), o);
          const std::string what = std::string(name) + " split " + std::to_string(split) +
                                   " kind " + std::to_string(kind) + " " + c.str();
          if (split < 0) {
            EXPECT_EQ(out_as_double(dec_buf.view()), want) << "not bit-identical: " << what;
          } else {
            EXPECT_LE(row_error(dec_buf.view(), want), 2e-6) << what;
          }
        }
      }
    }
}

// Query i of `in` alone against keys [0, i], one decode row per head, for each i in `rows`:
// the fused kernel's row must equal row i of its prefill output `in.out` bit for bit.
void expect_fused_decode_rows_equal(const Inputs& in, const AttentionOptions& o,
                                    const std::vector<int64_t>& rows) {
  const Case& c = in.c;
  for (int64_t i : rows) {
    const std::vector<double> want = out_as_double(in.out.slice(2, i, i + 1));
    Tensor dec = Tensor::zeros(DType::kF32, {c.B, c.Hq, 1, c.D});
    get_attention_kernel("fused")(in.q.slice(2, i, i + 1), in.k.slice(2, 0, i + 1),
                                  in.v.slice(2, 0, i + 1), dec.view(), o);
    EXPECT_EQ(out_as_double(dec.view()), want) << "row " << i << " " << c.str();
  }
}

// Prefill tasks of >= 8 rows score through transposed key tiles (a GEMM-shaped kernel), decode
// rows through per-pair dot products: the two must agree bit for bit for every head dim that
// is a multiple of 8 (64 and 128 compiled as constants, the rest at run time), every K/V dtype,
// and rows on partial tiles (S = 77: a 13-key last tile, diagonal tiles with masked keys).
TEST(Attention, FusedTransposedScoresEqualPerPairDecode) {
  for (int64_t D : {8, 24, 64, 80, 128})
    for (DType kv : {DType::kF32, DType::kF16, DType::kBF16}) {
      Case c;
      c.B = 1;
      c.Hq = 6;
      c.Hkv = 2;
      c.Sq = 77;
      c.Skv = 77;
      c.D = D;
      c.kv = kv;
      auto in = make_inputs(c, 7 + static_cast<uint32_t>(D));
      AttentionOptions o = in->opts;
      o.kv_split = -1;
      get_attention_kernel("fused")(in->q, in->k, in->v, in->out, o);
      expect_fused_decode_rows_equal(*in, o, {0, 40, c.Sq - 1});  // 3 decode rows per task
    }
}

// With G = 3, 77-84 positions are one query tile and 130 or 133 two (68 + 62, 68 + 65: the
// last one shorter); most of these tasks end in a partial register block of the transposed
// score kernel (1 to 3 rows). Each row still equals the decode row of the same query.
TEST(Attention, FusedTransposedTailRowsEqualDecode) {
  for (int64_t D : {24, 64})
    for (int64_t S : {77, 78, 79, 81, 84, 130, 133}) {
      Case c;
      c.B = 1;
      c.Hq = 6;
      c.Hkv = 2;
      c.Sq = S;
      c.Skv = S;
      c.D = D;
      c.kv = DType::kF16;
      auto in = make_inputs(c, 11 + static_cast<uint32_t>(S + D));
      AttentionOptions o = in->opts;
      o.kv_split = -1;
      get_attention_kernel("fused")(in->q, in->k, in->v, in->out, o);
      expect_fused_decode_rows_equal(*in, o, {S - 6, S - 5, S - 4, S - 3, S - 2, S - 1});
    }
}

TEST(Attention, EagerReturnsProbabilities) {
  Case c;
  c.B = 2;
  c.Hq = 4;
  c.Hkv = 2;
  c.Sq = 9;
  c.Skv = 31;
  c.kv_offset = 5;
  c.sinks = true;
  c.window = 12;
  auto in = make_inputs(c, 42);
  Tensor w;
  in->opts.weights_out = &w;
  get_attention_kernel("eager")(in->q, in->k, in->v, in->out, in->opts);
  ASSERT_EQ(w.shape(), (Shape{2, 4, 9, 31}));
  const ReferenceResult ref = attention_reference(in->q, in->k, in->v, in->opts);
  double worst = 0;
  for (int64_t i = 0; i < w.numel(); ++i)
    worst = std::max(worst, std::abs(w.data_as<float>()[i] - ref.probs[static_cast<size_t>(i)]));
  EXPECT_LE(worst, 1e-6);
  // Masked keys have probability exactly 0 (window of 12 over 31 keys).
  EXPECT_EQ(w.data_as<float>()[0], 0.0f);
}

TEST(Attention, FlexUserFunctionsMatchBuiltins) {
  Case c;
  c.B = 1;
  c.Hq = 4;
  c.Hkv = 1;
  c.Sq = 150;
  c.Skv = 150;
  c.D = 64;
  c.causal = true;
  c.window = 20;
  auto in = make_inputs(c, 9);
  get_attention_kernel("fused")(in->q, in->k, in->v, in->out, in->opts);
  const std::vector<double> builtin = out_as_double(in->out);
  // The same mask expressed as mask_mod functions only.
  const MaskFn user = and_masks({causal_mask(), sliding_window_overlay(20)});
  AttentionOptions o = in->opts;
  o.causal = false;
  o.sliding_window = 0;
  o.mask = &user;
  get_attention_kernel("flex")(in->q, in->k, in->v, in->out, o);
  EXPECT_EQ(out_as_double(in->out), builtin);  // same arithmetic, same tiles skipped
}

// A BlockMask holds the function's values as bits: flex reading the bits computes exactly what
// flex calling the function computes (same visibility, same arithmetic), for a head-dependent
// mask over odd sizes, with built-in window and documents ANDed on top; eager honours it too.
TEST(Attention, FlexBlockMaskEqualsMaskFunction) {
  for (int variant = 0; variant < 3; ++variant) {
    Case c;
    c.B = 2;
    c.Hq = 4;
    c.Hkv = 2;
    c.Sq = variant == 2 ? 1 : 97;
    c.Skv = 200;
    c.D = 80;
    c.kv_offset = 3;
    c.docs = variant == 1;
    c.window = variant == 1 ? 90 : 0;
    SCOPED_TRACE(c.str());
    auto in = make_inputs(c, 40 + static_cast<uint32_t>(variant));
    // Head-dependent stripes plus a per-row prefix that is always visible ("global tokens").
    const MaskFn fn = [](int64_t b, int64_t h, int64_t q, int64_t kv) {
      return kv < 5 + b || ((q + kv + h) % 3 != 0 && kv % 64 != 7);
    };
    const MaskGeometry g =
        make_geometry(c.B, c.Hq, c.Sq, c.Skv, in->opts.q_offset, in->opts.kv_offset);
    const BlockMask bm = BlockMask::create(fn, g, /*per_head=*/true);
    EXPECT_GT(bm.density(), 0.3);
    EXPECT_LT(bm.density(), 0.8);
    EXPECT_EQ(bm.bytes(), static_cast<size_t>(c.B * c.Hq * c.Sq * 4) * sizeof(uint64_t));
    AttentionOptions with_fn = in->opts, with_bits = in->opts;
    with_fn.mask = &fn;
    with_bits.block_mask = &bm;
    for (const char* name : {"flex", "fused", "fused_scalar"}) {
      get_attention_kernel(name)(in->q, in->k, in->v, in->out, with_fn);
      const std::vector<double> a = out_as_double(in->out);
      std::fill(in->obuf.data_as<float>(), in->obuf.data_as<float>() + in->obuf.numel(), NAN);
      get_attention_kernel(name)(in->q, in->k, in->v, in->out, with_bits);
      EXPECT_EQ(out_as_double(in->out), a) << name;
    }
    get_attention_kernel("eager")(in->q, in->k, in->v, in->out, with_bits);
    const ReferenceResult ref = attention_reference(in->q, in->k, in->v, with_fn);
    EXPECT_LE(row_error(in->out, ref.out), kF32Tol) << "eager with block_mask vs reference";
  }
}

TEST(Attention, BlockMaskRejectsOtherGeometries) {
  Case c;
  c.Hq = 2;
  c.Sq = 10;
  c.Skv = 30;
  auto in = make_inputs(c, 3);
  const MaskFn fn = [](int64_t, int64_t, int64_t q, int64_t kv) { return kv <= q; };
  const BlockMask bm = BlockMask::create(fn, make_geometry(1, 2, 10, 31, -1, 0), false);
  AttentionOptions o = in->opts;
  o.block_mask = &bm;
  EXPECT_THROW(get_attention_kernel("flex")(in->q, in->k, in->v, in->out, o), Error);
  const BlockMask ok = BlockMask::create(fn, make_geometry(1, 2, 10, 30, -1, 0), false);
  o.block_mask = &ok;
  EXPECT_NO_THROW(get_attention_kernel("flex")(in->q, in->k, in->v, in->out, o));
  o.mask = &fn;  // both at once
  EXPECT_THROW(get_attention_kernel("flex")(in->q, in->k, in->v, in->out, o), Error);
  EXPECT_THROW(BlockMask::create(MaskFn(), make_geometry(1, 1, 1, 1, -1, 0), false), Error);
}

TEST(Attention, RowsThatSeeNothingAreZero) {
  Case c;
  c.B = 2;
  c.Hq = 2;
  c.Hkv = 1;
  c.Sq = 20;
  c.Skv = 20;
  auto in = make_inputs(c, 5);
  const int64_t begin[2] = {10, 0}, end[2] = {20, 20};  // row 0: queries 0..9 see no key
  in->opts.kv_valid_begin = begin;
  in->opts.kv_valid_end = end;
  for (const char* name : kKernels) {
    std::fill(in->obuf.data_as<float>(), in->obuf.data_as<float>() + in->obuf.numel(), NAN);
    get_attention_kernel(name)(in->q, in->k, in->v, in->out, in->opts);
    for (int64_t i = 0; i < 10; ++i)
      for (int64_t d = 0; d < c.D; ++d) ASSERT_EQ(*in->out.ptr_as<float>(0, 1, i, d), 0.0f) << name;
    EXPECT_NE(*in->out.ptr_as<float>(0, 1, 15, 0), 0.0f) << name;
  }
}

// A NaN key (a model fault) makes NaN exactly the rows that attend to it, in every kernel: the
// group's heads at the positions that see the key, in prefill, in a decode split into partitions
// (merged afterwards), for f32 and f16 storage. The rows that do not see it stay finite. Before,
// the vector softmax's max dropped the NaN and its exp clamped it, so fused rows came out finite.
TEST(Attention, NaNKeyPoisonsExactlyTheRowsThatSeeIt) {
  for (const DType kv : {DType::kF32, DType::kF16})
    for (const bool decode : {false, true}) {
      Case c;
      c.Hq = 4;
      c.Hkv = 2;
      c.kv = kv;
      c.Sq = decode ? 1 : 40;
      c.Skv = decode ? 3000 : 40;  // decode: split-KV partitions
      const int64_t bad = decode ? 2500 : 20;
      auto in = make_inputs(c, 11);
      if (kv == DType::kF32)
        *in->k.ptr_as<float>(0, 0, bad, 3) = NAN;
      else
        *in->k.ptr_as<uint16_t>(0, 0, bad, 3) = 0x7e00;
      for (const char* name : kKernels) {
        std::fill(in->obuf.data_as<float>(), in->obuf.data_as<float>() + in->obuf.numel(), 0.0f);
        get_attention_kernel(name)(in->q, in->k, in->v, in->out, in->opts);
        for (int64_t h = 0; h < c.Hq; ++h)
          for (int64_t i = 0; i < c.Sq; ++i) {
            const bool sees = h < c.Hq / c.Hkv && (decode || i >= bad);
            for (int64_t d = 0; d < c.D; ++d)
              ASSERT_EQ(std::isnan(*in->out.ptr_as<float>(0, h, i, d)), sees)
                  << name << " " << c.str() << " head " << h << " row " << i << " d " << d;
          }
      }
    }
}

// The same for a split decode whose other partitions see nothing (a sliding window inside the
// last partition): the merge must keep the poisoned partition's NaN, not take the max of the
// others (-inf) and write zeros.
TEST(Attention, NaNKeyInTheOnlyVisiblePartitionOfASplitDecode) {
  Case c;
  c.Hq = 4;
  c.Hkv = 2;
  c.Skv = 3000;
  c.window = 100;
  auto in = make_inputs(c, 12);
  *in->k.ptr_as<float>(0, 0, 2950, 3) = NAN;
  for (const char* name : kKernels) {
    AttentionOptions o = in->opts;
    o.kv_split = 1024;
    std::fill(in->obuf.data_as<float>(), in->obuf.data_as<float>() + in->obuf.numel(), 0.0f);
    get_attention_kernel(name)(in->q, in->k, in->v, in->out, o);
    for (int64_t h = 0; h < c.Hq; ++h)
      for (int64_t d = 0; d < c.D; ++d)
        ASSERT_EQ(std::isnan(*in->out.ptr_as<float>(0, h, 0, d)), h < 2)
            << name << " head " << h << " d " << d;
  }
}

TEST(Attention, RejectsBadArguments) {
  Case c;
  c.Hq = 3;
  c.Hkv = 2;  // not a multiple
  auto in = make_inputs(c, 1);
  for (const char* name : kKernels)
    EXPECT_THROW(get_attention_kernel(name)(in->q, in->k, in->v, in->out, in->opts), Error);
  try {
    get_attention_kernel("sdpa");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("eager"), std::string::npos);
  }
  const auto names = attention_kernel_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "flex"), names.end());
  Case d;
  auto ok = make_inputs(d, 2);
  Tensor q16 = Tensor::zeros(DType::kF16, {1, 1, 1, 64});
  EXPECT_THROW(get_attention_kernel("fused")(q16.view(), ok->k, ok->v, ok->out, ok->opts), Error);
  const TensorView strided_k(ok->k.data(), ok->k.dtype(), ok->k.shape(), {64, 64, 64, 2});
  EXPECT_THROW(get_attention_kernel("fused")(ok->q, strided_k, ok->v, ok->out, ok->opts), Error);
}

// The checks build their messages only when they fail: the details (counts, shapes) still reach
// the user.
TEST(Attention, BadArgumentMessagesCarryTheDetails) {
  const auto message = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  Case c;
  c.Hq = 3;
  c.Hkv = 2;
  auto in = make_inputs(c, 1);
  const std::string heads =
      message([&] { get_attention_kernel("fused")(in->q, in->k, in->v, in->out, in->opts); });
  EXPECT_NE(heads.find("H_q (3) must be a multiple of H_kv (2)"), std::string::npos) << heads;
  Case d;
  auto ok = make_inputs(d, 2);
  const TensorView q3(ok->q.data(), ok->q.dtype(), {1, 1, 64}, {64, 64, 1});
  const std::string dims =
      message([&] { get_attention_kernel("eager")(q3, ok->k, ok->v, ok->out, ok->opts); });
  EXPECT_NE(dims.find("must be 4-d"), std::string::npos) << dims;
  EXPECT_NE(dims.find(q3.shape().str()), std::string::npos) << dims;
  const TensorView out_bad(ok->out.data(), ok->out.dtype(), {1, 1, 1, 32}, {64, 64, 64, 1});
  const std::string out =
      message([&] { get_attention_kernel("fused")(ok->q, ok->k, ok->v, out_bad, ok->opts); });
  EXPECT_NE(out.find("got " + out_bad.shape().str()), std::string::npos) << out;
}

}  // namespace
}  // namespace kvcache
