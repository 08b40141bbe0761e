#pragma once
// Heap allocation counting for tests. Linking alloc_hook.cpp into a test executable
// replaces the global operator new/delete and, on glibc without sanitizers, malloc
// itself, so memory any library takes (spdlog, the C++ runtime, libsentencepiece) is seen.
#include <cstddef>
#include <string>

namespace kiln::test {

// Counts allocations (on any thread) between construction and stop(), and remembers the
// largest single request (also one that failed: a huge request is what tests look for).
class AllocationWindow {
 public:
  AllocationWindow();
  ~AllocationWindow();
  long stop();
  static size_t largest();
  // The sizes of the first allocations, to tell which buffer grew.
  static std::string sizes();
  // Whether malloc is counted too (not under sanitizers, which own malloc).
  static bool counts_malloc();
};

}  // namespace kiln::test
