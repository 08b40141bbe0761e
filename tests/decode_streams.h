#pragma once
// Runs fn once for each way the AVX-512 packed decode can stream its weights
// (kernels/x86/prefetch.h: one 16-row group at a time as on Intel, or several groups
// record by record as on AMD), whichever this CPU would choose, then restores the choice:
// every way must give the same bits.
#include <gtest/gtest.h>

#include <string>

#ifdef KILN_HAVE_X86
#include "kernels/x86/prefetch.h"
#endif

namespace kiln::test {

template <class F>
void for_each_decode_stream(F&& fn) {
#ifdef KILN_HAVE_X86
  using kernels::x86::StreamPrefetch;
  const StreamPrefetch chosen = kernels::x86::g_stream_prefetch;
  for (const StreamPrefetch s : {StreamPrefetch{1024, 4096, 1, 0}, StreamPrefetch{0, 0, 4, 2048},
                                 StreamPrefetch{0, 0, 3, 64}, StreamPrefetch{0, 0, 2, 0}}) {
    SCOPED_TRACE("decode streams: " + std::to_string(s.groups) + " groups");
    kernels::x86::g_stream_prefetch = s;
    fn();
  }
  kernels::x86::g_stream_prefetch = chosen;
#else
  fn();
#endif
}

}  // namespace kiln::test
