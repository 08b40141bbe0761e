// Software prefetch for weights read in the file's layout (MoE experts, --no-repack).
// Rows are read front to back, row after row, but each 64-byte line takes long enough to
// unpack (offsets, scales, nibbles) that the hardware prefetcher falls behind and a
// token's matvec waits on DRAM. Fetching the lines kPrefetchAhead bytes further on (the
// next rows: a task's rows follow each other in memory) measured 24 -> 39.5 tok/s on
// mamba2-1b Q8_0 --no-repack with AVX-512 (2 threads; 0.5 KiB ahead 25, 2 KiB 30,
// 4 KiB 37, 8 KiB 39.5, 16 KiB 37). Nothing at or past `end` (the task's last row) is
// fetched: a MoE's expert matrices are short, and the bytes after one belong to an expert
// the token did not choose. Internal linkage: each ISA's translation unit keeps its own
// copy, compiled with its own target flags.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace kiln::kernels::x86 {

inline constexpr size_t kPrefetchAhead = 8192;


static inline void prefetch_ahead(const uint8_t* p, size_t bytes, const uint8_t* end) {
  const uint8_t* q = p + kPrefetchAhead;
  if (q >= end) return;
  for (size_t line = 0; line < bytes; line += 64) _mm_prefetch(reinterpret_cast<const char*>(q + line), _MM_HINT_T0);
}

// Decode (one activation row) reads each packed record once, front to back, and a core
// alone cannot keep enough lines in flight: on the project's Intel VM (2 threads, tinyllama
// shapes, every layer matrix from DRAM) the packed decode tiles streamed 23-25 GB/s
// against a 30-35 GB/s read loop, Q4_K and Q6_K no faster with any prefetch into L1 alone.
// Two distances fix it: each line is asked into L1 `near` bytes ahead and into L2 `far`
// bytes ahead, so the L1 requests find their lines on the way and the core's
// few L1 miss buffers are not all held for a full DRAM round trip. Measured: Q4_0 24.5 ->
// 30.5 GB/s, Q4_K 24 -> 30, Q6_K 23.5 -> 27.6 (1 KiB/4 KiB; 512 B-2 KiB near and 4 KiB
// far were equal, 2 KiB far or 8 KiB far lost 2-3 GB/s, either distance alone lost 3).
// The prefetches are asm volatile because GCC deletes a loop whose body is only
// _mm_prefetch calls (C++ loops without side effects may be assumed finite and dropped).
// The distances are the CPU's (stream_prefetch_for_cpu in kernels/dispatch.cpp): on an AMD
// EPYC (Zen 5) VM the same two prefetches cost a plain read loop a fifth of its bandwidth
// (2 threads, 1 GiB: 52-58 GB/s without, 42 with) and 1.1B Q4_0 decode 67.5 -> 73.4 tok/s;
// its hardware prefetchers keep up alone (a single stream; see `groups`). 0 turns a
// distance off. Set before main (kernels/dispatch.cpp); tests may set it between calls.
// groups > 1: the AVX-512 packed decode reads that many 16-row groups at once, record by
// record, each record's lines asked into L1 group_ahead bytes ahead (avx512/packed_tiles.h).
struct StreamPrefetch {
  size_t near, far;
  int groups = 1;
  size_t group_ahead = 0;
};
extern StreamPrefetch g_stream_prefetch;

// Prefetches the lines that start within part `part` of kParts equal parts of the kBytes
// record at rec (a record read in kParts steps spreads its prefetches over them).
template <size_t kBytes, int kParts = 1>
static inline void prefetch_stream(const uint8_t* rec, int part = 0) {
  const StreamPrefetch d = g_stream_prefetch;
  if (d.near + d.far == 0) return;
  const uintptr_t at = reinterpret_cast<uintptr_t>(rec);
  const uintptr_t end = at + kBytes * size_t(part + 1) / kParts;
  for (uintptr_t line = (at + kBytes * size_t(part) / kParts + 63) & ~uintptr_t(63); line < end; line += 64) {
    if (d.near) __asm__ volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(line + d.near)));
    if (d.far) __asm__ volatile("prefetcht2 %0" : : "m"(*reinterpret_cast<const char*>(line + d.far)));
  }
}

// The lines that start within the kBytes at p, into L1.
template <size_t kBytes>
static inline void prefetch_record(const uint8_t* p) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  for (uintptr_t line = (at + 63) & ~uintptr_t(63); line < at + kBytes; line += 64)
    __asm__ volatile("prefetcht0 %0" : : "m"(*reinterpret_cast<const char*>(line)));
}

// Prefill tiles of the packed K-quants and IQ4_XS (several activation rows) read records
// in address order, yet the hardware prefetcher loses the stream: each of a record's 8
// steps fetches an eighth of the record two records further on. Measured before decode
// had prefetch_stream (one core, 16384 x 4096 weights beyond L3): decode Q5_K from DRAM
// 7 -> 17-20 GB/s, Q4_K 12-15 -> 28-37; batch of 32 (4096 x 4096) Q4_K 84 -> 96 GMAC/s,
// Q5_K 66 -> 72; Q3_K and Q2_K unchanged within noise.
template <size_t kBytes>
static inline void prefetch_record_ahead(const uint8_t* rec, int step) {
  constexpr size_t kLines = (kBytes / 64 + 7) / 8;
  const char* p = reinterpret_cast<const char*>(rec) + 2 * kBytes + 64 * kLines * step;
#pragma GCC unroll 8
  for (size_t l = 0; l < kLines; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
}

// Step `step` of 8 of a packed record's prefetch in a tile of RB activation rows: decode
// streams (prefetch_stream), prefill fetches two records ahead (prefetch_record_ahead).
template <size_t kBytes, int RB>
static inline void prefetch_record_step(const uint8_t* rec, int step) {
  if constexpr (RB == 1) prefetch_stream<kBytes, 8>(rec, step);
  else prefetch_record_ahead<kBytes>(rec, step);
}

}  // namespace kiln::kernels::x86
