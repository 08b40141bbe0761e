#pragma once
// Internal to the AVX-512 packed kernels (gemm_packed*.cpp and the AMX tiles,
// kernels/x86/amx/, compiled with AVX-512 flags): small helpers and the loop over 16-row
// groups and activation-row tiles.
#include <immintrin.h>

#include <cstring>

#include "kernels/kernels.h"
#include "kernels/packed.h"

namespace kiln::kernels::avx512 {

// Runs packed gemm rows [a.r0, a.r1) for activation rows [b0, b1) whose prepared copy
// starts at act (row b0): legacy types in gemm_packed.cpp, K-quants in gemm_packed_k.cpp.
void run_packed_legacy(const GemmArgs& a, const void* act, size_t b0, size_t b1);
void run_packed_k(const GemmArgs& a, const void* act, size_t b0, size_t b1);
// Q5_K, Q3_K and Q2_K, in gemm_packed_k2.cpp.
void run_packed_k2(const GemmArgs& a, const void* act, size_t b0, size_t b1);
// IQ4_NL and IQ4_XS, in gemm_iquant_packed.cpp.
void run_packed_iq4(const GemmArgs& a, const void* act, size_t b0, size_t b1);

namespace {

using namespace packed;

inline __m512i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
inline __m512i load(const void* p) { return _mm512_loadu_si512(p); }
inline __m512 load_fp16x16(const void* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
}

inline __mmask64 mask_at(const uint8_t* p) {
  __mmask64 m;
  std::memcpy(&m, p, 8);
  return m;
}
inline __m512i load_u8x32_as_i16(const void* p) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(static_cast<const __m256i*>(p)));
}

// The lanes of the group starting at row0 that lie inside [r0, r1): a group overlapping
// the range runs whole and stores only these.
inline __mmask16 group_lanes(size_t row0, size_t r0, size_t r1) {
  const size_t lo = r0 > row0 ? r0 - row0 : 0;
  const size_t hi = r1 - row0 < kGroupRows ? r1 - row0 : kGroupRows;
  return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

// Activation rows per tile: RB accumulators and sums plus eight weight vectors fit the
// 32 registers.
constexpr int kTileRows = 8;

// Tile::fn<RB>(group, k, act, y, ldy, lanes): one group of 16 rows against RB activation
// rows. Every group overlapping [r0, r1) runs whole, storing only the lanes inside it.
template <class Tile>
void run_groups(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  const size_t gbytes = packed::group_bytes(a.w_type, a.k);
  const size_t act_stride = packed::act_row_bytes(packed::act_format(a.w_type), a.k);
  const auto* act_bytes = static_cast<const uint8_t*>(act);
  for (size_t g = a.r0 / packed::kGroupRows; g * packed::kGroupRows < a.r1; ++g) {
    const size_t row0 = g * packed::kGroupRows;
    const __mmask16 lanes = group_lanes(row0, a.r0, a.r1);
    const uint8_t* group = static_cast<const uint8_t*>(a.w) + g * gbytes;
    size_t b = b0;
    for (; b + kTileRows <= b1; b += kTileRows)
      Tile::template fn<kTileRows>(group, a.k, act_bytes + (b - b0) * act_stride, a.y + b * a.ldy + row0, a.ldy, lanes);
    for (; b + 4 <= b1; b += 4)
      Tile::template fn<4>(group, a.k, act_bytes + (b - b0) * act_stride, a.y + b * a.ldy + row0, a.ldy, lanes);
    // Two rows: the server's decode of two sequences. Two single-row passes made a step
    // 1.39x as long as one sequence's (1.1B Q4_0, 2 threads); this tile 1.14x.
    for (; b + 2 <= b1; b += 2)
      Tile::template fn<2>(group, a.k, act_bytes + (b - b0) * act_stride, a.y + b * a.ldy + row0, a.ldy, lanes);
    for (; b < b1; ++b)
      Tile::template fn<1>(group, a.k, act_bytes + (b - b0) * act_stride, a.y + b * a.ldy + row0, a.ldy, lanes);
  }
}

}  // namespace
}  // namespace kiln::kernels::avx512
