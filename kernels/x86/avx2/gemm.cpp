// AVX2 gemm: float weights by kernels/x86/gemm_float.h over 8 lanes and 16 registers
// (packed ones by gemm_float_packed.cpp), packed quantized weights by gemm_packed.cpp (or gemm_packed_vnni.cpp for the avxvnni
// table), Q8_0/Q4_0/Q4_K/Q6_K in the file's layout by gemm_quant.cpp, MXFP4 by
// gemm_mxfp4.cpp, other quantized weights by the scalar reference.
#include "kernels/kernels.h"
#include "kernels/tables.h"
#include "kernels/x86/avx2/gemm_packed.h"
#include "kernels/x86/avx2/vec.h"
#include "kernels/x86/gemm_float.h"

namespace kiln::kernels::avx2 {
namespace {

// 4 x 3 = 12 accumulators + 3 activations + 1 weight fill the 16 registers; no separate
// schedule for small batches.
constexpr x86::FloatGemmShape kShape{
    .max_rb = 3, .small_batch = 0, .x_budget = 256 * 1024, .prefill_rw = 4, .prefill_rb = 3};
using FloatGemm = x86::FloatGemm<Vec, kShape>;

}  // namespace

void gemm(const GemmArgs& a) {
  if (a.r0 >= a.r1 || a.n_batch == 0) return;
  if (a.w_packed) return is_float_type(a.w_type) ? gemm_float_packed(a) : gemm_packed(a);
  if (gemm_quant(a) || gemm_mxfp4(a) || gemm_iquant(a)) return;
  if (!FloatGemm::run(a)) scalar_ops().gemm(a);
}

#ifdef KILN_HAVE_AVXVNNI
// The avxvnni table's gemm: packed weights and the file-layout i-quants have integer
// kernels to speed up; the rest is the avx2 table's.
void gemm_vnni(const GemmArgs& a) {
  if (a.w_packed && !is_float_type(a.w_type)) return gemm_packed_vnni(a);
  if (gemm_iquant_vnni(a)) return;
  gemm(a);
}
#endif

}  // namespace kiln::kernels::avx2
