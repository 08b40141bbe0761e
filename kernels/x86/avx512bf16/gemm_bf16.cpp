// The avx512 table's packed float tiles with vdpbf16ps for BF16, in a file of its own so
// that nothing else picks up an instruction CPUs with plain AVX-512 lack. One thread of a
// Zen 5, BF16 weights against 512 activation rows: 388 GFLOP/s at 5632 x 2048 and 417 at
// 2048 x 2048 against 198 and 203 with two FMAs a pair (the f32 FMA peak is ~215, the
// instruction's ~394; bench/RESULTS.md).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/x86/avx512bf16/gemm_bf16.h"

#include "kernels/x86/avx512/float_shape.h"
#include "kernels/x86/avx512/vec.h"

namespace kiln::kernels::avx512bf16 {
namespace {

struct DotInstruction {
  static constexpr bool kSplit = false;
  static __m512 step(__m512 acc, __m512i w, __m512i x) { return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x); }
};

}  // namespace

void gemm_float_packed(const GemmArgs& a) {
  x86::PackedFloatGemm<avx512::Vec, avx512::kPackedFloatShape, DotInstruction>::run(a);
}

}  // namespace kiln::kernels::avx512bf16
