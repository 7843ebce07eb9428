// A minimal work-sharing loop: no pool, no dependencies, exceptions carried to the caller.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace colgraph {

// Threads worth starting for `n_tasks` tasks: at least 1, at most num_threads.
inline int worker_count(int64_t n_tasks, int num_threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, n_tasks)));
}

// Multiply-adds a thread must have before another is started: starting and joining a thread
// took 0.1-0.7 ms on the project's 2-core VM, so a call of 7 single-vector pairs took 0.3 ms on
// two threads against 0.09 ms on one. 4M multiply-adds are about 0.2 ms of one core's AVX-512
// MaxSim (ours).
constexpr int64_t kWorkPerThread = int64_t{1} << 22;

// num_threads capped so that each thread gets at least kWorkPerThread multiply-adds (at least 1).
inline int threads_for_work(int64_t work, int num_threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, work / kWorkPerThread)));
}

// Runs `body(task, worker)` for every task in [0, n_tasks) on `workers` threads (the caller's
// thread is worker 0). Tasks are pulled from a shared counter (their costs differ, so static
// splits would leave a core idle). The first exception stops the remaining tasks and is
// rethrown here.
template <class Body>
void parallel_workers(int64_t n_tasks, int workers, Body body) {
  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto run = [&](int worker) {
    try {
      for (int64_t t; (t = next.fetch_add(1)) < n_tasks;) body(t, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next.store(n_tasks);
    }
  };
  if (workers <= 1) {
    run(0);
  } else {
    std::vector<std::thread> pool;
    pool.reserve(workers - 1);
    for (int w = 1; w < workers; ++w) pool.emplace_back(run, w);
    run(0);
    for (auto& th : pool) th.join();
  }
  if (failure) std::rethrow_exception(failure);
}

// parallel_workers on up to num_threads threads, each owning one default-constructed `Scratch`
// reused across its tasks: `body(task, scratch)`.
template <class Scratch, class Body>
void parallel_tasks(int64_t n_tasks, int num_threads, Body body) {
  const int workers = worker_count(n_tasks, num_threads);
  std::vector<Scratch> scratch(workers);
  parallel_workers(n_tasks, workers, [&](int64_t t, int w) { body(t, scratch[w]); });
}

}  // namespace colgraph
