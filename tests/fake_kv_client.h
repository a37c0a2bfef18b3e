// An in-memory KvClient (core/kv_client.h) for tests of the remote tier: clients made by one
// FakeKvStore share its map, and the store can fail every call, delay them past a deadline, or
// have its values edited by hand.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/kv_client.h"

namespace kvcache::testing_util {

struct FakeKvStore {
  std::mutex mu;
  std::map<std::string, std::vector<std::byte>> map;
  std::atomic<bool> fail{false};          // every key kError, no SET acknowledged
  std::atomic<int> delay_ms{0};           // each call takes this long (capped at its deadline)
  std::atomic<int64_t> gets{0}, sets{0};  // keys asked for / written

  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return map.size();
  }
  std::vector<std::string> keys() {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::string> out;
    for (const auto& kv : map) out.push_back(kv.first);
    return out;
  }
};

class FakeKvClient : public KvClient {
 public:
  explicit FakeKvClient(std::shared_ptr<FakeKvStore> store) : store_(std::move(store)) {}

  void get(std::span<const std::string> keys, SteadyTime deadline,
           const ValueFn& on_value) override {
    const bool late = wait(deadline);
    std::vector<std::vector<std::byte>> values(keys.size());
    std::vector<KvStatus> status(keys.size(), KvStatus::kError);
    if (!late && !store_->fail) {
      std::lock_guard<std::mutex> lock(store_->mu);
      for (size_t i = 0; i < keys.size(); ++i) {
        const auto it = store_->map.find(keys[i]);
        status[i] = it == store_->map.end() ? KvStatus::kMiss : KvStatus::kHit;
        if (it != store_->map.end()) values[i] = it->second;
      }
    }
    store_->gets += static_cast<int64_t>(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (status[i] == KvStatus::kError) ++stats_.errors;
      if (status[i] == KvStatus::kHit) stats_.bytes_in += values[i].size();
      on_value(i, status[i], values[i]);
    }
    if (late) ++stats_.timeouts;
  }

  size_t set(std::span<const std::string> keys, std::span<const std::span<const std::byte>> values,
             SteadyTime deadline, int64_t) override {
    const bool late = wait(deadline);
    if (late || store_->fail) return 0;
    std::lock_guard<std::mutex> lock(store_->mu);
    for (size_t i = 0; i < keys.size(); ++i) {
      store_->map[keys[i]].assign(values[i].begin(), values[i].end());
      stats_.bytes_out += values[i].size();
    }
    store_->sets += static_cast<int64_t>(keys.size());
    return keys.size();
  }

  KvClientStats stats() const override { return stats_; }
  std::string describe() const override { return "fake"; }

 private:
  // Sleeps the store's delay, at most until the deadline; true when the delay passed it.
  bool wait(SteadyTime deadline) {
    const auto want =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(store_->delay_ms);
    std::this_thread::sleep_until(std::min(want, deadline));
    return want > deadline;
  }
  std::shared_ptr<FakeKvStore> store_;
  KvClientStats stats_;
};

inline std::function<std::unique_ptr<KvClient>()> fake_client_factory(
    std::shared_ptr<FakeKvStore> store) {
  return [store] { return std::make_unique<FakeKvClient>(store); };
}

}  // namespace kvcache::testing_util
