// Sparse attention benchmarks (issue 39), DeepSeek-V4-Flash-like decode shapes: 64 query heads
// of D = 512 sharing one K == V head, a 128-token sliding window, the top 512 of the context / 4
// compressed entries (CSA, rate 4), bf16 storage, one query (decode).
//
//   BM_SparseDecode/csa/<context>   the attention: window + k selected entries. Its work is
//                                   fixed by W and k, so its time should stay flat from 4K to 64K
//                                   (the issue: 64K within 1.5x of 4K); only the selected rows
//                                   are read, scattered in a context / 4 entry series.
//   BM_SparseDecode/csa_paged/<context>  the same with both spans paged (16 slots a page).
//   BM_SparseDecode/hca/<context>   HCA: the window and every entry (rate 128), no selection.
//   BM_IndexerTopk/<context>        the lightning indexer: 64 heads x c = 128 scored against every
//                                   indexer key (context / 4 of them), then the top 512. Linear in
//                                   the context by design (DeepSeek's: it is the cheap part that
//                                   reads everything so the attention does not have to).
// Threads: KVCACHE_THREADS if set, else 2. Times are wall-clock.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/sparse_attention.h"

namespace kvcache {
namespace {

constexpr int64_t kHq = 64, kD = 512, kW = 128, kTopK = 512, kRate = 4, kHI = 64, kC = 128;

std::vector<bf16_t> random_bf16(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> f(n);
  for (float& x : f) x = d(rng);
  std::vector<bf16_t> out(n);
  f32_to_bf16_n(f.data(), out.data(), n);
  return out;
}

std::vector<float> random_f32(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> f(n);
  for (float& x : f) x = d(rng);
  return f;
}

// A [1, 1, T, D] bf16 series, dense or paged (16 slots a page, pages in a shuffled order).
struct Series {
  std::vector<bf16_t> data;
  std::vector<int32_t> indptr, indices, last;
  KVSpan span;
  Series(int64_t T, int64_t D, bool paged, int64_t kv_offset, uint32_t seed) {
    constexpr int64_t kBt = 16;
    const int64_t pages = (T + kBt - 1) / kBt;
    data = random_bf16(static_cast<size_t>((paged ? pages * kBt : T) * D), seed);
    span.kv_offset = kv_offset;
    if (!paged) {
      span.k = TensorView(data.data(), DType::kBF16, Shape{1, 1, T, D});
      span.v = span.k;
      return;
    }
    span.kind = KVSpanKind::kPaged;
    indices.resize(static_cast<size_t>(pages));
    std::iota(indices.begin(), indices.end(), 0);
    std::shuffle(indices.begin(), indices.end(), std::mt19937(seed));
    indptr = {0, static_cast<int32_t>(pages)};
    last = {static_cast<int32_t>(T - (pages - 1) * kBt)};
    PagedKV& p = span.paged;
    p.k_pages = TensorView(data.data(), DType::kBF16, Shape{pages, 1, kBt, D});
    p.v_pages = p.k_pages;
    p.batch = 1;
    p.block_tokens = kBt;
    p.indptr = indptr.data();
    p.indices = indices.data();
    p.last_page_len = last.data();
  }
};

// 2 threads (the setting) unless KVCACHE_THREADS says otherwise; before the pool starts.
void default_threads() {
  static const bool once = [] {
    if (!std::getenv("KVCACHE_THREADS")) set_default_threads(2);
    return true;
  }();
  (void)once;
}

void contexts(benchmark::internal::Benchmark* b) {
  for (int64_t ctx : {4096, 16384, 65536}) b->Arg(ctx);
  b->UseRealTime()->Unit(benchmark::kMicrosecond)->MinTime(0.5);
}

void BM_SparseDecode(benchmark::State& state, bool paged, bool hca) {
  default_threads();
  const int64_t ctx = state.range(0), rate = hca ? 128 : kRate, T = ctx / rate;
  const int64_t pos = ctx - 1;  // the query: the context's last token
  Series window(kW, kD, paged, ctx - kW, 1), entries(T, kD, paged, 0, 2);
  std::vector<float> q = random_f32(static_cast<size_t>(kHq * kD), 3);
  std::vector<float> sinks = random_f32(static_cast<size_t>(kHq), 4);
  std::vector<float> out(static_cast<size_t>(kHq * kD));
  std::vector<int32_t> sel(static_cast<size_t>(T));
  std::iota(sel.begin(), sel.end(), 0);
  std::shuffle(sel.begin(), sel.end(), std::mt19937(5));
  sel.resize(static_cast<size_t>(std::min(kTopK, T)));
  SparseAttentionParams p;
  p.sliding_window = kW;
  p.sinks = sinks.data();
  p.rate = rate;
  p.selected = hca ? nullptr : sel.data();
  p.top_k = static_cast<int64_t>(sel.size());
  const std::vector<int64_t> positions{pos};
  const TensorView qv(q.data(), DType::kF32, Shape{1, kHq, 1, kD});
  const TensorView ov(out.data(), DType::kF32, Shape{1, kHq, 1, kD});
  for (auto _ : state) {
    sparse_attention(qv, window.span, entries.span, positions, p, ov);
    benchmark::DoNotOptimize(out.data());
  }
  const int64_t keys = kW + (hca ? T : p.top_k);
  state.counters["keys"] = static_cast<double>(keys);
  state.counters["entries"] = static_cast<double>(T);
  state.SetBytesProcessed(state.iterations() * keys * kD * 2);
}

void BM_IndexerTopk(benchmark::State& state) {
  default_threads();
  const int64_t ctx = state.range(0), T = ctx / kRate;
  Series keys(T, kC, false, 0, 6);
  std::vector<float> q = random_f32(static_cast<size_t>(kHI * kC), 7);
  std::vector<float> w = random_f32(static_cast<size_t>(kHI), 8);
  std::vector<int32_t> sel(static_cast<size_t>(kTopK));
  IndexerParams p;
  p.rate = kRate;
  p.top_k = kTopK;
  p.index_scale = 1.0f / std::sqrt(static_cast<float>(kC));
  const std::vector<int64_t> positions{ctx - 1};
  const TensorView qv(q.data(), DType::kF32, Shape{1, 1, kHI, kC});
  const TensorView wv(w.data(), DType::kF32, Shape{1, 1, kHI});
  for (auto _ : state) {
    indexer_topk(qv, wv, keys.span, positions, p, sel.data());
    benchmark::DoNotOptimize(sel.data());
  }
  state.counters["entries"] = static_cast<double>(T);
  state.SetBytesProcessed(state.iterations() * T * kC * 2);
}

// Dense and paged spans; CSA (rate 4, the top 512) and HCA (rate 128, every entry).
BENCHMARK_CAPTURE(BM_SparseDecode, csa, false, false)->Apply(contexts);
BENCHMARK_CAPTURE(BM_SparseDecode, csa_paged, true, false)->Apply(contexts);
BENCHMARK_CAPTURE(BM_SparseDecode, hca, false, true)->Apply(contexts);
BENCHMARK(BM_IndexerTopk)->Apply(contexts);

}  // namespace
}  // namespace kvcache

BENCHMARK_MAIN();
