// AVX-512 gemm on packed float weights (F32, F16, BF16; layout: kernels/packed.h): a
// record holds one column of 16 rows, so each weight vector (widened to f32) times one
// broadcast activation advances 16 outputs, which stay in their lanes to the end: no
// horizontal sums, and results are stored as vectors.
//
// Why: the file layout's dot-product tile (kernels/x86/gemm_float.h) converts 6 weight
// vectors per 24 FMAs and sums 24 accumulators horizontally per tile; it ran prefill at
// about half of the f32 FMA peak (bench/RESULTS.md). Here a prefill tile of 3 groups x 8
// activation rows converts 3 weight vectors per 24 FMAs.
//
// Determinism: every output is one FMA chain over k in order, whatever the tile, the
// group's place in [r0, r1) or the batch size: decode equals batch, and no split of rows
// or batches changes a bit.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "kernels/packed.h"
#include "kernels/x86/avx512/gemm_packed.h"

namespace kiln::kernels::avx512 {
namespace {

constexpr size_t G = packed::kGroupRows;

template <TensorType T>
inline __m512 widen(const uint8_t* rec) {
  if constexpr (T == TensorType::F32) return _mm512_loadu_ps(reinterpret_cast<const float*>(rec));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec));
  if constexpr (T == TensorType::F16) return _mm512_cvtph_ps(h);
  else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// NG groups of 16 rows (the first at row r, every one whole but maybe the last) against
// NB activation rows from b. Decode (NB = 1) reads NG streams; the lines a tile reads 2
// KiB further on are prefetched.
template <TensorType T, int NG, int NB>
void tile(const GemmArgs& a, size_t r, size_t b) {
  constexpr size_t R = packed::record_bytes(T);
  const size_t gbytes = packed::group_bytes(T, a.k);
  const uint8_t* w = static_cast<const uint8_t*>(a.w) + r / G * gbytes;
  const float* x = a.x + b * a.ldx;
  __m512 acc[NG][NB];
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g)
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) acc[g][j] = _mm512_setzero_ps();
  for (size_t i = 0; i < a.k; ++i) {
    const uint8_t* rec = w + i * R;
    if constexpr (NB <= 3)
      if (i * R % 64 == 0)
#pragma GCC unroll 4
        for (int g = 0; g < NG; ++g) _mm_prefetch(reinterpret_cast<const char*>(rec + g * gbytes + 2048), _MM_HINT_T0);
    __m512 wv[NG];
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) wv[g] = widen<T>(rec + g * gbytes);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) {
      const __m512 xb = _mm512_set1_ps(x[j * a.ldx + i]);
#pragma GCC unroll 4
      for (int g = 0; g < NG; ++g) acc[g][j] = _mm512_fmadd_ps(wv[g], xb, acc[g][j]);
    }
  }
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g) {
    const size_t row = r + g * G;
    const __mmask16 rows = row + G <= a.r1 ? __mmask16(0xffff) : __mmask16((1u << (a.r1 - row)) - 1);
#pragma GCC unroll 8
    for (int j = 0; j < NB; ++j) _mm512_mask_storeu_ps(a.y + (b + j) * a.ldy + row, rows, acc[g][j]);
  }
}

constexpr int kMaxNb = 8, kMaxNg = 4;
using TileFn = void (*)(const GemmArgs&, size_t, size_t);

// tile<T, ng, nb> as by_shape[ng][nb], ng = 1..kMaxNg, nb = 1..kMaxNb.
template <TensorType T, int NG, int... Nbs>
constexpr void fill(TileFn* out, std::integer_sequence<int, Nbs...>) {
  ((out[Nbs + 1] = &tile<T, NG, Nbs + 1>), ...);
}
template <TensorType T>
struct Tiles {
  TileFn by_shape[kMaxNg + 1][kMaxNb + 1] = {};
  template <int... Ngs>
  constexpr void fill_all(std::integer_sequence<int, Ngs...>) {
    (fill<T, Ngs + 1>(by_shape[Ngs + 1], std::make_integer_sequence<int, kMaxNb>{}), ...);
  }
  constexpr Tiles() { fill_all(std::make_integer_sequence<int, kMaxNg>{}); }
};

// Decode and small batches (up to 3 rows: bandwidth bound) take 4 groups per tile, 4
// streams; larger batches 3 groups x 8 rows (24 accumulators, 3 weight vectors and 8
// broadcasts per step; one thread, F16, L2-resident: 163 GFLOP/s against 150 for 2 x 12
// and 125 for 4 x 6), in blocks of activation rows that stay in L2 while the groups of
// [r0, r1) sweep them. (A transposed copy of the block, for one pointer instead of one
// per row in the loop, cost more than it saved: 95 -> 77-82 tok/s on mamba2-1b F16 pp512.)
template <TensorType T>
void run(const GemmArgs& a) {
  static constexpr Tiles<T> kTiles;
  const bool small = a.n_batch <= 3;
  const size_t groups_per_tile = small ? 4 : 3;
  const size_t nb_tile = small ? a.n_batch : kMaxNb;
  const size_t block = small ? a.n_batch : (512 * 1024) / (a.k * sizeof(float) + 1) / kMaxNb * kMaxNb + kMaxNb;
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

}  // namespace

void gemm_float_packed(const GemmArgs& a) {
  if (a.r0 >= a.r1 || a.n_batch == 0) return;
  switch (a.w_type) {
    case TensorType::F32: return run<TensorType::F32>(a);
    case TensorType::F16: return run<TensorType::F16>(a);
    case TensorType::BF16: return run<TensorType::BF16>(a);
    default: return;
  }
}

}  // namespace kiln::kernels::avx512
