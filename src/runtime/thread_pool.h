#pragma once
// One persistent pool: threads are created once per Session, never per operation.
// Work is split statically so a given task always runs the same arithmetic whatever
// the timing (the kernels guarantee per-row results independent of the split).
#include <cstddef>
#include <functional>
#include <memory>

namespace kiln {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1; the caller's thread is one of them
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;

  // Runs fn(thread_index, n_threads) once on every thread (the caller is thread 0) and
  // returns when all have finished. fn must not throw.
  void run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into size() contiguous chunks, chunk boundaries rounded to `align`,
  // and calls fn(begin, end) for each non-empty chunk.
  void parallel_for(size_t n, size_t align, const std::function<void(size_t, size_t)>& fn);

  // Splits [0, n) into chunks of `chunk` that threads take in turn as they finish, so a
  // core slowed by other work gets fewer. Only for work whose result does not depend on
  // which thread ran a chunk (gemm rows, by the kernel contract).
  void parallel_for_dynamic(size_t n, size_t chunk, const std::function<void(size_t, size_t)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Physical cores (not hyper-threads) of this machine, at least 1.
int physical_core_count();

}  // namespace kiln
