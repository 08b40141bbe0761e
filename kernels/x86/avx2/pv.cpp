// The AVX2 P V (kernels/x86/pv.h); the AVX-VNNI table uses it too (no integer dots
// here). Tiles of up to 6 rows: 12 accumulators + 2 values + 1 broadcast of the 16
// registers.
#include "kernels/x86/avx2/vec.h"
#include "kernels/x86/pv.h"

namespace kiln::kernels::avx2 {

void pv(const PvArgs& a) { x86::PvKernel<Vec, 6>::pv(a); }

}  // namespace kiln::kernels::avx2
