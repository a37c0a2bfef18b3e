// Paged attention kernels (see paged_attention.h). The eager kernel mirrors eager_attention in
// attention.cc operation for operation (dot_f32, scale, softcap, max, exp, sum in key order,
// 1/den, P.V in key order) so paged and dense eager agree bit for bit.
#include "kernels/paged_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fault.h"
#include "core/thread_pool.h"
#include "kernels/attention_internal.h"
#include "kernels/mask.h"

namespace kvcache {

namespace {

[[noreturn]] void bad(const std::string& msg, ErrorKind kind = ErrorKind::kInvalidArgument) {
  throw Error(kind, "paged_attention: " + msg);
}

bool inner_unit(const TensorView& t) {
  return t.dim(t.ndim() - 1) <= 1 || t.stride(t.ndim() - 1) == 1;
}

}  // namespace

void validate_paged_attention_args(const PagedAttentionArgs& a, const AttentionOptions& o) {
  const PagedKV& kv = a.kv;
  if (kv.k_pages.ndim() != 4 || kv.v_pages.ndim() != 4)
    bad("k_pages/v_pages must be 4-D [num_pages, H_kv, block_tokens, D]");
  if (kv.k_pages.dtype() != kv.v_pages.dtype()) bad("k_pages and v_pages must have the same dtype");
  const DType dt = kv.k_pages.dtype();
  if (dt != DType::kF32 && dt != DType::kF16 && dt != DType::kBF16)
    bad("pages must be f32, f16 or bf16", ErrorKind::kUnsupported);
  const int64_t P = kv.k_pages.dim(0), Hkv = kv.k_pages.dim(1);
  if (kv.v_pages.dim(0) != P || kv.v_pages.dim(1) != Hkv || kv.v_pages.dim(2) != kv.k_pages.dim(2))
    bad("v_pages must match k_pages in num_pages, H_kv and block_tokens");
  if (kv.block_tokens <= 0 || kv.k_pages.dim(2) != kv.block_tokens)
    bad("block_tokens " + std::to_string(kv.block_tokens) +
        " must be > 0 and equal k_pages.dim(2) (" + std::to_string(kv.k_pages.dim(2)) + ")");
  if (!inner_unit(kv.k_pages) || !inner_unit(kv.v_pages) || !inner_unit(a.q) || !inner_unit(a.out))
    bad("q, out, k_pages and v_pages need a unit innermost stride");
  if (kv.batch < 0) bad("batch must be >= 0");
  if (!kv.indptr || !kv.last_page_len || !a.cu_seqlens_q || (!kv.indices && kv.batch > 0))
    bad("indptr, indices, last_page_len and cu_seqlens_q must be set");
  if (kv.indptr[0] != 0) bad("indptr[0] must be 0");
  if (a.cu_seqlens_q[0] != 0) bad("cu_seqlens_q[0] must be 0");
  for (int64_t b = 0; b < kv.batch; ++b) {
    const std::string where = " (sequence " + std::to_string(b) + ")";
    if (kv.indptr[b + 1] < kv.indptr[b]) bad("indptr must be non-decreasing" + where);
    if (a.cu_seqlens_q[b + 1] < a.cu_seqlens_q[b])
      bad("cu_seqlens_q must be non-decreasing" + where);
    const int64_t n = kv.indptr[b + 1] - kv.indptr[b], last = kv.last_page_len[b];
    if (n == 0 ? last != 0 : (last < 1 || last > kv.block_tokens))
      bad("last_page_len " + std::to_string(last) + " must be in [1, block_tokens=" +
          std::to_string(kv.block_tokens) + "] (0 for a sequence without pages)" + where);
    for (int64_t p = kv.indptr[b]; p < kv.indptr[b + 1]; ++p)
      if (kv.indices[p] < 0 || kv.indices[p] >= P)
        bad("page id " + std::to_string(kv.indices[p]) + " at indices[" + std::to_string(p) +
            "] is outside [0, " + std::to_string(P) + ")" + where);
    const int64_t sq = a.cu_seqlens_q[b + 1] - a.cu_seqlens_q[b];
    if (sq > kv.seq_len(b))
      bad("sequence has " + std::to_string(sq) + " queries but only " +
          std::to_string(kv.seq_len(b)) + " keys; queries are bottom-right aligned" + where);
  }
  const int64_t total_q = a.cu_seqlens_q[kv.batch];
  if (a.q.ndim() != 3 || a.q.dtype() != DType::kF32 || a.q.dim(0) != total_q)
    bad("q must be f32 [total_q=" + std::to_string(total_q) + ", H_q, D_k]");
  if (a.q.dim(2) != kv.k_pages.dim(3)) bad("q's D_k must equal k_pages.dim(3)");
  if (Hkv <= 0 || a.q.dim(1) % Hkv != 0) bad("H_q must be a multiple of H_kv");
  if (a.out.ndim() != 3 || a.out.dtype() != DType::kF32 || a.out.dim(0) != total_q ||
      a.out.dim(1) != a.q.dim(1) || a.out.dim(2) != kv.v_pages.dim(3))
    bad("out must be f32 [total_q, H_q, D_v]");
  if (o.q_offset != -1 || o.mask || o.block_mask || o.score || o.doc_ids || o.kv_valid_begin ||
      o.kv_valid_end || o.weights_out)
    bad("q_offset, mask, block_mask, score, doc_ids, kv_valid_* and weights_out are not supported",
        ErrorKind::kUnsupported);
  if (o.sliding_window < 0 || o.chunk_size < 0) bad("sliding_window/chunk_size must be >= 0");
}

namespace {

void paged_eager(const PagedAttentionArgs& a, const AttentionOptions& o) {
  const PagedKV& kv = a.kv;
  const int64_t B = kv.batch, Hq = a.q.dim(1), Dk = a.q.dim(2), Dv = a.out.dim(2);
  const int64_t Hkv = kv.k_pages.dim(1), G = Hq / Hkv, ps = kv.block_tokens;
  const float scale = o.scale > 0 ? o.scale : 1.0f / std::sqrt(static_cast<float>(Dk));
  const MaskSpec spec = attention_mask_spec(o);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  default_pool().parallel_for(B * Hkv, [&](int64_t task) {
    const int64_t b = task / Hkv, hk = task % Hkv;
    const int64_t Skv = kv.seq_len(b), q_begin = a.cu_seqlens_q[b];
    const int64_t Sq = a.cu_seqlens_q[b + 1] - q_begin;
    if (Sq == 0) return;
    const int64_t q_offset = o.kv_offset + Skv - Sq;
    thread_local std::vector<float> kf, vf, s;
    kf.resize(static_cast<size_t>(Skv * Dk));
    vf.resize(static_cast<size_t>(Skv * Dv));
    s.resize(static_cast<size_t>(Skv));
    // Widen through the page table (eager copies; the same widening dense eager does).
    for (int64_t j = 0; j < Skv; ++j) {
      const int64_t page = kv.indices[kv.indptr[b] + j / ps], slot = j % ps;
      convert_n(kv.k_pages.ptr(page, hk, slot), kv.k_pages.dtype(), kf.data() + j * Dk, DType::kF32,
                static_cast<size_t>(Dk));
      convert_n(kv.v_pages.ptr(page, hk, slot), kv.v_pages.dtype(), vf.data() + j * Dv, DType::kF32,
                static_cast<size_t>(Dv));
    }
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = hk * G + g;
      for (int64_t i = 0; i < Sq; ++i) {
        const int64_t qp = q_offset + i;
        const KeyRange kr = key_range(spec, b, qp);
        const int64_t lo = std::clamp(kr.lo - o.kv_offset, int64_t{0}, Skv);
        const int64_t hi = std::clamp(kr.hi - o.kv_offset, int64_t{0}, Skv);
        const float* qr = a.q.ptr_as<const float>(q_begin + i, h);
        float mx = kNegInf;
        bool poisoned = false;  // a NaN logit: the row is NaN (the skeleton's rule)
        for (int64_t j = lo; j < hi; ++j) {
          float x = detail::dot_f32(qr, kf.data() + j * Dk, Dk) * scale;
          if (o.softcap > 0) x = o.softcap * std::tanh(x / o.softcap);
          s[static_cast<size_t>(j)] = x;
          mx = std::max(mx, x);  // drops a NaN: hence the flag
          poisoned = poisoned || std::isnan(x);
        }
        const float sink = o.sinks ? o.sinks[h] : kNegInf;
        mx = std::max(mx, sink);
        float* orow = a.out.ptr_as<float>(q_begin + i, h);
        std::fill(orow, orow + Dv, poisoned ? std::numeric_limits<float>::quiet_NaN() : 0.0f);
        if (poisoned || mx == kNegInf) continue;  // NaN, or sees nothing
        float den = o.sinks ? std::exp(sink - mx) : 0.0f;
        for (int64_t j = lo; j < hi; ++j) {
          s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - mx);
          den += s[static_cast<size_t>(j)];
        }
        const float inv = 1.0f / den;
        for (int64_t j = lo; j < hi; ++j) {
          const float p = s[static_cast<size_t>(j)] * inv;
          if (p == 0.0f) continue;
          const float* vr = vf.data() + j * Dv;
          for (int64_t d = 0; d < Dv; ++d) orow[d] += p * vr[d];
        }
      }
    }
  });
}

}  // namespace

namespace {

void run_fused(const PagedAttentionArgs& a, const AttentionOptions& o) {
  detail::fused_paged_attention(a.q, a.kv, a.cu_seqlens_q, a.out, o);
}

void run_fused_scalar(const PagedAttentionArgs& a, const AttentionOptions& o) {
  detail::fused_paged_attention_scalar(a.q, a.kv, a.cu_seqlens_q, a.out, o);
}

// Every entry point checks the same way before it computes.
template <PagedAttentionFn kRun>
void checked(const PagedAttentionArgs& args, const AttentionOptions& options) {
  fault::point("paged_attention");
  validate_paged_attention_args(args, options);
  kRun(args, options);
}

struct PagedEntry {
  const char* name;
  PagedAttentionFn fn;
};

const PagedEntry kPagedKernels[] = {
    {"eager", &checked<&paged_eager>},
    {"fused", &checked<&run_fused>},
    {"fused_scalar", &checked<&run_fused_scalar>},
};

}  // namespace

const std::vector<std::string>& paged_attention_kernel_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const PagedEntry& e : kPagedKernels) n.emplace_back(e.name);
    return n;
  }();
  return names;
}

PagedAttentionFn find_paged_attention_kernel(std::string_view kernel) {
  for (const PagedEntry& e : kPagedKernels)
    if (kernel == e.name) return e.fn;
  return nullptr;
}

bool is_paged_attention_kernel(std::string_view kernel) {
  return find_paged_attention_kernel(kernel) != nullptr;
}

void paged_attention(std::string_view kernel, const PagedAttentionArgs& args,
                     const AttentionOptions& options) {
  if (const PagedAttentionFn fn = find_paged_attention_kernel(kernel)) {
    fn(args, options);
    return;
  }
  fault::point("paged_attention");
  validate_paged_attention_args(args, options);
  std::string known;
  for (const std::string& name : paged_attention_kernel_names())
    known += (known.empty() ? "" : ", ") + name;
  throw Error(ErrorKind::kInvalidArgument, "paged_attention: unknown kernel '" +
                                               std::string(kernel) + "' (paged kernels: " + known +
                                               ")");
}

}  // namespace kvcache
