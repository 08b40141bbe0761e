// ThreadPool: coverage and alignment of parallel_for, run() semantics, no deadlock over
// many back-to-back runs and across sleeps (the futex path), physical_core_count sanity.
#include "runtime/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace kiln {
namespace {

TEST(ThreadPool, RunCallsEveryThreadOnceWithCallerAsZero) {
  for (int n : {1, 2, 3, 4, 7}) {
    ThreadPool pool(n);
    ASSERT_EQ(pool.size(), n);
    std::vector<std::atomic<int>> calls(n);
    std::atomic<bool> bad_count{false};
    std::thread::id zero_thread;
    pool.run([&](int t, int count) {
      if (count != n) bad_count = true;
      calls[t]++;
      if (t == 0) zero_thread = std::this_thread::get_id();
    });
    for (int t = 0; t < n; ++t) EXPECT_EQ(calls[t].load(), 1) << "n=" << n << " t=" << t;
    EXPECT_FALSE(bad_count);
    EXPECT_EQ(zero_thread, std::this_thread::get_id());
  }
}

TEST(ThreadPool, RunReturnsOnlyAfterAllFinish) {
  ThreadPool pool(4);
  std::atomic<int> finished{0};
  pool.run([&](int t, int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(t == 0 ? 0 : 20 * t));
    finished++;
  });
  EXPECT_EQ(finished.load(), 4);
}

// Each index exactly once, every chunk boundary on a multiple of align, contiguous.
void check_parallel_for(ThreadPool& pool, size_t n, size_t align) {
  std::vector<std::atomic<int>> hits(n);
  std::mutex m;
  std::vector<std::pair<size_t, size_t>> chunks;
  pool.parallel_for(n, align, [&](size_t b, size_t e) {
    {
      std::lock_guard<std::mutex> lock(m);
      chunks.emplace_back(b, e);
    }
    for (size_t i = b; i < e; ++i) hits[i]++;
  });
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " align=" << align << " i=" << i;
  ASSERT_LE(chunks.size(), (size_t)pool.size());
  for (auto [b, e] : chunks) {
    EXPECT_LT(b, e) << "empty chunk passed to fn";
    if (align > 1) {
      EXPECT_EQ(b % align, 0u) << "n=" << n << " align=" << align;
      if (e != n) {
        EXPECT_EQ(e % align, 0u) << "n=" << n << " align=" << align;
      }
    }
  }
}

TEST(ThreadPool, ParallelForCoversEachIndexOnceAligned) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {0, 1, 2, 3, 15, 16, 17, 100, 1000, 4097, 5632})
      for (size_t align : {0, 1, 4, 16, 64, 5000}) check_parallel_for(pool, n, align);
  }
}

TEST(ThreadPool, ParallelForSplitsWorkAcrossThreads) {
  ThreadPool pool(2);
  std::atomic<int> chunks{0};
  pool.parallel_for(2048, 16, [&](size_t b, size_t e) {
    chunks++;
    EXPECT_EQ(e - b, 1024u);
  });
  EXPECT_EQ(chunks.load(), 2);
}

TEST(ThreadPool, ManyRunsNoDeadlock) {
  ThreadPool pool(std::max(2, physical_core_count()) + 1);  // oversubscribed on purpose
  std::atomic<long> total{0};
  for (int i = 0; i < 20000; ++i) pool.run([&](int t, int) { total += t + 1; });
  const long per_run = (long)pool.size() * (pool.size() + 1) / 2;
  EXPECT_EQ(total.load(), 20000 * per_run);
}

// Gaps longer than the spin window make workers sleep; they must wake for the next run.
TEST(ThreadPool, WakesAfterIdleSleep) {
  ThreadPool pool(3);
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::atomic<int> ran{0};
    pool.run([&](int, int) { ran++; });
    EXPECT_EQ(ran.load(), 3);
  }
}

TEST(ThreadPool, IdleWorkersDoNotSpin) {
  ThreadPool pool(3);
  pool.run([](int, int) {});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin window
  const std::clock_t c0 = std::clock();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const double cpu_s = double(std::clock() - c0) / CLOCKS_PER_SEC;  // whole process
  EXPECT_LT(cpu_s, 0.05) << "idle pool burned CPU";
}

// Workers waiting between runs fetch the hinted lines; the next run() drops what is left
// of the hint, and a hint never changes what run() computes.
TEST(ThreadPool, IdleWorkersPrefetchTheHintUntilTheNextRun) {
  ThreadPool pool(2);
  std::vector<uint8_t> weights(4 << 20, 1);
  const ThreadPool::ByteRange ranges[2] = {{weights.data(), 1 << 20}, {weights.data() + (2 << 20), (1 << 20) + 1}};
  bool consumed = false;
  for (int attempt = 0; attempt < 20 && !consumed; ++attempt) {
    pool.run([](int, int) {});  // the worker spins (rather than sleeps) right after a run
    pool.prefetch_while_idle(ranges, 2);
    EXPECT_LE(pool.idle_prefetch_pending(), (2u << 20) / 64 + 4);  // a line or two more where unaligned
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (pool.idle_prefetch_pending() > 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    consumed = pool.idle_prefetch_pending() == 0;
  }
  EXPECT_TRUE(consumed) << "no idle worker fetched the hinted lines";

  pool.prefetch_while_idle(ranges, 2);
  std::atomic<int> calls{0};
  pool.run([&](int, int) { calls.fetch_add(1); });
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(pool.idle_prefetch_pending(), 0u);

  ThreadPool alone(1);  // no workers: a hint is ignored
  alone.prefetch_while_idle(ranges, 2);
  EXPECT_EQ(alone.idle_prefetch_pending(), 0u);
}

TEST(ThreadPool, ConstructDestroyRepeatedly) {
  for (int i = 0; i < 200; ++i) {
    ThreadPool pool(1 + i % 4);
    if (i % 2) pool.run([](int, int) {});
  }
}

TEST(ThreadPool, PhysicalCoreCountIsSane) {
  const int n = physical_core_count();
  EXPECT_GE(n, 1);
  EXPECT_LE(n, (int)std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace
}  // namespace kiln
