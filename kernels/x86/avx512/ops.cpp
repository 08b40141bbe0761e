// The AVX-512 table: the vector kernels of kernels/x86/vector_ops.h over the AVX-512
// traits, plus this ISA's gemm, packing and P V.
#include "kernels/tables.h"
#include "kernels/x86/avx512/gemm_packed.h"
#include "kernels/x86/avx512/vec.h"
#include "kernels/x86/vector_ops.h"

namespace kiln::kernels::avx512 {

bool gemm_supports(TensorType t);
void gemm(const GemmArgs& a);
void pv(const PvArgs& a);  // pv.cpp

namespace {

constexpr Ops kOps = x86::vector_table<Vec>({
    .isa = Isa::avx512,
    .gemm_supports = gemm_supports,
    .gemm = gemm,
    .packed_bytes = packed_bytes,
    .prepared_bytes = prepared_bytes,
    .prepare = prepare,
    .pv = pv,
});

}  // namespace
}  // namespace kiln::kernels::avx512

namespace kiln::kernels {
const Ops& avx512_ops() { return avx512::kOps; }
}  // namespace kiln::kernels
