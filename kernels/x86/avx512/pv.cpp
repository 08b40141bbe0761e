// The AVX-512 P V (kernels/x86/pv.h). Tiles of up to 8 rows: 16 accumulators + 2 values
// + 1 broadcast of the 32 registers.
#include "kernels/x86/avx512/vec.h"
#include "kernels/x86/pv.h"

namespace kiln::kernels::avx512 {

void pv(const PvArgs& a) { x86::PvKernel<Vec, 8>::pv(a); }

}  // namespace kiln::kernels::avx512
