#pragma once
// Soft-capping (Gemma 2): x -> cap * tanh(x / cap), which leaves small values almost as they
// are and bounds the rest to (-cap, cap). Attention scores and final logits use it; a
// plain loop, as it runs on a few rows per token.
#include <cmath>
#include <cstddef>

namespace kiln {

inline void soft_cap(float* x, size_t n, float cap) {
  const float inv = 1.0f / cap;
  for (size_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

}  // namespace kiln
