#pragma once
// Packed BF16 weights by AVX512-BF16's vdpbf16ps (kernels/bf16_dot.h): 32 multiply-adds an
// instruction where an f32 FMA does 16. Internal to kernels/: the avx512 table's packed
// float gemm hands BF16 weights here when g_enabled.
#include "kernels/kernels.h"

namespace kiln::kernels::avx512bf16 {

// The CPU has AVX512-BF16 (CPUID 7.1 EAX bit 5) beside the avx512 table's features, this
// build compiled the tiles, and KILN_BF16_DOT is not 0. Set before main (kernels/dispatch.cpp);
// tests may switch it between calls to check both ways give the same bits.
extern bool g_enabled;

// PackedFloatGemm's run for packed BF16 weights, rows [a.r0, a.r1).
void gemm_float_packed(const GemmArgs& a);

}  // namespace kiln::kernels::avx512bf16
