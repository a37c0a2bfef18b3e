#include "kernels/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace kvcache {
namespace {

// Element d of a K/V row, widened exactly to double.
double load(const void* row, DType t, int64_t d) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(row)[d];
    case DType::kF16:
      return f16_to_f32(static_cast<const f16_t*>(row)[d]);
    case DType::kBF16:
      return bf16_to_f32(static_cast<const bf16_t*>(row)[d]);
    default:
      break;
  }
  throw Error(ErrorKind::kUnsupported, "attention_reference: K/V dtype must be f32, f16 or bf16");
}

int64_t floor_div_ref(int64_t a, int64_t b) {
  return static_cast<int64_t>(std::floor(static_cast<double>(a) / static_cast<double>(b)));
}

bool visible(const AttentionOptions& o, int64_t b, int64_t h, int64_t qp, int64_t kp) {
  if (o.causal && kp > qp) return false;
  if (o.sliding_window > 0 && kp <= qp - o.sliding_window) return false;
  if (o.chunk_size > 0) {
    const int64_t off = o.chunk_offset ? o.chunk_offset[b] : 0;
    if (floor_div_ref(kp - off, o.chunk_size) != floor_div_ref(qp - off, o.chunk_size))
      return false;
  }
  if (o.kv_valid_begin && kp < o.kv_valid_begin[b]) return false;
  if (o.kv_valid_end && kp >= o.kv_valid_end[b]) return false;
  if (o.doc_ids) {
    if (qp < 0 || qp >= o.doc_len || kp < 0 || kp >= o.doc_len) return false;
    if (o.doc_ids[b * o.doc_len + qp] != o.doc_ids[b * o.doc_len + kp]) return false;
  }
  if (o.mask && !(*o.mask)(b, h, qp, kp)) return false;
  return true;
}

}  // namespace

ReferenceResult attention_reference(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const AttentionOptions& o) {
  const int64_t B = q.dim(0), Hq = q.dim(1), Sq = q.dim(2), Dk = q.dim(3);
  const int64_t Hkv = k.dim(1), Skv = k.dim(2), Dv = v.dim(3);
  const int64_t group = Hq / Hkv;
  const double scale = o.scale > 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(Dk));
  const int64_t q_off = o.q_offset >= 0 ? o.q_offset : o.kv_offset + Skv - Sq;
  ReferenceResult r;
  r.out.assign(static_cast<size_t>(B * Hq * Sq * Dv), 0.0);
  r.probs.assign(static_cast<size_t>(B * Hq * Sq * Skv), 0.0);
  std::vector<double> s(static_cast<size_t>(Skv));
  std::vector<char> vis(static_cast<size_t>(Skv));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t qp = q_off + i;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < Skv; ++j) {
          const int64_t kp = o.kv_offset + j;
          vis[static_cast<size_t>(j)] = visible(o, b, h, qp, kp);
          if (!vis[static_cast<size_t>(j)]) continue;
          const float* qr = q.ptr_as<const float>(b, h, i);
          const void* kr = k.ptr(b, hk, j);
          double dot = 0;
          for (int64_t d = 0; d < Dk; ++d)
            dot += static_cast<double>(qr[d]) * load(kr, k.dtype(), d);
          double x = dot * scale;
          if (o.softcap > 0) x = o.softcap * std::tanh(x / o.softcap);
          if (o.score) x = (*o.score)(static_cast<float>(x), b, h, qp, kp);
          s[static_cast<size_t>(j)] = x;
          mx = std::max(mx, x);
        }
        const bool has_sink = o.sinks != nullptr;
        const double sink = has_sink ? static_cast<double>(o.sinks[h]) : 0.0;
        if (has_sink) mx = std::max(mx, sink);
        if (mx == -std::numeric_limits<double>::infinity()) continue;  // sees nothing: zeros
        double den = has_sink ? std::exp(sink - mx) : 0.0;
        for (int64_t j = 0; j < Skv; ++j)
          if (vis[static_cast<size_t>(j)]) den += std::exp(s[static_cast<size_t>(j)] - mx);
        double* orow = r.out.data() + (((b * Hq + h) * Sq + i) * Dv);
        double* prow = r.probs.data() + (((b * Hq + h) * Sq + i) * Skv);
        for (int64_t j = 0; j < Skv; ++j) {
          if (!vis[static_cast<size_t>(j)]) continue;
          const double p = std::exp(s[static_cast<size_t>(j)] - mx) / den;
          prow[j] = p;
          const void* vr = v.ptr(b, hk, j);
          for (int64_t d = 0; d < Dv; ++d) orow[d] += p * load(vr, v.dtype(), d);
        }
      }
    }
  return r;
}

}  // namespace kvcache
