#pragma once
// Weight unpacking of the packed layout (kernels/packed.h) that the x86 packed kernels
// share, written over a vector traits struct V (kernels/x86/avx2/vec.h,
// kernels/x86/avx512/vec.h): with 64-byte vectors a load spans a group's 16 rows, with
// 32-byte ones half of them. V has internal linkage, so every instantiation does too.
#include <cstdint>

#include "kernels/x86/vec_traits.h"

namespace kiln::kernels::x86 {

// Q6_K: the eight vectors of 6-bit weights (unsigned, q + 32) of one chunk, from its
// low nibbles ql (four vectors 64 bytes apart, two sub-blocks per byte) and its high
// bits qh (two vectors, 64 bytes apart, four 2-bit fields per byte).
template <VectorTraits V>
inline void q6_k_weights(const uint8_t* ql, const uint8_t* qh, typename V::I w[8]) {
  using I = typename V::I;
  const I low4 = V::set1_i8(0x0f), bits45 = V::set1_i8(0x30);
  const I h0 = V::load_i(qh), h1 = V::load_i(qh + 64);
#pragma GCC unroll 4
  for (int u = 0; u < 4; ++u) {
    const I l = V::load_i(ql + 64 * u);
    w[u] = l & low4;
    w[u + 4] = V::template shr16<4>(l) & low4;
  }
  // Bits 2s..2s+1 of the qh bytes become bits 4..5 (16-bit shifts are fine: the mask
  // drops whatever crossed from the neighbouring byte).
  w[0] = w[0] | (V::template shl16<4>(h0) & bits45);
  w[1] = w[1] | (V::template shl16<2>(h0) & bits45);
  w[2] = w[2] | (h0 & bits45);
  w[3] = w[3] | (V::template shr16<2>(h0) & bits45);
  w[4] = w[4] | (V::template shl16<4>(h1) & bits45);
  w[5] = w[5] | (V::template shl16<2>(h1) & bits45);
  w[6] = w[6] | (h1 & bits45);
  w[7] = w[7] | (V::template shr16<2>(h1) & bits45);
}

}  // namespace kiln::kernels::x86
