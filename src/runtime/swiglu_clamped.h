#pragma once
// gpt-oss's SwiGLU variant: the gate is capped from above and the up projection clamped
// on both sides at `limit` (they trained with it, to keep activations bounded), the gate's
// SiLU is sharpened to g sigmoid(alpha g) (alpha 1.702: the sigmoid approximation of GELU),
// and the up projection enters as (u + 1). A plain loop like soft_cap: it runs over the
// chosen experts' rows only.
#include <algorithm>
#include <cmath>
#include <cstddef>

namespace kiln {

// out[i] = g sigmoid(alpha g) (u + 1), g = min(gate[i], limit), u = clamp(up[i], -limit, limit).
// out may alias gate.
inline void swiglu_clamped(const float* gate, const float* up, float* out, size_t n, float alpha, float limit) {
  for (size_t i = 0; i < n; ++i) {
    const float g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
    out[i] = g / (1.0f + std::exp(-alpha * g)) * (u + 1.0f);
  }
}

}  // namespace kiln
