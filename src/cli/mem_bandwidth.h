#pragma once
// This machine's memory read bandwidth, the ceiling ("roofline") that token generation
// approaches when it streams every weight once per token.
#include <cstddef>
#include <cstdint>

namespace kiln::cli {

struct ReadBandwidth {
  double gb_per_s = 0;  // best pass, 1e9 bytes per second
  size_t bytes = 0;     // buffer size read per pass
  int threads = 0;
  int passes = 0;
};

// The sum of n words, read front to back: the probe's plain pass.
uint64_t sum_words(const uint64_t* p, size_t n);

// The same, each 64-byte line asked for 1 KiB ahead into L1 and 4 KiB ahead
// into L2 as the decode kernels do (kernels/x86/prefetch.h): the probe's prefetched pass,
// and bench/decode_stream_bench's yardstick on CPUs whose kernels prefetch.
uint64_t sum_words_prefetched(const uint64_t* p, size_t n);

// A buffer far larger than the caches: at least 1 GiB and twice the model, but at most a
// quarter of the memory available now (the machine is shared), and never under 64 MiB.
size_t roofline_buffer_bytes(uint64_t model_bytes);

// A buffer of `bytes`, filled once (so its pages are real, not the shared zero page), to
// read again whenever a measurement is wanted: a shared machine's bandwidth drifts over
// minutes, so a benchmark measures it right beside each run it compares with it.
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(size_t bytes);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;

  // Reads the buffer `passes` (at least 2) times split over `threads` threads, passes
  // alternating a plain read loop and one with software prefetch; the fastest pass.
  ReadBandwidth measure(int threads, int passes);
  size_t bytes() const { return bytes_; }

 private:
  uint64_t* data_ = nullptr;
  size_t bytes_ = 0;
  uint64_t sink_ = 0;
};

// One probe, one measurement.
ReadBandwidth measure_read_bandwidth(size_t bytes, int threads, int passes);

}  // namespace kiln::cli
