#pragma once
// The avx512 table's gemm entry (gemm.cpp) and the VNNI gemm on packed quantized weights
// behind it (gemm_packed.cpp; a.w_packed must be set).
#include "kernels/kernels.h"

namespace kiln::kernels::avx512 {

void gemm(const GemmArgs& a);
void gemm_packed(const GemmArgs& a);

}  // namespace kiln::kernels::avx512
