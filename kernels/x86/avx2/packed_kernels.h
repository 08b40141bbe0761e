#pragma once
// Internal to the AVX2 packed kernels: gemm on packed quantized weights (layout:
// kernels/packed.h) against prepared 8-bit activations. Included by gemm_packed.cpp
// (plain AVX2) and gemm_packed_vnni.cpp (built with -mavxvnni), each defining
// KILN_PACKED_VNNI to 0 or 1 first. Everything here has internal linkage, so the two
// builds never merge at link time (a VNNI copy picked for the plain table would fault on
// CPUs without AVX-VNNI).
//
// Layout on AVX2: a 64-byte vector of the packed layout is 16 lanes, rows 0..7 of the
// group in its first 32 bytes and rows 8..15 in its second. A group runs as two halves
// of 8 rows: one 32-byte load is 8 rows x 4 consecutive elements, and per-row scales
// load 8 at a time from offset 8h of their 16-entry arrays (see kTileRows for the order
// in which halves and records are visited).
//
// Integer dots. With AVX-VNNI, vpdpbusd (u8 x s8, four products into each int32 lane,
// no saturation), exactly as the AVX-512 kernels. Without it, vpmaddubsw multiplies
// u8 x s8 and adds pairs into int16 with SATURATION, then vpmaddwd by ones (or by an
// int16 scale) widens pairs to int32. Bounds: activations are |x_q| <= 127 (both
// quantizers divide by amax/127 and saturate; 128 is used below for margin), weights
// are below 2^bits, so one vpmaddubsw lane is at most 2 * (2^bits - 1) * 128 and G of
// them may be added in int16 while G times that stays <= 32767:
//   2-bit (Q2_K):              768 per product pair, G = 42 (a sub-block of 16 needs 4)
//   3-bit (Q3_K, q + 4):      1792, G = 18 (4 used)
//   4-bit (Q4_0, Q4_1, Q4_K): 3840, G = 8 (30720)
//   5-bit (Q5_0, Q5_1, Q5_K): 7936, G = 4 (31744)
//   6-bit (Q6_K, q + 32):    16128, G = 2 (32256)
//   8-bit (Q8_0 stored q + 128): 2 * 255 * 128 = 65280 overflows even alone, so Q8_0
//   goes back to signed q and multiplies |q| by x with q's sign (vpsignb):
//   2 * 128 * 127 = 32512, one product pair at a time.
// Every integer sum is therefore exact, and so equal between the two builds.
//
// Determinism (kernels.h): each output (row, activation row) runs the same operations in
// the same order whatever the tile height, the group's place in [r0, r1) or the batch.
#include <immintrin.h>

#include <cstring>

#include "kernels/kernels.h"
#include "kernels/packed.h"
#include "kernels/quant_iq.h"
#include "kernels/x86/avx2/gemm_packed.h"
#include "kernels/x86/avx2/vec.h"
#include "kernels/x86/packed_entry.h"
#include "kernels/x86/packed_unpack.h"
#include "kernels/x86/prefetch.h"

#ifndef KILN_PACKED_VNNI
#error "define KILN_PACKED_VNNI (0 or 1) before including packed_kernels.h"
#endif

namespace kiln::kernels::avx2 {
namespace {

using namespace packed;

constexpr bool kVnni = KILN_PACKED_VNNI;

inline __m256i bcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
inline __m256i load(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline __m256 load_fp16x8(const void* p) { return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p))); }

#if KILN_PACKED_VNNI
inline __m256i dpbusd(__m256i acc, __m256i w, __m256i x) { return _mm256_dpbusd_avx_epi32(acc, w, x); }
// int16 pairs a x b added to the int32 lanes of acc (vpdpwssd, also AVX-VNNI).
inline __m256i dpwssd(__m256i acc, __m256i a, __m256i b) { return _mm256_dpwssd_avx_epi32(acc, a, b); }
#else
// Only `if constexpr (kVnni)` branches call it, and those are discarded in this build;
// any other call fails to compile rather than run an instruction the CPU may lack.
template <class V>
inline V dpbusd(V acc, V, V) {
  static_assert(sizeof(V) == 0, "vpdpbusd in the plain AVX2 build");
  return acc;
}
template <class V>
inline V dpwssd(V acc, V, V) {
  static_assert(sizeof(V) == 0, "vpdpwssd in the plain AVX2 build");
  return acc;
}
#endif

// acc + the dot products of N weight vectors (unsigned bytes) with the activation bytes
// xq[0 .. 4N), four per lane: VNNI build only.
template <int N>
inline __m256i dpbusd_sum(__m256i acc, const __m256i* w, const int8_t* xq) {
#pragma GCC unroll 8
  for (int u = 0; u < N; ++u) acc = dpbusd(acc, w[u], bcast4(xq + 4 * u));
  return acc;
}

// The same dot products without VNNI, each int16 pair weighted by m16 (ones, or a scale
// repeated in both halves of the lane): G vpmaddubsw results are summed in int16 (the
// bounds at the top of this file), then widened by one vpmaddwd.
template <int kBits, int N>
inline __m256i maddubs_sum(const __m256i* w, const int8_t* xq, __m256i m16) {
  constexpr int kFit = 32767 / (2 * ((1 << kBits) - 1) * 128), G = kFit < N ? kFit : N;
  static_assert(G >= 1 && N % G == 0, "vpmaddubsw sums would saturate");
  __m256i acc = _mm256_setzero_si256();
#pragma GCC unroll 8
  for (int u0 = 0; u0 < N; u0 += G) {
    __m256i s = _mm256_maddubs_epi16(w[u0], bcast4(xq + 4 * u0));
#pragma GCC unroll 8
    for (int i = 1; i < G; ++i) s = _mm256_add_epi16(s, _mm256_maddubs_epi16(w[u0 + i], bcast4(xq + 4 * (u0 + i))));
    acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s, m16));
  }
  return acc;
}

// acc + the int16 pair products of a and b per int32 lane (one vpdpwssd with VNNI).
inline __m256i madd_acc(__m256i acc, __m256i a, __m256i b) {
#if KILN_PACKED_VNNI
  return dpwssd(acc, a, b);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b));
#endif
}

// Byte i of the result is 0xff where bit i of the 32 bits at p is set: each byte picks
// the source byte holding its bit (vpshufb), then tests that bit.
inline __m256i bytes_from_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i which = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), which), bit), bit);
}

// Rows [lo, hi) of a group are this call's to store (groups overlapping r0 or r1 are
// computed whole: that is what keeps results independent of the split).
struct Lanes {
  int lo, hi;
};
// Stores half h (rows 8h..8h+7) of a group's results.
inline void store_half(float* y, __m256 v, int h, Lanes l) {
  const int lo = l.lo - 8 * h, hi = l.hi - 8 * h;
  if (lo <= 0 && hi >= 8) {
    _mm256_storeu_ps(y + 8 * h, v);
  } else if (hi > 0 && lo < 8) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i keep = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(lo), idx),
                                             _mm256_cmpgt_epi32(_mm256_set1_epi32(hi), idx));
    _mm256_maskstore_ps(y + 8 * h, keep, v);
  }
}

// A tile's accumulators: RB activation rows x the group's two halves, zeroed; and the
// store of halves [H0, H1) of them.
template <int RB>
inline void zero_tile(__m256 (&acc)[RB][2]) {
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
}
template <int RB, int H0, int H1>
inline void store_tile(float* y, size_t ldy, const __m256 (&acc)[RB][2], Lanes lanes) {
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j)
    for (int h = H0; h < H1; ++h) store_half(y + j * ldy, acc[j][h], h, lanes);
}

// A K-quant record's float step for one activation row of scale dx: acc + sumi x (d dx)
// - msum x (dmin dx), the integer sums converted once per 256 values.
inline __m256 k_record_step(__m256 acc, __m256i sumi, __m256i msum, __m256 d, __m256 dmin, float dx) {
  const __m256 x = _mm256_set1_ps(dx);
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(d, x), acc);
  return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, x), acc);
}

// ---------------------------------------------------------------- legacy types

template <TensorType T>
struct Legacy {
  static constexpr bool has_m = T == TensorType::Q4_1 || T == TensorType::Q5_1;
  static constexpr bool has_qh = T == TensorType::Q5_0 || T == TensorType::Q5_1;
  // Plain AVX2 multiplies Q8_0 as signed q (top of file); everything else reads the
  // stored unsigned values and starts the sum at -offset * sum(x_q).
  static constexpr bool signed_q8 = T == TensorType::Q8_0 && !kVnni;
  static constexpr int32_t offset = T == TensorType::Q8_0 ? (kVnni ? 128 : 0)
                                    : T == TensorType::Q4_0 ? 8
                                    : T == TensorType::Q5_0 ? 16 : 0;
  static constexpr int kBits = T == TensorType::Q8_0 ? 8 : has_qh ? 5 : 4;
  static constexpr size_t qs_at = 32 + (has_m ? 32 : 0) + (has_qh ? 64 : 0);
  static constexpr size_t kRecordBytes = record_bytes(T);
  static constexpr int kMagnitudes = signed_q8 ? 8 : 1;  // vectors of |w| dot() reads
  struct Context {};
  static Context context() { return {}; }

  // The block's eight weight vectors for rows 8h..8h+7 (and their magnitudes, signed_q8).
  static inline void unpack(Context, const uint8_t* rec, int h, __m256i w[8], __m256i wa[kMagnitudes]) {
    unpack_values(rec, h, w);
    if constexpr (signed_q8) {
#pragma GCC unroll 8
      for (int v = 0; v < 8; ++v) wa[v] = _mm256_abs_epi8(w[v]);
    }
  }
  static inline void unpack_values(const uint8_t* rec, int h, __m256i w[8]) {
    const uint8_t* qs = rec + qs_at + 32 * h;
    if constexpr (T == TensorType::Q8_0) {
      const __m256i flip = _mm256_set1_epi8((char)0x80);
#pragma GCC unroll 8
      for (int v = 0; v < 8; ++v) w[v] = signed_q8 ? _mm256_xor_si256(load(qs + 64 * v), flip) : load(qs + 64 * v);
    } else {
      const __m256i low4 = _mm256_set1_epi8(0x0f);
#pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) {
        const __m256i b = load(qs + 64 * v);
        w[v] = _mm256_and_si256(b, low4);
        w[v + 4] = _mm256_and_si256(_mm256_srli_epi16(b, 4), low4);
      }
      if constexpr (has_qh) {
        // qh word v, bits 32h..32h+31: bit 4r+i adds 16 to lane r, byte i.
        const uint8_t* qh = rec + 32 + (has_m ? 32 : 0) + 4 * h;
        const __m256i sixteen = _mm256_set1_epi8(16);
#pragma GCC unroll 8
        for (int v = 0; v < 8; ++v) w[v] = _mm256_or_si256(w[v], _mm256_and_si256(bytes_from_bits(qh + 8 * v), sixteen));
      }
    }
  }

  // Integer dot of one block for 8 rows with one activation row; wa = |w| (signed_q8).
  static inline __m256i dot(const __m256i* w, const __m256i* wa, const int8_t* xq, int32_t s) {
    const __m256i init = offset ? _mm256_set1_epi32(-offset * s) : _mm256_setzero_si256();
    if constexpr (kVnni) {
      return dpbusd_sum<8>(init, w, xq);
    } else if constexpr (signed_q8) {
      const __m256i ones = _mm256_set1_epi16(1);
      __m256i acc = init;
#pragma GCC unroll 8
      for (int u = 0; u < 8; ++u)
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(wa[u], _mm256_sign_epi8(bcast4(xq + 4 * u), w[u])), ones));
      return acc;
    } else {
      return _mm256_add_epi32(init, maddubs_sum<kBits, 8>(w, xq, _mm256_set1_epi16(1)));
    }
  }
};

// One 32-element block per record, the record's first 16 halves its rows' fp16 scales:
// the legacy types (Legacy<T>) and IQ4_NL (Iq4NlBlocks, kernels/x86/iquant_packed_avx2.h).
// L: kRecordBytes, has_m, kMagnitudes, context(), unpack(context, rec, h, w, wa),
// dot(w, wa, xq, sum of xq).
template <class L, int RB, int H0, int H1>
void block32_tile(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, Lanes lanes) {
  constexpr size_t R = L::kRecordBytes;
  const auto context = L::context();
  ActRow32 xr[RB];
  __m256 acc[RB][2];
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j) xr[j] = act_row32(act, k, j);
  zero_tile(acc);
  for (size_t blk = 0; blk < k / 32; ++blk) {
    const uint8_t* rec = group + blk * R;
    if constexpr (RB == 1) x86::prefetch_stream<R>(rec);
    for (int h = H0; h < H1; ++h) {
      const __m256 dw = load_fp16x8(rec + 16 * h);
      __m256i w[8], wa[L::kMagnitudes];
      L::unpack(context, rec, h, w, wa);
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) {
        const int32_t s = xr[j].s[blk];
        const __m256i isum = L::dot(w, wa, xr[j].q + 32 * blk, s);
        const float dx = xr[j].d[blk];
        acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(dx)), acc[j][h]);
        // x = d q + m: the m part is m * sum(x) = m * dx * sum(x_q).
        if constexpr (L::has_m)
          acc[j][h] = _mm256_fmadd_ps(load_fp16x8(rec + 32 + 16 * h), _mm256_set1_ps(dx * float(s)), acc[j][h]);
      }
    }
  }
  store_tile<RB, H0, H1>(y, ldy, acc, lanes);
}

// ---------------------------------------------------------------- K-quants

#include "kernels/x86/avx2/packed_k_tiles.h"

// ---------------------------------------------------------------- IQ4_NL and IQ4_XS

#include "kernels/x86/iquant_packed_avx2.h"

// ---------------------------------------------------------------- driver

// Tile<T>::fn<RB, H0, H1>: halves [H0, H1) of one group against RB activation rows.
template <TensorType T>
struct Tile {
  template <int RB, int H0, int H1>
  static void fn(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, Lanes lanes) {
    if constexpr (T == TensorType::Q4_K) k4_tile<false, RB, H0, H1>(group, k, act, y, ldy, lanes);
    else if constexpr (T == TensorType::Q5_K) k4_tile<true, RB, H0, H1>(group, k, act, y, ldy, lanes);
    else if constexpr (T == TensorType::Q6_K) q6_k_tile<RB, H0, H1>(group, k, act, y, ldy, lanes);
    else if constexpr (T == TensorType::Q3_K || T == TensorType::Q2_K) k16_tile<T, RB, H0, H1>(group, k, act, y, ldy, lanes);
    else if constexpr (T == TensorType::IQ4_NL) block32_tile<Iq4NlBlocks, RB, H0, H1>(group, k, act, y, ldy, lanes);
    else if constexpr (T == TensorType::IQ4_XS) iq4_xs_tile<RB, H0, H1>(group, k, act, y, ldy, lanes);
    else block32_tile<Legacy<T>, RB, H0, H1>(group, k, act, y, ldy, lanes);
  }
};

// Activation rows per tile: each weight vector is unpacked once per tile, so taller
// tiles amortize the unpacking. A tile of several rows runs one half of the group at a
// time (RB accumulators + 8 weight vectors fit the 16 registers; the group's second pass
// reads L1/L2); a single row (decode: bandwidth bound) does both halves of each record
// in one pass over memory.
constexpr int kTileRows = 4;

// Gemm rows [a.r0, a.r1) for activation rows [b0, b1) whose prepared copy starts at act
// (row b0). Every group overlapping [r0, r1) runs whole, storing only the rows inside.
template <TensorType T>
void run_groups(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  const size_t gbytes = group_bytes(T, a.k);
  const size_t act_stride = act_row_bytes(act_format(T), a.k);
  const auto* act_bytes = static_cast<const uint8_t*>(act);
  for (size_t g = a.r0 / kGroupRows; g * kGroupRows < a.r1; ++g) {
    const size_t row0 = g * kGroupRows;
    const Lanes lanes{a.r0 > row0 ? int(a.r0 - row0) : 0, a.r1 - row0 < kGroupRows ? int(a.r1 - row0) : int(kGroupRows)};
    const uint8_t* group = static_cast<const uint8_t*>(a.w) + g * gbytes;
    size_t b = b0;
    for (; b + kTileRows <= b1; b += kTileRows) {
      const uint8_t* x = act_bytes + (b - b0) * act_stride;
      float* y = a.y + b * a.ldy + row0;
      Tile<T>::template fn<kTileRows, 0, 1>(group, a.k, x, y, a.ldy, lanes);
      Tile<T>::template fn<kTileRows, 1, 2>(group, a.k, x, y, a.ldy, lanes);
    }
    for (; b < b1; ++b)
      Tile<T>::template fn<1, 0, 2>(group, a.k, act_bytes + (b - b0) * act_stride, a.y + b * a.ldy + row0, a.ldy, lanes);
  }
}

void run_packed(const GemmArgs& a, const void* act, size_t b0, size_t b1) {
  switch (a.w_type) {
    case TensorType::Q8_0: return run_groups<TensorType::Q8_0>(a, act, b0, b1);
    case TensorType::Q4_0: return run_groups<TensorType::Q4_0>(a, act, b0, b1);
    case TensorType::Q4_1: return run_groups<TensorType::Q4_1>(a, act, b0, b1);
    case TensorType::Q5_0: return run_groups<TensorType::Q5_0>(a, act, b0, b1);
    case TensorType::Q5_1: return run_groups<TensorType::Q5_1>(a, act, b0, b1);
    case TensorType::Q4_K: return run_groups<TensorType::Q4_K>(a, act, b0, b1);
    case TensorType::Q6_K: return run_groups<TensorType::Q6_K>(a, act, b0, b1);
    case TensorType::Q5_K: return run_groups<TensorType::Q5_K>(a, act, b0, b1);
    case TensorType::Q3_K: return run_groups<TensorType::Q3_K>(a, act, b0, b1);
    case TensorType::Q2_K: return run_groups<TensorType::Q2_K>(a, act, b0, b1);
    case TensorType::IQ4_NL: return run_groups<TensorType::IQ4_NL>(a, act, b0, b1);
    case TensorType::IQ4_XS: return run_groups<TensorType::IQ4_XS>(a, act, b0, b1);
    default: return;  // packed_bytes() is 0 for every other type, so nothing is packed
  }
}

void gemm_packed_impl(const GemmArgs& a) { x86::PackedActivations<Vec>::gemm<run_packed>(a); }

}  // namespace
}  // namespace kiln::kernels::avx2
