// A fixed pool of worker threads for data-parallel loops (kernels, matmuls).
// parallel_for() blocks until every task ran; the calling thread works too, so a pool of
// n threads keeps n-1 workers. No allocation per call: the task is borrowed, not copied.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kvcache {

class ThreadPool {
 public:
  // n_threads >= 1 counts the caller; 0 picks std::thread::hardware_concurrency().
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task) for task in [0, n_tasks), tasks handed out dynamically. Not reentrant:
  // do not call parallel_for from inside fn.
  template <typename Fn>
  void parallel_for(int64_t n_tasks, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    run(n_tasks, [](void* ctx, int64_t t) { (*static_cast<F*>(ctx))(t); },
        const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using TaskFn = void (*)(void*, int64_t);
  void run(int64_t n_tasks, TaskFn fn, void* ctx);
  void worker_loop();
  void drain();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  uint64_t generation_ = 0;  // bumped per parallel_for
  bool stop_ = false;
  TaskFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_tasks_ = 0;
  std::atomic<int64_t> next_{0};
  int busy_ = 0;  // workers still inside the current generation
};

// The process-wide pool. Its size comes from set_default_threads() (the CLI's -t) or the
// KVCACHE_THREADS environment variable, else the machine's core count.
ThreadPool& default_pool();
void set_default_threads(int n_threads);

}  // namespace kvcache
