// AVX-VNNI gemm on packed quantized weights: the kernels of packed_kernels.h with the
// VEX-encoded vpdpbusd on ymm. This file alone is built with -mavxvnni
// (kernels/CMakeLists.txt) and runs only through the avxvnni table, which dispatch.cpp
// offers when CPUID says the CPU has AVX-VNNI, so the avx2 table stays runnable on
// CPUs without it. Activations are prepared as in the avx2 table (kernels/x86/packed_entry.h).
#define KILN_PACKED_VNNI 1
#include "kernels/x86/avx2/packed_kernels.h"

namespace kiln::kernels::avx2 {

void gemm_packed_vnni(const GemmArgs& a) { gemm_packed_impl(a); }

}  // namespace kiln::kernels::avx2
