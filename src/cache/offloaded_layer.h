// The offloaded containers ("offloaded" and "offloaded_static" / "full_attention"):
// transformers' OffloadedCache (Cache(offloading=True), KV cache notes "Offloading") on a CPU,
// where the tier below RAM is a file (an NVMe, or its page cache).
//
// Every offloaded layer keeps its K/V in a file of its own (in OffloadOptions::dir, unlinked at
// creation so nothing is left behind). It is resident only while it holds one of its Cache's TWO
// slots (OffloadPool, shared by the Cache's layers through CacheConfig::context), so at most two
// offloaded layers' K/V are in RAM at once, whatever the model's depth:
//   prefetch()  takes a slot (when both are held, the least recently used holder is offloaded
//               first) and queues a read of the layer's live K/V into it on the pool's
//               TierCopier; returns at once.
//   update()    waits for that read (or reads now when nothing was prefetched), appends the new
//               tokens to the slot, queues a write of ONLY the new tokens to the file (write
//               behind: the file already holds the rest), returns a span over the slot.
//   offload()   gives the slot up; its span is invalid from then on. The slot's buffer is kept
//               (and reused by the next holder without reallocation); a later job on it runs
//               after the written-behind tokens reached the file (the copier is FIFO, and a
//               holder that reads nothing waits for the slot's last job before writing to it).
// Cache::update drives the hooks: before layer l's update it offloads the previous offloadable
// layer and prefetches the next (cyclically), so the read of l+1 overlaps l's compute.
// A layer re-taking the slot it gave up, before anyone else took it, reads nothing (a model
// with two offloaded layers keeps both resident).
//
// Layout: the slot holds an exact image of the file, K [B_cap, H_kv, cap, D_k] then V
// [B_cap, H_kv, cap, D_v] (no V with K == V), so a read or write of tokens [t0, t1) is one
// pread/pwrite per (row, head) at the same offset in both. cap: dynamic grows x2 from
// max(16, first update, reserve()); static is max_cache_len (preallocated, overflow refused
// before any change).
//
// Lifecycle ops: crop and reset change the length only; reorder / select / repeat_interleave /
// a dynamic growth / reserve read the live K/V from the file, rearrange it and write it back
// whole (rare; the layer is not resident afterwards).
//
// Failures: a failed read (or an injected fault at "offload.read") is an Error(kIo) from the
// update that needed it, and the layer stays as it was (the file is intact). A failed
// write-behind leaves the file incomplete: every later update / prefetch throws Error(kIo)
// until reset().
//
// bytes(): the slot buffer(s) this layer holds now; the free slots' buffers are billed to the
// pool's first layer, so Cache::bytes() counts the pool once, exactly (OffloadPool::bytes()).
// offloaded_bytes(): the live K/V in the file, B·H_kv·S·(D_k + D_v)·dtype bytes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "cache/cache.h"
#include "cache/cache_layer.h"
#include "core/tensor.h"
#include "core/tier.h"

namespace kvcache {

class OffloadedLayer;

// The resident tier of one Cache's offloaded layers: two slot buffers and the copier.
class OffloadPool {
 public:
  static constexpr int kSlots = 2;
  struct Slot {
    Tensor buffer;                         // grown as needed, never shrunk, reused by holders
    OffloadedLayer* holder = nullptr;      // the layer resident in it now
    const OffloadedLayer* last = nullptr;  // the latest holder: its content may still be there
    uint64_t last_use = 0;                 // LRU clock
    TierCopier::Ticket last_job = 0;       // the latest copier job reading or writing it
  };

  // The pool of the cache `config` belongs to (CacheConfig::context).
  static std::shared_ptr<OffloadPool> of(const CacheConfig& config);

  int resident() const;  // slots held now: at most kSlots
  size_t bytes() const;  // both slot buffers
  const Slot& slot(int i) const { return slots_[static_cast<size_t>(i)]; }
  TierCopier& copier() { return copier_; }
  const TierCopier& copier() const { return copier_; }

 private:
  friend class OffloadedLayer;
  std::array<Slot, kSlots> slots_;
  uint64_t clock_ = 0;
  const OffloadedLayer* billed_ = nullptr;  // bytes() of this layer includes the free slots
  TierCopier copier_{"offload"};            // last: joined before the buffers are freed
};

// The pool of a cache's offloaded layers, nullptr when it has none (benchmarks read its copier's
// statistics).
const OffloadPool* find_offload_pool(const Cache& cache);

struct OffloadedLayerParams {
  std::string name;  // registry name, "offloaded/full_attention"
  int layer_index = -1;
  std::optional<DType> kv_dtype;  // storage dtype; unset: the first update's
  int64_t max_batch_size = 0;     // static: rows preallocated (0: the first batch)
  bool fixed = false;             // static: capacity max_cache_len, never grown
  int64_t max_cache_len = 0;
  bool shared_kv = false;  // K == V: stored once, the span's v is its k
  std::string dir;         // where the file goes; empty: $TMPDIR or /tmp
  // Before every read of the file: fdatasync it and drop its pages from the page cache
  // (posix_fadvise DONTNEED), so the read comes from the device ("cold"; benchmarks only).
  bool drop_page_cache = false;
};

class OffloadedLayer final : public CacheLayer {
 public:
  OffloadedLayer(OffloadedLayerParams params, std::shared_ptr<OffloadPool> pool);
  ~OffloadedLayer() override;
  OffloadedLayer(const OffloadedLayer&) = delete;
  OffloadedLayer& operator=(const OffloadedLayer&) = delete;

  KVSpan update(const TensorView& k, const TensorView& v) override;
  MaskSizes mask_sizes(int64_t query_len) const override { return {seq_ + query_len, 0}; }
  int64_t seq_length() const override { return seq_; }
  int64_t max_length() const override { return params_.fixed ? params_.max_cache_len : -1; }
  bool is_initialized() const override { return fd_ >= 0; }

  void crop(int64_t n) override;
  void reset() override;
  void reorder(std::span<const int64_t> beam_idx) override;
  void repeat_interleave(int64_t r) override;
  void select(std::span<const int64_t> indices) override;
  void reserve(int64_t tokens) override;

  void offload() override;
  void prefetch() override;
  bool offloadable() const override { return true; }

  size_t bytes() const override;
  size_t offloaded_bytes() const override;
  std::string_view name() const override { return params_.name; }
  // Session files: the shape, dtype and length, then the live K and V ([B, H_kv, S, D] each,
  // row-major, from the file). load() needs an empty layer (fresh or reset) and checks every
  // field against its configuration before it changes anything.
  void save(StateWriter& out) const override;
  void load(StateReader& in) override;

  bool resident() const { return slot_ >= 0; }
  int64_t capacity() const { return cap_; }  // tokens per row in the file and the slot
  const OffloadPool& pool() const { return *pool_; }
  // Test hook: closes the file, so that the next read fails as a lost device would.
  void close_file_for_testing();

 private:
  std::string where() const;
  int64_t check_update(const TensorView& k, const TensorView& v) const;
  void initialize(const TensorView& k, const TensorView& v, int64_t n);
  size_t elt() const;
  size_t token_dims() const;  // D_k + D_v (D_k with K == V)
  size_t layout_bytes() const;
  uint64_t k_offset(int64_t b, int64_t h, int64_t t) const;
  uint64_t v_offset(int64_t b, int64_t h, int64_t t) const;
  // Calls f(offset, bytes) for every (row, head) run of tokens [t0, t1), K then V.
  template <typename F>
  void for_runs(int64_t t0, int64_t t1, F f) const;
  std::string file_label() const;
  void throw_if_broken() const;

  void acquire();        // takes a slot, queues the read (see the header comment)
  void make_resident();  // acquire() if needed, then waits for the slot's content
  void wait_ready();     // waits for ready_; Error(kIo) when the read failed
  void release_slot();   // offload() without the checks
  TierCopier::Ticket queue_read(uint8_t* base);
  void queue_write_behind(int64_t t0, int64_t t1);

  // Rare ops: the live K/V as contiguous [B, H_kv, S, D] tensors (from the file, after the
  // write-behind drained), and writing such tensors back whole at the current layout.
  void materialize(Tensor* k, Tensor* v);
  void rewrite(const Tensor& k, const Tensor& v);
  void transfer(bool write, const Tensor& k, const Tensor& v);
  void gather_rows(std::span<const int64_t> rows, const char* op);
  void grow(int64_t capacity);

  OffloadedLayerParams params_;
  std::shared_ptr<OffloadPool> pool_;
  int fd_ = -1;
  std::string path_;       // for messages (the file itself is unlinked)
  int64_t batch_ = 0;      // live rows
  int64_t batch_cap_ = 0;  // rows laid out in the file and the slot
  int64_t heads_ = 0, dk_ = 0, dv_ = 0;
  DType dtype_ = DType::kF32;
  int64_t cap_ = 0;               // tokens per (row, head) in the layout
  int64_t seq_ = 0;               // tokens stored
  int64_t reserved_ = 0;          // the largest reserve() (dynamic)
  int slot_ = -1;                 // the slot held, -1 when offloaded
  int cached_slot_ = -1;          // the slot given up last with this layer's content still in it
  TierCopier::Ticket ready_ = 0;  // the job after which the slot holds this layer's content
  uint64_t read_gen_ = 0;         // reads queued so far (errors are matched by generation)

  mutable std::mutex io_mu_;  // the copier thread reports failures here
  uint64_t failed_read_gen_ = 0;
  std::string read_error_;
  std::string write_error_;  // sticky until reset()
};

}  // namespace kvcache
