#pragma once
// gemm on packed float weights (F32, F16, BF16; layout: kernels/packed.h), written once
// over a vector traits struct V and instantiated in each ISA's gemm_float_packed.cpp,
// compiled with that ISA's flags (V has internal linkage, so every instantiation does
// too). A record holds one column of 16 rows, 16 / V::kLanes vectors: each one widened to
// f32 times one broadcast activation advances kLanes outputs, which stay in their lanes to
// the end: no horizontal sums, and results are stored as vectors.
//
// Why: the file layout's dot-product tile (kernels/x86/gemm_float.h) converts 6 weight
// vectors per 24 FMAs and sums its accumulators horizontally per tile; on AVX-512 it ran
// prefill at about half of the f32 FMA peak (bench/RESULTS.md). A packed prefill tile of 3
// groups x 8 activation rows converts 3 weight vectors per 24 FMAs.
//
// Determinism: every output is one FMA chain over k in order, whatever the tile, the
// group's place in [r0, r1) or the batch size: decode equals batch, and no split of rows
// or batches changes a bit.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "kernels/x86/vec_traits.h"

namespace kiln::kernels::x86 {

// An ISA's tiles: groups of 16 rows per decode / small-batch tile (up to 3 activation
// rows: bandwidth bound, one stream per group), and the prefill tile of prefill_groups x
// prefill_rows, swept over blocks of activation rows that stay in L2 (x_budget bytes).
struct PackedFloatShape {
  int small_groups, prefill_groups, prefill_rows;
  size_t x_budget;
};

template <VectorTraits V, PackedFloatShape S>
class PackedFloatGemm {
  using F = typename V::F;
  static constexpr size_t G = packed::kGroupRows, W = V::kLanes, kHalves = G / W;
  static constexpr int kMaxNg = S.small_groups > S.prefill_groups ? S.small_groups : S.prefill_groups;
  static constexpr int kMaxNb = S.prefill_rows > 3 ? S.prefill_rows : 3;

  template <TensorType T>
  static F widen(const uint8_t* p) {
    if constexpr (T == TensorType::F32) return V::load(reinterpret_cast<const float*>(p));
    else if constexpr (T == TensorType::F16) return V::from_fp16(V::load_h(reinterpret_cast<const uint16_t*>(p)));
    else return V::from_bf16(V::load_h(reinterpret_cast<const uint16_t*>(p)));
  }

  // NG groups of 16 rows (the first at row r, every one whole but maybe the last) against
  // NB activation rows from b. Decode reads NG streams; the lines it reads 2 KiB further
  // on are prefetched.
  template <TensorType T, int NG, int NB>
  static void tile(const GemmArgs& a, size_t r, size_t b) {
    constexpr size_t R = packed::record_bytes(T), kVecBytes = R / kHalves;
    const size_t gbytes = packed::group_bytes(T, a.k);
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + r / G * gbytes;
    const float* x = a.x + b * a.ldx;
    F acc[NG * kHalves][NB];
#pragma GCC unroll 8
    for (size_t v = 0; v < NG * kHalves; ++v)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[v][j] = F{};
    for (size_t i = 0; i < a.k; ++i) {
      const uint8_t* rec = w + i * R;
      if constexpr (NB <= 3)
        if (i * R % 64 == 0)
#pragma GCC unroll 4
          for (int g = 0; g < NG; ++g) __builtin_prefetch(rec + g * gbytes + 2048);
      F wv[NG * kHalves];
#pragma GCC unroll 8
      for (size_t v = 0; v < NG * kHalves; ++v) wv[v] = widen<T>(rec + v / kHalves * gbytes + v % kHalves * kVecBytes);
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) {
        const F xb = V::set1(x[j * a.ldx + i]);
#pragma GCC unroll 8
        for (size_t v = 0; v < NG * kHalves; ++v) acc[v][j] = V::fmadd(wv[v], xb, acc[v][j]);
      }
    }
#pragma GCC unroll 8
    for (size_t v = 0; v < NG * kHalves; ++v) {
      const size_t row = r + v * W;  // the vector's first row
      if (row >= a.r1) continue;
      const size_t n = a.r1 - row < W ? a.r1 - row : W;
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) {
        float* y = a.y + (b + j) * a.ldy + row;
        if (n == W) V::store(y, acc[v][j]);
        else V::store_tail(y, acc[v][j], n);
      }
    }
  }

  using TileFn = void (*)(const GemmArgs&, size_t, size_t);
  template <TensorType T, int NG, int... Nbs>
  static constexpr void fill(TileFn* out, std::integer_sequence<int, Nbs...>) {
    ((out[Nbs + 1] = &tile<T, NG, Nbs + 1>), ...);
  }
  // tile<T, ng, nb> as by_shape[ng][nb].
  template <TensorType T>
  struct Tiles {
    TileFn by_shape[kMaxNg + 1][kMaxNb + 1] = {};
    template <int... Ngs>
    constexpr void fill_all(std::integer_sequence<int, Ngs...>) {
      (fill<T, Ngs + 1>(by_shape[Ngs + 1], std::make_integer_sequence<int, kMaxNb>{}), ...);
    }
    constexpr Tiles() { fill_all(std::make_integer_sequence<int, kMaxNg>{}); }
  };

  // The last groups of [r0, r1) take a tile of exactly their number.
  template <TensorType T>
  static void run_type(const GemmArgs& a) {
    static constexpr Tiles<T> kTiles;
    const bool small = a.n_batch <= 3;
    const size_t groups_per_tile = size_t(small ? S.small_groups : S.prefill_groups);
    const size_t nb_tile = small ? a.n_batch : size_t(S.prefill_rows);
    size_t block = a.n_batch;
    if (!small) block = S.x_budget / (a.k * sizeof(float) + 1) / nb_tile * nb_tile + nb_tile;
    for (size_t b0 = 0; b0 < a.n_batch; b0 += block) {
      const size_t b1 = b0 + block < a.n_batch ? b0 + block : a.n_batch;
      for (size_t r = a.r0; r < a.r1; r += groups_per_tile * G) {
        const size_t left = (a.r1 - r + G - 1) / G, ng = left < groups_per_tile ? left : groups_per_tile;
        for (size_t b = b0; b < b1; b += nb_tile) {
          const size_t nb = b1 - b < nb_tile ? b1 - b : nb_tile;
          kTiles.by_shape[ng][nb](a, r, b);
        }
      }
    }
  }

 public:
  // Rows [a.r0, a.r1) (a.r0 a multiple of 16) of a packed float weight.
  static void run(const GemmArgs& a) {
    if (a.r0 >= a.r1 || a.n_batch == 0) return;
    switch (a.w_type) {
      case TensorType::F32: return run_type<TensorType::F32>(a);
      case TensorType::F16: return run_type<TensorType::F16>(a);
      case TensorType::BF16: return run_type<TensorType::BF16>(a);
      default: return;
    }
  }
};

}  // namespace kiln::kernels::x86
