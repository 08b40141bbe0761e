#pragma once
// The avx512 table's tiles for packed float weights (kernels/x86/gemm_float_packed.h), for
// both of its translation units: gemm_float_packed.cpp and, with vdpbf16ps for BF16,
// kernels/x86/avx512bf16. Prefill 3 groups x 8 activation rows (24 accumulators; one
// thread, F16, L2-resident: 163 GFLOP/s against 150 for 2 x 12 and 125 for 4 x 6; a
// transposed copy of the activations, one pointer instead of one per row, lost 95 ->
// 77-82 tok/s on mamba2-1b F16 pp512); decode 4 groups, 4 streams.
#include "kernels/x86/gemm_float_packed.h"

namespace kiln::kernels::avx512 {

inline constexpr x86::PackedFloatShape kPackedFloatShape{
    .small_groups = 4, .prefill_groups = 3, .prefill_rows = 8, .x_budget = 512 * 1024};

}  // namespace kiln::kernels::avx512
