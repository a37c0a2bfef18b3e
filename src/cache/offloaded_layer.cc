#include "cache/offloaded_layer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "cache/crop_rule.h"
#include "cache/layer_state.h"
#include "core/error.h"
#include "core/fault.h"

namespace kvcache {

std::shared_ptr<OffloadPool> OffloadPool::of(const CacheConfig& config) {
  // A layer built outside a Cache (the CLI's container demo, tests) gets a pool of its own.
  if (!config.context) return std::make_shared<OffloadPool>();
  auto& holder = config.context->get<std::shared_ptr<OffloadPool>>(
      "offload", [] { return new std::shared_ptr<OffloadPool>(std::make_shared<OffloadPool>()); });
  return holder;
}

int OffloadPool::resident() const {
  int n = 0;
  for (const Slot& s : slots_) n += s.holder != nullptr ? 1 : 0;
  return n;
}

size_t OffloadPool::bytes() const {
  size_t n = 0;
  for (const Slot& s : slots_) n += s.buffer.size_bytes();
  return n;
}

const OffloadPool* find_offload_pool(const Cache& cache) {
  for (int i = 0; i < cache.num_layers(); ++i) {
    if (cache.is_shared(i)) continue;
    if (const auto* l = dynamic_cast<const OffloadedLayer*>(&cache.layer(i))) return &l->pool();
  }
  return nullptr;
}

namespace {

// An unlinked file in dir: O_TMPFILE where the file system has it, else mkstemp + unlink.
int open_unlinked(const std::string& dir, const std::string& where) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  std::string path = dir + "/kvcache-offload-XXXXXX";
  std::vector<char> name(path.begin(), path.end());
  name.push_back('\0');
  fd = ::mkstemp(name.data());
  if (fd < 0) {
    throw Error(ErrorKind::kIo, where + ": cannot create the offload file in " + dir + ": " +
                                    std::strerror(errno) +
                                    "; pass --offload-dir with a writable directory");
  }
  ::unlink(name.data());
  return fd;
}

std::string default_dir() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

}  // namespace

OffloadedLayer::OffloadedLayer(OffloadedLayerParams params, std::shared_ptr<OffloadPool> pool)
    : params_(std::move(params)), pool_(std::move(pool)) {
  if (params_.dir.empty()) params_.dir = default_dir();
  if (params_.kv_dtype && !dtype_is_float(*params_.kv_dtype)) {
    throw Error(ErrorKind::kUnsupported, where() + ": kv_dtype " + dtype_name(*params_.kv_dtype) +
                                             " is a block type; the offloaded containers store "
                                             "f32, f16 or bf16");
  }
  if (params_.fixed && params_.max_cache_len <= 0) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": the static offloaded cache needs max_cache_len > 0 (got " +
                    std::to_string(params_.max_cache_len) + "); pass --max-cache-len");
  }
  if (params_.max_batch_size < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "max_batch_size must be >= 0, got " + std::to_string(params_.max_batch_size));
  }
  if (pool_->billed_ == nullptr) pool_->billed_ = this;
}

OffloadedLayer::~OffloadedLayer() {
  // Jobs queued for this layer name its fd and `this`: let them finish first.
  pool_->copier().drain();
  for (auto& s : pool_->slots_) {
    if (s.holder == this) s.holder = nullptr;
    if (s.last == this) s.last = nullptr;
  }
  if (pool_->billed_ == this) pool_->billed_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
}

std::string OffloadedLayer::where() const {
  return "layer " + std::to_string(params_.layer_index) + " (" + params_.name + ")";
}

std::string OffloadedLayer::file_label() const {
  return where() + "'s offload file in " + params_.dir;
}

size_t OffloadedLayer::elt() const {
  return dtype_bytes(dtype_, 1);
}

size_t OffloadedLayer::token_dims() const {
  return static_cast<size_t>(dk_ + (params_.shared_kv ? 0 : dv_));
}

size_t OffloadedLayer::layout_bytes() const {
  return static_cast<size_t>(batch_cap_ * heads_ * cap_) * token_dims() * elt();
}

uint64_t OffloadedLayer::k_offset(int64_t b, int64_t h, int64_t t) const {
  return static_cast<uint64_t>(((b * heads_ + h) * cap_ + t) * dk_) * elt();
}

uint64_t OffloadedLayer::v_offset(int64_t b, int64_t h, int64_t t) const {
  const auto k_region = static_cast<uint64_t>(batch_cap_ * heads_ * cap_ * dk_) * elt();
  return k_region + static_cast<uint64_t>(((b * heads_ + h) * cap_ + t) * dv_) * elt();
}

template <typename F>
void OffloadedLayer::for_runs(int64_t t0, int64_t t1, F f) const {
  if (t1 <= t0) return;
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t h = 0; h < heads_; ++h) {
      f(k_offset(b, h, t0), static_cast<size_t>((t1 - t0) * dk_) * elt());
      if (!params_.shared_kv) f(v_offset(b, h, t0), static_cast<size_t>((t1 - t0) * dv_) * elt());
    }
}

void OffloadedLayer::throw_if_broken() const {
  std::lock_guard<std::mutex> lock(io_mu_);
  if (!write_error_.empty()) {
    throw Error(ErrorKind::kIo, where() + ": an earlier write to the offload file failed (" +
                                    write_error_ +
                                    "); the file misses tokens, so the cache cannot continue: "
                                    "reset() it and recompute");
  }
}

int64_t OffloadedLayer::check_update(const TensorView& k, const TensorView& v) const {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorKind::kInvalidArgument, where() + ": update(k, v): " + what);
  };
  if (k.ndim() != 4 || v.ndim() != 4)
    fail("k and v must be 4-D [B, H_kv, S, D]; got k " + k.shape().str() + ", v " +
         v.shape().str());
  if (k.dim(0) != v.dim(0) || k.dim(1) != v.dim(1) || k.dim(2) != v.dim(2))
    fail("k " + k.shape().str() + " and v " + v.shape().str() +
         " must agree on batch, heads and tokens");
  if (k.dim(0) < 1 || k.dim(1) < 1 || k.dim(3) < 1 || v.dim(3) < 1)
    fail("empty batch, heads or head dim: k " + k.shape().str() + ", v " + v.shape().str());
  if (params_.shared_kv && !(k.shape() == v.shape()))
    fail("this layer stores K == V once: k and v must be the same tensor; got k " +
         k.shape().str() + ", v " + v.shape().str());
  if (!dtype_is_float(k.dtype()) || !dtype_is_float(v.dtype()))
    fail(std::string("k and v must be f32, f16 or bf16; got ") + dtype_name(k.dtype()) + ", " +
         dtype_name(v.dtype()));
  if (fd_ >= 0) {
    if (k.dim(1) != heads_ || k.dim(3) != dk_ || v.dim(3) != dv_)
      fail("k " + k.shape().str() + ", v " + v.shape().str() + " do not match the cache's " +
           std::to_string(heads_) + " KV heads and head dims " + std::to_string(dk_) + "/" +
           std::to_string(dv_) + " set by the first update");
    if (seq_ > 0 && k.dim(0) != batch_)
      fail("batch " + std::to_string(k.dim(0)) + " but the cache holds " + std::to_string(batch_) +
           " rows; use reorder/select/repeat_interleave, or reset()");
  }
  const int64_t n = k.dim(2);
  if (params_.fixed && seq_ + n > params_.max_cache_len) {
    throw Error(ErrorKind::kOutOfRange,
                where() + ": cannot write " + std::to_string(n) + " tokens at position " +
                    std::to_string(seq_) + ": the static cache holds " +
                    std::to_string(params_.max_cache_len) + " tokens (max_cache_len); raise " +
                    "--max-cache-len to at least " + std::to_string(seq_ + n) +
                    " or use --cache offloaded");
  }
  const int64_t rows_allowed = fd_ >= 0 && params_.fixed ? batch_cap_ : params_.max_batch_size;
  if (rows_allowed > 0 && k.dim(0) > rows_allowed) {
    throw Error(ErrorKind::kOutOfRange, where() + ": batch " + std::to_string(k.dim(0)) +
                                            " exceeds the " + std::to_string(rows_allowed) +
                                            " rows allowed (max_batch_size); raise "
                                            "--max-batch-size or split the batch");
  }
  return n;
}

void OffloadedLayer::initialize(const TensorView& k, const TensorView& v, int64_t n) {
  const int fd = open_unlinked(params_.dir, where());
  fd_ = fd;
  batch_ = k.dim(0);
  batch_cap_ = params_.fixed && params_.max_batch_size > 0 ? params_.max_batch_size : batch_;
  heads_ = k.dim(1);
  dk_ = k.dim(3);
  dv_ = v.dim(3);
  dtype_ = params_.kv_dtype.value_or(k.dtype());
  cap_ = params_.fixed ? params_.max_cache_len : std::max({n, int64_t{16}, reserved_});
  seq_ = 0;
}

// ---- slots -------------------------------------------------------------------------------

TierCopier::Ticket OffloadedLayer::queue_read(uint8_t* base) {
  struct Run {
    uint64_t offset;
    size_t bytes;
  };
  std::vector<Run> runs;
  size_t total = 0;
  for_runs(0, seq_, [&](uint64_t off, size_t len) {
    runs.push_back({off, len});
    total += len;
  });
  const uint64_t gen = ++read_gen_;
  const int fd = fd_;
  const bool drop = params_.drop_page_cache;
  std::string label = file_label();
  auto run = [runs = std::move(runs), base, fd, drop, label] {
    fault::point("offload.read");
    if (drop) {
      // "Cold": the written-behind pages are dirty until synced; DONTNEED drops clean pages only.
      ::fdatasync(fd);
      ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    }
    for (const Run& r : runs) read_exact(fd, r.offset, base + r.offset, r.bytes, label);
  };
  auto done = [this, gen](const std::string& error) {
    if (error.empty()) return;
    std::lock_guard<std::mutex> lock(io_mu_);
    failed_read_gen_ = gen;
    read_error_ = error;
  };
  return pool_->copier().submit(Tier::kDisk, Tier::kHost, total, std::move(run), std::move(done));
}

void OffloadedLayer::acquire() {
  OffloadPool& pool = *pool_;
  const size_t need = layout_bytes();
  // A free slot still holding this layer's content; else the free slot used least recently;
  // else the least recently used holder is offloaded.
  int pick = -1;
  bool cached = false;
  for (int i = 0; i < OffloadPool::kSlots; ++i) {
    const auto& s = pool.slots_[static_cast<size_t>(i)];
    if (s.holder == nullptr && i == cached_slot_ && s.last == this &&
        s.buffer.size_bytes() >= need) {
      pick = i;
      cached = true;
    }
  }
  for (int i = 0; pick < 0 && i < OffloadPool::kSlots; ++i) {
    const auto& s = pool.slots_[static_cast<size_t>(i)];
    if (s.holder == nullptr &&
        (pick < 0 || s.last_use < pool.slots_[static_cast<size_t>(pick)].last_use))
      pick = i;
  }
  if (pick < 0) {
    pick = pool.slots_[0].last_use <= pool.slots_[1].last_use ? 0 : 1;
    pool.slots_[static_cast<size_t>(pick)].holder->release_slot();
  }
  OffloadPool::Slot& s = pool.slots_[static_cast<size_t>(pick)];
  if (s.buffer.size_bytes() < need) {
    // Jobs of earlier holders may still read or write the old buffer.
    pool.copier().drain();
    s.buffer = Tensor();
    s.buffer = Tensor::empty(DType::kF32, {static_cast<int64_t>((need + 3) / 4)});
    s.last_job = 0;
  }
  s.holder = this;
  s.last = this;
  s.last_use = ++pool.clock_;
  slot_ = pick;
  cached_slot_ = -1;
  if (cached || seq_ == 0) {
    ready_ = s.last_job;  // the last job on the buffer (a read of ours, a previous holder's write)
    return;
  }
  ready_ = s.last_job = queue_read(static_cast<uint8_t*>(s.buffer.data()));
}

void OffloadedLayer::wait_ready() {
  pool_->copier().wait(ready_);  // jobs with callbacks never throw here
  // Every earlier write of this layer ran before this read (FIFO): a failed one left the file,
  // and so what was read, short of tokens.
  try {
    throw_if_broken();
  } catch (const Error&) {
    release_slot();
    cached_slot_ = -1;
    throw;
  }
  std::string error;
  {
    std::lock_guard<std::mutex> lock(io_mu_);
    if (failed_read_gen_ != 0 && failed_read_gen_ == read_gen_) {
      error = read_error_;
      failed_read_gen_ = 0;
    }
  }
  if (!error.empty()) {
    release_slot();
    cached_slot_ = -1;  // the slot holds garbage: read again next time
    throw Error(ErrorKind::kIo, where() + ": reading its K/V back from the offload file failed: " +
                                    error + "; the cache is unchanged, the step can be retried");
  }
}

void OffloadedLayer::make_resident() {
  if (slot_ < 0) acquire();
  wait_ready();
  ready_ = 0;
}

void OffloadedLayer::release_slot() {
  if (slot_ < 0) return;
  pool_->slots_[static_cast<size_t>(slot_)].holder = nullptr;
  cached_slot_ = slot_;
  slot_ = -1;
}

void OffloadedLayer::offload() {
  release_slot();
}

void OffloadedLayer::prefetch() {
  if (fd_ < 0 || slot_ >= 0) return;
  throw_if_broken();
  acquire();
}

void OffloadedLayer::queue_write_behind(int64_t t0, int64_t t1) {
  struct Run {
    uint64_t offset;
    size_t bytes;
  };
  std::vector<Run> runs;
  size_t total = 0;
  for_runs(t0, t1, [&](uint64_t off, size_t len) {
    runs.push_back({off, len});
    total += len;
  });
  OffloadPool::Slot& s = pool_->slots_[static_cast<size_t>(slot_)];
  const auto* base = static_cast<const uint8_t*>(s.buffer.data());
  const int fd = fd_;
  std::string label = file_label();
  auto run = [runs = std::move(runs), base, fd, label] {
    for (const Run& r : runs) write_exact(fd, r.offset, base + r.offset, r.bytes, label);
  };
  auto done = [this](const std::string& error) {
    if (error.empty()) return;
    std::lock_guard<std::mutex> lock(io_mu_);
    if (write_error_.empty()) write_error_ = error;
  };
  s.last_job =
      pool_->copier().submit(Tier::kHost, Tier::kDisk, total, std::move(run), std::move(done));
}

// ---- update --------------------------------------------------------------------------------

KVSpan OffloadedLayer::update(const TensorView& k, const TensorView& v) {
  const int64_t n = check_update(k, v);  // every refusal before the first change
  throw_if_broken();
  if (fd_ < 0) {
    initialize(k, v, n);
  } else if (seq_ == 0 && k.dim(0) != batch_) {
    // Empty: adopt the new batch (the layout's row capacity grows for a dynamic layer).
    pool_->copier().drain();
    release_slot();
    cached_slot_ = -1;
    batch_ = k.dim(0);
    batch_cap_ = std::max(batch_cap_, batch_);
  }
  if (seq_ + n > cap_) grow(std::max(2 * cap_, seq_ + n));  // dynamic only (static refused)
  make_resident();
  OffloadPool::Slot& s = pool_->slots_[static_cast<size_t>(slot_)];
  auto* base = static_cast<uint8_t*>(s.buffer.data());
  const int64_t cap = cap_;
  auto view = [&](uint64_t offset, int64_t dim, int64_t t0, int64_t t1) {
    return TensorView(base + offset, dtype_, {batch_, heads_, t1 - t0, dim},
                      Dims{heads_ * cap * dim, cap * dim, dim, 1});
  };
  copy_view(k, view(k_offset(0, 0, seq_), dk_, seq_, seq_ + n));
  if (!params_.shared_kv) copy_view(v, view(v_offset(0, 0, seq_), dv_, seq_, seq_ + n));
  queue_write_behind(seq_, seq_ + n);
  seq_ += n;
  KVSpan span;
  span.k = view(k_offset(0, 0, 0), dk_, 0, seq_);
  span.v = params_.shared_kv ? span.k : view(v_offset(0, 0, 0), dv_, 0, seq_);
  span.kv_offset = 0;
  return span;
}

// ---- rare ops: through the file -----------------------------------------------------------

// Moves the live K/V between the file and contiguous [B, H_kv, S, D] tensors, one run per
// (row, head): read (file -> tensors) or write (tensors -> file), on the calling thread.
void OffloadedLayer::transfer(bool write, const Tensor& k, const Tensor& v) {
  const std::string label = file_label();
  const size_t krun = static_cast<size_t>(seq_ * dk_) * elt();
  const size_t vrun = static_cast<size_t>(seq_ * dv_) * elt();
  auto move = [&](uint64_t offset, const Tensor& t, size_t i, size_t run) {
    auto* p = static_cast<uint8_t*>(t.data()) + i * run;
    if (write)
      write_exact(fd_, offset, p, run, label);
    else
      read_exact(fd_, offset, p, run, label);
  };
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t h = 0; h < heads_; ++h) {
      const auto i = static_cast<size_t>(b * heads_ + h);
      move(k_offset(b, h, 0), k, i, krun);
      if (!params_.shared_kv) move(v_offset(b, h, 0), v, i, vrun);
    }
}

void OffloadedLayer::materialize(Tensor* k, Tensor* v) {
  pool_->copier().drain();  // the written-behind tokens are in the file
  throw_if_broken();
  *k = Tensor::empty(dtype_, {batch_, heads_, seq_, dk_});
  if (!params_.shared_kv) *v = Tensor::empty(dtype_, {batch_, heads_, seq_, dv_});
  transfer(/*write=*/false, *k, *v);
}

void OffloadedLayer::rewrite(const Tensor& k, const Tensor& v) {
  transfer(/*write=*/true, k, v);
}

void OffloadedLayer::grow(int64_t capacity) {
  KV_CHECK(!params_.fixed, "a static offloaded layer never grows (update refuses first)");
  Tensor k, v;
  if (seq_ > 0) materialize(&k, &v);
  pool_->copier().drain();
  release_slot();
  cached_slot_ = -1;  // the layout changes
  cap_ = capacity;
  if (seq_ > 0) rewrite(k, v);
}

void OffloadedLayer::gather_rows(std::span<const int64_t> rows, const char* op) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= batch_) {
      throw Error(ErrorKind::kInvalidArgument,
                  where() + ": " + op + ": index " + std::to_string(rows[i]) + " at position " +
                      std::to_string(i) + " is outside the batch [0, " + std::to_string(batch_) +
                      ")");
    }
  }
  const auto new_batch = static_cast<int64_t>(rows.size());
  if (params_.fixed && new_batch > batch_cap_) {
    throw Error(ErrorKind::kOutOfRange,
                where() + ": " + op + " needs " + std::to_string(new_batch) + " rows but " +
                    std::to_string(batch_cap_) + " are preallocated; raise --max-batch-size");
  }
  Tensor k, v;
  if (seq_ > 0) materialize(&k, &v);
  pool_->copier().drain();
  release_slot();
  cached_slot_ = -1;
  batch_ = new_batch;
  batch_cap_ = std::max(batch_cap_, new_batch);
  if (seq_ == 0) return;
  Tensor nk = Tensor::empty(dtype_, {new_batch, heads_, seq_, dk_});
  Tensor nv = params_.shared_kv ? Tensor() : Tensor::empty(dtype_, {new_batch, heads_, seq_, dv_});
  for (int64_t i = 0; i < new_batch; ++i) {
    const int64_t r = rows[static_cast<size_t>(i)];
    copy_view(k.view().slice(0, r, r + 1), nk.view().slice(0, i, i + 1));
    if (!params_.shared_kv) copy_view(v.view().slice(0, r, r + 1), nv.view().slice(0, i, i + 1));
  }
  rewrite(nk, nv);
}

void OffloadedLayer::reorder(std::span<const int64_t> beam_idx) {
  if (fd_ < 0) return;
  if (static_cast<int64_t>(beam_idx.size()) != batch_) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": reorder: beam_idx has " + std::to_string(beam_idx.size()) +
                    " entries but the batch has " + std::to_string(batch_) + " rows");
  }
  gather_rows(beam_idx, "reorder");
}

void OffloadedLayer::repeat_interleave(int64_t r) {
  if (r < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": repeat_interleave: repeats must be >= 1, got " + std::to_string(r));
  }
  if (fd_ < 0 || r == 1) return;
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < batch_; ++b)
    for (int64_t i = 0; i < r; ++i) rows.push_back(b);
  gather_rows(rows, "repeat_interleave");
}

void OffloadedLayer::select(std::span<const int64_t> indices) {
  if (fd_ < 0) return;
  if (indices.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": select: no rows listed; a cache needs at least one row (use reset())");
  }
  gather_rows(indices, "select");
}

void OffloadedLayer::crop(int64_t n) {
  const int64_t keep = crop_target_length(n, seq_);
  // A pending write-behind may still read the slot bytes the next update overwrites.
  if (keep < seq_) pool_->copier().drain();
  seq_ = keep;
}

void OffloadedLayer::reset() {
  pool_->copier().drain();
  seq_ = 0;
  std::lock_guard<std::mutex> lock(io_mu_);
  write_error_.clear();  // what the file missed no longer matters
  failed_read_gen_ = 0;
}

void OffloadedLayer::reserve(int64_t tokens) {
  if (tokens < 0)
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": reserve(" + std::to_string(tokens) + "): tokens must be >= 0");
  if (params_.fixed) return;
  reserved_ = std::max(reserved_, tokens);
  if (fd_ >= 0 && cap_ < tokens) grow(tokens);
}

size_t OffloadedLayer::bytes() const {
  size_t n = 0;
  for (const auto& s : pool_->slots_)
    if (s.holder == this || (s.holder == nullptr && pool_->billed_ == this))
      n += s.buffer.size_bytes();
  return n;
}

size_t OffloadedLayer::offloaded_bytes() const {
  if (fd_ < 0) return 0;
  return static_cast<size_t>(batch_ * heads_ * seq_) * token_dims() * elt();
}

void OffloadedLayer::save(StateWriter& out) const {
  out.i64(fd_ >= 0 ? 1 : 0);
  if (fd_ < 0) return;
  out.i64(batch_);
  out.i64(heads_);
  out.i64(dk_);
  out.i64(dv_);
  out.u32(static_cast<uint32_t>(dtype_));
  out.i64(seq_);
  if (seq_ == 0) return;
  Tensor k, v;
  // The written-behind tokens must be in the file: materialize drains the copier (a const
  // method's side effect on the copier only; the layer's content is unchanged).
  const_cast<OffloadedLayer*>(this)->materialize(&k, &v);
  out.view(k.view());
  if (!params_.shared_kv) out.view(v.view());
}

void OffloadedLayer::load(StateReader& in) {
  auto bad = [&](const std::string& what) {
    throw Error(ErrorKind::kFormat, where() + ": saved state does not fit: " + what);
  };
  if (seq_ != 0) bad("load() needs an empty layer (fresh or reset); this one holds tokens");
  if (in.i64() == 0) return;
  const int64_t batch = in.i64(), heads = in.i64(), dk = in.i64(), dv = in.i64();
  const uint32_t dt = in.u32();
  const int64_t seq = in.i64();
  if (batch < 1 || heads < 1 || dk < 1 || dv < 1 || seq < 0 || dt > 2)
    bad("shape [" + std::to_string(batch) + ", " + std::to_string(heads) + ", " +
        std::to_string(seq) + ", " + std::to_string(dk) + "/" + std::to_string(dv) + "] or dtype " +
        std::to_string(dt) + " is invalid (damaged file?)");
  const auto dtype = static_cast<DType>(dt);
  if (params_.kv_dtype && *params_.kv_dtype != dtype)
    bad(std::string("saved dtype ") + dtype_name(dtype) + ", this cache stores " +
        dtype_name(*params_.kv_dtype));
  if (params_.shared_kv && dk != dv) bad("K == V needs equal head dims");
  if (fd_ >= 0 && (heads != heads_ || dk != dk_ || dv != dv_ || dtype != dtype_))
    bad("saved " + std::to_string(heads) + " heads x " + std::to_string(dk) + "/" +
        std::to_string(dv) + " " + dtype_name(dtype) + ", this layer has " +
        std::to_string(heads_) + " x " + std::to_string(dk_) + "/" + std::to_string(dv_) + " " +
        dtype_name(dtype_));
  if (params_.fixed && seq > params_.max_cache_len)
    bad(std::to_string(seq) + " tokens saved, max_cache_len is " +
        std::to_string(params_.max_cache_len));
  const int64_t rows = fd_ >= 0 && params_.fixed ? batch_cap_ : params_.max_batch_size;
  if (rows > 0 && batch > rows)
    bad(std::to_string(batch) + " rows saved, " + std::to_string(rows) + " allowed");
  Tensor k = Tensor::empty(dtype, {batch, heads, seq, dk});
  Tensor v = params_.shared_kv ? Tensor() : Tensor::empty(dtype, {batch, heads, seq, dv});
  if (seq > 0) {
    in.view(k.view());
    if (!params_.shared_kv) in.view(v.view());
  }
  // Everything read and checked: now the layer changes.
  if (fd_ < 0) {
    initialize(k.view(), params_.shared_kv ? k.view() : v.view(), seq);
  } else {
    pool_->copier().drain();
    release_slot();
    cached_slot_ = -1;
    batch_ = batch;
    batch_cap_ = std::max(batch_cap_, batch);
    if (!params_.fixed) cap_ = std::max(cap_, seq);
  }
  seq_ = seq;
  if (seq > 0) rewrite(k, v);
}

void OffloadedLayer::close_file_for_testing() {
  pool_->copier().drain();
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);  // reads end at once: "file truncated"
}

// ---- registry ------------------------------------------------------------------------------

namespace {

// Whether a KV-shared layer reads `layer_index` (Gemma-3n: the last non-shared layer of each
// type): its span must stay valid after its update, so such a layer is never offloaded.
bool read_by_shared_layers(const CacheConfig& config, int layer_index) {
  const auto n = static_cast<int>(config.layer_types.size());
  if (config.num_kv_shared_layers <= 0 || config.num_kv_shared_layers >= n) return false;
  const int first_shared = n - config.num_kv_shared_layers;
  for (int i = first_shared; i < n; ++i) {
    for (int j = first_shared - 1; j >= 0; --j) {
      if (config.layer_types[static_cast<size_t>(j)] ==
          config.layer_types[static_cast<size_t>(i)]) {
        if (j == layer_index) return true;
        break;
      }
    }
  }
  return false;
}

// A layer that stays resident: the dynamic or static container of its type, as registered.
std::unique_ptr<CacheLayer> resident(const CacheConfig& config, int layer_index, bool fixed,
                                     const char* type) {
  return LayerRegistry::create(fixed ? "static" : "dynamic", type, config, layer_index);
}

template <bool kFixed>
std::unique_ptr<CacheLayer> make_offloaded_full(const CacheConfig& config, int layer_index) {
  if (read_by_shared_layers(config, layer_index))
    return resident(config, layer_index, kFixed, "full_attention");
  OffloadedLayerParams p;
  p.name = kFixed ? "offloaded_static/full_attention" : "offloaded/full_attention";
  p.layer_index = layer_index;
  p.kv_dtype = config.options.kv_dtype;
  p.max_batch_size = config.options.max_batch_size;
  p.fixed = kFixed;
  p.max_cache_len = config.options.max_cache_len;
  p.shared_kv = config.kv_content == CacheConfig::KVContent::kSharedKV;
  p.dir = config.options.offload.dir;
  p.drop_page_cache = config.options.offload.drop_page_cache;
  return std::make_unique<OffloadedLayer>(std::move(p), OffloadPool::of(config));
}

constexpr char kSliding[] = "sliding_attention";
constexpr char kChunked[] = "chunked_attention";
constexpr char kLinear[] = "linear_attention";

// Sliding and chunked layers hold a bounded window: transformers' only_non_sliding keeps them
// resident, and so do we.
template <bool kFixed, const char* kType>
std::unique_ptr<CacheLayer> make_resident_window(const CacheConfig& config, int layer_index) {
  if (!config.options.offload.only_non_sliding) {
    throw Error(ErrorKind::kUnsupported,
                "layer " + std::to_string(layer_index) + " (" + kType +
                    "): offloading sliding and chunked layers (OffloadOptions::only_non_sliding "
                    "= false) is not implemented; their windows are bounded, keep them resident "
                    "(only_non_sliding = true, the default)");
  }
  return resident(config, layer_index, kFixed, kType);
}

// Linear-attention state is a fixed size per sequence: it stays resident.
template <bool kFixed>
std::unique_ptr<CacheLayer> make_resident_state(const CacheConfig& config, int layer_index) {
  return resident(config, layer_index, kFixed, kLinear);
}

}  // namespace

KVCACHE_REGISTER_LAYER(offloaded_full, "offloaded", "full_attention", make_offloaded_full<false>);
KVCACHE_REGISTER_LAYER(offloaded_static_full, "offloaded_static", "full_attention",
                       make_offloaded_full<true>);
KVCACHE_REGISTER_LAYER(offloaded_sliding, "offloaded", kSliding,
                       (make_resident_window<false, kSliding>));
KVCACHE_REGISTER_LAYER(offloaded_static_sliding, "offloaded_static", kSliding,
                       (make_resident_window<true, kSliding>));
KVCACHE_REGISTER_LAYER(offloaded_chunked, "offloaded", kChunked,
                       (make_resident_window<false, kChunked>));
KVCACHE_REGISTER_LAYER(offloaded_static_chunked, "offloaded_static", kChunked,
                       (make_resident_window<true, kChunked>));
KVCACHE_REGISTER_LAYER(offloaded_linear, "offloaded", kLinear, make_resident_state<false>);
KVCACHE_REGISTER_LAYER(offloaded_static_linear, "offloaded_static", kLinear,
                       make_resident_state<true>);

}  // namespace kvcache
