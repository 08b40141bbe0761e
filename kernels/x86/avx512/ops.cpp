// The AVX-512 table: the vector kernels and packed-weight entries of kernels/x86 over
// the AVX-512 traits, plus this ISA's gemm and P V.
#include "kernels/packed.h"
#include "kernels/tables.h"
#include "kernels/x86/avx512/gemm_packed.h"
#include "kernels/x86/avx512/vec.h"
#include "kernels/x86/vector_ops.h"

namespace kiln::kernels::avx512 {

void pv(const PvArgs& a);  // pv.cpp

namespace {

// This table also packs float weights (kernels/packed.h): gemm_float_packed reads them.
constexpr Ops make_ops() {
  Ops o = x86::vector_table<Vec>({.isa = Isa::avx512, .gemm = gemm, .pv = pv});
  o.packed_bytes = [](TensorType t, size_t rows, size_t k) -> size_t {
    return is_float_type(t) ? packed::tensor_bytes(t, rows, k) : x86::PackedActivations<Vec>::packed_bytes(t, rows, k);
  };
  return o;
}
constexpr Ops kOps = make_ops();

}  // namespace
}  // namespace kiln::kernels::avx512

namespace kiln::kernels {
const Ops& avx512_ops() { return avx512::kOps; }
}  // namespace kiln::kernels
