// The selective-scan kernel (kernels::Ops::ssm_update) of every ISA this CPU has against
// float64 and against the scalar table, on awkward lengths (tails of every width), and
// over many steps so that an error carried in the state would grow.
#include <gtest/gtest.h>

#include <cmath>
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
