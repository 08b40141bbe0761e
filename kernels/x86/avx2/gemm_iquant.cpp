// The avx2 table's gemm on IQ1..IQ3 and TQ1_0/TQ2_0 weights in the file's layout: the
// kernels of kernels/x86/iquant_gemm_avx2.h with vpmaddubsw + vpmaddwd.
#define KILN_IQ_VNNI 0
#include "kernels/x86/avx2/gemm_packed.h"
#include "kernels/x86/iquant_gemm_avx2.h"

namespace kiln::kernels::avx2 {

bool gemm_iquant(const GemmArgs& a) { return iq_gemm_dispatch(a); }

}  // namespace kiln::kernels::avx2
