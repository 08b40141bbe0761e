// The selective-scan kernel (kernels::Ops::ssm_update) of every ISA this CPU has against
// float64 and against the scalar table, on awkward lengths (tails of every width), and
// over many steps so that an error carried in the state would grow.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/kernels.h"

using namespace kiln::kernels;

namespace {

const size_t kSizes[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 257};

}  // namespace

TEST(SsmUpdate, EveryIsaMatchesFloat64AndScalarOverManySteps) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), decay_d(0.0f, 1.0f);
  for (Isa isa : available_isas()) {
    const Ops& t = *ops_for(isa);
    for (size_t n : kSizes) {
      SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n));
      std::vector<float> h(n), h_scalar(n);
      std::vector<double> h64(n);
      for (size_t j = 0; j < n; ++j) h64[j] = h[j] = h_scalar[j] = u(rng);
      double worst_y = 0, worst_h = 0;
      for (int step = 0; step < 20; ++step) {
        std::vector<float> B(n), C(n);
        for (size_t j = 0; j < n; ++j) B[j] = u(rng), C[j] = u(rng);
        const float decay = decay_d(rng), x_dt = u(rng);
        const float y = t.ssm_update(h.data(), B.data(), C.data(), decay, x_dt, n);
        const float y_scalar = ops_for(Isa::scalar)->ssm_update(h_scalar.data(), B.data(), C.data(), decay, x_dt, n);
        // The sum against the kernel's own new state (the state's drift is checked apart).
        double y_own = 0, scale = 0;
        for (size_t j = 0; j < n; ++j) {
          h64[j] = h64[j] * decay + double(x_dt) * B[j];
          y_own += double(h[j]) * C[j];
          scale += std::fabs(double(h[j]) * C[j]);
        }
        worst_y = std::max(worst_y, std::fabs(y - y_own) / (scale + 1e-30));
        EXPECT_NEAR(y, y_scalar, 1e-5 * (scale + 1e-30));
        for (size_t j = 0; j < n; ++j) {
          worst_h = std::max(worst_h, std::fabs(h[j] - h64[j]));
          EXPECT_NEAR(h[j], h_scalar[j], 1e-5);
        }
      }
      EXPECT_LT(worst_y, 1e-6);  // relative to the sum of |terms|: float rounding only
      EXPECT_LT(worst_h, 1e-5);  // 20 steps of float rounding against float64
    }
  }
}

// A head's rows at once give each row exactly ssm_update's state and sum (the forward
// pass relies on it: decode and prefill take the same path, and tests elsewhere compare
// against llama.cpp through it), for row counts around the kernels' groups of four.
TEST(SsmUpdate, RowsOfAHeadAreBitForBitTheRowKernel) {
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), decay_d(0.0f, 1.0f);
  for (Isa isa : available_isas()) {
    const Ops& t = *ops_for(isa);
    for (size_t n : {size_t{1}, size_t{17}, size_t{64}, size_t{129}}) {
      for (size_t rows : {size_t{1}, size_t{3}, size_t{4}, size_t{5}, size_t{9}}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + " n=" + std::to_string(n) + " rows=" + std::to_string(rows));
        std::vector<float> h(rows * n), B(n), C(n), x(rows), y(rows, NAN);
        for (float& v : h) v = u(rng);
        for (size_t j = 0; j < n; ++j) B[j] = u(rng), C[j] = u(rng);
        for (float& v : x) v = u(rng);
        const float decay = decay_d(rng), dt = decay_d(rng);
        std::vector<float> h_rows = h;
        t.ssm_update_rows(h_rows.data(), B.data(), C.data(), decay, dt, x.data(), y.data(), rows, n);
        for (size_t r = 0; r < rows; ++r) {
          const float want = t.ssm_update(h.data() + r * n, B.data(), C.data(), decay, x[r] * dt, n);
          EXPECT_EQ(std::bit_cast<uint32_t>(y[r]), std::bit_cast<uint32_t>(want)) << "row " << r;
        }
        for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(std::bit_cast<uint32_t>(h_rows[i]), std::bit_cast<uint32_t>(h[i])) << i;
      }
    }
  }
}
