#pragma once
// AVX-512 VNNI kernels on packed quantized weights (kernels/packed.h); the Ops entries
// of the avx512 table.
#include <cstddef>

#include "kernels/kernels.h"

namespace kiln::kernels::avx512 {

// Stack space of the path that converts activations itself (no x_prepared): at least
// one row, which bounds the k that packing accepts (~130k, beyond any model's width).
inline constexpr size_t kPreparedStackBytes = 160 * 1024;

size_t packed_bytes(TensorType t, size_t rows, size_t k);
size_t prepared_bytes(TensorType w_type, size_t k, size_t n_batch);
void prepare(TensorType w_type, const float* x, size_t ldx, size_t k, size_t b0, size_t b1, void* out);
// a.w_packed must be set; a.x_prepared may be null (then activations are quantized here).
void gemm_packed(const GemmArgs& a);

}  // namespace kiln::kernels::avx512
