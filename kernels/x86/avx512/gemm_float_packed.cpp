// The avx512 table's gemm on packed float weights: kernels/x86/gemm_float_packed.h over
// 16 lanes and 32 registers (shape: float_shape.h). BF16 goes to the vdpbf16ps tiles
// where the CPU has them (kernels/x86/avx512bf16).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/x86/avx512/float_shape.h"
#include "kernels/x86/avx512/gemm_packed.h"
#include "kernels/x86/avx512/vec.h"
#include "kernels/x86/avx512bf16/gemm_bf16.h"

namespace kiln::kernels::avx512 {

void gemm_float_packed(const GemmArgs& a) {
#ifdef KILN_HAVE_AVX512BF16
  // The same test as PackedActivations' choice of bf16 activations for the instruction.
  if (a.w_type == TensorType::BF16 && Vec::bf16_dot_instruction()) return avx512bf16::gemm_float_packed(a);
#endif
  x86::PackedFloatGemm<Vec, kPackedFloatShape>::run(a);
}

}  // namespace kiln::kernels::avx512
