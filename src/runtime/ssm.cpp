// Mamba-2's conv, scan and gated norm (runtime/ssm.h). The scan's inner loop over d_state,
// the hot one, is a kernel (kernels::Ops::ssm_update); the rest is per channel or per
// head and runs once per token.
#include "runtime/ssm.h"

#include <algorithm>
#include <cmath>

#include "kernels/kernels.h"

namespace kiln::ssm {

float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

static float silu(float v) { return v / (1.0f + std::exp(-v)); }

void conv_silu(float* rows, size_t ld, size_t n, size_t c0, size_t c1, const float* w, const float* bias, size_t d_conv,
               float* state) {
  // Tokens outer, channels inner, in blocks of kBlock channels: a token's row is read and
  // written contiguously. (Walking one channel down the tokens touched a cache line per
  // token per channel: rows are ld floats apart, and a prefill's rows do not fit in L2.)
  // The last k_prev inputs of the block's channels sit in a ring of k_prev rows; each sum
  // still runs oldest input first, as the formula reads.
  constexpr size_t kBlock = 64;
  const size_t k_prev = d_conv - 1;
  float ring[63 * kBlock];  // d_conv <= 64
  for (size_t b0 = c0; b0 < c1; b0 += kBlock) {
    const size_t width = std::min(kBlock, c1 - b0);
    for (size_t j = 0; j < width; ++j)
      for (size_t k = 0; k < k_prev; ++k) ring[k * kBlock + j] = state[(b0 + j) * k_prev + k];
    size_t oldest = 0;  // the ring row holding the oldest input
    // Ring row of the k-th oldest input.
    const auto slot = [&](size_t k) { return oldest + k < k_prev ? oldest + k : oldest + k - k_prev; };
    for (size_t t = 0; t < n; ++t) {
      float* v = rows + t * ld + b0;
      for (size_t j = 0; j < width; ++j) {
        const float* wc = w + (b0 + j) * d_conv;
        float sum = 0.0f;
        for (size_t k = 0; k < k_prev; ++k) sum += wc[k] * ring[slot(k) * kBlock + j];
        const float input = v[j];
        sum += wc[k_prev] * input;
        if (k_prev > 0) ring[oldest * kBlock + j] = input;  // the oldest is no longer needed
        v[j] = silu(sum + bias[b0 + j]);
      }
      if (k_prev > 0) oldest = oldest + 1 < k_prev ? oldest + 1 : 0;
    }
    for (size_t j = 0; j < width; ++j)
      for (size_t k = 0; k < k_prev; ++k) state[(b0 + j) * k_prev + k] = ring[slot(k) * kBlock + j];
  }
}

void scan(const Scan& s, size_t n, size_t h0, size_t h1) {
  const kernels::Ops& ops = kernels::ops();
  const size_t heads_per_group = s.n_heads / s.n_groups, hd = s.head_dim, ds = s.d_state;
  for (size_t h = h0; h < h1; ++h) {
    const size_t g = h / heads_per_group;
    float* state = s.state + h * hd * ds;
    for (size_t t = 0; t < n; ++t) {
      const float dt = softplus(s.dt[t * s.ld + h] + s.dt_bias[h]);
      const float decay = std::exp(dt * s.A[h]);
      const float* x = s.x + t * s.ld + h * hd;
      const float* B = s.B + t * s.ld + g * ds;
      const float* C = s.C + t * s.ld + g * ds;
      float* y = s.y + t * s.ld_y + h * hd;
      ops.ssm_update_rows(state, B, C, decay, dt, x, y, hd, ds);
      for (size_t i = 0; i < hd; ++i) y[i] += s.D[h] * x[i];
    }
  }
}

void gate_norm(float* y, const float* z, const float* weight, size_t d_inner, size_t n_groups, float eps) {
  for (size_t i = 0; i < d_inner; ++i) y[i] *= silu(z[i]);
  const size_t group = d_inner / n_groups;
  for (size_t g = 0; g < n_groups; ++g) {
    float* part = y + g * group;
    double ss = 0;
    for (size_t i = 0; i < group; ++i) ss += double(part[i]) * part[i];
    const float scale = float(1.0 / std::sqrt(ss / double(group) + eps));
    for (size_t i = 0; i < group; ++i) part[i] = part[i] * scale * weight[g * group + i];
  }
}

}  // namespace kiln::ssm
