#pragma once
// AMX-INT8 prefill for packed Q8_0, Q4_0, IQ4_NL and Q4_K weights: 16 activation rows x 16
// weight rows per tile instruction instead of one vpdpbusd's 16 lanes. Internal to
// kernels/; the AVX-512 packed gemm hands it whole 16-row runs of activations.
#include <cstddef>

#include "kernels/kernels.h"

namespace kiln::kernels::amx {

// True when this CPU has AMX-TILE and AMX-INT8, the kernel granted this process the tile
// state (arch_prctl), and KILN_AMX is not 0. Decided once.
bool usable();

bool supports(TensorType w_type);

// Packed gemm rows [a.r0, a.r1) of a.w (a type supports() accepts) for activation rows
// [b0, b1), b1 - b0 a multiple of 16, whose prepared activations start at act (row b0).
// Every output is bit for bit what the AVX-512 VNNI tile gives it: the same exact
// integer block sums, then the same float operations in the same order.
void run_packed(const GemmArgs& a, const void* act, size_t b0, size_t b1);

}  // namespace kiln::kernels::amx
