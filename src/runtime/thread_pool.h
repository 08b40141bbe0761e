#pragma once
// One persistent pool: threads are created once per Session, never per operation.
// Work is split statically so a given task always runs the same arithmetic whatever
// the timing (the kernels guarantee per-row results independent of the split).
#include <cstddef>
#include <memory>
#include <type_traits>
#include <utility>

namespace kiln {

// A non-owning reference to a callable (like C++26 std::function_ref): two pointers,
// never a heap copy. std::function would allocate for every lambda capturing more than
// two pointers, i.e. on every pool call of the per-token path. The callable must outlive
// the call it is passed to, which holds for the temporaries passed to run/parallel_for.
template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> && std::is_invocable_r_v<R, F&, Args...>)
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): lambdas convert implicitly
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1; the caller's thread is one of them
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;

  // Runs fn(thread_index, n_threads) once on every thread (the caller is thread 0) and
  // returns when all have finished. fn must not throw.
  void run(FunctionRef<void(int, int)> fn);

  // Splits [0, n) into size() contiguous chunks, chunk boundaries rounded to `align`,
  // and calls fn(begin, end) for each non-empty chunk.
  void parallel_for(size_t n, size_t align, FunctionRef<void(size_t, size_t)> fn);

  // Splits [0, n) into chunks of `chunk` that threads take in turn as they finish, so a
  // core slowed by other work gets fewer. Only for work whose result does not depend on
  // which thread ran a chunk (gemm rows, by the kernel contract).
  void parallel_for_dynamic(size_t n, size_t chunk, FunctionRef<void(size_t, size_t)> fn);

  // Bytes the caller will read next (the weights of its next run): until that run starts,
  // waiting workers fetch them toward their caches instead of only spinning. Decode runs
  // a few µs of single-threaded work between two multithreaded matmuls, and the memory
  // bus is otherwise idle then. Replaces the previous hint; ranges past kMaxHints are
  // ignored. Only a hint: prefetches never fault, and the data need not stay valid.
  struct ByteRange {
    const void* data;
    size_t bytes;
  };
  static constexpr size_t kMaxHints = 32;
  void prefetch_while_idle(const ByteRange* ranges, size_t n);
  // Cache lines of the current hint no worker has fetched yet (0 once run() starts).
  size_t idle_prefetch_pending() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Physical cores (not hyper-threads) of this machine, at least 1.
int physical_core_count();

}  // namespace kiln
