#pragma once
// The softmax of an attention row with a sink (Xiao et al. 2023's attention sink, learned
// per head as gpt-oss does): one more logit that takes its share of the denominator but
// adds no value, so the weights sum to less than 1 when the sink is large. Shared by the
// direct attention and the H2O score pass, which must weigh keys alike.
#include <algorithm>
#include <cmath>
#include <cstddef>

#include "kernels/kernels.h"

namespace kiln {

// x[0..n) = exp(x - m) / (sum exp(x - m) + exp(sink - m)), m the largest of x and the sink.
inline void softmax_with_sink(const kernels::Ops& ops, float* x, size_t n, float sink) {
  float max = sink;
  for (size_t j = 0; j < n; ++j) max = std::max(max, x[j]);
  const float sum = ops.exp_sum(x, n, max) + std::exp(sink - max);
  ops.scale(x, 1.0f / sum, n);
}

}  // namespace kiln
