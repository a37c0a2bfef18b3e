#include "core/thread_pool.h"

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <system_error>

#include "core/error.h"

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVCACHE_CPU_RELAX() _mm_pause()
#else
#define KVCACHE_CPU_RELAX() std::this_thread::yield()
#endif

namespace kvcache {

namespace {

// True on pool workers and on a caller while it runs tasks: a parallel_for issued from inside
// a task runs serially instead of publishing a second loop (which would deadlock).
thread_local bool tl_in_pool_task = false;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

constexpr uint64_t kIndexMask = 0xffffffffull;

// Polls pred with a pause per iteration until it holds or spin_ns elapsed (the clock is read
// every 64 polls, so its reads stay a small share of the spin). Returns pred's last value.
template <typename Pred>
bool spin_until(Pred pred, int64_t spin_ns) {
  if (pred()) return true;
  if (spin_ns <= 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin_ns);
  for (;;) {
    for (int i = 0; i < 64; ++i) {
      KVCACHE_CPU_RELAX();
      if (pred()) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return pred();
  }
}

// Where each new worker should start: the CPUs this thread may run on, the one it is running
// on last, so worker i gets the i-th other CPU (empty: no placement, e.g. not Linux).
// Why: a new thread starts on its creator's CPU, and the scheduler may leave it there, sharing
// that CPU with the caller, for a while after the process starts: the first parallel loops then
// run at one CPU's speed, which short runs and first requests would pay for.
std::vector<int> start_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) != 0) return cpus;
  const int self = sched_getcpu();
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mask) && c != self) cpus.push_back(c);
  if (self >= 0 && self < CPU_SETSIZE && CPU_ISSET(self, &mask)) cpus.push_back(self);
#endif
  return cpus;
}

// Moves the calling thread to `cpu`, then gives it back every CPU it was allowed: a start
// position, not pinning (the scheduler may move it later like any thread). Best effort: a
// failure (e.g. a seccomp policy refusing the call) only leaves the thread where it was.
void start_on(int cpu) {
#if defined(__linux__)
  if (cpu < 0 || cpu >= CPU_SETSIZE) return;
  cpu_set_t all, one;
  CPU_ZERO(&all);
  if (pthread_getaffinity_np(pthread_self(), sizeof(all), &all) != 0) return;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (pthread_setaffinity_np(pthread_self(), sizeof(one), &one) != 0) return;
  pthread_setaffinity_np(pthread_self(), sizeof(all), &all);
#else
  (void)cpu;
#endif
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : ThreadPool(ThreadPoolOptions{.n_threads = n_threads}) {}

ThreadPool::ThreadPool(const ThreadPoolOptions& options) : options_(options) {
  int n = options_.n_threads;
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  const std::vector<int> cpus = start_cpus();
  workers_.reserve(static_cast<size_t>(n - 1));
  for (int i = 1; i < n; ++i) {
    const int cpu = cpus.empty() ? -1 : cpus[static_cast<size_t>(i - 1) % cpus.size()];
    try {
      workers_.emplace_back([this, cpu] {
        start_on(cpu);
        worker_loop();
      });
    } catch (const std::system_error& e) {
      // The system's thread limit: stop the workers already started (a joinable std::thread
      // left behind would terminate the process) and say what to change.
      stop_workers();
      throw Error(ErrorKind::kInvalidArgument,
                  "cannot start thread " + std::to_string(i + 1) + " of " + std::to_string(n) +
                      " (" + e.what() + "); ask for fewer threads (-t, KVCACHE_THREADS)");
    }
  }
}

void ThreadPool::stop_workers() {
  stop_.store(true, std::memory_order_seq_cst);
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  epoch_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

ThreadPool::~ThreadPool() {
  stop_workers();
}

int64_t ThreadPool::drain(uint32_t gen) {
  const Job& job = jobs_[gen & 1];
  // Acquire: if these loads see a later loop's writes (gen + 2), the claim below must see that
  // the generation moved on and fail, so stale values are never used.
  const TaskFn fn = job.fn.load(std::memory_order_acquire);
  void* const ctx = job.ctx.load(std::memory_order_acquire);
  const auto n = static_cast<uint64_t>(job.n_tasks.load(std::memory_order_acquire));
  int64_t ran = 0;
  uint64_t s = next_.load(std::memory_order_acquire);
  while ((s >> 32) == gen && (s & kIndexMask) < n) {
    if (next_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                    std::memory_order_acquire)) {
      fn(ctx, static_cast<int64_t>(s & kIndexMask));
      ++ran;
      s = next_.load(std::memory_order_acquire);
    }
  }
  return ran;
}

void ThreadPool::worker_loop() {
  tl_in_pool_task = true;
  uint32_t seen = 0;
  for (;;) {
    auto changed = [&] { return epoch_.load(std::memory_order_acquire) != seen; };
    if (!spin_until(changed, options_.spin_ns)) {
      // Announce the sleep before the last check: the caller reads sleepers_ after publishing
      // (both seq_cst), so either it sees us and notifies, or we see its new epoch.
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      while (epoch_.load(std::memory_order_seq_cst) == seen)
        epoch_.wait(seen, std::memory_order_seq_cst);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
    }
    // The epoch before the stop flag: stop_workers sets stop_ and then bumps the epoch, so a
    // worker that reads the bumped epoch here also sees stop_. Read after the check, the bump
    // could land in `seen` unseen (woken by loop g, stop_ still false, then the caller ends loop g
    // and stops the pool, then seen = g + 1): the worker went back to sleep on an epoch that
    // nothing would change again, and the pool's destructor waited on it forever (a clean
    // clone's test_runtime hung at exit in stop_workers' join, 12-07).
    seen = epoch_.load(std::memory_order_seq_cst);
    if (stop_.load(std::memory_order_seq_cst)) return;
    if (options_.on_worker_wake != nullptr) options_.on_worker_wake(options_.on_worker_wake_ctx);
    const bool timed = timing_.load(std::memory_order_relaxed);
    const int64_t t0 = timed ? now_ns() : 0;
    const int64_t ran = drain(seen);
    // Before completing: once the last task is counted, the caller may read times().
    if (timed && ran > 0) t_task_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
    if (ran > 0) {
      completed_.fetch_add(ran, std::memory_order_seq_cst);  // releases the tasks' writes
      if (caller_sleeping_.load(std::memory_order_seq_cst)) completed_.notify_all();
    }
  }
}

void ThreadPool::run(int64_t n_tasks, TaskFn fn, void* ctx) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1 || tl_in_pool_task) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(ctx, t);
    return;
  }
  KV_CHECK(n_tasks < (int64_t{1} << 31), "parallel_for: too many tasks for the 32-bit task index");
  std::lock_guard<std::mutex> lock(run_mu_);
  const uint32_t gen = ++generation_;
  // The loop's time starts before it is published: a worker spinning on the epoch may start a
  // task (and its task clock) before this thread is back from the notify below, and a loop's
  // time must cover its tasks' (ThreadPoolTimes: from publishing to the last task finishing).
  const bool timed = timing_.load(std::memory_order_relaxed);
  const int64_t t0 = timed ? now_ns() : 0;
  Job& job = jobs_[gen & 1];
  job.fn.store(fn, std::memory_order_release);
  job.ctx.store(ctx, std::memory_order_release);
  job.n_tasks.store(n_tasks, std::memory_order_release);
  completed_.store(0, std::memory_order_relaxed);
  next_.store(static_cast<uint64_t>(gen) << 32, std::memory_order_release);  // publishes the loop
  epoch_.store(gen, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();

  const int64_t t1 = timed ? now_ns() : 0;  // the caller's own tasks
  tl_in_pool_task = true;
  const int64_t ran = drain(gen);
  tl_in_pool_task = false;
  if (timed) t_task_ns_.fetch_add(now_ns() - t1, std::memory_order_relaxed);
  int64_t done = completed_.fetch_add(ran, std::memory_order_acq_rel) + ran;
  // Wait for tasks other threads claimed (not for threads to wake): spin, then sleep.
  auto finished = [&] { return (done = completed_.load(std::memory_order_acquire)) == n_tasks; };
  if (!spin_until(finished, options_.spin_ns)) {
    caller_sleeping_.store(true, std::memory_order_seq_cst);
    while ((done = completed_.load(std::memory_order_seq_cst)) != n_tasks) {
      completed_.wait(done, std::memory_order_seq_cst);
    }
    caller_sleeping_.store(false, std::memory_order_relaxed);
  }
  if (timed) {
    t_in_loops_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);
    t_loops_.fetch_add(1, std::memory_order_relaxed);
  }
}

void ThreadPool::set_timing(bool on) {
  if (on) {
    t_loops_.store(0, std::memory_order_relaxed);
    t_in_loops_ns_.store(0, std::memory_order_relaxed);
    t_task_ns_.store(0, std::memory_order_relaxed);
  }
  timing_.store(on, std::memory_order_relaxed);
}

ThreadPoolTimes ThreadPool::times() const {
  // The workers' adds are relaxed: read after the loops returned (each return synchronises
  // with every task's completion), they are all in.
  ThreadPoolTimes t;
  t.loops = t_loops_.load(std::memory_order_relaxed);
  t.in_loops_ns = t_in_loops_ns_.load(std::memory_order_relaxed);
  t.task_ns = t_task_ns_.load(std::memory_order_relaxed);
  return t;
}

namespace {
int g_default_threads = 0;
std::unique_ptr<ThreadPool> g_pool;
std::mutex g_pool_mu;
}  // namespace

void set_default_threads(int n_threads) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_default_threads = n_threads;
  g_pool.reset();
}

ThreadPool& default_pool() {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_pool) {
    int n = g_default_threads;
    if (n <= 0) {
      if (const char* env = std::getenv("KVCACHE_THREADS")) n = std::atoi(env);
    }
    g_pool = std::make_unique<ThreadPool>(n);
  }
  return *g_pool;
}

}  // namespace kvcache
