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

}  // namespace kiln::kernels::x86
