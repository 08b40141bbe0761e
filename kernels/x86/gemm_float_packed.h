#pragma once
// gemm on packed float weights (F32, F16, BF16; layout: kernels/packed.h), written once
// over a vector traits struct V and instantiated in each ISA's gemm_float_packed.cpp,
// compiled with that ISA's flags (V has internal linkage, so every instantiation does
// too). A record holds one column of 16 rows, 16 / V::kLanes vectors: each one widened to
// f32 times one broadcast activation advances kLanes outputs, which stay in their lanes to
// the end: no horizontal sums, and results are stored as vectors. BF16 records hold a pair
// of columns: activations prepared as bf16 (PackedActivations) are multiplied a pair at
// a time as kernels/bf16_dot.h defines, by PairDot (vdpbf16ps in kernels/x86/avx512bf16,
// two FMAs elsewhere).
//
// Why: the file layout's dot-product tile (kernels/x86/gemm_float.h) converts 6 weight
// vectors per 24 FMAs and sums its accumulators horizontally per tile; on AVX-512 it ran
// prefill at about half of the f32 FMA peak (bench/RESULTS.md). A packed prefill tile of 3
// groups x 8 activation rows converts 3 weight vectors per 24 FMAs.
//
// Determinism: every output is one FMA chain (BF16: one chain of pair steps) over k in
// order, whatever the tile, the group's place in [r0, r1) or the batch size: decode
// equals batch, and no split of rows or batches changes a bit.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "kernels/x86/packed_entry.h"
#include "kernels/x86/vec_traits.h"

namespace kiln::kernels::x86 {

// BF16 pairs (kernels/bf16_dot.h) by two FMAs a pair: for tables without vdpbf16ps.
// Operands come split into odd and even halves, so a tile splits each weight once, not
// once per product; activations come as floats (PackedActivations), each a broadcast.
// (AVX2, one thread, 2048 x 2048 against 512 rows: 55-60 GFLOP/s splitting bf16 pairs in
// the tile against 80-99 broadcasting floats; the AVX-512 FMA pairs ran the same either way.)
template <VectorTraits V>
struct FmaPairDot {
  static constexpr bool kSplit = true;
  static typename V::F step(typename V::F acc, typename V::F w_odd, typename V::F w_even, typename V::F x_odd,
                            typename V::F x_even) {
    return V::fmadd(w_even, x_even, V::fmadd(w_odd, x_odd, acc));
  }
};

// An ISA's tiles: groups of 16 rows per decode / small-batch tile (up to 3 activation
// rows: bandwidth bound, one stream per group), and the prefill tile of prefill_groups x
// prefill_rows, swept over blocks of activation rows that stay in L2 (x_budget bytes).
struct PackedFloatShape {
  int small_groups, prefill_groups, prefill_rows;
  size_t x_budget;
};

// PairDot: FmaPairDot, or a table's own with kSplit false and step(acc, w, x) on the
// unsplit pairs (kernels/x86/avx512bf16).
template <VectorTraits V, PackedFloatShape S, class PairDot = FmaPairDot<V>>
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
    const size_t gbytes = a.w_group_bytes ? a.w_group_bytes : packed::group_bytes(T, a.k);
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
    store<NG, NB>(a, acc, r, b);
  }

  // tile() for BF16 pairs: NB rows of prepared activations from act (row stride ldx
  // elements: floats for FMA pairs, bf16 for the instruction) into output rows from b.
  // Record i holds elements 2i, 2i + 1.
  template <int NG, int NB>
  static void pair_tile(const GemmArgs& a, const void* act, size_t ldx, size_t r, size_t b) {
    using I = typename V::I;
    constexpr size_t R = packed::record_bytes(TensorType::BF16), kVecBytes = R / kHalves;
    const size_t gbytes = a.w_group_bytes ? a.w_group_bytes : packed::group_bytes(TensorType::BF16, a.k);
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + r / G * gbytes;
    F acc[NG * kHalves][NB];
#pragma GCC unroll 8
    for (size_t v = 0; v < NG * kHalves; ++v)
#pragma GCC unroll 8
      for (int j = 0; j < NB; ++j) acc[v][j] = F{};
    for (size_t i = 0; i < a.k / 2; ++i) {
      const uint8_t* rec = w + i * R;
      if constexpr (NB <= 3)
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g) __builtin_prefetch(rec + g * gbytes + 2048);
      I wv[NG * kHalves];
#pragma GCC unroll 8
      for (size_t v = 0; v < NG * kHalves; ++v) wv[v] = V::load_i(rec + v / kHalves * gbytes + v % kHalves * kVecBytes);
      if constexpr (PairDot::kSplit) {
        const float* x = static_cast<const float*>(act) + 2 * i;
        F w_odd[NG * kHalves], w_even[NG * kHalves];
#pragma GCC unroll 8
        for (size_t v = 0; v < NG * kHalves; ++v) w_odd[v] = V::bf16_odd(wv[v]), w_even[v] = V::bf16_even(wv[v]);
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) {
          const F x_even = V::set1(x[j * ldx]), x_odd = V::set1(x[j * ldx + 1]);
#pragma GCC unroll 8
          for (size_t v = 0; v < NG * kHalves; ++v) acc[v][j] = PairDot::step(acc[v][j], w_odd[v], w_even[v], x_odd, x_even);
        }
      } else {
        const uint16_t* x = static_cast<const uint16_t*>(act) + 2 * i;
#pragma GCC unroll 8
        for (int j = 0; j < NB; ++j) {
          uint32_t pair;
          __builtin_memcpy(&pair, x + j * ldx, 4);
          const I xv = V::set1_i32(pair);
#pragma GCC unroll 8
          for (size_t v = 0; v < NG * kHalves; ++v) acc[v][j] = PairDot::step(acc[v][j], wv[v], xv);
        }
      }
    }
    store<NG, NB>(a, acc, r, b);
  }

  // A tile's accumulators into rows [r, ...) of output rows b.., only rows below a.r1.
  template <int NG, int NB>
  static void store(const GemmArgs& a, F (&acc)[NG * kHalves][NB], size_t r, size_t b) {
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
  using PairTileFn = void (*)(const GemmArgs&, const void*, size_t, size_t, size_t);
  template <int NG, int... Nbs>
  static constexpr void fill_pairs(PairTileFn* out, std::integer_sequence<int, Nbs...>) {
    ((out[Nbs + 1] = &pair_tile<NG, Nbs + 1>), ...);
  }
  // tile<T, ng, nb> (BF16: pair_tile<ng, nb>) as by_shape[ng][nb].
  template <TensorType T, class Fn>
  struct Tiles {
    Fn by_shape[kMaxNg + 1][kMaxNb + 1] = {};
    template <int... Ngs>
    constexpr void fill_all(std::integer_sequence<int, Ngs...>) {
      if constexpr (T == TensorType::BF16)
        (fill_pairs<Ngs + 1>(by_shape[Ngs + 1], std::make_integer_sequence<int, kMaxNb>{}), ...);
      else
        (fill<T, Ngs + 1>(by_shape[Ngs + 1], std::make_integer_sequence<int, kMaxNb>{}), ...);
    }
    constexpr Tiles() { fill_all(std::make_integer_sequence<int, kMaxNg>{}); }
  };

  // tile_at(ng, nb, r, b) over rows [a.r0, a.r1) x batch rows [0, n_batch): the batch in
  // blocks whose activations (x_row_bytes a row) stay in L2; the last groups of [r0, r1)
  // take a tile of exactly their number.
  template <class TileAt>
  static void sweep(const GemmArgs& a, size_t n_batch, size_t x_row_bytes, size_t prefill_rows, TileAt&& tile_at) {
    const bool small = n_batch <= 3;
    const size_t groups_per_tile = size_t(small ? S.small_groups : S.prefill_groups);
    const size_t nb_tile = small ? n_batch : prefill_rows;
    size_t block = n_batch;
    if (!small) block = S.x_budget / (x_row_bytes + 1) / nb_tile * nb_tile + nb_tile;
    for (size_t b0 = 0; b0 < n_batch; b0 += block) {
      const size_t b1 = b0 + block < n_batch ? b0 + block : n_batch;
      for (size_t r = a.r0; r < a.r1; r += groups_per_tile * G) {
        const size_t left = (a.r1 - r + G - 1) / G, ng = left < groups_per_tile ? left : groups_per_tile;
        for (size_t b = b0; b < b1; b += nb_tile) tile_at(ng, b1 - b < nb_tile ? b1 - b : nb_tile, r, b);
      }
    }
  }

  template <TensorType T>
  static void run_type(const GemmArgs& a) {
    static constexpr Tiles<T, TileFn> kTiles;
    sweep(a, a.n_batch, a.k * sizeof(float), size_t(S.prefill_rows),
          [&](size_t ng, size_t nb, size_t r, size_t b) { kTiles.by_shape[ng][nb](a, r, b); });
  }

  // BF16: batch rows [b0, b1), their activations prepared at act (PackedActivations: as
  // floats or as bf16, the way PairDot reads them).
  // FMA pairs hold each weight vector's two halves in registers: fewer activation rows
  // than the shape's where accumulators, halves and two broadcasts would not fit (AVX2:
  // 5 rows, not 6; the 6-row tile spilled accumulators, 62-70 GFLOP/s a thread against
  // F16's 96-103).
  static constexpr size_t kPairRows = [] {
    const int vectors = S.prefill_groups * int(kHalves), registers = W == 16 ? 32 : 16;
    const int fit = (registers - 2 - 2 * vectors) / vectors;
    return size_t(!PairDot::kSplit || fit >= S.prefill_rows ? S.prefill_rows : fit);
  }();
  static void run_pairs(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
    static constexpr Tiles<TensorType::BF16, PairTileFn> kTiles;
    const size_t elem = PairDot::kSplit ? 4 : 2, ldx = packed::act_row_bytes(packed::ActFormat::bf16, a.k) / elem;
    sweep(a, b1 - b0, a.k * elem, kPairRows, [&](size_t ng, size_t nb, size_t r, size_t b) {
      kTiles.by_shape[ng][nb](a, static_cast<const uint8_t*>(act) + b * ldx * elem, ldx, r, b0 + b);
    });
  }

 public:
  // Rows [a.r0, a.r1) (a.r0 a multiple of 16) of a packed float weight.
  static void run(const GemmArgs& a) {
    if (a.r0 >= a.r1 || a.n_batch == 0) return;
    switch (a.w_type) {
      case TensorType::F32: return run_type<TensorType::F32>(a);
      case TensorType::F16: return run_type<TensorType::F16>(a);
      case TensorType::BF16: return PackedActivations<V>::template gemm<run_pairs>(a);
      default: return;
    }
  }
};

}  // namespace kiln::kernels::x86
