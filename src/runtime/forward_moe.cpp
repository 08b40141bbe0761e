// The mixture-of-experts FFN (Shazeer et al. 2017; Mixtral, Qwen3-MoE): a router scores
// every expert for each token, the top n_experts_used run as SwiGLU FFNs (clamped, with
// biases: gpt-oss), and the token's output is their sum weighted by the router's softmax
// (renormalized over the chosen ones when the model says so, or over the chosen logits). A batch is grouped by expert, so each chosen expert's
// matrices are read once for all the tokens routed to it, and an expert no token chose
// is not read at all. A shared expert (Granite 4.0-H) runs on every token and is added to
// the routed sum.
//
// Each token's result depends only on its own row: its experts and their order come from
// its router scores alone, and the weighted sum runs in that order whatever the batch.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "runtime/forward.h"
#include "runtime/swiglu_clamped.h"

namespace kiln {

void Forward::moe_ffn(const LayerWeights& L, size_t B) {
  const size_t dim = c.dim, ffn = c.expert_ffn_dim, n_exp = c.n_experts, n_used = c.n_experts_used;
  // The shared expert first: it reads xb, which the routed sum overwrites, and hb/hb2 are
  // free until the routed experts take them.
  if (L.gate_shexp) {
    const size_t sh = c.shared_expert_ffn_dim;
    matmuls(xb.data(), B, {{L.gate_shexp, hb.data()}, {L.up_shexp, hb2.data()}});
    for (size_t b = 0; b < B; ++b) ops.swiglu(&hb[b * sh], &hb2[b * sh], &hb[b * sh], sh);
    matmul(L.down_shexp, hb.data(), shexp_y.data(), B);
  }
  matmul(L.ffn_gate_inp, xb.data(), router.data(), B);
  add_bias(router.data(), L.ffn_gate_inp_b, n_exp, B);

  // Routing: the n_used experts of highest score (ties: the lower index), in descending
  // order. Scores are the softmax over all experts, the chosen ones' weights renormalized
  // or not; or (expert_softmax_chosen) the router logits themselves, the same ranking,
  // weighted by the softmax over the chosen logits alone.
  std::vector<int32_t>& order = expert_order;
  for (size_t b = 0; b < B; ++b) {
    float* p = &router[b * n_exp];
    if (!c.expert_softmax_chosen) {
      const float max = *std::max_element(p, p + n_exp);
      double sum = 0;
      for (size_t e = 0; e < n_exp; ++e) sum += (p[e] = std::exp(p[e] - max));
      for (size_t e = 0; e < n_exp; ++e) p[e] = float(p[e] / sum);
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + ptrdiff_t(n_used), order.end(),
                      [&](int32_t a, int32_t z) { return p[a] > p[z] || (p[a] == p[z] && a < z); });
    float* w = &route_weight[b * n_used];
    for (size_t j = 0; j < n_used; ++j) route_expert[b * n_used + j] = order[j], w[j] = p[order[j]];
    if (c.expert_softmax_chosen) {
      double sum = 0;
      for (size_t j = 0; j < n_used; ++j) sum += (w[j] = std::exp(w[j] - p[order[0]]));  // order[0]: the max
      for (size_t j = 0; j < n_used; ++j) w[j] = float(w[j] / sum);
    } else if (c.expert_weights_norm) {
      double chosen = 0;
      for (size_t j = 0; j < n_used; ++j) chosen += w[j];
      for (size_t j = 0; j < n_used; ++j) w[j] = float(w[j] / chosen);
    }
  }

  if (B == 1) {  // the gate and up job below, whose matrices come in expert order
    int32_t chosen[ThreadPool::kMaxHints / 2];
    const size_t m = std::min(n_used, ThreadPool::kMaxHints / 2);
    std::partial_sort_copy(route_expert.begin(), route_expert.begin() + ptrdiff_t(n_used), chosen, chosen + m);
    const WeightView* next[ThreadPool::kMaxHints];
    for (size_t j = 0; j < m; ++j) next[2 * j] = &L.gate_exps[size_t(chosen[j])], next[2 * j + 1] = &L.up_exps[size_t(chosen[j])];
    prefetch_next({next, 2 * m});
  }
  // Group the (token, choice) pairs by expert, then run every chosen expert's gate and up
  // as one pool job and every down as another: a decoding token's eight small experts
  // cost two hand-offs to the threads, not sixteen.
  std::fill(expert_start.begin(), expert_start.end(), 0u);
  for (size_t i = 0; i < B * n_used; ++i) ++expert_start[size_t(route_expert[i]) + 1];
  for (size_t e = 0; e < n_exp; ++e) expert_start[e + 1] += expert_start[e];
  for (size_t e = 0; e < n_exp; ++e) expert_order[e] = int32_t(expert_start[e]);  // next free row
  for (size_t b = 0; b < B; ++b)
    for (size_t j = 0; j < n_used; ++j) {
      const uint32_t row = uint32_t(expert_order[size_t(route_expert[b * n_used + j])]++);
      route_row[b * n_used + j] = row;
      std::copy_n(&xb[b * dim], dim, &expert_in[size_t(row) * dim]);
    }
  const auto each_chosen_expert = [&](auto&& add_jobs) {
    expert_jobs.clear();
    for (size_t e = 0; e < n_exp; ++e)
      if (const size_t n = expert_start[e + 1] - expert_start[e]) add_jobs(e, size_t(expert_start[e]), n);
    gemms(expert_jobs);
  };
  each_chosen_expert([&](size_t e, size_t row0, size_t n) {
    expert_jobs.push_back({&L.gate_exps[e], &expert_in[row0 * dim], n, &hb[row0 * ffn], int64_t(e)});
    expert_jobs.push_back({&L.up_exps[e], &expert_in[row0 * dim], n, &hb2[row0 * ffn], int64_t(e)});
  });
  if (B == 1) {
    const WeightView* next[ThreadPool::kMaxHints];
    size_t n = 0;
    for (size_t e = 0; e < n_exp && n < ThreadPool::kMaxHints; ++e)
      if (expert_start[e + 1] > expert_start[e]) next[n++] = &L.down_exps[e];
    prefetch_next({next, n});
  }
  // Expert e's biases (row e of each bias tensor) on the rows routed to it.
  const auto add_expert_bias = [&](const WeightView& bias, float* y, size_t width) {
    if (!bias) return;
    for (size_t e = 0; e < n_exp; ++e) {
      const float* be = static_cast<const float*>(bias.data) + e * width;
      for (size_t r = expert_start[e]; r < expert_start[e + 1]; ++r) ops.add(y + r * width, be, y + r * width, width);
    }
  };
  add_expert_bias(L.gate_exps_b, hb.data(), ffn);
  add_expert_bias(L.up_exps_b, hb2.data(), ffn);
  if (c.ffn == Ffn::swiglu_clamped)
    swiglu_clamped(hb.data(), hb2.data(), hb.data(), B * n_used * ffn, c.swiglu_alpha, c.swiglu_limit);
  else
    for (size_t r = 0; r < B * n_used; ++r) ops.swiglu(&hb[r * ffn], &hb2[r * ffn], &hb[r * ffn], ffn);
  each_chosen_expert([&](size_t e, size_t row0, size_t n) {
    expert_jobs.push_back({&L.down_exps[e], &hb[row0 * ffn], n, &expert_y[row0 * dim], int64_t(e)});
  });
  add_expert_bias(L.down_exps_b, expert_y.data(), dim);

  for (size_t b = 0; b < B; ++b) {
    float* out = &xb[b * dim];
    std::fill_n(out, dim, 0.0f);
    for (size_t j = 0; j < n_used; ++j) {
      const float w = route_weight[b * n_used + j];
      const float* y = &expert_y[size_t(route_row[b * n_used + j]) * dim];
      for (size_t i = 0; i < dim; ++i) out[i] += w * y[i];
    }
    if (L.gate_shexp) ops.add(out, &shexp_y[b * dim], out, dim);  // ungated (Granite)
  }
}

}  // namespace kiln
