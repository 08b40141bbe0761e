#pragma once
// What this process may still allocate: the machine's memory, or less where a limit says
// so (ulimit -v counting what is already mapped, ulimit -d, a cgroup's memory.max).
// Allocating past an address-space limit fails with a bare std::bad_alloc, and past a
// container's limit the kernel kills the process: sizes are better refused up front.
#include <string>

namespace kiln {

struct MemoryLimit {
  double bytes = 0;  // 0: unknown
  std::string what;  // "this machine's memory", "the data-size limit, ulimit -d", ...
};
MemoryLimit memory_limit();

// "512 MiB", "4.8 GiB".
std::string human_bytes(double bytes);

}  // namespace kiln
