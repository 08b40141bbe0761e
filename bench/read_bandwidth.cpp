// read_bandwidth: how fast this machine streams memory into the cores, the ceiling a
// memory-bound decode step is measured against (bench/RESULTS.md: "roofline share").
//
//   build/bench/read_bandwidth [-t THREADS] [--mib SIZE] [-r REPS]
//
// Each thread sums its contiguous share of a buffer far larger than the caches with wide
// loads (four independent accumulators, so the loads, not the adds, set the pace), the way
// a decode matmul reads its weight rows. Prints every repetition's GB/s, then the median
// and the best; the first touch (page faults) is done before timing.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

__attribute__((target("avx2"))) uint64_t sum_avx2(const uint8_t* p, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "read_bandwidth: %s\nusage: read_bandwidth [-t THREADS] [--mib SIZE] [-r REPS]\n", why);
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, reps = 10;
  size_t mib = 1024;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage(("missing value after " + a).c_str());
    const long v = std::strtol(argv[++i], nullptr, 10);
    if (v <= 0) usage(("bad value for " + a).c_str());
    if (a == "-t") threads = int(v);
    else if (a == "--mib") mib = size_t(v);
    else if (a == "-r") reps = int(v);
    else usage(("unknown option " + a).c_str());
  }
  if (!__builtin_cpu_supports("avx2")) usage("this probe needs AVX2");
  const size_t bytes = mib << 20, share = bytes / size_t(threads) / 128 * 128;
  auto* buf = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
  if (!buf) usage("cannot allocate the buffer");
  std::memset(buf, 1, bytes);

  std::vector<double> gbs;
  uint64_t sink = 0;
  for (int r = 0; r < reps; ++r) {
    std::vector<uint64_t> sums(static_cast<size_t>(threads));
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] { sums[size_t(t)] = sum_avx2(buf + size_t(t) * share, share); });
    for (std::thread& th : pool) th.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (uint64_t v : sums) sink += v;
    gbs.push_back(double(share) * threads / s / 1e9);
    std::printf("rep %d: %.1f GB/s\n", r, gbs.back());
  }
  std::vector<double> sorted = gbs;
  std::sort(sorted.begin(), sorted.end());
  std::printf("read bandwidth, %d threads, %zu MiB: median %.1f GB/s, best %.1f GB/s (check %llu)\n", threads, mib,
              sorted[sorted.size() / 2], sorted.back(), static_cast<unsigned long long>(sink % 1000));
  std::free(buf);
  return 0;
}
