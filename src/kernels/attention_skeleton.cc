// The attention skeleton's non-template steps (see attention_skeleton.h).
#include "kernels/attention_skeleton.h"

#include <new>
#include <string>

#include "core/error.h"

namespace kvcache::detail {

void init_call(CallPlan& P, const TensorView& q, const TensorView& out, int64_t B, int64_t Hkv,
               int64_t Dv, const AttentionOptions& o) {
  P.q = q;
  P.out = out;
  P.varlen = q.ndim() == 3;
  P.B = B;
  P.Hq = q.dim(1);
  P.Dk = q.dim(q.ndim() - 1);
  P.Hkv = Hkv;
  P.Dv = Dv;
  P.G = Hkv > 0 ? P.Hq / Hkv : 0;
  P.scale = o.scale > 0 ? o.scale : 1.0f / std::sqrt(static_cast<float>(P.Dk));
  P.softcap = o.softcap;
  P.sinks = o.sinks;
  P.score = o.score;
  P.block_mask = o.block_mask;
  P.spec = attention_mask_spec(o);
}

void set_dense_seqs(CallPlan& P, int64_t Sq, int64_t Skv, int64_t q_offset) {
  for (int64_t b = 0; b < P.B; ++b) {
    P.seqs[b].Sq = Sq;
    P.seqs[b].Skv = Skv;
    P.seqs[b].q_offset = q_offset;
  }
}

CallPlan bound_plan(const AttentionShape& s, const QueryTiling& tiling) {
  CallPlan P;
  P.B = s.batch;
  P.Hkv = std::max<int64_t>(s.heads_kv, 1);
  P.G = std::max<int64_t>(s.heads_q / P.Hkv, 1);
  P.Dk = s.head_dim_k;
  P.Dv = s.head_dim_v;
  P.tq = max_query_tile(s.q_len, P.G, tiling);
  P.max_rows = P.G * P.tq;
  P.partial_floats = max_partial_floats(s, tiling);
  return P;
}

int64_t query_tile(int64_t max_sq, int64_t G, const QueryTiling& tiling) {
  int64_t tq = std::min(max_sq, std::max<int64_t>(1, tiling.rows_per_task / G));
  if (!tiling.balance) return tq;
  // Tiles of equal size, as many as max_sq holds rows_per_task rows to the nearest: every task
  // packs each key tile it reads once for all its rows, so a last tile of a few positions (200
  // positions at G = 3 and 192 rows: 64, 64, 64 and 8) paid a whole packing of the keys for 24
  // rows. Now 67, 67, 66 (then rounded up below to whole register blocks: 68, 68, 64).
  if (tq < max_sq) {
    const int64_t n_tiles = std::max<int64_t>(1, (2 * max_sq + tq) / (2 * tq));
    tq = (max_sq + n_tiles - 1) / n_tiles;
  }
  // Many-row tasks: whole register blocks (G = 3, blocks of 5 rows: 25 positions, 75 rows,
  // instead of 21 and a 3-row tail). Rows are independent in the kernels that balance: the split
  // of positions into tasks never changes a row's arithmetic.
  while (tq > 1 && tq < max_sq && G * tq >= tiling.min_block_rows &&
         (G * tq) % tiling.row_block != 0)
    ++tq;
  return tq;
}

int64_t max_query_tile(int64_t q_len, int64_t G, const QueryTiling& tiling) {
  const int64_t tq0 = std::max<int64_t>(1, tiling.rows_per_task / G);
  if (!tiling.balance) return std::min(q_len, tq0);
  // Balanced tiles: one tile (max_sq < 1.5 tq0) holds at most max_sq < 1.5 tq0 positions; n >= 2
  // tiles hold ceil(max_sq / n) < 1.25 tq0 + 1; rounding to register blocks adds less than a
  // block. Never more than max_sq.
  return std::max<int64_t>(1, std::min(q_len, tq0 + tq0 / 2 + 1 + tiling.row_block));
}

int64_t max_partial_floats(const AttentionShape& s, const QueryTiling& tiling) {
  const int64_t n_split = max_partitions(s.kv_split, s.kv_len);
  if (n_split <= 1 || s.batch == 0) return 0;
  const int64_t Hkv = std::max<int64_t>(s.heads_kv, 1), G = std::max<int64_t>(s.heads_q / Hkv, 1);
  // Only sequences of one task's queries split automatically (split_keys).
  const int64_t sq =
      s.kv_split > 0 ? s.q_len : std::min(s.q_len, std::max<int64_t>(1, tiling.rows_per_task / G));
  return s.batch * Hkv * n_split * G * sq * (s.head_dim_v + 2);
}

int64_t split_keys(int64_t kv_split, int64_t Sq, int64_t Skv, int64_t G, int64_t rows_per_task) {
  if (kv_split > 0) return kv_split < Skv ? kv_split : 0;
  if (kv_split < 0) return 0;
  // One task's worth of queries: Sq * G <= rows_per_task, and a decode row always (a group wider
  // than a task is still one task per KV head, the case split-KV exists for).
  if (Sq > std::max<int64_t>(1, rows_per_task / G)) return 0;
  return auto_split_keys(Skv);
}

int64_t max_partitions(int64_t kv_split, int64_t kv_len) {
  if (kv_split < 0 || kv_len <= 0) return 1;
  if (kv_split > 0) return std::max<int64_t>(1, (kv_len + kv_split - 1) / kv_split);
  // auto_split_keys: partitions of 1,024 keys up to 4,096 keys (at most 4), of a quarter of the
  // keys rounded up to 64 up to 16,384 (at most 5: a quarter rounded down, e.g. 1,088 of 4,355
  // keys, leaves 3 over), of 4,096 beyond.
  if (kv_len <= 1024) return 1;
  return std::max<int64_t>(5, (kv_len + 4095) / 4096);
}

size_t call_bytes(int64_t B, int64_t partial_floats, int64_t n_slots, size_t slot_bytes) {
  Arena a;
  a.take<SeqPlan>(B);
  a.take<float>(partial_floats);
  a.take<std::byte>(n_slots * static_cast<int64_t>(slot_bytes));
  return a.used();
}

size_t workspace_bytes(int64_t B, int64_t partial_floats, int64_t n_slots, size_t slot_bytes) {
  return call_bytes(B, partial_floats, n_slots, slot_bytes) + Arena::kAlign - 1;
}

namespace {

// The workspace from its first 64-byte boundary on.
std::span<std::byte> aligned(std::span<std::byte> ws) {
  const auto addr = reinterpret_cast<uintptr_t>(ws.data());
  const size_t skip = (Arena::kAlign - addr % Arena::kAlign) % Arena::kAlign;
  return skip >= ws.size() ? std::span<std::byte>() : ws.subspan(skip);
}

[[noreturn]] void too_small(size_t have, size_t need) {
  throw Error(ErrorKind::kInvalidArgument,
              "attention: the workspace holds " + std::to_string(have) +
                  " bytes; this call needs " + std::to_string(need + Arena::kAlign - 1) +
                  " (size AttentionOptions::workspace with attention_workspace_bytes)");
}

}  // namespace

void CallWorkspace::out_of_memory(size_t bytes) {
  throw Error(ErrorKind::kOutOfRange,
              "attention: cannot allocate a workspace of " + std::to_string(bytes) + " bytes");
}

SeqPlan* carve_seqs(std::span<std::byte> ws, int64_t B) {
  const std::span<std::byte> w = aligned(ws);
  Arena a(w.data(), w.size());
  const size_t need = Arena::round_up(sizeof(SeqPlan) * static_cast<size_t>(B));
  if (w.size() < need) too_small(ws.size(), need);
  SeqPlan* seqs = a.take<SeqPlan>(B);
  for (int64_t b = 0; b < B; ++b) new (seqs + b) SeqPlan{};
  return seqs;
}

void carve_call(CallPlan& P, std::span<std::byte> ws, size_t slot_bytes) {
  const std::span<std::byte> w = aligned(ws);
  P.n_slots = default_pool().n_threads();
  P.slot_bytes = slot_bytes;
  const size_t need = call_bytes(P.B, P.partial_floats, P.n_slots, slot_bytes);
  if (w.size() < need) too_small(ws.size(), need);
  Arena a(w.data(), w.size());
  KV_CHECK(a.take<SeqPlan>(P.B) == P.seqs, "the sequence plans come first");
  P.partial = a.take<float>(P.partial_floats);
  P.slots = a.take<std::byte>(P.n_slots * static_cast<int64_t>(slot_bytes));
}

RowScratch carve_rows(Arena& a, const CallPlan& P, int64_t acc_cols, int64_t s_cols,
                      bool with_vis) {
  const int64_t R = P.max_rows, nq = P.tq;
  RowScratch rs;
  rs.acc_cols = acc_cols;
  rs.s_cols = s_cols;
  rs.qs = a.take<float>(R * P.Dk);
  rs.acc = a.take<float>(R * acc_cols);
  rs.s = a.take<float>(R * s_cols);
  rs.m = a.take<float>(R);
  rs.l = a.take<float>(R);
  rs.lo = a.take<int64_t>(nq);
  rs.hi = a.take<int64_t>(nq);
  rs.kind = a.take<RowKind>(R);
  if (with_vis) rs.vis = a.take<uint8_t>(R * s_cols);
  return rs;
}

// The sequence owning task (or group) index x, given each sequence's first index.
template <typename Field>
static int64_t find_seq(const CallPlan& P, int64_t x, Field field) {
  int64_t lo = 0, hi = P.B;  // last b with field(seqs[b]) <= x
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (field(P.seqs[mid]) <= x)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

Task locate_task(const CallPlan& P, int64_t task) {
  Task t;
  t.id = task;
  t.b = find_seq(P, task, [](const SeqPlan& x) { return x.task0; });
  const SeqPlan& S = P.seqs[t.b];
  t.seq = &S;
  int64_t x = task - S.task0;
  t.sp = x % S.n_split;
  x /= S.n_split;
  t.qt = x % S.n_qt;
  t.hk = x / S.n_qt;
  t.q0 = t.qt * P.tq;
  t.nq = std::min(S.Sq, t.q0 + P.tq) - t.q0;
  t.R = P.G * t.nq;
  t.t_begin = t.sp * S.tiles_per_split;
  t.t_end = std::min(std::max<int64_t>(S.n_tiles, 1), t.t_begin + S.tiles_per_split);
  return t;
}

// ---- TaskRows ----

void TaskRows::init(int64_t j_begin, int64_t j_end) {
  const int64_t R = t.R, nq = t.nq, Dk = P.Dk, Skv = t.seq->Skv;
  for (int64_t r = 0; r < R; ++r) {
    const float* qr = P.q_row(*t.seq, t.b, t.hk * P.G + r / nq, t.q0 + r % nq);
    for (int64_t d = 0; d < Dk; ++d) rs.qs[r * Dk + d] = qr[d] * P.scale;
    rs.m[r] = kNegInf;
    rs.l[r] = 0;
  }
  std::fill(rs.acc, rs.acc + R * rs.acc_cols, 0.0f);
  jlo = j_end;
  jhi = j_begin;
  for (int64_t i = 0; i < nq; ++i) {
    int64_t lo = 0, hi = Skv;
    if (!P.mask_free) {
      const KeyRange kr = key_range(P.spec, t.b, t.seq->q_offset + t.q0 + i);
      lo = std::clamp(kr.lo - P.kv_offset, int64_t{0}, Skv);
      hi = std::clamp(kr.hi - P.kv_offset, int64_t{0}, Skv);
    }
    rs.lo[i] = lo;
    rs.hi[i] = hi;
    if (lo < hi) {
      jlo = std::min(jlo, lo);
      jhi = std::max(jhi, hi);
    }
  }
  jlo = std::max(jlo, j_begin);
  jhi = std::min(jhi, j_end);
}

namespace {

RowKind kind_of(int64_t count, int64_t n) {
  return count == 0 ? RowKind::kEmpty : count == n ? RowKind::kFull : RowKind::kPartial;
}

}  // namespace

bool TaskRows::classify(int64_t k0, int64_t k1) {
  RowKind* kind = rs.kind;
  if (P.mask_free) {
    std::fill(kind, kind + t.R, RowKind::kFull);
    return true;
  }
  classify_intervals(k0, k1);
  if (P.block_mask)
    refine_by_block_mask(k0, k1);
  else if (P.spec.fn)
    refine_by_mask_fn(k0, k1);
  for (int64_t r = 0; r < t.R; ++r)
    if (kind[r] != RowKind::kEmpty) return true;
  return false;
}

void TaskRows::classify_intervals(int64_t k0, int64_t k1) {
  const MaskSpec& spec = P.spec;
  const int64_t b = t.b, nq = t.nq;
  int32_t dmin = 0, dmax = -1;  // the tile's document ids
  if (spec.doc_ids) {
    dmin = std::numeric_limits<int32_t>::max();
    dmax = std::numeric_limits<int32_t>::min();
    for (int64_t j = k0; j < k1; ++j) {
      const int32_t d = doc_id(spec, b, P.kv_offset + j);
      dmin = std::min(dmin, d);
      dmax = std::max(dmax, d);
    }
  }
  for (int64_t i = 0; i < nq; ++i) {
    const int64_t lo = std::max(rs.lo[i], k0), hi = std::min(rs.hi[i], k1);
    RowKind k = lo >= hi                 ? RowKind::kEmpty
                : (lo == k0 && hi == k1) ? RowKind::kFull
                                         : RowKind::kPartial;
    if (k != RowKind::kEmpty && spec.doc_ids) {
      const int32_t dq = doc_id(spec, b, t.seq->q_offset + t.q0 + i);
      if (dq < dmin || dq > dmax)
        k = RowKind::kEmpty;
      else if (dmin != dmax)
        k = RowKind::kPartial;
    }
    for (int64_t g = 0; g < P.G; ++g) rs.kind[g * nq + i] = k;
  }
}

// The user mask as bits: rows are classified by word, and never call a function. Block-mask
// words cover 64-key tiles aligned to key 0: only the fused kernel's geometry (the quantized
// kernel refuses block masks).
void TaskRows::refine_by_block_mask(int64_t k0, int64_t k1) {
  const MaskSpec& spec = P.spec;
  const BlockMask& bm = *P.block_mask;
  const int64_t n = k1 - k0, b = t.b, nq = t.nq;
  const uint64_t all = n == BlockMask::kTile ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
  for (int64_t r = 0; r < t.R; ++r) {
    RowKind& kind = rs.kind[r];
    if (kind == RowKind::kEmpty) continue;
    const int64_t i = r % nq, h = t.hk * P.G + r / nq;
    const uint64_t w = bm.word(b, h, t.q0 + i, k0 / BlockMask::kTile);
    if (w == 0) {
      kind = RowKind::kEmpty;
    } else if (w != all || kind == RowKind::kPartial) {
      const int64_t qp = t.seq->q_offset + t.q0 + i;
      const int64_t lo = std::max(rs.lo[i], k0), hi = std::min(rs.hi[i], k1);
      uint8_t* vis = rs.vis + r * rs.s_cols;
      int64_t count = 0;
      for (int64_t j = k0; j < k1; ++j) {
        const bool v = ((w >> (j - k0)) & 1) && j >= lo && j < hi &&
                       (!spec.doc_ids || builtin_visible(spec, b, qp, P.kv_offset + j));
        vis[j - k0] = v;
        count += v;
      }
      kind = kind_of(count, n);
    }  // else: every key visible to the function and to the built-ins: stays full
  }
}

// The user mask function, evaluated where the built-ins leave keys visible.
void TaskRows::refine_by_mask_fn(int64_t k0, int64_t k1) {
  const MaskSpec& spec = P.spec;
  const int64_t n = k1 - k0, b = t.b, nq = t.nq;
  for (int64_t r = 0; r < t.R; ++r) {
    if (rs.kind[r] == RowKind::kEmpty) continue;
    const int64_t i = r % nq, h = t.hk * P.G + r / nq, qp = t.seq->q_offset + t.q0 + i;
    const int64_t lo = std::max(rs.lo[i], k0), hi = std::min(rs.hi[i], k1);
    uint8_t* vis = rs.vis + r * rs.s_cols;
    int64_t count = 0;
    for (int64_t j = k0; j < k1; ++j) {
      const int64_t kp = P.kv_offset + j;
      const bool v =
          j >= lo && j < hi && builtin_visible(spec, b, qp, kp) && (*spec.fn)(b, h, qp, kp);
      vis[j - k0] = v;
      count += v;
    }
    rs.kind[r] = kind_of(count, n);
  }
}

void TaskRows::mask_row(int64_t r, int64_t k0, int64_t n, float* sr) const {
  const MaskSpec& spec = P.spec;
  const int64_t i = r % t.nq, qp = t.seq->q_offset + t.q0 + i;
  if (P.score) {
    const int64_t h = t.hk * P.G + r / t.nq;
    for (int64_t j = 0; j < n; ++j) sr[j] = (*P.score)(sr[j], t.b, h, qp, P.kv_offset + k0 + j);
  }
  if (rs.kind[r] != RowKind::kPartial) return;
  const int64_t lo = rs.lo[i], hi = rs.hi[i];
  if (!spec.doc_ids && !spec.fn) {  // an interval only (causal, window, chunk): two fills
    std::fill(sr, sr + std::clamp(lo - k0, int64_t{0}, n), kNegInf);
    std::fill(sr + std::clamp(hi - k0, int64_t{0}, n), sr + n, kNegInf);
    return;
  }
  const int32_t dq = spec.doc_ids ? doc_id(spec, t.b, qp) : 0;
  const uint8_t* vis = rs.vis + r * rs.s_cols;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t jj = k0 + j;
    bool v = jj >= lo && jj < hi;
    if (v && spec.doc_ids) v = doc_id(spec, t.b, P.kv_offset + jj) == dq;
    if (v && spec.fn) v = vis[j] != 0;
    if (!v) sr[j] = kNegInf;
  }
}

void TaskRows::write() const {
  const SeqPlan& S = *t.seq;
  const int64_t Dv = P.Dv, rec = Dv + 2;
  // Split sequence: the group's block [n_split, R, rec] lies at its rows' place in the sequence
  // ([H_kv, S_q] positions x G heads x n_split), this task's slice at sp.
  float* part = S.n_split == 1 ? nullptr
                               : P.partial + S.partial0 +
                                     ((t.hk * S.Sq + t.q0) * P.G * S.n_split + t.sp * t.R) * rec;
  for (int64_t r = 0; r < t.R; ++r) {
    const int64_t h = t.hk * P.G + r / t.nq, i = t.q0 + r % t.nq;
    const float* acc = rs.acc + r * rs.acc_cols;
    if (!part) {
      finalize_row(rs.m[r], rs.l[r], acc, P.sinks ? P.sinks + h : nullptr, Dv,
                   P.out_row(S, t.b, h, i));
    } else {
      float* dst = part + r * rec;
      std::memcpy(dst, acc, static_cast<size_t>(Dv) * sizeof(float));
      dst[Dv] = rs.m[r];
      dst[Dv + 1] = rs.l[r];
    }
  }
}

void merge_group(const CallPlan& P, int64_t group, float* tmp) {
  const int64_t b = find_seq(P, group, [](const SeqPlan& x) { return x.group0; });
  const SeqPlan& S = P.seqs[b];
  if (S.n_split == 1) return;  // run_task wrote the rows
  const int64_t gl = group - S.group0, qt = gl % S.n_qt, hk = gl / S.n_qt;
  const int64_t q0 = qt * P.tq, nq = std::min(S.Sq, q0 + P.tq) - q0, R = P.G * nq;
  const int64_t Dv = P.Dv, rec = Dv + 2, n_split = S.n_split;
  const float* block = P.partial + S.partial0 + (hk * S.Sq + q0) * P.G * n_split * rec;
  for (int64_t r = 0; r < R; ++r) {
    const float* first = block + r * rec;  // split sp's state of row r at first + sp * R * rec
    // A poisoned partition's m is NaN (softmax_update_scalar): the merged M takes it, where
    // std::max would keep the others' (-inf when they saw nothing) and write zeros.
    float M = kNegInf;
    for (int64_t sp = 0; sp < n_split; ++sp) {
      const float m = first[sp * R * rec + Dv];
      if (std::isnan(m) || m > M) M = m;
    }
    float L = 0;
    std::fill(tmp, tmp + Dv, 0.0f);
    if (M != kNegInf) {
      for (int64_t sp = 0; sp < n_split; ++sp) {
        const float* part = first + sp * R * rec;
        if (part[Dv] == kNegInf) continue;
        const float w = std::exp(part[Dv] - M);
        L += part[Dv + 1] * w;
        for (int64_t d = 0; d < Dv; ++d) tmp[d] += part[d] * w;
      }
    }
    const int64_t h = hk * P.G + r / nq;
    finalize_row(M, L, tmp, P.sinks ? P.sinks + h : nullptr, Dv, P.out_row(S, b, h, q0 + r % nq));
  }
}

}  // namespace kvcache::detail
