// Persistent pool with a generation-counter barrier. Between kernels of one token the
// gap is microseconds, so workers spin briefly on the counter (no syscall on the hot
// path); between tokens or while the user types they fall asleep on a futex so an idle
// pool costs no CPU.
#include "runtime/thread_pool.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

namespace kiln {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

void prefetch_l2(const void* p) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_prefetch(p, 0, 2);  // prefetcht1: L2 and outward
#else
  (void)p;
#endif
}

// Blocks while *word == expected; wake_all releases every waiter on word.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
#ifdef __linux__
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
#else
  word.wait(expected);
#endif
}
void futex_wake_all(std::atomic<uint32_t>& word) {
#ifdef __linux__
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
  word.notify_all();
#endif
}

// How long a waiter spins before sleeping: long enough to bridge the gap between two
// kernels of one forward pass, short enough not to burn a core between tokens.
constexpr auto kSpin = std::chrono::microseconds(100);
// After this long spinning, yield between checks: if the machine is oversubscribed the
// thread we wait for may need this very core.
constexpr auto kPureSpin = std::chrono::microseconds(10);

// Spins then sleeps until word != value. `sleepers` counts threads that may be in
// futex_wait so the waker only pays for a syscall when someone actually sleeps.
// idle_work: called while spinning, returns false when it has nothing (more) to do.
template <class IdleWork>
void wait_while_equal(std::atomic<uint32_t>& word, uint32_t value, std::atomic<int>& sleepers, IdleWork&& idle_work) {
  const auto start = std::chrono::steady_clock::now();
  bool yielding = false;
  for (int i = 0;; ++i) {
    if (word.load(std::memory_order_acquire) != value) return;
    if (idle_work()) continue;
    if (yielding) {
      std::this_thread::yield();
    } else {
      cpu_relax();
    }
    if ((i & 63) == 63) {
      const auto spent = std::chrono::steady_clock::now() - start;
      if (spent > kSpin) break;
      yielding = spent > kPureSpin;
    }
  }
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  while (word.load(std::memory_order_seq_cst) == value) futex_wait(word, value);
  sleepers.fetch_sub(1, std::memory_order_relaxed);
}
void wait_while_equal(std::atomic<uint32_t>& word, uint32_t value, std::atomic<int>& sleepers) {
  wait_while_equal(word, value, sleepers, [] { return false; });
}

void bump_and_wake(std::atomic<uint32_t>& word, std::atomic<int>& sleepers) {
  word.fetch_add(1, std::memory_order_seq_cst);
  // seq_cst on both sides: either the waiter sees the new value before sleeping, or we
  // see its sleepers increment and issue the wake.
  if (sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(word);
}

}  // namespace

struct ThreadPool::Impl {
  int n_threads = 1;
  std::vector<std::thread> workers;
  const FunctionRef<void(int, int)>* task = nullptr;  // run()'s argument, alive until all finish
  bool stopping = false;

  alignas(64) std::atomic<uint32_t> generation{0};  // bumped by run() to start a task
  alignas(64) std::atomic<int> start_sleepers{0};
  alignas(64) std::atomic<int> remaining{0};        // workers still inside the task
  alignas(64) std::atomic<uint32_t> done{0};        // bumped by the last worker to finish
  alignas(64) std::atomic<int> done_sleepers{0};

  // prefetch_while_idle's ranges; workers claim kLinesPerClaim lines at a time from
  // hint_next. Relaxed atomics: a worker reading a range while the caller replaces it
  // prefetches a stale address, which is harmless.
  static constexpr size_t kLinesPerClaim = 8;
  alignas(64) std::atomic<size_t> hint_next{0};
  std::atomic<size_t> hint_count{0}, hint_total_lines{0};
  std::atomic<uintptr_t> hint_begin[kMaxHints], hint_lines[kMaxHints];

  // Prefetches the next unclaimed lines of the hint into this core's L2; false when none
  // are left.
  bool prefetch_hint() {
    const size_t n = hint_count.load(std::memory_order_acquire);
    if (n == 0 || hint_next.load(std::memory_order_relaxed) >= hint_total_lines.load(std::memory_order_relaxed))
      return false;
    size_t line = hint_next.fetch_add(kLinesPerClaim, std::memory_order_relaxed);
    for (size_t r = 0; r < n; ++r) {
      const size_t lines = hint_lines[r].load(std::memory_order_relaxed);
      if (line >= lines) {
        line -= lines;
        continue;
      }
      const uintptr_t begin = hint_begin[r].load(std::memory_order_relaxed);
      for (size_t i = line, end = std::min(lines, line + kLinesPerClaim); i < end; ++i)
        prefetch_l2(reinterpret_cast<const void*>(begin + 64 * i));
      return true;
    }
    return false;
  }

  void worker(int index) {
    uint32_t seen = 0;
    for (;;) {
      wait_while_equal(generation, seen, start_sleepers, [this] { return prefetch_hint(); });
      seen = generation.load(std::memory_order_acquire);
      if (stopping) return;
      (*task)(index, n_threads);
      if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) bump_and_wake(done, done_sleepers);
    }
  }
};

ThreadPool::ThreadPool(int n_threads) : impl_(std::make_unique<Impl>()) {
  impl_->n_threads = std::max(1, n_threads);
  impl_->workers.reserve(impl_->n_threads - 1);
  for (int i = 1; i < impl_->n_threads; ++i) impl_->workers.emplace_back([this, i] { impl_->worker(i); });
}

ThreadPool::~ThreadPool() {
  impl_->stopping = true;
  bump_and_wake(impl_->generation, impl_->start_sleepers);
  for (auto& t : impl_->workers) t.join();
}

int ThreadPool::size() const { return impl_->n_threads; }

void ThreadPool::run(FunctionRef<void(int, int)> fn) {
  Impl& p = *impl_;
  if (p.n_threads == 1) {
    fn(0, 1);
    return;
  }
  p.task = &fn;
  p.hint_count.store(0, std::memory_order_relaxed);  // the hint was for this run
  p.remaining.store(p.n_threads - 1, std::memory_order_relaxed);
  const uint32_t done_before = p.done.load(std::memory_order_relaxed);
  bump_and_wake(p.generation, p.start_sleepers);  // publishes task and remaining
  fn(0, p.n_threads);
  wait_while_equal(p.done, done_before, p.done_sleepers);
}

void ThreadPool::prefetch_while_idle(const ByteRange* ranges, size_t n) {
  Impl& p = *impl_;
  if (p.n_threads == 1) return;
  n = std::min(n, kMaxHints);
  p.hint_count.store(0, std::memory_order_relaxed);
  size_t total = 0;
  for (size_t r = 0; r < n; ++r) {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(ranges[r].data) & ~uintptr_t(63);
    const uintptr_t end = reinterpret_cast<uintptr_t>(ranges[r].data) + ranges[r].bytes;
    p.hint_begin[r].store(begin, std::memory_order_relaxed);
    const size_t lines = end > begin ? (end - begin + 63) / 64 : 0;
    p.hint_lines[r].store(lines, std::memory_order_relaxed);
    total += lines;
  }
  p.hint_total_lines.store(total, std::memory_order_relaxed);
  p.hint_next.store(0, std::memory_order_relaxed);
  p.hint_count.store(n, std::memory_order_release);
}

size_t ThreadPool::idle_prefetch_pending() const {
  const Impl& p = *impl_;
  if (p.hint_count.load(std::memory_order_acquire) == 0) return 0;
  const size_t total = p.hint_total_lines.load(std::memory_order_relaxed), next = p.hint_next.load(std::memory_order_relaxed);
  return total - std::min(total, next);
}

void ThreadPool::parallel_for(size_t n, size_t align, FunctionRef<void(size_t, size_t)> fn) {
  if (n == 0) return;
  align = std::max<size_t>(align, 1);
  const size_t n_threads = (size_t)size();
  const size_t units = (n + align - 1) / align;
  const size_t per_thread = (units + n_threads - 1) / n_threads * align;
  if (per_thread >= n) {  // one chunk: no need to wake anyone
    fn(0, n);
    return;
  }
  run([&](int t, int) {
    const size_t begin = std::min(n, (size_t)t * per_thread), end = std::min(n, begin + per_thread);
    if (begin < end) fn(begin, end);
  });
}

void ThreadPool::parallel_for_dynamic(size_t n, size_t chunk, FunctionRef<void(size_t, size_t)> fn) {
  if (n == 0) return;
  chunk = std::max<size_t>(chunk, 1);
  if (size() == 1 || chunk >= n) {
    fn(0, n);
    return;
  }
  std::atomic<size_t> next{0};
  run([&](int, int) {
    for (;;) {
      const size_t begin = next.fetch_add(chunk, std::memory_order_relaxed);
      if (begin >= n) return;
      fn(begin, std::min(n, begin + chunk));
    }
  });
}

int physical_core_count() {
  // Count distinct (package, core) pairs among the CPUs this process may run on, so
  // SMT siblings and CPUs excluded by taskset/cgroups are not counted.
  std::set<std::pair<int, int>> cores;
#ifdef __linux__
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const bool have_mask = sched_getaffinity(0, sizeof(allowed), &allowed) == 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (have_mask && !CPU_ISSET(cpu, &allowed)) continue;
    const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream core_file(dir + "core_id"), package_file(dir + "physical_package_id");
    int core = -1, package = 0;
    if (!(core_file >> core)) {
      if (have_mask) continue;
      break;
    }
    package_file >> package;
    cores.emplace(package, core);
  }
#endif
  if (!cores.empty()) return (int)cores.size();
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace kiln
