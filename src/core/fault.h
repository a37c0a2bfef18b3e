// Fault injection: named points in library code where a test makes an operation fail the way
// it can fail in production (an allocation, a kernel refusing its input, a tokenizer error), to
// check that the failure stays contained — the request fails, the engine goes on, no block
// leaks. FoundationDB's BUGGIFY and LevelDB's fault-injection Env serve the same purpose.
// Disarmed (always, outside tests), a point costs one relaxed atomic load.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <string_view>

namespace kvcache::fault {

namespace detail {
extern std::atomic<int> g_armed;  // points armed anywhere
void hit(std::string_view name);
}  // namespace detail

// Runs the armed action of `name` (which throws) when that point is armed and its skip count
// is spent; otherwise nothing.
inline void point(std::string_view name) {
  if (detail::g_armed.load(std::memory_order_relaxed) != 0) detail::hit(name);
}

// Arms the point `name` for the object's lifetime: the first `skip` hits pass, the next `times`
// hits (-1: all of them) call `action`, which is expected to throw. At most one Scoped per name.
class Scoped {
 public:
  Scoped(std::string name, std::function<void()> action, int skip = 0, int times = 1);
  ~Scoped();
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;
  int fired() const;  // hits that ran the action so far

 private:
  std::string name_;
};

}  // namespace kvcache::fault
