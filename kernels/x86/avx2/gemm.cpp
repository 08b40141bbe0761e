// AVX2 gemm for F32/F16/BF16 weights against F32 activations; packed quantized weights
// go to gemm_packed.cpp (or gemm_packed_vnni.cpp for the avxvnni table).
//
// Same scheme as the AVX-512 version with 8 lanes and 16 registers: a tile keeps RW x RB
// accumulators, each weight vector is converted once per k step and reused across the
// batch rows. Every (b, r) output owns one accumulator fed 8-element chunks in
// increasing k, then a zero-padded tail chunk, then one fixed horizontal reduction, so
// results never depend on the tile an output landed in (see kernels.h). A single
// activation row takes the streaming matvec path instead.
#include <immintrin.h>

#include <utility>

#include "kernels/kernels.h"
#include "kernels/tables.h"
#include "kernels/x86/avx2/gemm_packed.h"
#include "kernels/x86/gemm_tiles.h"

namespace kiln::kernels::avx2 {
namespace {

constexpr int kMaxRw = 8;
constexpr int kMaxRb = 3;

template <TensorType T>
inline __m256 load_w(const char* row, size_t i) {
  if constexpr (T == TensorType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
    if constexpr (T == TensorType::F16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// The last k % 8 weights, zero padded (AVX2 has no 16-bit masked loads).
template <TensorType T>
inline __m256 load_w_tail(const char* row, size_t i, size_t n) {
  constexpr size_t elem = T == TensorType::F32 ? 4 : 2;
  alignas(32) unsigned char buf[8 * elem] = {};
  const char* src = row + i * elem;
  for (size_t j = 0; j < n * elem; ++j) buf[j] = (unsigned char)src[j];
  return load_w<T>(reinterpret_cast<const char*>(buf), 0);
}

inline __m256 load_x_tail(const float* x, size_t n) {
  alignas(32) float buf[8] = {};
  for (size_t j = 0; j < n; ++j) buf[j] = x[j];
  return _mm256_load_ps(buf);
}

inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// Decode (one activation row): one weight row at a time as a single sequential stream
// with four accumulators, as in the AVX-512 version (see there for why).
template <TensorType T>
void matvec_rows(const GemmArgs& a) {
  const size_t k = a.k, k32 = k & ~size_t{31}, k8 = k & ~size_t{7};
  for (size_t r = a.r0; r < a.r1; ++r) {
    const char* w = static_cast<const char*>(a.w) + r * a.w_row_bytes;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
           acc3 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i < k32; i += 32) {
      acc0 = _mm256_fmadd_ps(load_w<T>(w, i), _mm256_loadu_ps(a.x + i), acc0);
      acc1 = _mm256_fmadd_ps(load_w<T>(w, i + 8), _mm256_loadu_ps(a.x + i + 8), acc1);
      acc2 = _mm256_fmadd_ps(load_w<T>(w, i + 16), _mm256_loadu_ps(a.x + i + 16), acc2);
      acc3 = _mm256_fmadd_ps(load_w<T>(w, i + 24), _mm256_loadu_ps(a.x + i + 24), acc3);
    }
    for (; i < k8; i += 8) acc0 = _mm256_fmadd_ps(load_w<T>(w, i), _mm256_loadu_ps(a.x + i), acc0);
    if (k8 < k) acc1 = _mm256_fmadd_ps(load_w_tail<T>(w, k8, k - k8), load_x_tail(a.x + k8, k - k8), acc1);
    a.y[r] = hsum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  }
}

template <TensorType T, int RW, int RB>
void tile(const GemmArgs& a, size_t r, size_t b) {
  const char* w = static_cast<const char*>(a.w) + r * a.w_row_bytes;
  const float* x = a.x + b * a.ldx;
  const size_t wrb = a.w_row_bytes, ldx = a.ldx, k = a.k, k8 = k & ~size_t{7};

  __m256 acc[RW][RB];
#pragma GCC unroll 8
  for (int i = 0; i < RW; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < RB; ++j) acc[i][j] = _mm256_setzero_ps();

  for (size_t i = 0; i < k8; i += 8) {
    __m256 xv[RB];
#pragma GCC unroll 4
    for (int j = 0; j < RB; ++j) xv[j] = _mm256_loadu_ps(x + j * ldx + i);
#pragma GCC unroll 8
    for (int rr = 0; rr < RW; ++rr) {
      const __m256 wv = load_w<T>(w + rr * wrb, i);
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) acc[rr][j] = _mm256_fmadd_ps(wv, xv[j], acc[rr][j]);
    }
  }
  if (k8 < k) {
    __m256 xv[RB];
#pragma GCC unroll 4
    for (int j = 0; j < RB; ++j) xv[j] = load_x_tail(x + j * ldx + k8, k - k8);
#pragma GCC unroll 8
    for (int rr = 0; rr < RW; ++rr) {
      const __m256 wv = load_w_tail<T>(w + rr * wrb, k8, k - k8);
#pragma GCC unroll 4
      for (int j = 0; j < RB; ++j) acc[rr][j] = _mm256_fmadd_ps(wv, xv[j], acc[rr][j]);
    }
  }
#pragma GCC unroll 8
  for (int rr = 0; rr < RW; ++rr)
#pragma GCC unroll 4
    for (int j = 0; j < RB; ++j) a.y[(b + j) * a.ldy + r + rr] = hsum(acc[rr][j]);
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
  if (a.w_packed) return gemm_packed(a);
  if (a.w_type != TensorType::F32 && a.w_type != TensorType::F16 && a.w_type != TensorType::BF16) {
    scalar_ops().gemm(a);
    return;
  }
  const Table& t = a.w_type == TensorType::F32 ? kF32
                       : a.w_type == TensorType::F16 ? kF16
                                                     : kBF16;
  if (a.n_batch == 1) {  // bandwidth bound: one sequential stream per thread
    if (a.w_type == TensorType::F16) matvec_rows<TensorType::F16>(a);
    else if (a.w_type == TensorType::F32) matvec_rows<TensorType::F32>(a);
    else matvec_rows<TensorType::BF16>(a);
    return;
  }
  // 4 x 3 = 12 accumulators + 3 activations + 1 weight fills the 16 registers.
  const size_t x_budget = 256 * 1024;
  size_t block = x_budget / (a.k * sizeof(float) + 1);
  block = block < kMaxRb ? kMaxRb : block - block % kMaxRb;
  for (size_t b0 = 0; b0 < a.n_batch; b0 += block)
    t.run(a, b0, min_size(b0 + block, a.n_batch), 4, kMaxRb);
}

#ifdef KILN_HAVE_AVXVNNI
// The avxvnni table's gemm: only packed weights have integer kernels to speed up; the
// rest is the avx2 table's.
void gemm_vnni(const GemmArgs& a) {
  if (a.w_packed) return gemm_packed_vnni(a);
  gemm(a);
}
#endif

}  // namespace kiln::kernels::avx2
