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

// A buffer far larger than the caches: at least 1 GiB and twice the model, but at most a
// quarter of the memory available now (the machine is shared), and never under 64 MiB.
size_t roofline_buffer_bytes(uint64_t model_bytes);

// Fills `bytes` once (so its pages are real, not the shared zero page), then reads it
// `passes` times split over `threads` threads and keeps the fastest pass.
ReadBandwidth measure_read_bandwidth(size_t bytes, int threads, int passes);

}  // namespace kiln::cli
