#pragma once
// AVX2 kernels on packed quantized weights (kernels/packed.h): the Ops entries of the
// avx2 and avxvnni tables. Declarations only (no intrinsics), so any TU may include it.
#include <cstddef>

#include "kernels/kernels.h"

namespace kiln::kernels::avx2 {

// Stack space of the path that converts activations itself (no x_prepared): at least
// one row, which bounds the k that packing accepts (~130k, beyond any model's width).
inline constexpr size_t kPreparedStackBytes = 160 * 1024;

// Shared by both tables: the layout and the activation formats are the same.
size_t packed_bytes(TensorType t, size_t rows, size_t k);
size_t prepared_bytes(TensorType w_type, size_t k, size_t n_batch);
void prepare(TensorType w_type, const float* x, size_t ldx, size_t k, size_t b0, size_t b1, void* out);

// a.w_packed must be set; a.x_prepared may be null (then activations are quantized here).
// Plain AVX2: integer dots by vpmaddubsw + vpmaddwd (gemm_packed.cpp).
void gemm_packed(const GemmArgs& a);
#ifdef KILN_HAVE_AVXVNNI
// AVX-VNNI: integer dots by the VEX vpdpbusd (gemm_packed_vnni.cpp, built with -mavxvnni;
// call only where the CPU has AVX-VNNI).
void gemm_packed_vnni(const GemmArgs& a);
#endif

}  // namespace kiln::kernels::avx2
