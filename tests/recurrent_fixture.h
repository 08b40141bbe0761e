#pragma once
// What the recurrent families' tests (mamba2_test, granite_hybrid_test, recurrent_test)
// share: their small sessions, deterministic token lists, and logit comparisons.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "kiln/session.h"

namespace kiln::test {

// A context of 128 on 2 threads: room for every test's prompt and replies.
inline SessionParams recurrent_params(KvLayout layout = KvLayout::contiguous, int32_t n_batch = 512) {
  SessionParams p;
  p.n_ctx = 128, p.n_batch = n_batch, p.n_threads = 2, p.kv_layout = layout;
  return p;
}

// n token ids spread over the GPT-NeoX vocabulary, a different list per seed.
inline std::vector<int32_t> spread_tokens(size_t n, int32_t seed = 1) {
  std::vector<int32_t> t;
  for (size_t i = 0; i < n; ++i) t.push_back(int32_t((seed * 7919 + i * 104729) % 50000));
  return t;
}

inline std::vector<float> copy(std::span<const float> s) { return {s.begin(), s.end()}; }

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, double(std::fabs(a[i] - b[i])));
  return worst;
}

// Two runs of the same tokens through different paths: equal up to float summation order.
inline void expect_same(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_LT(max_diff(got, want), 1e-4) << what;
}

}  // namespace kiln::test
