// A fixed pool of worker threads for data-parallel loops (kernels, matmuls).
// parallel_for() returns once every task has *completed* — it counts finished tasks and never
// waits for a worker to wake up, so a descheduled worker costs nothing. The calling thread
// works too, so a pool of n threads keeps n-1 workers. No allocation per call: the task is
// borrowed, not copied. Idle workers spin briefly (decode issues ~100 short loops per token
// with microseconds of serial work between them) and then sleep on a futex. On Linux each
// worker starts on a CPU other than its creator's and is then given its creator's whole CPU set
// back (a start position, not pinning: a new thread otherwise began on the creator's CPU and
// could stay there for the first hundreds of milliseconds, halving the first loops' speed).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kvcache {

struct ThreadPoolOptions {
  int n_threads = 0;          // >= 1 counts the caller; 0: std::thread::hardware_concurrency()
  int64_t spin_ns = 100'000;  // how long an idle worker polls for the next loop before sleeping
  // Test seam: called by a worker each time it wakes for a new loop, before it takes tasks
  // (tests block it to prove parallel_for does not wait for workers). nullptr in production.
  void (*on_worker_wake)(void* ctx) = nullptr;
  void* on_worker_wake_ctx = nullptr;
};

// Where the pool's threads spent a stretch of time (ThreadPool::set_timing): `loops` parallel
// loops ran on the workers, the caller spent in_loops_ns inside them (from publishing a loop to
// its last task finishing) and all threads together spent task_ns running tasks. Over a wall
// time W on n threads, the threads idled (n - 1) (W - in_loops_ns) while the caller worked
// alone between loops, and n in_loops_ns - task_ns waiting at the loops' ends (imbalance,
// wake-ups, hand-offs). Loops run inline (one task, nested, or no workers) count as the
// caller's serial work.
struct ThreadPoolTimes {
  int64_t loops = 0;
  int64_t in_loops_ns = 0;
  int64_t task_ns = 0;
};

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads = 0);
  explicit ThreadPool(const ThreadPoolOptions& options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return static_cast<int>(workers_.size()) + 1; }
  // Starts (true: from zero) or stops accumulating times(). Off by default: two clock reads per
  // loop and per worker wake-up when on.
  void set_timing(bool on);
  ThreadPoolTimes times() const;

  // Runs fn(task) for task in [0, n_tasks), tasks handed out dynamically; everything fn wrote
  // is visible to the caller on return. A parallel_for issued from inside fn (or while another
  // thread's loop is running) runs serially / waits its turn instead of deadlocking.
  template <typename Fn>
  void parallel_for(int64_t n_tasks, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(
        n_tasks, [](void* ctx, int64_t t) { (*static_cast<F*>(ctx))(t); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void*, int64_t);
  // One loop's description. Two slots, alternating by generation parity: while loop g runs,
  // the caller can only be writing slot (g+1)&1 after g has completed, so a worker late from
  // g-1 may read a half-written slot but can never claim a task from it (its claim names g-1).
  struct Job {
    std::atomic<TaskFn> fn{nullptr};
    std::atomic<void*> ctx{nullptr};
    std::atomic<int64_t> n_tasks{0};
  };

  void run(int64_t n_tasks, TaskFn fn, void* ctx);
  void worker_loop();
  void stop_workers();  // wakes every worker to exit and joins it (destructor, failed start)
  // Claims and runs tasks of generation gen until none are left; returns how many it ran.
  int64_t drain(uint32_t gen);

  ThreadPoolOptions options_;
  std::vector<std::thread> workers_;
  Job jobs_[2];
  // The task counter: generation << 32 | index of the next unclaimed task. A claim is a CAS
  // that also checks the generation, so no thread can take a task from a loop it did not see
  // published (acquire on the claim pairs with the caller's release when publishing).
  std::atomic<uint64_t> next_{0};
  std::atomic<int64_t> completed_{0};  // tasks of the current loop finished (release per add)
  std::atomic<uint32_t> epoch_{0};     // the current generation, for workers to wait on
  std::atomic<int> sleepers_{0};       // workers blocked in epoch_.wait
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> timing_{false};
  std::atomic<int64_t> t_loops_{0}, t_in_loops_ns_{0}, t_task_ns_{0};
  uint32_t generation_ = 0;  // caller side only (under run_mu_)
  std::mutex run_mu_;        // one loop at a time when several threads share the pool
};

// The process-wide pool. Its size comes from set_default_threads() (the CLI's -t) or the
// KVCACHE_THREADS environment variable, else the machine's core count.
ThreadPool& default_pool();
void set_default_threads(int n_threads);

}  // namespace kvcache
