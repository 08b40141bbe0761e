#pragma once
#include <chrono>

namespace kiln {

// Milliseconds from t0 to now, on the steady clock (the timings kiln prints).
inline double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kiln
