// The avx2 (and avxvnni) table's gemm on packed float weights:
// kernels/x86/gemm_float_packed.h over 8 lanes and 16 registers, a group's record as two
// vectors. Prefill 1 group x 6 activation rows (12 accumulators, 2 weight vectors, 1
// broadcast: 15 registers); decode and small batches 2 groups.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/x86/gemm_float_packed.h"

#include "kernels/x86/avx2/gemm_packed.h"
#include "kernels/x86/avx2/vec.h"

namespace kiln::kernels::avx2 {

void gemm_float_packed(const GemmArgs& a) {
  x86::PackedFloatGemm<Vec, x86::PackedFloatShape{
                                .small_groups = 2, .prefill_groups = 1, .prefill_rows = 6, .x_budget = 256 * 1024}>::run(a);
}

}  // namespace kiln::kernels::avx2
