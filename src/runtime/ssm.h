#pragma once
// The numeric steps of a Mamba-2 mixer (Dao & Gu 2024), apart from the model code that
// strings them together (Forward::ssm_mixer, runtime/forward_ssm.cpp). Tokens are rows of
// the in-projection's output, [z | xBC | dt] (d_inner, conv_dim, n_heads wide), of one
// sequence in order; the sequence's state is carried in and out.
#include <cstddef>

namespace kiln::ssm {

// softplus(v) = log(1 + e^v), v itself past 20 (where the two agree in float), as the
// reference kernels do.
float softplus(float v);

// Causal depthwise conv1d + SiLU over channels [c0, c1) of n rows (row t at rows + t * ld),
// in place: out[t][c] = silu(bias[c] + sum_k w[c][k] * in[t - (d_conv - 1) + k][c]), where
// inputs before row 0 come from `state` ([channel][d_conv - 1], oldest first), which ends
// holding the last d_conv - 1 inputs.
void conv_silu(float* rows, size_t ld, size_t n, size_t c0, size_t c1, const float* w, const float* bias, size_t d_conv,
               float* state);

// The selective scan over heads [h0, h1) for n tokens. Per head h of group
// g = h / (n_heads / n_groups) and token t: dt = softplus(dt_t[h] + dt_bias[h]),
// h_state = exp(dt * A[h]) h_state + dt * x_t[h] B_t[g]^T (head_dim x d_state),
// y_t[h] = h_state C_t[g] + D[h] x_t[h].
struct Scan {
  const float* x;   // row t's x at x + t * ld: [n_heads][head_dim]
  const float* B;   // row t's B at B + t * ld: [n_groups][d_state]
  const float* C;   // the same for C
  const float* dt;  // row t's dt at dt + t * ld: [n_heads], before the bias
  size_t ld;
  const float *A, *D, *dt_bias;  // [n_heads]
  size_t n_heads, head_dim, d_state, n_groups;
  float* state;  // [n_heads][head_dim][d_state]
  float* y;      // row t at y + t * ld_y: [n_heads][head_dim]
  size_t ld_y;
};
void scan(const Scan& s, size_t n, size_t h0, size_t h1);

// The output gate and gated RMSNorm of Mamba-2: y *= silu(z), then RMSNorm over each of
// n_groups equal parts of y's d_inner values, times weight. One token.
void gate_norm(float* y, const float* z, const float* weight, size_t d_inner, size_t n_groups, float eps);

}  // namespace kiln::ssm
