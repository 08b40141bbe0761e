// The Mamba-2 mixer (Dao & Gu 2024) of one layer over a batch: in-projection to
// [z | xBC | dt], the causal depthwise conv over xBC continuing from each sequence's last
// d_conv - 1 inputs, SiLU; the selective scan per head, its state [head_dim][d_state]
// carried across tokens; y gated by silu(z) and RMS-normed per group; out-projection.
// Each span of the batch is one sequence's tokens in order, scanned token by token (a
// chunked scan of the state-space duality would do prefill as matrix products; later).
// A span at position 0 starts from the zero state, whatever the sequence held before.
// Heads (and conv channels) are independent across tokens: the pool splits them, so a
// row's arithmetic does not depend on the thread count or on the batch around it.
#include <algorithm>

#include "runtime/forward.h"
#include "runtime/ssm.h"

namespace kiln {

void Forward::ssm_mixer(const LayerWeights& L, size_t l, std::span<const QuerySpan> spans, size_t B) {
  const size_t d_inner = c.ssm_d_inner, conv_dim = c.ssm_conv_dim(), heads = c.ssm_n_heads, ds = c.ssm_d_state;
  const size_t ng = c.ssm_n_groups, d_conv = c.ssm_d_conv, ld = d_inner + conv_dim + heads;
  matmul(L.ssm_in, xb.data(), ssm_proj.data(), B);
  const auto* conv_w = static_cast<const float*>(L.ssm_conv1d.data);
  const auto* conv_b = static_cast<const float*>(L.ssm_conv1d_b.data);
  for (const QuerySpan& sp : spans) {
    if (sp.pos == 0) {  // a fresh sequence: no inputs before it, nothing folded in
      std::fill_n(state.conv(l, sp.seq), state.conv_floats(), 0.0f);
      std::fill_n(state.ssm(l, sp.seq), state.ssm_floats(), 0.0f);
    }
    float* rows = &ssm_proj[sp.row * ld];
    const ssm::Scan scan{rows + d_inner,
                         rows + 2 * d_inner,
                         rows + 2 * d_inner + ng * ds,
                         rows + d_inner + conv_dim,
                         ld,
                         static_cast<const float*>(L.ssm_a.data),
                         static_cast<const float*>(L.ssm_d.data),
                         static_cast<const float*>(L.ssm_dt_b.data),
                         heads,
                         d_inner / heads,
                         ds,
                         ng,
                         state.ssm(l, sp.seq),
                         &ssm_y[sp.row * d_inner],
                         d_inner};
    float* conv_state = state.conv(l, sp.seq);
    // Small work stays on the calling thread: waking the pool costs more.
    if (pool.size() == 1 || sp.n * d_inner * ds < 32 * 1024) {
      ssm::conv_silu(rows + d_inner, ld, sp.n, 0, conv_dim, conv_w, conv_b, d_conv, conv_state);
      ssm::scan(scan, sp.n, 0, heads);
    } else {
      pool.parallel_for(conv_dim, 16, [&](size_t c0, size_t c1) {
        ssm::conv_silu(rows + d_inner, ld, sp.n, c0, c1, conv_w, conv_b, d_conv, conv_state);
      });
      pool.parallel_for(heads, 1, [&](size_t h0, size_t h1) { ssm::scan(scan, sp.n, h0, h1); });
    }
  }
  prefetch_next({&L.ssm_out});
  const auto* norm_w = static_cast<const float*>(L.ssm_norm.data);
  const auto gate_norm_rows = [&](size_t b0, size_t b1) {
    for (size_t b = b0; b < b1; ++b) ssm::gate_norm(&ssm_y[b * d_inner], &ssm_proj[b * ld], norm_w, d_inner, ng, c.rms_eps);
  };
  rows_in_parallel(B, gate_norm_rows);
  matmul(L.ssm_out, ssm_y.data(), xb.data(), B);
}

}  // namespace kiln
