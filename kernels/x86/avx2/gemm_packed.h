#pragma once
// The avx2 and avxvnni tables' gemm entries (gemm.cpp) and the packed-weight gemms
// behind them (packed_kernels.h; a.w_packed must be set). Declarations only (no
// intrinsics), so any TU may include it.
#include "kernels/kernels.h"

namespace kiln::kernels::avx2 {

void gemm(const GemmArgs& a);
// Quantized weights in the file's own layout (a MoE's experts stay mapped from the file)
// against 8-bit activations, vpmaddubsw + vpmaddwd (gemm_quant.cpp). False for a type or
// length it has no kernel for (the caller falls back to the scalar reference).
bool gemm_quant(const GemmArgs& a);
// Plain AVX2: integer dots by vpmaddubsw + vpmaddwd (gemm_packed.cpp).
void gemm_packed(const GemmArgs& a);
// Packed float weights (F32/F16/BF16, gemm_float_packed.cpp).
void gemm_float_packed(const GemmArgs& a);
// MXFP4 weights in the file's layout (gemm_mxfp4.cpp); false: not MXFP4 or k too long,
// nothing done.
bool gemm_mxfp4(const GemmArgs& a);
// IQ1..IQ3 and TQ1_0/TQ2_0 in the file's layout (gemm_iquant.cpp); false for other types.
bool gemm_iquant(const GemmArgs& a);
#ifdef KILN_HAVE_AVXVNNI
void gemm_vnni(const GemmArgs& a);
// AVX-VNNI: integer dots by the VEX vpdpbusd (gemm_packed_vnni.cpp, built with -mavxvnni;
// call only where the CPU has AVX-VNNI).
void gemm_packed_vnni(const GemmArgs& a);
// gemm_iquant with the VEX vpdpbusd (gemm_iquant_vnni.cpp, built with -mavxvnni).
bool gemm_iquant_vnni(const GemmArgs& a);
#endif

}  // namespace kiln::kernels::avx2
