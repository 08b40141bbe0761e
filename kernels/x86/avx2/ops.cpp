// The AVX2 and AVX-VNNI tables: the vector kernels of kernels/x86/vector_ops.h over
// the AVX2 traits, plus this ISA's gemm, packing and P V.
#include "kernels/tables.h"
#include "kernels/x86/avx2/gemm_packed.h"
#include "kernels/x86/avx2/vec.h"
#include "kernels/x86/vector_ops.h"

namespace kiln::kernels::avx2 {

bool gemm_supports(TensorType t);
void gemm(const GemmArgs& a);
void pv(const PvArgs& a);  // pv.cpp
#ifdef KILN_HAVE_AVXVNNI
void gemm_vnni(const GemmArgs& a);
#endif

namespace {

constexpr Ops kOps = x86::vector_table<Vec>({
    .isa = Isa::avx2,
    .gemm_supports = gemm_supports,
    .gemm = gemm,
    .packed_bytes = packed_bytes,
    .prepared_bytes = prepared_bytes,
    .prepare = prepare,
    .pv = pv,
});

#ifdef KILN_HAVE_AVXVNNI
// AVX2 plus AVX-VNNI: the same table but for the packed integer dots (vpdpbusd), so the
// weights are packed the same and activations prepared the same.
constexpr Ops with_vnni_gemm(Ops ops) {
  ops.isa = Isa::avxvnni;
  ops.gemm = gemm_vnni;
  return ops;
}
constexpr Ops kOpsVnni = with_vnni_gemm(kOps);
#endif

}  // namespace
}  // namespace kiln::kernels::avx2

namespace kiln::kernels {
const Ops& avx2_ops() { return avx2::kOps; }
#ifdef KILN_HAVE_AVXVNNI
const Ops& avxvnni_ops() { return avx2::kOpsVnni; }
#endif
}  // namespace kiln::kernels
