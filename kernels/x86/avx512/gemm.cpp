// AVX-512 gemm for F32/F16/BF16 weights against F32 activations.
//
// Shape: W rows and X rows are both contiguous along k, so every output is a dot
// product. A tile keeps RW x RB accumulators of 16 lanes in registers; each k step loads
// RB activation vectors and converts each of the RW weight vectors once, reusing it
// across the batch rows.
//
// Determinism: for n_batch > 1 every (b, r) output owns exactly one accumulator, fed the
// products of 16-element chunks in increasing k, then a masked tail chunk, then the same
// horizontal reduction. Tile shape only decides which outputs share a loop, never the
// arithmetic, so results do not depend on r0/r1 or which tile an output landed in.
// A single activation row (decode) takes its own path, one weight row at a time with four
// accumulators: that keeps one sequential stream per thread, which the hardware
// prefetchers feed best (measured ~20% more tokens/s than 8-row tiles on TinyLlama F16).
// Its results are equally independent of the row split, but differ in rounding from the
// batched path.
//
// Everything is in an anonymous namespace: no out-of-line AVX-512 copy of a shared
// inline function can leak to other translation units.
// GCC 12 flags the deliberately undefined upper lanes inside its own 512->256 extract
// intrinsics as uninitialized; a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <utility>

#include "kernels/kernels.h"
#include "kernels/tables.h"
#include "kernels/x86/gemm_tiles.h"

namespace kiln::kernels::avx512 {
namespace {

constexpr int kMaxRw = 8;  // weight rows per tile
constexpr int kMaxRb = 4;  // batch rows per tile
// Prefill tile: 24 accumulators + 4 activations + 1 weight of the 32 registers. Measured
// on Zen 5 against 4x6, 5x5, 3x8, 8x3, 7x3, 6x3: more activation rows per tile lose
// (they stream from L2), more weight rows gain nothing.
constexpr int kPrefillRw = 6, kPrefillRb = 4;

template <TensorType T>
inline __m512 load_w(const char* row, size_t i) {
  if constexpr (T == TensorType::F32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * i));
    if constexpr (T == TensorType::F16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Masked loads never touch memory past the row end (no fault, no uninitialised lanes).
template <TensorType T>
inline __m512 load_w_tail(const char* row, size_t i, __mmask16 m) {
  if constexpr (T == TensorType::F32) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, row + 2 * i);
    if constexpr (T == TensorType::F16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Fixed tree: 16 -> 8 -> 4 -> 2 -> 1 lanes, identical for every output.
inline float hsum(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  const __m128 s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
  return _mm_cvtss_f32(s1);
}

template <TensorType T, int RW, int RB>
void tile(const GemmArgs& a, size_t r, size_t b) {
  const char* w = static_cast<const char*>(a.w) + r * a.w_row_bytes;
  const float* x = a.x + b * a.ldx;
  const size_t wrb = a.w_row_bytes, ldx = a.ldx, k = a.k, k16 = k & ~size_t{15};

  __m512 acc[RW][RB];
#pragma GCC unroll 8
  for (int i = 0; i < RW; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < RB; ++j) acc[i][j] = _mm512_setzero_ps();

  for (size_t i = 0; i < k16; i += 16) {
    __m512 xv[RB];
#pragma GCC unroll 4
    for (int j = 0; j < RB; ++j) xv[j] = _mm512_loadu_ps(x + j * ldx + i);
#pragma GCC unroll 8
    for (int rr = 0; rr < RW; ++rr) {
      const __m512 wv = load_w<T>(w + rr * wrb, i);
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) acc[rr][j] = _mm512_fmadd_ps(wv, xv[j], acc[rr][j]);
    }
  }
  if (k16 < k) {
    const __mmask16 m = (__mmask16)((1u << (k - k16)) - 1);
    __m512 xv[RB];
#pragma GCC unroll 4
    for (int j = 0; j < RB; ++j) xv[j] = _mm512_maskz_loadu_ps(m, x + j * ldx + k16);
#pragma GCC unroll 8
    for (int rr = 0; rr < RW; ++rr) {
      const __m512 wv = load_w_tail<T>(w + rr * wrb, k16, m);
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) acc[rr][j] = _mm512_fmadd_ps(wv, xv[j], acc[rr][j]);
    }
  }
#pragma GCC unroll 8
  for (int rr = 0; rr < RW; ++rr)
#pragma GCC unroll 4
    for (int j = 0; j < RB; ++j) a.y[(b + j) * a.ldy + r + rr] = hsum(acc[rr][j]);
}

// Decode (one activation row): one weight row at a time as a single sequential stream,
// four accumulators over consecutive 16-element chunks to hide FMA latency.
template <TensorType T>
void matvec_rows(const GemmArgs& a) {
  const size_t k = a.k, k64 = k & ~size_t{63}, k16 = k & ~size_t{15};
  for (size_t r = a.r0; r < a.r1; ++r) {
    const char* w = static_cast<const char*>(a.w) + r * a.w_row_bytes;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
           acc3 = _mm512_setzero_ps();
    size_t i = 0;
    for (; i < k64; i += 64) {
      acc0 = _mm512_fmadd_ps(load_w<T>(w, i), _mm512_loadu_ps(a.x + i), acc0);
      acc1 = _mm512_fmadd_ps(load_w<T>(w, i + 16), _mm512_loadu_ps(a.x + i + 16), acc1);
      acc2 = _mm512_fmadd_ps(load_w<T>(w, i + 32), _mm512_loadu_ps(a.x + i + 32), acc2);
      acc3 = _mm512_fmadd_ps(load_w<T>(w, i + 48), _mm512_loadu_ps(a.x + i + 48), acc3);
    }
    for (; i < k16; i += 16) acc0 = _mm512_fmadd_ps(load_w<T>(w, i), _mm512_loadu_ps(a.x + i), acc0);
    if (k16 < k) {
      const __mmask16 m = (__mmask16)((1u << (k - k16)) - 1);
      acc1 = _mm512_fmadd_ps(load_w_tail<T>(w, k16, m), _mm512_maskz_loadu_ps(m, a.x + k16), acc1);
    }
    a.y[r] = hsum(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
  }
}

template <TensorType T, int RW, int RB>
struct Tile {
  static void run(const GemmArgs& a, size_t r, size_t b) { tile<T, RW, RB>(a, r, b); }
};
using Table = x86::TileTable<Tile, kMaxRw, kMaxRb>;
constexpr Table kF32 = Table::make<TensorType::F32>();
constexpr Table kF16 = Table::make<TensorType::F16>();
constexpr Table kBF16 = Table::make<TensorType::BF16>();

inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

}  // namespace

// Quantized weights run on the scalar reference until they get SIMD paths here.
bool gemm_supports(TensorType t) { return scalar_ops().gemm_supports(t); }

void gemm(const GemmArgs& a) {
  if (a.r0 >= a.r1 || a.n_batch == 0) return;
  if (a.w_type != TensorType::F32 && a.w_type != TensorType::F16 && a.w_type != TensorType::BF16) {
    scalar_ops().gemm(a);
    return;
  }
  const Table& t = a.w_type == TensorType::F32 ? kF32
                       : a.w_type == TensorType::F16 ? kF16
                                                     : kBF16;
  if (a.n_batch == 1) {
    if (a.w_type == TensorType::F16) matvec_rows<TensorType::F16>(a);
    else if (a.w_type == TensorType::F32) matvec_rows<TensorType::F32>(a);
    else matvec_rows<TensorType::BF16>(a);
    return;
  }
  if (a.n_batch <= 3) {
    // Decode-like: bandwidth bound; 8 rows give 8 independent FMA chains and 8 streams
    // in flight (software prefetch and fewer rows measured no better).
    t.run(a, 0, a.n_batch, kMaxRw, (int)a.n_batch);
    return;
  }
  // Prefill: compute bound. Take the batch in blocks whose activations stay in L2 while
  // the weight rows of a tile (hot in L1) are swept across the block.
  const size_t x_budget = 512 * 1024;
  size_t block = x_budget / (a.k * sizeof(float) + 1);
  block = block < kMaxRb ? kMaxRb : block - block % kMaxRb;
  for (size_t b0 = 0; b0 < a.n_batch; b0 += block)
    t.run(a, b0, min_size(b0 + block, a.n_batch), kPrefillRw, kPrefillRb);
}

}  // namespace kiln::kernels::avx512
