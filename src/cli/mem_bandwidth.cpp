#include "cli/mem_bandwidth.h"

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "runtime/thread_pool.h"

namespace kiln::cli {
namespace {

#if defined(__SANITIZE_THREAD__)
#define KILN_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_UNDER_TSAN 1
#endif
#endif
uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

}  // namespace

// Eight independent sums the compiler vectorizes. Cloned per ISA and picked at run time
// (the build targets baseline x86-64): on this project's VM 16-byte SSE2 loads read
// ~25 GB/s where 64-byte loads reach the ~31 GB/s the AVX-512 gemm streams at.
// Not under ThreadSanitizer: GCC instruments the clones' ifunc resolver, which the dynamic
// loader runs before TSan's runtime exists, and every kiln binary crashed at startup.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(KILN_UNDER_TSAN)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t acc[8] = {};
  for (size_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
  uint64_t s = 0;
  for (uint64_t a : acc) s += a;
  return s;
}

// On this project's VM a core streams ~15% more with the prefetches than the plain loop
// gets, so a probe without them would understate the roofline the kernels are held to.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(KILN_UNDER_TSAN)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
uint64_t sum_words_prefetched(const uint64_t* p, size_t n) {
  uint64_t acc[8] = {};
  for (size_t i = 0; i + 8 <= n; i += 8) {
    const uintptr_t line = reinterpret_cast<uintptr_t>(p + i);  // may run past the buffer: never dereferenced
    __builtin_prefetch(reinterpret_cast<const void*>(line + 1024), 0, 3);
    __builtin_prefetch(reinterpret_cast<const void*>(line + 4096), 0, 1);
    for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
  }
  uint64_t s = 0;
  for (uint64_t a : acc) s += a;
  return s;
}

size_t roofline_buffer_bytes(uint64_t model_bytes) {
  uint64_t bytes = std::max<uint64_t>(uint64_t(1) << 30, 2 * model_bytes);
  if (const uint64_t avail = mem_available_bytes(); avail > 0) bytes = std::min(bytes, avail / 4);
  return (size_t)std::max<uint64_t>(bytes, uint64_t(64) << 20);
}

ReadBandwidthProbe::ReadBandwidthProbe(size_t bytes) {
  constexpr size_t kHugePage = size_t(2) << 20;
  bytes_ = std::max(kHugePage, bytes / kHugePage * kHugePage);
  data_ = static_cast<uint64_t*>(std::aligned_alloc(kHugePage, bytes_));
  if (!data_) throw Error("--roofline: cannot allocate " + std::to_string(bytes_ >> 20) + " MiB to measure bandwidth");
#ifdef MADV_HUGEPAGE
  // Huge pages: filling 1 GiB of 4 KiB pages costs seconds of page faults on a VM, and
  // TLB misses would lower the figure below what the (huge-paged) weights see.
  madvise(data_, bytes_, MADV_HUGEPAGE);
#endif
  const size_t words = bytes_ / sizeof(uint64_t);
  for (size_t i = 0; i < words; ++i) data_[i] = i;
}

ReadBandwidthProbe::~ReadBandwidthProbe() { std::free(data_); }

ReadBandwidth ReadBandwidthProbe::measure(int threads, int passes) {
  threads = std::max(1, threads);
  ThreadPool pool(threads);
  const size_t words = bytes_ / sizeof(uint64_t);
  // Each thread's slice is a whole number of 64-byte lines.
  const size_t per_thread = (words / threads + 7) / 8 * 8;
  ReadBandwidth r{0.0, words * sizeof(uint64_t), threads, passes};
  std::vector<uint64_t> sums(size_t(threads) * 8);  // a cache line per thread
  // Plain and prefetched passes alternate (at least one of each): the roofline is the
  // faster way to read.
  passes = std::max(passes, 2);
  r.passes = passes;
  for (int p = 0; p < passes; ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run([&](int t, int) {
      const size_t b = std::min(words, size_t(t) * per_thread), e = std::min(words, b + per_thread);
      sums[size_t(t) * 8] += p % 2 ? sum_words_prefetched(data_ + b, e - b) : sum_words(data_ + b, e - b);
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.gb_per_s = std::max(r.gb_per_s, double(r.bytes) / s / 1e9);
  }
  // The sums feed an observable value so the reads cannot be optimized away.
  for (uint64_t s : sums) sink_ += s;
  volatile uint64_t sink = sink_;
  (void)sink;
  return r;
}

ReadBandwidth measure_read_bandwidth(size_t bytes, int threads, int passes) {
  ReadBandwidthProbe probe(bytes);
  return probe.measure(threads, passes);
}

}  // namespace kiln::cli
