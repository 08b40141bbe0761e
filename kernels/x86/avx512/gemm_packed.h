#pragma once
// The avx512 table's gemm entry (gemm.cpp) and the VNNI gemm on packed quantized weights
// behind it (gemm_packed.cpp; a.w_packed must be set), and the one on packed floats.
#include "kernels/kernels.h"

namespace kiln::kernels::avx512 {

void gemm(const GemmArgs& a);
void gemm_packed(const GemmArgs& a);
// Packed float weights (F32/F16/BF16, gemm_float_packed.cpp).
void gemm_float_packed(const GemmArgs& a);
// Quantized weights in the file's layout (gemm_file_vnni.cpp); false (nothing done) for
// the types and widths it does not take.
bool gemm_file_vnni(const GemmArgs& a);
// IQ1..IQ3 and TQ1_0/TQ2_0 in the file's layout (gemm_iquant.cpp); false for other types.
bool gemm_iquant(const GemmArgs& a);

}  // namespace kiln::kernels::avx512
