#pragma once
// Ops::gemm_packed_dots over a vector traits struct V, instantiated by each ISA's table
// (kernels/x86/vector_ops.h) with that ISA's flags.
//
// Why: attention's Q K^T is a gemm whose k is a head dimension (64 on the Llama shapes).
// The file layout's tile (kernels/x86/gemm_float.h) then pays a horizontal sum and a
// scalar store for every 4 vector FMAs of products (1.1B Q4_0 pp512: 12% of the time).
// With the keys packed (a record holds one dimension of 16 keys) the same partial sums
// are vectors over keys: the products need no shuffles and hsum's tree becomes kLanes - 1
// vertical adds. The arithmetic is the file tile's, operation for operation, so a score
// has the same bits whichever way it was computed (decode keeps the file layout).
#include <cstddef>
#include <cstdint>

#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "kernels/x86/vec_traits.h"

namespace kiln::kernels::x86 {

// FloatGemm's order per output: partial l (of kLanes) takes elements c * kLanes + l,
// chunk by chunk, as FMAs from +0; a last partial chunk is zero padded (its missing lanes
// add fma(0, 0, partial)); then hsum's tree, lane i plus lane i + half for half = kLanes/2
// down to 1 (both vec.h trees are exactly that). RB activation rows share each record
// load: RB chains per partial keep the FMA units busy.
template <VectorTraits V, int RB>
void packed_dots_rows(const GemmArgs& a, const float* rec, size_t b, float* y_col, size_t n) {
  using F = typename V::F;
  constexpr size_t G = packed::kGroupRows, W = V::kLanes;
  const size_t kw = a.k - a.k % W;
  const float* x = a.x + b * a.ldx;
  F part[RB][W];
#pragma GCC unroll 16
  for (size_t l = 0; l < W; ++l) {
    F acc[RB];
#pragma GCC unroll 8
    for (int j = 0; j < RB; ++j) acc[j] = F{};
    for (size_t c = 0; c < kw; c += W) {
      const F w = V::load(rec + (c + l) * G);
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) acc[j] = V::fmadd(w, V::set1(x[j * a.ldx + c + l]), acc[j]);
    }
    if (kw < a.k) {
      const bool in = kw + l < a.k;
      const F w = in ? V::load(rec + (kw + l) * G) : F{};
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) acc[j] = V::fmadd(w, V::set1(in ? x[j * a.ldx + kw + l] : 0.0f), acc[j]);
    }
#pragma GCC unroll 8
    for (int j = 0; j < RB; ++j) part[j][l] = acc[j];
  }
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j) {
#pragma GCC unroll 4
    for (size_t half = W / 2; half >= 1; half /= 2)
#pragma GCC unroll 8
      for (size_t i = 0; i < half; ++i) part[j][i] = part[j][i] + part[j][i + half];
    float* y = y_col + (b + j) * a.ldy;
    if (n == W) V::store(y, part[j][0]);
    else V::store_tail(y, part[j][0], n);
  }
}

template <VectorTraits V>
void gemm_packed_dots(const GemmArgs& a) {
  constexpr size_t G = packed::kGroupRows, W = V::kLanes, kHalves = G / W, RB = 8;
  const size_t gbytes = packed::group_bytes(TensorType::F32, a.k);
  for (size_t r = a.r0; r < a.r1; r += G) {
    const float* group = reinterpret_cast<const float*>(static_cast<const uint8_t*>(a.w) + r / G * gbytes);
    for (size_t h = 0; h < kHalves; ++h) {
      const size_t row = r + h * W;
      if (row >= a.r1) break;
      const size_t n = a.r1 - row < W ? a.r1 - row : W;
      const float* rec = group + h * W;  // element i of these W rows: rec + i * G
      size_t b = 0;
      for (; b + RB <= a.n_batch; b += RB) packed_dots_rows<V, RB>(a, rec, b, a.y + row, n);
      for (; b < a.n_batch; ++b) packed_dots_rows<V, 1>(a, rec, b, a.y + row, n);
    }
  }
}

}  // namespace kiln::kernels::x86
