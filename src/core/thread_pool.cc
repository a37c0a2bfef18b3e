#include "core/thread_pool.h"

#include <cstdlib>
#include <memory>

namespace kvcache {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (n_threads <= 0) n_threads = 1;
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::drain() {
  for (;;) {
    const int64_t t = next_.fetch_add(1, std::memory_order_relaxed);
    if (t >= n_tasks_) break;
    fn_(ctx_, t);
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    drain();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--busy_ == 0) cv_done_.notify_one();
    }
  }
}

void ThreadPool::run(int64_t n_tasks, TaskFn fn, void* ctx) {
  if (n_tasks <= 0) return;
  if (workers_.empty() || n_tasks == 1) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(ctx, t);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = fn;
    ctx_ = ctx;
    n_tasks_ = n_tasks;
    next_.store(0, std::memory_order_relaxed);
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  cv_start_.notify_all();
  drain();
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return busy_ == 0; });
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
