// The avx512 table's gemm on packed float weights: kernels/x86/gemm_float_packed.h over
// 16 lanes and 32 registers. Prefill 3 groups x 8 activation rows (24 accumulators; one
// thread, F16, L2-resident: 163 GFLOP/s against 150 for 2 x 12 and 125 for 4 x 6; a
// transposed copy of the activations, one pointer instead of one per row, lost 95 ->
// 77-82 tok/s on mamba2-1b F16 pp512); decode 4 groups, 4 streams.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/x86/gemm_float_packed.h"

#include "kernels/x86/avx512/gemm_packed.h"
#include "kernels/x86/avx512/vec.h"

namespace kiln::kernels::avx512 {

void gemm_float_packed(const GemmArgs& a) {
  x86::PackedFloatGemm<Vec, x86::PackedFloatShape{
                                .small_groups = 4, .prefill_groups = 3, .prefill_rows = 8, .x_budget = 512 * 1024}>::run(a);
}

}  // namespace kiln::kernels::avx512
