#include "kernels/bf16_dot.h"

#include <vector>

#include "kernels/packed.h"

namespace kiln::kernels::bf16_dot {

void reference_gemm(const GemmArgs& a) {
  constexpr size_t G = packed::kGroupRows;
  const size_t gbytes = a.w_group_bytes ? a.w_group_bytes : packed::group_bytes(TensorType::BF16, a.k);
  std::vector<uint16_t> x(a.k);
  for (size_t b = 0; b < a.n_batch; ++b) {
    for (size_t i = 0; i < a.k; ++i) x[i] = activation(a.x[b * a.ldx + i]);
    for (size_t r = a.r0; r < a.r1; ++r) {
      // Record j: 16 rows x (element 2j, element 2j + 1); row r's pair at slot r % 16.
      const auto* group = reinterpret_cast<const uint16_t*>(static_cast<const uint8_t*>(a.w) + r / G * gbytes);
      float acc = 0.0f;
      for (size_t j = 0; j < a.k / 2; ++j) {
        const uint16_t* pair = group + j * 2 * G + 2 * (r % G);
        acc = step(acc, pair[0], pair[1], x[2 * j], x[2 * j + 1]);
      }
      a.y[b * a.ldy + r] = acc;
    }
  }
}

}  // namespace kiln::kernels::bf16_dot
