// The AVX2 and AVX-VNNI tables: the vector kernels and packed-weight entries of
// kernels/x86 over the AVX2 traits, plus this ISA's gemm and P V.
#include "kernels/tables.h"
#include "kernels/x86/avx2/gemm_packed.h"
#include "kernels/x86/avx2/vec.h"
#include "kernels/x86/vector_ops.h"

namespace kiln::kernels::avx2 {

void pv(const PvArgs& a);  // pv.cpp

namespace {

constexpr Ops kOps = x86::vector_table<Vec>({.isa = Isa::avx2, .gemm = gemm, .pv = pv});

#ifdef KILN_HAVE_AVXVNNI
// AVX2 plus AVX-VNNI: the same table but for the packed integer dots (vpdpbusd), so the
// weights are packed the same and activations prepared the same.
constexpr Ops kOpsVnni = x86::vector_table<Vec>({.isa = Isa::avxvnni, .gemm = gemm_vnni, .pv = pv});
#endif

}  // namespace
}  // namespace kiln::kernels::avx2

namespace kiln::kernels {
const Ops& avx2_ops() { return avx2::kOps; }
#ifdef KILN_HAVE_AVXVNNI
const Ops& avxvnni_ops() { return avx2::kOpsVnni; }
#endif
}  // namespace kiln::kernels
