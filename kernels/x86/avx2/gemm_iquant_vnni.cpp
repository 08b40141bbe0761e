// The avxvnni table's gemm on IQ1..IQ3 and TQ1_0/TQ2_0 weights in the file's layout: the
// kernels of kernels/x86/iquant_gemm_avx2.h with the VEX vpdpbusd. Built with -mavxvnni
// (kernels/CMakeLists.txt) and reached only through the avxvnni table, as
// gemm_packed_vnni.cpp.
#define KILN_IQ_VNNI 1
#include "kernels/x86/avx2/gemm_packed.h"
#include "kernels/x86/iquant_gemm_avx2.h"

namespace kiln::kernels::avx2 {

bool gemm_iquant_vnni(const GemmArgs& a) { return iq_gemm_dispatch(a); }

}  // namespace kiln::kernels::avx2
