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
// chunk by chunk, as FMAs from +0; a last partial chunk is zero padded; then hsum's tree, lane i plus lane i + half for half = kLanes/2
// down to 1 (both vec.h trees are exactly that). RB activation rows share each record
// load and NK records (NK x kLanes keys) each activation broadcast: RB x NK chains keep
// the FMA units busy with one load for every NK multiply-adds.
template <VectorTraits V, int RB, int NK, size_t K = 0>
void packed_dots_rows(const GemmArgs& a, const float* const* rec, size_t b, float* const* y_col, const size_t* n) {
  using F = typename V::F;
  constexpr size_t G = packed::kGroupRows, W = V::kLanes;
  const size_t k = K ? K : a.k;
  const size_t kw = k - k % W;
  const float* x = a.x + b * a.ldx;
  F part[RB][NK][W];
#pragma GCC unroll 16
  for (size_t l = 0; l < W; ++l) {
    F acc[RB][NK];
#pragma GCC unroll 8
    for (int j = 0; j < RB; ++j)
#pragma GCC unroll 4
      for (int h = 0; h < NK; ++h) acc[j][h] = F{};
    // Element c + l of each row; past k (the last, partial chunk) zeros, which add
    // fma(0, 0, partial).
    const auto chunk = [&](size_t c, bool in) __attribute__((always_inline)) {
      F w[NK];
#pragma GCC unroll 4
      for (int h = 0; h < NK; ++h) w[h] = in ? V::load(rec[h] + (c + l) * G) : F{};
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) {
        const F xb = V::set1(in ? x[j * a.ldx + c + l] : 0.0f);
#pragma GCC unroll 4
        for (int h = 0; h < NK; ++h) acc[j][h] = V::fmadd(w[h], xb, acc[j][h]);
      }
    };
    // A known k unrolls its chunks; an unknown one keeps a loop (unrolled, the 16 copies
    // of it spilled the accumulators: 44 -> 103 GFLOP/s at k = 100, one thread).
    if constexpr (K != 0) {
#pragma GCC unroll 8
      for (size_t c = 0; c < kw; c += W) chunk(c, true);
    } else {
#pragma GCC unroll 1
      for (size_t c = 0; c < kw; c += W) chunk(c, true);
    }
    if (kw < k) chunk(kw, kw + l < k);
#pragma GCC unroll 8
    for (int j = 0; j < RB; ++j)
#pragma GCC unroll 4
      for (int h = 0; h < NK; ++h) part[j][h][l] = acc[j][h];
  }
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j)
#pragma GCC unroll 4
    for (int h = 0; h < NK; ++h) {
      F* p = part[j][h];
#pragma GCC unroll 4
      for (size_t half = W / 2; half >= 1; half /= 2)
#pragma GCC unroll 8
        for (size_t i = 0; i < half; ++i) p[i] = p[i] + p[i + half];
      float* y = y_col[h] + (b + j) * a.ldy;
      if (n[h] == W) V::store(y, p[0]);
      else V::store_tail(y, p[0], n[h]);
    }
}

// RB activation rows at a time against NK records. A head dimension known when compiling
// (64, 128) lets the chunks unroll, so that the partials' chains interleave. One thread,
// 64 packed rows x 64 activation rows, against RB = 8 x NK = 1 (Zen 5, FMA peak 227
// GFLOP/s): k = 64 106 -> 135 GFLOP/s, 128 128 -> 137, 80 119 -> 132, 100 90 -> 120.
template <VectorTraits V, int NK>
void packed_dots_records(const GemmArgs& a, const float* const* rec, float* const* y_col, const size_t* n) {
  constexpr size_t RB = 4;
  size_t b = 0;
  if (a.k == 64)
    for (; b + RB <= a.n_batch; b += RB) packed_dots_rows<V, RB, NK, 64>(a, rec, b, y_col, n);
  else if (a.k == 128)
    for (; b + RB <= a.n_batch; b += RB) packed_dots_rows<V, RB, NK, 128>(a, rec, b, y_col, n);
  for (; b + RB <= a.n_batch; b += RB) packed_dots_rows<V, RB, NK>(a, rec, b, y_col, n);
  for (; b < a.n_batch; ++b) packed_dots_rows<V, 1, NK>(a, rec, b, y_col, n);
}

// NK consecutive kLanes-row slices (a group's halves, then the next group's) from row on.
template <VectorTraits V, int NK>
void packed_dots_slices(const GemmArgs& a, size_t row) {
  constexpr size_t G = packed::kGroupRows, W = V::kLanes;
  const size_t gbytes = packed::group_bytes(TensorType::F32, a.k);
  const float* rec[NK];
  float* y[NK];
  size_t n[NK];
  for (int h = 0; h < NK; ++h) {
    const size_t r = row + h * W;
    rec[h] = reinterpret_cast<const float*>(static_cast<const uint8_t*>(a.w) + r / G * gbytes) + r % G / W * W;
    y[h] = a.y + r, n[h] = a.r1 - r < W ? a.r1 - r : W;
  }
  packed_dots_records<V, NK>(a, rec, y, n);
}

// Four slices a pass where the registers hold 4 x 4 accumulators (32 vector registers),
// two where they hold 8 (16 registers).
template <VectorTraits V>
void gemm_packed_dots(const GemmArgs& a) {
  constexpr size_t W = V::kLanes, NK = W == 16 ? 4 : 2;
  size_t row = a.r0;
  for (; row + NK * W <= a.r1; row += NK * W) packed_dots_slices<V, NK>(a, row);
  if constexpr (NK == 4)
    if (row + 2 * W <= a.r1) packed_dots_slices<V, 2>(a, row), row += 2 * W;
  for (; row < a.r1; row += W) packed_dots_slices<V, 1>(a, row);
}

}  // namespace kiln::kernels::x86
