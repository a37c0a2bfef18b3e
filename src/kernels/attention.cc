// Kernel registry, argument validation, and the "eager" kernel (materialised mask and scores).
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/attention_internal.h"

namespace kvcache {

MaskSpec attention_mask_spec(const AttentionOptions& o) {
  MaskSpec s;
  s.causal = o.causal;
  s.sliding_window = o.sliding_window;
  s.chunk_size = o.chunk_size;
  s.chunk_offset = o.chunk_offset;
  s.doc_ids = o.doc_ids;
  s.doc_len = o.doc_len;
  s.kv_begin = o.kv_valid_begin;
  s.kv_end = o.kv_valid_end;
  s.fn = o.block_mask ? &o.block_mask->fn() : o.mask;
  return s;
}

namespace {

// The message is built only on failure: the checks run on every call (a decode step calls
// once per layer), and building the shape strings eagerly would weigh on a short decode call.
void require(bool ok, ErrorKind kind, const char* msg) {
  if (!ok) throw Error(kind, std::string("attention: ") + msg);
}
template <typename MakeMsg>
void require(bool ok, ErrorKind kind, MakeMsg&& make_msg) {
  if (!ok) throw Error(kind, "attention: " + std::string(make_msg()));
}

}  // namespace

void validate_attention_args(const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const AttentionOptions& o) {
  const auto ia = ErrorKind::kInvalidArgument;
  require(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4 && out.ndim() == 4, ia, [&] {
    return "q, k, v and out must be 4-d ([B, H, S, D]); got q " + q.shape().str() + ", k " +
           k.shape().str() + ", v " + v.shape().str() + ", out " + out.shape().str();
  });
  require(q.dtype() == DType::kF32 && out.dtype() == DType::kF32, ErrorKind::kUnsupported,
          "q and out must be f32");
  const DType kt = k.dtype();
  require(
      kt == DType::kF32 || kt == DType::kF16 || kt == DType::kBF16, ErrorKind::kUnsupported, [&] {
        return std::string("k/v dtype ") + dtype_name(kt) + " is not supported (f32, f16, bf16)";
      });
  require(v.dtype() == kt, ia, "k and v must have the same dtype");
  const int64_t B = q.dim(0), Hq = q.dim(1), Sq = q.dim(2), Dk = q.dim(3);
  require(k.dim(0) == B && v.dim(0) == B && out.dim(0) == B, ia, "batch sizes differ");
  require(k.dim(1) > 0 && Hq % k.dim(1) == 0, ia, [&] {
    return "H_q (" + std::to_string(Hq) + ") must be a multiple of H_kv (" +
           std::to_string(k.dim(1)) + ")";
  });
  require(v.dim(1) == k.dim(1), ia, "k and v have different head counts");
  require(v.dim(2) == k.dim(2), ia, "k and v have different sequence lengths");
  require(k.dim(3) == Dk, ia, "q and k head dims differ");
  require(out.dim(1) == Hq && out.dim(2) == Sq && out.dim(3) == v.dim(3), ia, [&] {
    return "out must be [B, H_q, S_q, D_v] = " + Shape{B, Hq, Sq, v.dim(3)}.str() + ", got " +
           out.shape().str();
  });
  require(q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1 && out.stride(3) == 1, ia,
          "the innermost (head-dim) stride of q, k, v and out must be 1");
  require(o.scale >= 0 && std::isfinite(o.scale), ia, "scale must be finite and >= 0");
  require(o.softcap >= 0 && std::isfinite(o.softcap), ia, "softcap must be finite and >= 0");
  require(o.sliding_window >= 0 && o.chunk_size >= 0, ia,
          "sliding_window and chunk_size must be >= 0");
  require(o.kv_offset >= 0 && o.q_offset >= -1, ia, "kv_offset must be >= 0, q_offset >= -1");
  if (o.block_mask) {
    require(!o.mask, ia, "set either mask or block_mask, not both");
    require(static_cast<bool>(*o.block_mask), ia, "block_mask is empty (use BlockMask::create)");
    const MaskGeometry& g = o.block_mask->geometry();
    const int64_t q_off = o.q_offset >= 0 ? o.q_offset : o.kv_offset + k.dim(2) - Sq;
    require(g.batch == B && g.q_len == Sq && g.kv_len == k.dim(2) && g.q_offset == q_off &&
                g.kv_offset == o.kv_offset && (!o.block_mask->per_head() || g.heads == Hq),
            ia, [&] {
              return "block_mask was built for batch " + std::to_string(g.batch) + ", heads " +
                     std::to_string(g.heads) + ", q_len " + std::to_string(g.q_len) + ", kv_len " +
                     std::to_string(g.kv_len) + ", q_offset " + std::to_string(g.q_offset) +
                     ", kv_offset " + std::to_string(g.kv_offset) + "; this call has " +
                     std::to_string(B) + ", " + std::to_string(Hq) + ", " + std::to_string(Sq) +
                     ", " + std::to_string(k.dim(2)) + ", " + std::to_string(q_off) + ", " +
                     std::to_string(o.kv_offset) + " (build one per call geometry)";
            });
  }
  if (o.doc_ids) {
    const int64_t q_off = o.q_offset >= 0 ? o.q_offset : o.kv_offset + k.dim(2) - Sq;
    require(q_off >= 0 && q_off + Sq <= o.doc_len && o.kv_offset + k.dim(2) <= o.doc_len, ia, [&] {
      return "doc_ids must cover every query and key position (doc_len " +
             std::to_string(o.doc_len) + ")";
    });
  }
}

// ---- eager ----
namespace {

void eager_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const AttentionOptions& o) {
  validate_attention_args(q, k, v, out, o);
  const int64_t B = q.dim(0), Hq = q.dim(1), Sq = q.dim(2), Dk = q.dim(3);
  const int64_t Hkv = k.dim(1), Skv = k.dim(2), Dv = v.dim(3), group = Hq / Hkv;
  const float scale = o.scale > 0 ? o.scale : 1.0f / std::sqrt(static_cast<float>(Dk));
  const MaskSpec spec = attention_mask_spec(o);
  const MaskGeometry geo = make_geometry(B, Hq, Sq, Skv, o.q_offset, o.kv_offset);

  // Use 3 of the mask module: no mask at all when everything is visible (decode, causal).
  Tensor mask;  // [B, 1 or H_q, S_q, S_kv] additive, or nothing
  const bool masked = !mask_is_all_visible(spec, geo);
  if (masked) mask = materialize_additive_mask(spec, geo);
  const int64_t mask_planes = masked ? mask.dim(1) : 0;

  float* weights = nullptr;
  if (o.weights_out) {
    *o.weights_out = Tensor::zeros(DType::kF32, {B, Hq, Sq, Skv});
    weights = o.weights_out->data_as<float>();
  }

  // K/V widened to f32 once per (b, h_kv) (eager copies; fused never does).
  default_pool().parallel_for(B * Hq, [&](int64_t task) {
    const int64_t b = task / Hq, h = task % Hq, hk = h / group;
    std::vector<float> kf(static_cast<size_t>(Skv * Dk)), vf(static_cast<size_t>(Skv * Dv));
    for (int64_t j = 0; j < Skv; ++j) {
      convert_n(k.ptr(b, hk, j), k.dtype(), kf.data() + (j * Dk), DType::kF32,
                static_cast<size_t>(Dk));
      convert_n(v.ptr(b, hk, j), v.dtype(), vf.data() + (j * Dv), DType::kF32,
                static_cast<size_t>(Dv));
    }
    // The materialised [S_q, S_kv] score matrix of this head.
    std::vector<float> scores(static_cast<size_t>(Sq * Skv));
    for (int64_t i = 0; i < Sq; ++i) {
      const float* qr = q.ptr_as<const float>(b, h, i);
      float* s = scores.data() + (i * Skv);
      const float* mrow = mask_planes
                              ? mask.data_as<float>() +
                                    ((b * mask_planes + (mask_planes > 1 ? h : 0)) * Sq + i) * Skv
                              : nullptr;
      const int64_t qp = geo.q_offset + i;
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < Skv; ++j) {
        float x = detail::dot_f32(qr, kf.data() + (j * Dk), Dk) * scale;
        if (o.softcap > 0) x = o.softcap * std::tanh(x / o.softcap);
        if (o.score) x = (*o.score)(x, b, h, qp, o.kv_offset + j);
        // A masked key takes no part whatever its logit: -inf, not x - inf (NaN for a NaN key,
        // which would poison rows that never see it; the other kernels skip masked keys).
        if (mrow) x = mrow[j] == -std::numeric_limits<float>::infinity() ? mrow[j] : x + mrow[j];
        s[j] = x;
        mx = std::max(mx, x);
      }
      const float sink = o.sinks ? o.sinks[h] : -std::numeric_limits<float>::infinity();
      mx = std::max(mx, sink);
      float* orow = out.ptr_as<float>(b, h, i);
      std::fill(orow, orow + Dv, 0.0f);
      if (mx == -std::numeric_limits<float>::infinity()) {  // sees nothing
        std::fill(s, s + Skv, 0.0f);
        continue;
      }
      float den = o.sinks ? std::exp(sink - mx) : 0.0f;
      for (int64_t j = 0; j < Skv; ++j) {
        s[j] = std::exp(s[j] - mx);
        den += s[j];
      }
      const float inv = 1.0f / den;
      for (int64_t j = 0; j < Skv; ++j) {
        s[j] *= inv;
        if (s[j] == 0.0f) continue;
        const float* vr = vf.data() + (j * Dv);
        for (int64_t d = 0; d < Dv; ++d) orow[d] += s[j] * vr[d];
      }
    }
    if (weights) std::copy(scores.begin(), scores.end(), weights + (b * Hq + h) * Sq * Skv);
  });
}

struct Entry {
  const char* name;
  AttentionFn fn;
};

const Entry kKernels[] = {
    {"eager", &eager_attention},
    {"fused", &detail::fused_attention},
    {"flex", &detail::flex_attention},
    {"fused_scalar", &detail::fused_attention_scalar},
};

}  // namespace

AttentionFn get_attention_kernel(std::string_view name) {
  for (const Entry& e : kKernels)
    if (name == e.name) return e.fn;
  std::string known;
  for (const Entry& e : kKernels) known += std::string(known.empty() ? "" : ", ") + e.name;
  throw Error(ErrorKind::kInvalidArgument,
              "unknown attention kernel '" + std::string(name) + "'; registered: " + known);
}

std::vector<std::string> attention_kernel_names() {
  std::vector<std::string> names;
  for (const Entry& e : kKernels) names.emplace_back(e.name);
  return names;
}

}  // namespace kvcache
