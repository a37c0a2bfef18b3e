// The CPU attention skeleton shared by the fused kernel (attention_fused.cc: f32/f16/bf16 K/V,
// dense or paged) and the quantized one (attention_quant.cc: KIVI / per-token blocks). It owns
// everything but the arithmetic on keys and values: the task split over (sequence, KV head,
// query tile, KV partition), the split-KV partitions, the rows' online-softmax state (m, l, acc),
// the tile classification and masking, the softmax update, the merge of partial states, and the
// workspace layout. A kernel plugs in its tile geometry, its scores of a tile and its P.V through
// a `Tiles` class resolved at compile time (see run_task); nothing is virtual.
//
// Workspace (plan / run, as FlashInfer's wrappers): shape_bytes() (behind
// attention_workspace_bytes) says how many bytes a call shape needs, and the run carves the same
// layout (Arena) from caller-owned memory, allocating nothing.
// Per-thread scratch lives in one slot per pool thread; a pool task claims a slot ("lane") and
// takes attention tasks one by one, so a thread keeps its slot hot across tasks.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <utility>

#include "core/error.h"
#include "core/tensor.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/attention_internal.h"
#include "kernels/attention_simd.h"
#include "kernels/attention_workspace.h"
#include "kernels/mask.h"

namespace kvcache::detail {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// How a row relates to a key tile: sees none of its keys, some, or all.
enum class RowKind : uint8_t { kEmpty, kPartial, kFull };

// ---- workspace carving ----------------------------------------------------------------------
// Hands out 64-byte-aligned arrays in order from a byte range. Without a range it only counts:
// the size a plan reports and the layout a run carves come from the same calls, so they cannot
// disagree.
class Arena {
 public:
  static constexpr size_t kAlign = 64;  // cache lines: no two slots share one
  Arena() = default;                    // counting only
  Arena(std::byte* base, size_t bytes) : base_(base), bytes_(bytes) {}
  template <typename T>
  T* take(int64_t n) {
    const size_t at = round_up(used_);
    used_ = at + sizeof(T) * static_cast<size_t>(std::max<int64_t>(n, 0));
    KV_CHECK(!base_ || used_ <= bytes_, "attention workspace carved past its planned size");
    return base_ ? reinterpret_cast<T*>(base_ + at) : nullptr;
  }
  size_t used() const { return round_up(used_); }
  static size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

 private:
  std::byte* base_ = nullptr;
  size_t bytes_ = 0, used_ = 0;
};

// ---- the call ---------------------------------------------------------------------------------
// One sequence of a call. Dense calls have B identical sequences; paged calls are varlen.
struct SeqPlan {
  int64_t q_row0 = 0;                     // varlen: first row of the sequence in q / out
  int64_t Sq = 0, Skv = 0, q_offset = 0;  // q_offset: absolute position of query 0
  int64_t n_tiles = 0;                    // key tiles, in the kernel's geometry
  int64_t n_qt = 0, n_split = 1, tiles_per_split = 1;
  int64_t task0 = 0, group0 = 0;  // first task / first (KV head, query tile) group
  int64_t partial0 = 0;           // first float of its partial states (split sequences only)
};

// How a kernel cuts a sequence's queries into tasks.
struct QueryTiling {
  int64_t rows_per_task = 64;  // target rows (heads x positions) per task
  // Tiles of equal size, as many as hold rows_per_task rows to the nearest, instead of full
  // tiles and a short last one (a task pays its per-tile packing once for all its rows).
  bool balance = false;
  // With balance: tasks of at least min_block_rows rows get a row count that is a multiple of
  // row_block (whole register blocks of the kernel's many-row score loop).
  int64_t row_block = 1, min_block_rows = 0;
};

// Everything the skeleton needs of a call, resolved once; the kernel's own parameters (where K/V
// live, its tile geometry) travel beside it in the kernel's Params.
struct CallPlan {
  TensorView q, out;    // dense: [B, H, S, D] views; varlen: [total_q, H, D]
  bool varlen = false;  // rows of sequence b at seqs[b].q_row0 + i
  int64_t B = 0, Hq = 0, Hkv = 0, G = 0, Dk = 0, Dv = 0;
  float scale = 1, softcap = 0;
  const float* sinks = nullptr;           // [H_q] or null
  const ScoreFn* score = nullptr;         // or null
  const BlockMask* block_mask = nullptr;  // user mask as bits (then spec.fn is its fn())
  MaskSpec spec;
  bool mask_free = false;  // every pair visible: no classification, no masking
  int64_t kv_offset = 0;
  // Filled by plan_tasks:
  int64_t tq = 1, max_rows = 0;  // query positions per tile; rows of the largest task
  SeqPlan* seqs = nullptr;       // [B] (in the workspace)
  int64_t n_tasks = 0, n_groups = 0, partial_floats = 0;
  // Filled by carve_call: split sequences' partial states, per group [n_split, R, D_v + 2]
  // (acc, m, l per row); one scratch slot of slot_bytes per pool thread.
  float* partial = nullptr;
  std::byte* slots = nullptr;
  size_t slot_bytes = 0;
  int64_t n_slots = 0;

  const float* q_row(const SeqPlan& sq, int64_t b, int64_t h, int64_t i) const {
    return varlen ? q.ptr_as<const float>(sq.q_row0 + i, h) : q.ptr_as<const float>(b, h, i);
  }
  float* out_row(const SeqPlan& sq, int64_t b, int64_t h, int64_t i) const {
    return varlen ? out.ptr_as<float>(sq.q_row0 + i, h) : out.ptr_as<float>(b, h, i);
  }
  std::byte* slot(int64_t lane) const { return slots + static_cast<size_t>(lane) * slot_bytes; }
};

// The call's views and sizes (q [B, H_q, S_q, D_k], or varlen [total_q, H_q, D_k] with B
// sequences) and its options: scale, softcap, sinks, score, block mask, mask spec.
void init_call(CallPlan& P, const TensorView& q, const TensorView& out, int64_t B, int64_t Hkv,
               int64_t Dv, const AttentionOptions& o);
// Dense calls: B alike sequences.
void set_dense_seqs(CallPlan& P, int64_t Sq, int64_t Skv, int64_t q_offset);

// Query positions per task for a call whose longest sequence has max_sq queries.
int64_t query_tile(int64_t max_sq, int64_t G, const QueryTiling& tiling);

// Keys per split-KV partition for a sequence, or 0 for none. kv_split is AttentionOptions'
// (0 automatic, -1 never, > 0 keys). The automatic rule (flash-decoding, auto_split_keys) applies
// to a sequence whose queries fit one task — decode rows and short verification steps — and
// looks at the sequence only, never at the batch or the thread count, so a sequence's output does
// not depend on what it is batched with.
int64_t split_keys(int64_t kv_split, int64_t Sq, int64_t Skv, int64_t G, int64_t rows_per_task);
// The most partitions split_keys can give any sequence of at most kv_len keys (a bound for
// workspace plans; every kernel maps a partition to at least split_keys keys).
int64_t max_partitions(int64_t kv_split, int64_t kv_len);

// Bounds for workspace plans (attention_workspace_bytes): query_tile's result for any longest
// sequence of at most q_len queries, and plan_tasks' partial_floats for any call of at most
// the shape.
int64_t max_query_tile(int64_t q_len, int64_t G, const QueryTiling& tiling);
int64_t max_partial_floats(const AttentionShape& s, const QueryTiling& tiling);

// Plans the tasks of P.seqs (Sq, Skv, q_offset set): query tiles, partitions, task and group
// numbering, partial-state offsets. Geo is the kernel's tile geometry:
//   int64_t n_tiles(const SeqPlan&)                     key tiles of the sequence
//   int64_t tiles_per_split(const SeqPlan&, int64_t keys)  tiles of a partition of `keys` keys
template <class Geo>
void plan_tasks(CallPlan& P, const Geo& geo, const QueryTiling& tiling, int64_t kv_split) {
  int64_t max_sq = 0;
  for (int64_t b = 0; b < P.B; ++b) max_sq = std::max(max_sq, P.seqs[b].Sq);
  P.tq = query_tile(std::max<int64_t>(max_sq, 1), P.G, tiling);
  P.max_rows = P.G * P.tq;
  int64_t tasks = 0, groups = 0, partial = 0;
  for (int64_t b = 0; b < P.B; ++b) {
    SeqPlan& x = P.seqs[b];
    x.n_tiles = geo.n_tiles(x);
    x.n_qt = (x.Sq + P.tq - 1) / P.tq;
    const int64_t keys = split_keys(kv_split, x.Sq, x.Skv, P.G, tiling.rows_per_task);
    const int64_t nt = std::max<int64_t>(x.n_tiles, 1);
    x.tiles_per_split = keys > 0 ? std::clamp<int64_t>(geo.tiles_per_split(x, keys), 1, nt) : nt;
    x.n_split = (nt + x.tiles_per_split - 1) / x.tiles_per_split;
    x.task0 = tasks;
    x.group0 = groups;
    x.partial0 = partial;
    groups += P.Hkv * x.n_qt;
    tasks += P.Hkv * x.n_qt * x.n_split;
    if (x.n_split > 1) partial += P.Hkv * x.n_split * P.G * x.Sq * (P.Dv + 2);
  }
  P.n_tasks = tasks;
  P.n_groups = groups;
  P.partial_floats = partial;
}

// Bytes of workspace for a call: B sequence plans, the partial states, and n_slots slots of
// slot_bytes, each region 64-byte aligned. (The run's workspace starts anywhere: callers get
// Arena::kAlign - 1 bytes of slack on top, see workspace_bytes.)
size_t call_bytes(int64_t B, int64_t partial_floats, int64_t n_slots, size_t slot_bytes);
size_t workspace_bytes(int64_t B, int64_t partial_floats, int64_t n_slots, size_t slot_bytes);

// The sequence plans at the start of the workspace (checked to fit; the workspace is aligned up
// to Arena::kAlign first). Throws Error naming the sizes when `ws` is too small.
SeqPlan* carve_seqs(std::span<std::byte> ws, int64_t B);
// After plan_tasks: carves the partial states and the slots behind the sequence plans. Throws
// Error (before anything is written to out) when `ws` holds fewer bytes than the call needs.
void carve_call(CallPlan& P, std::span<std::byte> ws, size_t slot_bytes);

// The workspace of one call: the caller's (AttentionOptions::workspace) or, when it passed
// none, bytes(n_threads of the default pool) allocated for this call alone (tests, one-off
// calls; a caller that loops passes its own and the kernel allocates nothing).
class CallWorkspace {
 public:
  template <typename Bytes>
  CallWorkspace(std::span<std::byte> given, Bytes&& bytes) : span_(given) {
    if (!span_.empty()) return;
    const size_t n = bytes(int64_t{default_pool().n_threads()});
    owned_ = allocate_large(n);
    if (!owned_) out_of_memory(n);
    span_ = {owned_.get(), n};
  }
  std::span<std::byte> span() const { return span_; }

 private:
  [[noreturn]] static void out_of_memory(size_t bytes);
  std::unique_ptr<std::byte, AlignedFree> owned_;
  std::span<std::byte> span_;
};

// A call's plan for workspace bounds: sizes from the shape, the largest query tile and the
// most partial-state floats of any call of at most that shape.
CallPlan bound_plan(const AttentionShape& s, const QueryTiling& tiling);

// ---- the rows of one task --------------------------------------------------------------------
// A task: batch row b, KV head hk, query tile qt, partition sp; rows r = g * nq + i are query
// head hk * G + g at query index q0 + i.
struct Task {
  int64_t id = 0, b = 0, hk = 0, qt = 0, sp = 0;
  const SeqPlan* seq = nullptr;
  int64_t q0 = 0, nq = 0, R = 0;
  int64_t t_begin = 0, t_end = 0;  // this partition's key tiles
};
Task locate_task(const CallPlan& P, int64_t task);

// One slot's per-row buffers (rows of the largest task, positions of the largest query tile).
struct RowScratch {
  float* qs = nullptr;      // [R, D_k] scaled queries
  float* acc = nullptr;     // [R, acc_cols] unnormalised output (the kernel may use more
                            // columns than D_v, e.g. a second accumulator order)
  float* s = nullptr;       // [R, s_cols] a tile's logits, then probabilities
  float* m = nullptr;       // [R] running max
  float* l = nullptr;       // [R] running denominator
  int64_t* lo = nullptr;    // [nq] visible key interval per query position, kv index space
  int64_t* hi = nullptr;    // [nq]
  RowKind* kind = nullptr;  // [R] this tile
  uint8_t* vis = nullptr;   // [R, s_cols] user-mask bits of partial rows, or null
  int64_t acc_cols = 0, s_cols = 0;
};
RowScratch carve_rows(Arena& a, const CallPlan& P, int64_t acc_cols, int64_t s_cols, bool with_vis);

// One row's online-softmax step (flash attention's update), the portable version of
// softmax_update (attention_simd.h; that one sums in 8 lanes): s[0, n) holds the tile's logits;
// on return s holds exp(s - m_new), l = l * alpha + sum, acc[0, Dv) is scaled by alpha =
// exp(m - m_new) and m = m_new. Returns false (s zeroed, state untouched) when every logit is
// -inf. alpha is exactly 1 when the max did not grow (m_new == m): no exp call and no pass over
// acc, and the kernels that keep per-row terms of their own (the quantized kernel's zero terms)
// rescale them only when m changed — so "m unchanged" and "alpha == 1" mean the same thing on
// every path instead of depending on the libm's exp(0).
// A NaN logit (a NaN query, key or quantized group: a model fault) poisons the row: m becomes
// NaN, so alpha, l and acc do, and std::max(NaN, x) keeps m NaN at every later tile; the row's
// output and a split's merge come out NaN. (A max alone would drop the NaN, and the exp of the
// others would make a finite row of it: a wrong answer that looks right.)
inline bool softmax_update_scalar(float* s, int64_t n, float& m, float& l, float* acc, int64_t Dv) {
  float mt = kNegInf;
  bool poisoned = false;
  for (int64_t j = 0; j < n; ++j) {
    mt = std::max(mt, s[j]);
    poisoned = poisoned || std::isnan(s[j]);
  }
  if (mt == kNegInf && !poisoned) {
    std::fill(s, s + n, 0.0f);
    return false;
  }
  const float m_new = poisoned ? std::numeric_limits<float>::quiet_NaN() : std::max(m, mt);
  const float alpha = m_new == m ? 1.0f : std::exp(m - m_new);
  float sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    s[j] = std::exp(s[j] - m_new);
    sum += s[j];
  }
  l = l * alpha + sum;
  if (alpha != 1.0f)
    for (int64_t d = 0; d < Dv; ++d) acc[d] *= alpha;
  m = m_new;
  return true;
}

// s[j] = c * tanh(s[j] / c), Gemma-2's logit softcap, with the libm tanh.
inline void softcap_scalar(float* s, int64_t n, float c) {
  for (int64_t j = 0; j < n; ++j) s[j] = c * std::tanh(s[j] / c);
}

// out = acc / l, with the sink logit joining the denominator only (GPT-OSS's s_aux).
inline void finalize_row(float m, float l, const float* acc, const float* sink, int64_t Dv,
                         float* out) {
  float f;
  if (sink) {
    const float mx = std::max(m, *sink);
    const float den = l * std::exp(m - mx) + std::exp(*sink - mx);
    f = std::exp(m - mx) / den;  // m = -inf (nothing seen): 0
  } else {
    f = l > 0 ? 1.0f / l : 0.0f;
  }
  for (int64_t d = 0; d < Dv; ++d) out[d] = acc[d] * f;
}

// The skeleton's steps on the rows of one task, in the order run_task calls them: init, then per
// tile classify / (the kernel's scores) / finish / (the kernel's P.V), then write.
class TaskRows {
 public:
  TaskRows(const CallPlan& P, const Task& t, const RowScratch& rs) : P(P), t(t), rs(rs) {}

  // Scaled queries, m = -inf, l = 0, acc = 0; the visible key interval of every query position
  // and their union [jlo, jhi), clipped to the partition's keys [j_begin, j_end).
  void init(int64_t j_begin, int64_t j_end);
  // Classifies every row for the tile of keys [k0, k1) into kind (and vis); false when no row
  // sees any of its keys.
  bool classify(int64_t k0, int64_t k1);
  // Softcap, score_mod and mask on the tile's logits in sb ([R, s_cols], column j - k0 for key
  // j), then the online softmax update of every row. Hooks: the kernel's softcap, its softmax
  // path (kSimd) and, with kRowTerms, rescale_row(r, alpha) for per-row terms it keeps itself.
  template <class Hooks>
  void finish(int64_t k0, int64_t k1, float* sb, Hooks& hooks);
  // Writes the rows' outputs, or this partition's partial states for merge_group.
  void write() const;

  const CallPlan& P;
  const Task& t;
  const RowScratch& rs;
  int64_t jlo = 0, jhi = 0;  // union of the rows' visible keys within the partition

 private:
  void classify_intervals(int64_t k0, int64_t k1);  // built-in intervals and documents
  void refine_by_block_mask(int64_t k0, int64_t k1);
  void refine_by_mask_fn(int64_t k0, int64_t k1);
  // score_mod and the mask on one row's logits sr[0, n).
  void mask_row(int64_t r, int64_t k0, int64_t n, float* sr) const;
};

template <class Hooks>
void TaskRows::finish(int64_t k0, int64_t k1, float* sb, Hooks& hooks) {
  const int64_t n = k1 - k0, R = t.R;
  for (int64_t r = 0; r < R; ++r) {
    float* sr = sb + r * rs.s_cols;
    if (rs.kind[r] == RowKind::kEmpty) {
      std::fill(sr, sr + n, kNegInf);
      continue;
    }
    if (P.softcap > 0) hooks.softcap(sr, n, P.softcap);
    if (!P.score && rs.kind[r] != RowKind::kPartial) continue;  // a full row: nothing to mask
    mask_row(r, k0, n, sr);
  }
  for (int64_t r = 0; r < R; ++r) {
    const float m_old = rs.m[r];
    if constexpr (Hooks::kSimd) {
#if KVCACHE_ATTN_AVX2
      softmax_update(sb + r * rs.s_cols, n, rs.m[r], rs.l[r], rs.acc + r * rs.acc_cols,
                     rs.acc_cols);
#endif
    } else {
      softmax_update_scalar(sb + r * rs.s_cols, n, rs.m[r], rs.l[r], rs.acc + r * rs.acc_cols,
                            rs.acc_cols);
    }
    if constexpr (Hooks::kRowTerms)
      if (rs.m[r] != m_old) hooks.rescale_row(r, std::exp(m_old - rs.m[r]));
  }
}

// The kernel's tile loop when it has nothing better: every tile the rows can see, in key order:
// classify, the kernel's logits, finish, the kernel's P.V. Geo maps tiles to keys:
//   std::pair<int64_t, int64_t> tile_keys(const SeqPlan&, int64_t t)   keys [k0, k1) of tile t
//   int64_t tile_at(const SeqPlan&, int64_t key)                        the tile holding key
// Tiles: logits(tile, k0, k1, sb) and pv(tile, k0, k1, sb).
template <class Geo, class Tiles>
void for_each_tile(TaskRows& rows, const Geo& geo, Tiles& tiles) {
  if (rows.jlo >= rows.jhi) return;
  const SeqPlan& seq = *rows.t.seq;
  const int64_t first = geo.tile_at(seq, rows.jlo), last = geo.tile_at(seq, rows.jhi - 1);
  for (int64_t tile = first; tile <= last; ++tile) {
    const auto [k0, k1] = geo.tile_keys(seq, tile);
    if (!rows.classify(k0, k1)) continue;
    tiles.logits(tile, k0, k1, rows.rs.s);
    rows.finish(k0, k1, rows.rs.s, tiles);
    tiles.pv(tile, k0, k1, rows.rs.s);
  }
}

// Merges the n_split partial states of one (sequence, KV head, query tile) group and writes its
// rows; tmp holds D_v floats.
void merge_group(const CallPlan& P, int64_t group, float* tmp);

// Runs f(task, lane) for task in [0, n_tasks) on default_pool(), at most n_slots at a time:
// each pool task is a lane owning scratch slot `lane`, taking tasks from a shared counter.
template <typename F>
void for_each_task(int64_t n_tasks, int64_t n_slots, F&& f) {
  const int64_t lanes = std::min(n_tasks, n_slots);
  if (lanes <= 1) {
    for (int64_t t = 0; t < n_tasks; ++t) f(t, int64_t{0});
    return;
  }
  std::atomic<int64_t> next{0};
  default_pool().parallel_for(lanes, [&](int64_t lane) {
    for (int64_t t = next.fetch_add(1, std::memory_order_relaxed); t < n_tasks;
         t = next.fetch_add(1, std::memory_order_relaxed))
      f(t, lane);
  });
}

// One task, start to end. Tiles is the kernel's per-task class:
//   Tiles(const Params&, TaskRows&, Arena&)   sets up K/V addressing, carves its own scratch
//   void run(TaskRows&)                        its tile loop (for_each_tile, or its own)
//   void fold(TaskRows&)                       its own terms into acc, before write
//   static constexpr bool kSimd, kRowTerms; softcap(s, n, c); rescale_row(r, alpha) (Hooks)
// and Params provides acc_cols(), s_cols(), with_vis and partition_keys(task) -> [j_begin,
// j_end).
template <class Tiles>
void run_task(const CallPlan& P, const typename Tiles::Params& kp, int64_t task, std::byte* slot) {
  const Task t = locate_task(P, task);
  Arena arena(slot, P.slot_bytes);
  const RowScratch rs = carve_rows(arena, P, kp.acc_cols(), kp.s_cols(), kp.with_vis);
  TaskRows rows(P, t, rs);
  const auto [j_begin, j_end] = kp.partition_keys(t);
  rows.init(j_begin, j_end);
  Tiles tiles(kp, rows, arena);
  tiles.run(rows);
  tiles.fold(rows);
  rows.write();
}

// Runs the planned and carved call: every task, then the merge of split sequences.
template <class Tiles>
void run_call(const CallPlan& P, const typename Tiles::Params& kp) {
  for_each_task(P.n_tasks, P.n_slots,
                [&](int64_t task, int64_t lane) { run_task<Tiles>(P, kp, task, P.slot(lane)); });
  if (P.partial_floats == 0) return;
  for_each_task(P.n_groups, P.n_slots, [&](int64_t group, int64_t lane) {
    merge_group(P, group, reinterpret_cast<float*>(P.slot(lane)));
  });
}

// plan_tasks, then the workspace carved behind the sequence plans.
template <class Params>
void plan_call(CallPlan& P, const Params& kp, const QueryTiling& tiling, int64_t kv_split,
               std::span<std::byte> ws);

// attention_workspace_bytes of a kernel whose Params are set as a run of the shape sets them
// (the sizes its carve_extra reads: upper bounds where a run may vary).
template <class Params>
size_t shape_bytes(const Params& kp, const AttentionShape& s, const QueryTiling& tiling,
                   int64_t n_threads);

// The scratch a slot needs beside the rows: Params::carve_extra(Arena&, R, nq) carves the same
// arrays in counting mode as its Tiles carve in a run. Rounded to whole cache lines.
template <class Params>
size_t slot_bytes(const Params& kp, const CallPlan& P) {
  Arena a;
  carve_rows(a, P, kp.acc_cols(), kp.s_cols(), kp.with_vis);
  kp.carve_extra(a, P.max_rows, P.tq);
  return std::max(a.used(), Arena::round_up(static_cast<size_t>(P.Dv) * sizeof(float)));
}

template <class Params>
void plan_call(CallPlan& P, const Params& kp, const QueryTiling& tiling, int64_t kv_split,
               std::span<std::byte> ws) {
  plan_tasks(P, kp, tiling, kv_split);
  carve_call(P, ws, slot_bytes(kp, P));
}

template <class Params>
size_t shape_bytes(const Params& kp, const AttentionShape& s, const QueryTiling& tiling,
                   int64_t n_threads) {
  const CallPlan P = bound_plan(s, tiling);
  return workspace_bytes(P.B, P.partial_floats, n_threads, slot_bytes(kp, P));
}

}  // namespace kvcache::detail
