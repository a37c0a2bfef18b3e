// ThreadPool: every task runs exactly once, results are visible on return, parallel_for never
// waits for a worker that has not woken up, sleeping workers are woken, nesting runs serially.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace kvcache {
namespace {

TEST(ThreadPoolTest, EveryTaskOnceForOddCountsAndPoolSizes) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.n_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 7, 64, 1001}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);  // plain ints: visibility is the pool's job
      for (int rep = 0; rep < 30; ++rep)
        pool.parallel_for(n, [&](int64_t t) { hits[static_cast<size_t>(t)]++; });
      for (int64_t t = 0; t < n; ++t)
        ASSERT_EQ(hits[static_cast<size_t>(t)], 30)
            << threads << " threads, task " << t << "/" << n;
    }
  }
}

TEST(ThreadPoolTest, WaitsForSlowTasksOnWorkers) {
  ThreadPool pool(3);
  std::vector<int> done(6, 0);
  pool.parallel_for(6, [&](int64_t t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * (t % 3)));
    done[static_cast<size_t>(t)] = 1;
  });
  for (int d : done) EXPECT_EQ(d, 1);
}

// set_timing: the tasks' time is counted on every thread, the loop's time on the caller, and
// nothing while timing is off.
TEST(ThreadPoolTest, TimingCountsTaskAndLoopTime) {
  ThreadPool pool(2);
  const auto busy = [](int64_t) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(3);
    while (std::chrono::steady_clock::now() < end) {
    }
  };
  pool.parallel_for(4, busy);  // timing off: not counted
  ThreadPoolTimes t = pool.times();
  EXPECT_EQ(t.loops, 0);
  EXPECT_EQ(t.task_ns, 0);
  pool.set_timing(true);
  pool.parallel_for(4, busy);
  pool.parallel_for(1, busy);  // one task runs inline: the caller's serial work, not a loop
  pool.set_timing(false);
  pool.parallel_for(4, busy);
  t = pool.times();
  EXPECT_EQ(t.loops, 1);
  EXPECT_GE(t.task_ns, 12'000'000);     // four tasks of 3 ms, on whichever threads ran them
  EXPECT_GE(t.in_loops_ns, 6'000'000);  // at best two tasks per thread, side by side
  // Two threads cannot run more task time than twice the loop's time.
  EXPECT_LE(t.task_ns, 2 * t.in_loops_ns + 1'000'000);
  pool.set_timing(true);  // restarts from zero
  EXPECT_EQ(pool.times().loops, 0);
  EXPECT_EQ(pool.times().task_ns, 0);
}

struct Gate {
  std::atomic<bool> open{false};
  std::atomic<int> blocked{0};
  static void wait(void* ctx) {
    auto* g = static_cast<Gate*>(ctx);
    g->blocked.fetch_add(1);
    while (!g->open.load()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    g->blocked.fetch_sub(1);
  }
};

// The defect this pool fixes: the old one waited for every worker to wake and check in, so one
// descheduled worker stalled every loop. Here all workers are held at wake-up; the caller must
// still finish the loop alone.
TEST(ThreadPoolTest, DoesNotWaitForWorkersThatHaveNotWoken) {
  Gate gate;
  ThreadPoolOptions o;
  o.n_threads = 3;
  o.on_worker_wake = &Gate::wait;
  o.on_worker_wake_ctx = &gate;
  ThreadPool pool(o);
  std::vector<int> hits(100, 0);
  auto loops = std::async(std::launch::async, [&] {
    for (int rep = 0; rep < 5; ++rep)
      pool.parallel_for(100, [&](int64_t t) { hits[static_cast<size_t>(t)]++; });
  });
  const bool finished = loops.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  gate.open.store(true);  // release the workers (and an old pool stuck in its join) either way
  loops.wait();
  EXPECT_TRUE(finished) << "parallel_for blocked on workers that never took a task";
  for (int h : hits) EXPECT_EQ(h, 5);
}

// Workers that went to sleep (idle longer than the spin) are woken by the next loop and take
// tasks: task 0 holds its thread until a second thread has entered a task.
TEST(ThreadPoolTest, SleepingWorkersWakeAndTakeTasks) {
  ThreadPoolOptions o;
  o.n_threads = 3;
  o.spin_ns = 1000;
  ThreadPool pool(o);
  for (int rep = 0; rep < 3; ++rep) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // well past the spin: asleep
    std::atomic<int> entered{0};
    std::atomic<bool> saw_two{false};
    std::mutex mu;
    std::set<std::thread::id> ids;
    pool.parallel_for(3, [&](int64_t) {
      {
        std::lock_guard<std::mutex> lock(mu);
        ids.insert(std::this_thread::get_id());
      }
      entered.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (entered.load() < 2 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::yield();
      if (entered.load() >= 2) saw_two.store(true);
    });
    EXPECT_TRUE(saw_two.load());
    EXPECT_GE(ids.size(), 2u) << "no worker woke up for the loop";
  }
}

// Pools destroyed right after a loop the caller finished alone, while the spinning workers wake
// for it: a worker that read the stop's epoch bump after its stop check went back to sleep on an
// epoch nothing would change, and the destructor's join hung (seen once, at a test process's
// exit). Many short-lived pools; the loops run on an async thread so a hang fails the test
// instead of stalling it.
TEST(ThreadPoolTest, DestroyedRightAfterALoopNeverHangs) {
  auto cycles = std::async(std::launch::async, [] {
    for (int i = 0; i < 4000; ++i) {
      ThreadPoolOptions o;
      o.n_threads = 3;
      ThreadPool pool(o);
      std::atomic<int> sum{0};
      pool.parallel_for(2, [&](int64_t t) { sum.fetch_add(static_cast<int>(t) + 1); });
      EXPECT_EQ(sum.load(), 3);
    }
  });
  ASSERT_EQ(cycles.wait_for(std::chrono::seconds(120)), std::future_status::ready)
      << "a pool's destructor hung joining a worker";
}

TEST(ThreadPoolTest, NestedParallelForRunsSerially) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(8 * 8);
  pool.parallel_for(8, [&](int64_t i) {
    pool.parallel_for(8, [&](int64_t j) { hits[static_cast<size_t>(i * 8 + j)].fetch_add(1); });
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPoolTest, TwoCallerThreadsShareOnePool) {
  ThreadPool pool(3);
  std::vector<int> a(500, 0), b(500, 0);
  std::thread other([&] {
    for (int rep = 0; rep < 50; ++rep)
      pool.parallel_for(500, [&](int64_t t) { a[static_cast<size_t>(t)]++; });
  });
  for (int rep = 0; rep < 50; ++rep)
    pool.parallel_for(500, [&](int64_t t) { b[static_cast<size_t>(t)]++; });
  other.join();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i], 50);
    ASSERT_EQ(b[i], 50);
  }
}

#if defined(__linux__)
// Workers start on a CPU other than their creator's but are not pinned: a worker's affinity is
// the whole set its creator may use (start_on gives the set back after the move).
TEST(ThreadPoolTest, WorkersAreNotPinned) {
  cpu_set_t caller;
  CPU_ZERO(&caller);
  ASSERT_EQ(sched_getaffinity(0, sizeof(caller), &caller), 0);
  ThreadPool pool(3);
  const std::thread::id main_id = std::this_thread::get_id();
  std::mutex mu;
  int seen = 0, differ = 0, count = 0;
  // The caller's tasks sleep, so the workers take the others (repeat until one has).
  for (int rep = 0; rep < 500 && seen == 0; ++rep)
    pool.parallel_for(8, [&](int64_t) {
      if (std::this_thread::get_id() == main_id) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        return;
      }
      cpu_set_t mine;
      CPU_ZERO(&mine);
      const bool ok = pthread_getaffinity_np(pthread_self(), sizeof(mine), &mine) == 0;
      std::lock_guard<std::mutex> lock(mu);
      ++seen;
      if (!ok || !CPU_EQUAL(&mine, &caller)) {
        ++differ;
        count = ok ? CPU_COUNT(&mine) : -1;
      }
    });
  ASSERT_GT(seen, 0) << "no worker took a task";
  EXPECT_EQ(differ, 0) << "a worker's CPU set differs from its creator's (" << count << " CPUs vs "
                       << CPU_COUNT(&caller) << ")";
}
#endif

}  // namespace
}  // namespace kvcache
