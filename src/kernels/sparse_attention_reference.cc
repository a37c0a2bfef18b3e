// The plain references of the indexer top-k and the sparse attention (sparse_attention.h): one
// query, one head, one key at a time, in double, following transformers'
// modeling_deepseek_v4.py (DeepseekV4IndexerScorer.forward, DeepseekV4Indexer.forward's causal
// threshold and -1 sentinel, eager_attention_forward's sink column). The same argument checks as
// the fast kernels (check_sparse_attention / check_indexer_topk).
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "kernels/sparse_attention.h"
#include "kernels/sparse_attention_internal.h"

namespace kvcache {
namespace {

std::vector<double> widen(const std::byte* row, DType dtype, int64_t n) {
  std::vector<float> f(static_cast<size_t>(n));
  convert_n(row, dtype, f.data(), DType::kF32, static_cast<size_t>(n));
  return {f.begin(), f.end()};
}

}  // namespace

void indexer_topk_reference(const TensorView& q_index, const TensorView& weights,
                            const KVSpan& keys, std::span<const int64_t> pos,
                            const IndexerParams& params, int32_t* selected) {
  const detail::IndexerPlan P = detail::check_indexer_topk("indexer_topk_reference", q_index,
                                                           weights, keys, pos, params, selected);
  const int64_t K = params.top_k;
  if (K == 0) return;
  for (int64_t b = 0; b < P.B; ++b)
    for (int64_t t = 0; t < P.S; ++t) {
      // Entries s >= (pos + 1) / rate are not candidates (transformers masks them with -inf and
      // then replaces picks past the threshold with -1: the same thing).
      const int64_t lim = P.limit(b, t, params.rate);
      std::vector<double> score(static_cast<size_t>(lim), 0.0);
      for (int64_t s = 0; s < lim; ++s) {
        const std::vector<double> k = widen(P.keys.k.row(b, 0, s), P.keys.dtype, P.C);
        double sum = 0;
        for (int64_t h = 0; h < P.HI; ++h) {
          const float* qr = q_index.ptr_as<const float>(b, t, h);
          double dot = 0;
          for (int64_t d = 0; d < P.C; ++d) dot += static_cast<double>(qr[d]) * k[d];
          sum += static_cast<double>(*weights.ptr_as<const float>(b, t, h)) * std::max(dot, 0.0) *
                 params.index_scale;
        }
        score[static_cast<size_t>(s)] =
            std::isnan(sum) ? -std::numeric_limits<double>::infinity() : sum;
      }
      std::vector<int32_t> order(static_cast<size_t>(lim));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t x, int32_t y) { return score[x] > score[y]; });
      int32_t* out = selected + (b * P.S + t) * K;
      for (int64_t i = 0; i < K; ++i) out[i] = i < lim ? order[static_cast<size_t>(i)] : -1;
    }
}

void sparse_attention_reference(const TensorView& q, const KVSpan& window, const KVSpan& entries,
                                std::span<const int64_t> pos, const SparseAttentionParams& params,
                                const TensorView& out) {
  const detail::SparsePlan P = detail::check_sparse_attention("sparse_attention_reference", q,
                                                              window, entries, pos, params, out);
  for (int64_t b = 0; b < P.B; ++b)
    for (int64_t t = 0; t < P.S; ++t) {
      // The keys of query (b, t): its window rows, then its entries.
      std::vector<std::pair<const detail::SpanInfo*, int64_t>> rows;
      int64_t lo = 0, hi = 0;
      P.window_rows(b, t, lo, hi);
      for (int64_t j = lo; j < hi; ++j) rows.emplace_back(&P.window, j);
      if (params.selected) {
        const int32_t* sel = params.selected + (b * P.S + t) * params.top_k;
        for (int64_t i = 0; i < params.top_k; ++i)
          if (sel[i] >= 0) rows.emplace_back(&P.entries, sel[i]);
      } else {
        for (int64_t e = 0; e < P.limit(b, t); ++e) rows.emplace_back(&P.entries, e);
      }
      for (int64_t h = 0; h < P.Hq; ++h) {
        const int64_t hk = h / P.G;
        const float* qr = q.ptr_as<const float>(b, h, t);
        std::vector<double> logit(rows.size());
        double mx = params.sinks ? params.sinks[h] : -std::numeric_limits<double>::infinity();
        for (size_t i = 0; i < rows.size(); ++i) {
          const detail::SpanInfo& sp = *rows[i].first;
          const std::vector<double> k = widen(sp.k.row(b, hk, rows[i].second), sp.dtype, P.D);
          double dot = 0;
          for (int64_t d = 0; d < P.D; ++d) dot += static_cast<double>(qr[d]) * k[d];
          logit[i] = dot * P.scale;
          mx = std::max(mx, logit[i]);
        }
        float* o = out.ptr_as<float>(b, h, t);
        std::fill(o, o + P.Dv, 0.0f);
        if (rows.empty() && !params.sinks) continue;  // sees nothing
        double den = params.sinks ? std::exp(params.sinks[h] - mx) : 0.0;
        for (double& x : logit) {
          x = std::exp(x - mx);
          den += x;
        }
        std::vector<double> acc(static_cast<size_t>(P.Dv), 0.0);
        for (size_t i = 0; i < rows.size(); ++i) {
          const detail::SpanInfo& sp = *rows[i].first;
          const std::vector<double> v = widen(sp.v.row(b, hk, rows[i].second), sp.dtype, P.Dv);
          for (int64_t d = 0; d < P.Dv; ++d) acc[static_cast<size_t>(d)] += logit[i] / den * v[d];
        }
        for (int64_t d = 0; d < P.Dv; ++d) o[d] = static_cast<float>(acc[static_cast<size_t>(d)]);
      }
    }
}

}  // namespace kvcache
