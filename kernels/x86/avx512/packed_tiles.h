#pragma once
// Internal to the AVX-512 packed kernels (gemm_packed*.cpp and the AMX tiles,
// kernels/x86/amx/, compiled with AVX-512 flags): small helpers and the loop over 16-row
// groups and activation-row tiles.
#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "kernels/x86/prefetch.h"

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

// A tile kind says how one record of a 16-row group meets RB activation rows:
//   Act, act_row(act, k, j)   activation row j's view (kernels/packed.h)
//   kElems, kBytes            the elements a record spans and its bytes
//   Consts                    what its steps share (tables, masks), built once a tile
//   step<RB>(rec, c, xr, i, acc)  record i's products added to acc[0, RB)
// Every output's operations are its steps', record after record, whatever the number of
// activation rows or groups a tile runs: decode equals batch.

// What every kind shares: the activation format follows from the record's span.
template <size_t kRecordElems, size_t kRecordBytes>
struct RecordKind {
  static constexpr size_t kElems = kRecordElems, kBytes = kRecordBytes;
  using Act = std::conditional_t<kElems == 32, ActRow32, ActRow256>;
  struct Consts {};
  static Act act_row(const void* act, size_t k, int j) {
    if constexpr (kElems == 32) return act_row32(act, k, j);
    else return act_row256(act, k, j);
  }
};

// One group of 16 rows against RB activation rows.
template <class Kind, int RB>
void group_tile(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, __mmask16 lanes) {
  const typename Kind::Consts c;
  typename Kind::Act xr[RB];
  __m512 acc[RB];
#pragma GCC unroll 16
  for (int j = 0; j < RB; ++j) xr[j] = Kind::act_row(act, k, j), acc[j] = _mm512_setzero_ps();
  for (size_t i = 0; i < k / Kind::kElems; ++i) Kind::template step<RB>(group + i * Kind::kBytes, c, xr, i, acc);
#pragma GCC unroll 16
  for (int j = 0; j < RB; ++j) _mm512_mask_storeu_ps(y + j * ldy, lanes, acc[j]);
}

// Decode (one activation row) of NG groups that follow each other gbytes apart, record i
// of each in turn, each record's lines asked into L1 `ahead` bytes before it is read:
// several prefetched streams, as the float decode tile reads (x86::StreamPrefetch).
// Near a group's end the distance reaches into the group after it, which another stream
// of this pass has read already; there it fetches the start of the same stream's group in
// the next pass instead (n_next groups follow in this task), so the next pass does not
// begin its streams cold. A group of a 2048-wide Q4_0 matrix is 18 KiB, so every pass
// began that way: 1.1B Q4_0 tg64 +5.6% (paired runs, 2 threads, Zen 5).
template <class Kind, int NG>
void decode_groups(const uint8_t* group, size_t gbytes, size_t k, const void* act, float* y, const __mmask16* lanes,
                   size_t ahead, size_t n_next) {
  const typename Kind::Consts c;
  const typename Kind::Act xr = Kind::act_row(act, k, 0);
  __m512 acc[NG];
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g) acc[g] = _mm512_setzero_ps();
  for (size_t i = 0; i < k / Kind::kElems; ++i)
#pragma GCC unroll 4
    for (int g = 0; g < NG; ++g) {
      const size_t at = i * Kind::kBytes;
      const uint8_t* rec = group + g * gbytes + at;
      if (ahead) {
        const size_t to = at + ahead;
        if (to < gbytes) x86::prefetch_record<Kind::kBytes>(rec + ahead);
        else if (size_t(g) < n_next) x86::prefetch_record<Kind::kBytes>(group + (NG + g) * gbytes + (to - gbytes));
      }
      Kind::template step<1>(rec, c, &xr, i, &acc[g]);
    }
#pragma GCC unroll 4
  for (int g = 0; g < NG; ++g) _mm512_mask_storeu_ps(y + g * kGroupRows, lanes[g], acc[g]);
}

template <class Kind>
void run_decode_groups(const GemmArgs& a, const void* act, size_t b, size_t ng) {
  const size_t gbytes = packed::group_bytes(a.w_type, a.k), ahead = x86::g_stream_prefetch.group_ahead;
  const size_t g_end = (a.r1 + kGroupRows - 1) / kGroupRows;
  for (size_t g = a.r0 / kGroupRows; g < g_end;) {
    const size_t n = g_end - g < ng ? g_end - g : ng;
    __mmask16 lanes[4];
    for (size_t i = 0; i < n; ++i) lanes[i] = group_lanes((g + i) * kGroupRows, a.r0, a.r1);
    const uint8_t* group = static_cast<const uint8_t*>(a.w) + g * gbytes;
    float* y = a.y + b * a.ldy + g * kGroupRows;
    const size_t left = g_end - g - n, next = left < ng ? left : ng;
    switch (n) {
      case 4: decode_groups<Kind, 4>(group, gbytes, a.k, act, y, lanes, ahead, next); break;
      case 3: decode_groups<Kind, 3>(group, gbytes, a.k, act, y, lanes, ahead, next); break;
      case 2: decode_groups<Kind, 2>(group, gbytes, a.k, act, y, lanes, ahead, next); break;
      default: decode_groups<Kind, 1>(group, gbytes, a.k, act, y, lanes, ahead, next); break;
    }
    g += n;
  }
}

// Every group overlapping [r0, r1) against activation rows [b0, b1), storing only the
// group's lanes inside [r0, r1).
template <class Kind>
void run_batch_chunk(const GemmArgs& a, const uint8_t* act_bytes, size_t act_stride, size_t b0, size_t b1) {
  const size_t gbytes = packed::group_bytes(a.w_type, a.k);
  for (size_t g = a.r0 / packed::kGroupRows; g * packed::kGroupRows < a.r1; ++g) {
    const size_t row0 = g * packed::kGroupRows;
    const __mmask16 lanes = group_lanes(row0, a.r0, a.r1);
    const uint8_t* group = static_cast<const uint8_t*>(a.w) + g * gbytes;
    size_t b = b0;
    for (; b + kTileRows <= b1; b += kTileRows)
      group_tile<Kind, kTileRows>(group, a.k, act_bytes + (b - b0) * act_stride, a.y + b * a.ldy + row0, a.ldy, lanes);
    for (; b + 4 <= b1; b += 4)
      group_tile<Kind, 4>(group, a.k, act_bytes + (b - b0) * act_stride, a.y + b * a.ldy + row0, a.ldy, lanes);
    // Two rows: the server's decode of two sequences. Two single-row passes made a step
    // 1.39x as long as one sequence's (1.1B Q4_0, 2 threads); this tile 1.14x.
    for (; b + 2 <= b1; b += 2)
      group_tile<Kind, 2>(group, a.k, act_bytes + (b - b0) * act_stride, a.y + b * a.ldy + row0, a.ldy, lanes);
    for (; b < b1; ++b)
      group_tile<Kind, 1>(group, a.k, act_bytes + (b - b0) * act_stride, a.y + b * a.ldy + row0, a.ldy, lanes);
  }
}

// The batch in chunks that stay in L2 (packed::batch_chunk_rows). Decode runs several
// groups at once only for records of 32 values (Q4_0, Q8_0, IQ4_NL...): the 256-value
// records of the K-quants and IQ4_XS (2 KiB and more a record) lost with it on the
// machine that asked for it (1.1B IQ4_XS tg 64-69 -> 52-53 tok/s, 4 groups without
// prefetch 33-36).
template <class Kind>
void run_groups(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  if (Kind::kElems == 32 && b1 - b0 == 1 && x86::g_stream_prefetch.groups > 1)
    return run_decode_groups<Kind>(a, act, b0, size_t(x86::g_stream_prefetch.groups));
  const size_t act_stride = packed::act_row_bytes(packed::act_format(a.w_type), a.k);
  const size_t chunk = packed::batch_chunk_rows(act_stride, kTileRows);
  for (size_t c0 = b0; c0 < b1; c0 += chunk)
    run_batch_chunk<Kind>(a, static_cast<const uint8_t*>(act) + (c0 - b0) * act_stride, act_stride, c0,
                          c0 + chunk < b1 ? c0 + chunk : b1);
}

}  // namespace
}  // namespace kiln::kernels::avx512
