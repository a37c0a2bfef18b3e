#include "core/fault.h"

#include <map>
#include <mutex>

#include "core/error.h"

namespace kvcache::fault {

namespace {

struct Armed {
  std::function<void()> action;
  int skip = 0;
  int times = 1;
  int fired = 0;
};

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}

std::map<std::string, Armed, std::less<>>& registry() {
  static std::map<std::string, Armed, std::less<>> points;
  return points;
}

}  // namespace

namespace detail {

std::atomic<int> g_armed{0};

void hit(std::string_view name) {
  std::function<void()> action;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    const auto it = registry().find(name);
    if (it == registry().end()) return;
    Armed& a = it->second;
    if (a.skip > 0) {
      --a.skip;
      return;
    }
    if (a.times == 0) return;
    if (a.times > 0) --a.times;
    ++a.fired;
    action = a.action;
  }
  action();  // outside the lock: it throws
}

}  // namespace detail

Scoped::Scoped(std::string name, std::function<void()> action, int skip, int times)
    : name_(std::move(name)) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  KV_CHECK(registry().count(name_) == 0, "fault point '" + name_ + "' armed twice");
  registry()[name_] = Armed{std::move(action), skip, times, 0};
  detail::g_armed.fetch_add(1);
}

Scoped::~Scoped() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase(name_);
  detail::g_armed.fetch_sub(1);
}

int Scoped::fired() const {
  std::lock_guard<std::mutex> lock(registry_mutex());
  const auto it = registry().find(name_);
  return it == registry().end() ? 0 : it->second.fired;
}

}  // namespace kvcache::fault
