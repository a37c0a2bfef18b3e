#include "cache/paged_linear_state.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace kvcache {

LinearStateSlots::LinearStateSlots(const LinearSlotLayout& layout, int32_t slots)
    : layout_(layout) {
  KV_CHECK(slots >= 0 && layout.slot_elems() > 0, "linear state slots: bad layout or count");
  if (slots > 0) data_ = Tensor::zeros(DType::kF32, {slots, layout_.slot_elems()});
  used_.assign(static_cast<size_t>(slots), 0);
  for (int32_t s = slots - 1; s >= 0; --s) free_.push_back(s);
}

int32_t LinearStateSlots::acquire() {
  if (free_.empty()) return -1;
  const int32_t s = free_.back();
  free_.pop_back();
  used_[static_cast<size_t>(s)] = 1;
  zero(s);
  return s;
}

void LinearStateSlots::release(int32_t slot) {
  KV_CHECK(in_use(slot), "releasing a linear state slot that is not in use");
  used_[static_cast<size_t>(slot)] = 0;
  // Keep the stack sorted (lowest on top) so that sequences admitted together get consecutive
  // slots, which the batch views read without a gather.
  free_.insert(std::upper_bound(free_.begin(), free_.end(), slot, std::greater<int32_t>()), slot);
}

bool LinearStateSlots::in_use(int32_t slot) const {
  return slot >= 0 && slot < num_slots() && used_[static_cast<size_t>(slot)];
}

float* LinearStateSlots::slot_data(int32_t slot) {
  KV_CHECK(slot >= 0 && slot < num_slots(), "linear state slot out of range");
  return static_cast<float*>(data_.data()) + static_cast<int64_t>(slot) * layout_.slot_elems();
}

const float* LinearStateSlots::slot_data(int32_t slot) const {
  return const_cast<LinearStateSlots*>(this)->slot_data(slot);
}

void LinearStateSlots::zero(int32_t slot) {
  std::memset(slot_data(slot), 0, layout_.slot_bytes());
}

void LinearStateSlots::copy(int32_t src, int32_t dst) {
  if (src != dst) std::memcpy(slot_data(dst), slot_data(src), layout_.slot_bytes());
}

size_t LinearStateSlots::bytes() const {
  return predict_bytes(layout_, num_slots());
}

size_t LinearStateSlots::predict_bytes(const LinearSlotLayout& layout, int32_t slots) {
  const auto n = static_cast<size_t>(slots);
  return n * layout.slot_bytes() + n * sizeof(int32_t) + n * sizeof(uint8_t);
}

LinearSnapshotStore::LinearSnapshotStore(int64_t snapshot_elems, int32_t capacity)
    : elems_(snapshot_elems) {
  KV_CHECK(snapshot_elems > 0 && capacity >= 0, "snapshot store: bad size or capacity");
  if (capacity > 0) data_ = Tensor::zeros(DType::kF32, {capacity, snapshot_elems});
  entries_.assign(static_cast<size_t>(capacity), Entry{});
}

int32_t LinearSnapshotStore::find_index(const BlockKey& key) const {
  for (size_t i = 0; i < entries_.size(); ++i)
    if (entries_[i].live && entries_[i].key == key) return static_cast<int32_t>(i);
  return -1;
}

bool LinearSnapshotStore::put(const BlockKey& key, int64_t position, const float* data) {
  if (entries_.empty()) return false;
  int32_t i = find_index(key);
  if (i < 0) {
    for (size_t j = 0; j < entries_.size() && i < 0; ++j)
      if (!entries_[j].live) i = static_cast<int32_t>(j);
    if (i < 0) {  // full: replace the least recently used
      i = 0;
      for (size_t j = 1; j < entries_.size(); ++j)
        if (entries_[j].last_use < entries_[static_cast<size_t>(i)].last_use)
          i = static_cast<int32_t>(j);
      ++stats_.evictions;
    } else {
      ++size_;
    }
  }
  Entry& e = entries_[static_cast<size_t>(i)];
  e.live = true;
  e.key = key;
  e.position = position;
  e.last_use = ++clock_;
  std::memcpy(static_cast<float*>(data_.data()) + static_cast<int64_t>(i) * elems_, data,
              static_cast<size_t>(elems_) * sizeof(float));
  ++stats_.puts;
  return true;
}

const float* LinearSnapshotStore::get(const BlockKey& key) {
  const int32_t i = find_index(key);
  if (i < 0) return nullptr;
  entries_[static_cast<size_t>(i)].last_use = ++clock_;
  ++stats_.hits;
  return static_cast<const float*>(data_.data()) + static_cast<int64_t>(i) * elems_;
}

int64_t LinearSnapshotStore::position(const BlockKey& key) const {
  const int32_t i = find_index(key);
  return i < 0 ? -1 : entries_[static_cast<size_t>(i)].position;
}

int64_t LinearSnapshotStore::latest_at_or_before(std::span<const BlockKey> keys) const {
  if (size_ == 0) return 0;
  for (auto n = static_cast<int64_t>(keys.size()); n > 0; --n)
    if (find_index(keys[static_cast<size_t>(n - 1)]) >= 0) return n;
  return 0;
}

bool LinearSnapshotStore::erase(const BlockKey& key) {
  const int32_t i = find_index(key);
  if (i < 0) return false;
  entries_[static_cast<size_t>(i)] = Entry{};
  --size_;
  return true;
}

bool LinearSnapshotStore::drop_with_block(const BlockKey& key) {
  if (!erase(key)) return false;
  ++stats_.dropped_with_block;
  return true;
}

void LinearSnapshotStore::clear() {
  for (Entry& e : entries_) e = Entry{};
  size_ = 0;
}

size_t LinearSnapshotStore::bytes() const {
  return predict_bytes(elems_, capacity());
}

size_t LinearSnapshotStore::predict_bytes(int64_t snapshot_elems, int32_t capacity) {
  const auto n = static_cast<size_t>(capacity);
  return n * static_cast<size_t>(snapshot_elems) * sizeof(float) + n * sizeof(Entry);
}

}  // namespace kvcache
