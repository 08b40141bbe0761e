// The mixture-of-experts FFN (Shazeer et al. 2017; Mixtral, Qwen3-MoE): a router scores
// every expert for each token, the top n_experts_used run as SwiGLU FFNs, and the token's
// output is their sum weighted by the router's softmax (renormalized over the chosen ones
// when the model says so). A batch is grouped by expert, so each chosen expert's
// matrices are read once for all the tokens routed to it, and an expert no token chose
// is not read at all.
//
// Each token's result depends only on its own row: its experts and their order come from
// its router scores alone, and the weighted sum runs in that order whatever the batch.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/forward.h"

namespace kiln {

void Forward::moe_ffn(const LayerWeights& L, size_t B) {
  const size_t dim = c.dim, ffn = c.expert_ffn_dim, n_exp = c.n_experts, n_used = c.n_experts_used;
  matmul(L.ffn_gate_inp, xb.data(), router.data(), B);

  // Routing: softmax over all experts, the n_used most probable (ties: the lower index),
  // in descending order.
  std::vector<int32_t>& order = expert_order;
  for (size_t b = 0; b < B; ++b) {
    float* p = &router[b * n_exp];
    const float max = *std::max_element(p, p + n_exp);
    double sum = 0;
    for (size_t e = 0; e < n_exp; ++e) sum += (p[e] = std::exp(p[e] - max));
    for (size_t e = 0; e < n_exp; ++e) p[e] = float(p[e] / sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(n_used), order.end(),
                      [&](int32_t a, int32_t z) { return p[a] > p[z] || (p[a] == p[z] && a < z); });
    double chosen = 0;
    for (size_t j = 0; j < n_used; ++j) chosen += p[order[j]];
    for (size_t j = 0; j < n_used; ++j) {
      route_expert[b * n_used + j] = order[j];
      route_weight[b * n_used + j] = c.expert_weights_norm ? float(p[order[j]] / chosen) : p[order[j]];
    }
  }

  // Each chosen expert once, on the rows routed to it.
  for (size_t e = 0; e < n_exp; ++e) {
    size_t n = 0;
    for (size_t b = 0; b < B; ++b)
      for (size_t j = 0; j < n_used; ++j)
        if (route_expert[b * n_used + j] == int32_t(e)) {
          expert_rows[n] = uint32_t(b * n_used + j);
          std::copy_n(&xb[b * dim], dim, &expert_in[n * dim]);
          ++n;
        }
    if (n == 0) continue;
    matmuls(expert_in.data(), n, {{L.gate_exps[e], hb.data()}, {L.up_exps[e], hb2.data()}});
    for (size_t i = 0; i < n; ++i) ops.swiglu(&hb[i * ffn], &hb2[i * ffn], &hb[i * ffn], ffn);
    matmul(L.down_exps[e], hb.data(), expert_y.data(), n);
    for (size_t i = 0; i < n; ++i) std::copy_n(&expert_y[i * dim], dim, &expert_out[size_t(expert_rows[i]) * dim]);
  }

  for (size_t b = 0; b < B; ++b) {
    float* out = &xb[b * dim];
    std::fill_n(out, dim, 0.0f);
    for (size_t j = 0; j < n_used; ++j) {
      const float w = route_weight[b * n_used + j];
      const float* y = &expert_out[(b * n_used + j) * dim];
      for (size_t i = 0; i < dim; ++i) out[i] += w * y[i];
    }
  }
}

}  // namespace kiln
