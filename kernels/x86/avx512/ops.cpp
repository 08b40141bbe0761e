// The AVX-512 table: the vector kernels and packed-weight entries of kernels/x86 over
// the AVX-512 traits, plus this ISA's gemm and P V.
#include "kernels/tables.h"
#include "kernels/x86/avx512/gemm_packed.h"
#include "kernels/x86/avx512/vec.h"
#include "kernels/x86/vector_ops.h"

namespace kiln::kernels::avx512 {

void pv(const PvArgs& a);  // pv.cpp

namespace {

constexpr Ops kOps = x86::vector_table<Vec>({.isa = Isa::avx512, .gemm = gemm, .pv = pv});

}  // namespace
}  // namespace kiln::kernels::avx512

namespace kiln::kernels {
const Ops& avx512_ops() { return avx512::kOps; }
}  // namespace kiln::kernels
