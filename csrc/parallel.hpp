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

// Runs `body(task, scratch)` for every task in [0, n_tasks) on up to `num_threads` threads.
// Tasks are pulled from a shared counter (their costs differ, so static splits would leave a
// core idle); each thread owns one default-constructed `Scratch` reused across its tasks. The
// first exception stops the remaining tasks and is rethrown here.
template <class Scratch, class Body>
void parallel_tasks(int64_t n_tasks, int num_threads, Body body) {
  const int workers = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, n_tasks)));
  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mutex;
  auto run = [&]() {
    Scratch scratch{};
    try {
      for (int64_t t; (t = next.fetch_add(1)) < n_tasks;) body(t, scratch);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (!failure) failure = std::current_exception();
      next.store(n_tasks);
    }
  };
  if (workers == 1) {
    run();
  } else {
    std::vector<std::thread> pool;
    pool.reserve(workers - 1);
    for (int w = 1; w < workers; ++w) pool.emplace_back(run);
    run();
    for (auto& th : pool) th.join();
  }
  if (failure) std::rethrow_exception(failure);
}

}  // namespace colgraph
