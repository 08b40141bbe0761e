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

// Software prefetch of the record two records ahead, an eighth of it per call (step
// 0..7), as the AVX-512 K tiles do (kernels/x86/avx512/packed_tiles.h): a decode tile
// reads each record as two interleaved halves and the hardware prefetcher loses the
// stream. Measured on one core, 16384 x 4096 weights (beyond L3), GMAC/s without -> with:
// decode Q4_K 40 -> 60-68, Q5_K 24 -> 31; batch of 32 (4096 x 4096) Q4_K 84 -> 96, Q5_K
// 66 -> 72; Q3_K and Q2_K unchanged within noise (their unpacking, not memory, limits).
template <size_t R>
inline void prefetch_ahead(const uint8_t* rec, int step) {
  constexpr size_t kLines = (R / 64 + 7) / 8;
  const char* p = reinterpret_cast<const char*>(rec) + 2 * R + 64 * kLines * step;
#pragma GCC unroll 8
  for (size_t l = 0; l < kLines; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
}

// Step `step` of 8 of a record's prefetch: decode (one activation row) streams with
// x86::prefetch_stream as the AVX-512 decode tiles do; prefill keeps prefetch_ahead.
template <size_t R, int RB>
inline void prefetch_record_step(const uint8_t* rec, int step) {
  if constexpr (RB == 1) x86::prefetch_stream<R, 8>(rec, step);
  else prefetch_ahead<R>(rec, step);
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
  for (int j = 0; j < RB; ++j) xr[j] = act_row32(act, k, j), acc[j][0] = acc[j][1] = _mm256_setzero_ps();
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
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j)
    for (int h = H0; h < H1; ++h) store_half(y + j * ldy, acc[j][h], h, lanes);
}

// ---------------------------------------------------------------- Q4_K and Q5_K

// Per 256-element record: sub-block sums times their 6-bit scales stay exact in int32
// (at most 256 * 31 * 128 * 63 for Q5_K), mins meet the activation sums per 32, and the
// float scales are applied once. Q5_K is Q4_K with a fifth bit OR-ed into each weight
// byte: its pairs are 640 bytes (8 nibble vectors, then 16 x uint64 of fifth bits whose
// bits 32h..32h+31 are this half's 8 rows), and 5-bit weights allow only 4 vpmaddubsw
// per int16 sum instead of 8 (maddubs_sum checks the bound).
template <bool kQ5, int RB, int H0, int H1>
void k4_tile(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, Lanes lanes) {
  constexpr size_t R = record_bytes(kQ5 ? TensorType::Q5_K : TensorType::Q4_K);
  constexpr size_t kPair = kQ5 ? 640 : 512;
  constexpr int kBits = kQ5 ? 5 : 4;
  ActRow256 xr[RB];
  __m256 acc[RB][2];
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j) xr[j] = act_row256(act, k, j), acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0f), sixteen = _mm256_set1_epi8(16);
  for (size_t sb = 0; sb < k / 256; ++sb) {
    const uint8_t* rec = group + sb * R;
    const uint8_t *sc = rec + 64, *mpair = rec + 192, *qs = rec + 320;
    for (int h = H0; h < H1; ++h) {
      __m256i sumi[RB];
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) sumi[j] = _mm256_setzero_si256();
      for (int sub = 0; sub < 8; ++sub) {  // pair sub/2, nibble sub%2
        if (h == H0) prefetch_record_step<R, RB>(rec, sub);  // first visit of the record
        const uint8_t* pv = qs + kPair * (sub / 2) + 32 * h;
        __m256i w[8];
#pragma GCC unroll 8
        for (int v = 0; v < 8; ++v)
          w[v] = _mm256_and_si256(sub % 2 ? _mm256_srli_epi16(load(pv + 64 * v), 4) : load(pv + 64 * v), low4);
        if constexpr (kQ5) {
          // Word 8(sub%2) + v of the pair's fifth bits; this half's 32 bits start at byte 4h.
          const uint8_t* qh = qs + kPair * (sub / 2) + 512 + 64 * (sub % 2) + 4 * h;
#pragma GCC unroll 8
          for (int v = 0; v < 8; ++v) w[v] = _mm256_or_si256(w[v], _mm256_and_si256(bytes_from_bits(qh + 8 * v), sixteen));
        }
        const __m256i sc32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 16 * sub + 8 * h)));
        if constexpr (kVnni) {
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j) {
            const __m256i isum = dpbusd_sum<8>(_mm256_setzero_si256(), w, xr[j].q + 256 * sb + 32 * sub);
            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_mullo_epi32(isum, sc32));
          }
        } else {
          // The scale (< 64) in both int16 halves: vpmaddwd applies it while widening.
          const __m256i sc16 = _mm256_or_si256(sc32, _mm256_slli_epi32(sc32, 16));
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j)
            sumi[j] = _mm256_add_epi32(sumi[j], maddubs_sum<kBits, 8>(w, xr[j].q + 256 * sb + 32 * sub, sc16));
        }
      }
      const __m256 d = load_fp16x8(rec + 16 * h), dmin = load_fp16x8(rec + 32 + 16 * h);
      __m256i mpairs[4];
#pragma GCC unroll 4
      for (int p = 0; p < 4; ++p)
        mpairs[p] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mpair + 32 * p + 16 * h)));
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) {
        // sum over sub-blocks of m * sum(x_q): int16 pairs (m, sum) in one vpmaddwd each.
        __m256i msum = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) msum = _mm256_add_epi32(msum, _mm256_madd_epi16(mpairs[p], bcast4(xr[j].s32 + 8 * sb + 2 * p)));
        const __m256 dx = _mm256_set1_ps(xr[j].d[sb]);
        acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j]), _mm256_mul_ps(d, dx), acc[j][h]);
        acc[j][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, dx), acc[j][h]);
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j)
    for (int h = H0; h < H1; ++h) store_half(y + j * ldy, acc[j][h], h, lanes);
}

// ---------------------------------------------------------------- Q6_K

template <int RB, int H0, int H1>
void q6_k_tile(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, Lanes lanes) {
  constexpr size_t R = record_bytes(TensorType::Q6_K);
  ActRow256 xr[RB];
  __m256 acc[RB][2];
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j) xr[j] = act_row256(act, k, j), acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  for (size_t sb = 0; sb < k / 256; ++sb) {
    const uint8_t* rec = group + sb * R;
    const uint8_t *scpair = rec + 32, *chunks = rec + 288;
    for (int h = H0; h < H1; ++h) {
      __m256i sumi[RB];
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) sumi[j] = _mm256_setzero_si256();
      for (int P = 0; P < 8; ++P) {
        if constexpr (RB == 1)
          if (h == H0) x86::prefetch_stream<R, 8>(rec, P);  // first visit of the record
        const uint8_t *ql = chunks + 384 * P + 32 * h, *qh = chunks + 384 * P + 256 + 32 * h;
        __m256i w[8];
        x86::q6_k_weights<Vec>(ql, qh, w);
        // Lane r: the int16 pair (scale of sub-block 2P, scale of 2P+1) of row 8h+r.
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scpair + 32 * P + 16 * h)));
        if constexpr (kVnni) {
          const __m256i sc_a = _mm256_srai_epi32(_mm256_slli_epi32(sc16, 16), 16), sc_b = _mm256_srai_epi32(sc16, 16);
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j) {
            const int8_t* xq = xr[j].q + 256 * sb + 32 * P;
            const int16_t* s16 = xr[j].s16 + 16 * sb + 2 * P;
            // Stored q is the file's q + 32: start each 16-element sum at -32 * sum(x_q).
            const __m256i ia = dpbusd_sum<4>(_mm256_set1_epi32(-32 * s16[0]), w, xq);
            const __m256i ib = dpbusd_sum<4>(_mm256_set1_epi32(-32 * s16[1]), w + 4, xq + 16);
            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_add_epi32(_mm256_mullo_epi32(ia, sc_a), _mm256_mullo_epi32(ib, sc_b)));
          }
        } else {
          // Each sub-block's scale in both int16 halves of the lane, for vpmaddwd.
          const __m256i sc_a = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(sc16, 0xa0), 0xa0);
          const __m256i sc_b = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(sc16, 0xf5), 0xf5);
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j) {
            const int8_t* xq = xr[j].q + 256 * sb + 32 * P;
            // The q + 32 offset: 32 * (sc_a * sum_a(x_q) + sc_b * sum_b(x_q)), one vpmaddwd.
            const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bcast4(xr[j].s16 + 16 * sb + 2 * P)), 5);
            const __m256i t = _mm256_add_epi32(maddubs_sum<6, 4>(w, xq, sc_a), maddubs_sum<6, 4>(w + 4, xq + 16, sc_b));
            sumi[j] = _mm256_add_epi32(sumi[j], _mm256_sub_epi32(t, off));
          }
        }
      }
      const __m256 d = load_fp16x8(rec + 16 * h);
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j)
        acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j]), _mm256_mul_ps(d, _mm256_set1_ps(xr[j].d[sb])), acc[j][h]);
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j)
    for (int h = H0; h < H1; ++h) store_half(y + j * ldy, acc[j][h], h, lanes);
}

// ---------------------------------------------------------------- Q3_K and Q2_K

// Sub-blocks of 16 elements: chunk P of a record holds sub-blocks 2P and 2P+1, each a
// crumb vector whose four unpacked vectors are (crumb >> 2j) & 3 (kernels/packed.h). A
// sub-block's dot is 4 weight vectors deep, so each sub-block meets its own scale:
//  * plain AVX2: one int16 sum of 4 vpmaddubsw (3-bit: 4 x 1792, 2-bit: 4 x 768, far
//    from saturating), widened by vpmaddwd against the scale in both int16 halves;
//  * AVX-VNNI: a 4-deep vpdpbusd chain sums to |s| <= 16 x 7 x 128 < 2^15, so vpdpwssd
//    against the scale in the low 16 bits of the lane (high 16 zero) multiplies and adds
//    it in one instruction, as the AVX-512 tiles do.
// Q3_K: x = d * sc * (q - 4), q in 0..7 stored (the 2 low bits plus 4 where the high-bit
// mask is set), sc in -32..31; the -4 joins the int32 sum as -4 * sc * sum(x_q) per
// sub-block: the int16 pair (-4 sc_a, -4 sc_b) against the pair of 16-element activation
// sums, one vpmaddwd (vpdpwssd with VNNI) per chunk. Q2_K: x = d * sc * q - dmin * m, q
// in 0..3, sc and m the low and high nibbles of the file's scales byte; the mins as
// Q4_K's, against the 16-element sums.
template <TensorType T, int RB, int H0, int H1>
void k16_tile(const uint8_t* group, size_t k, const void* act, float* y, size_t ldy, Lanes lanes) {
  constexpr bool kQ3 = T == TensorType::Q3_K;
  constexpr size_t R = record_bytes(T);
  constexpr size_t kScales = kQ3 ? 32 : 64, kChunks = kQ3 ? 288 : 320, kChunk = kQ3 ? 192 : 128;
  constexpr int kBits = kQ3 ? 3 : 2;  // stored q: Q3_K q + 4 <= 7, Q2_K q <= 3
  static_assert(16 * ((1 << kBits) - 1) * 128 <= 32767, "a sub-block's vpdpbusd sum must fit the lane's low int16");
  ActRow256 xr[RB];
  __m256 acc[RB][2];
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j) xr[j] = act_row256(act, k, j), acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
  for (size_t sb = 0; sb < k / 256; ++sb) {
    const uint8_t* rec = group + sb * R;
    const uint8_t *scales = rec + kScales, *chunks = rec + kChunks;
    for (int h = H0; h < H1; ++h) {
      __m256i sumi[RB];
#pragma GCC unroll 8
      for (int j = 0; j < RB; ++j) sumi[j] = _mm256_setzero_si256();
      for (int P = 0; P < 8; ++P) {
        if (h == H0) prefetch_record_step<R, RB>(rec, P);  // first visit of the record
        const uint8_t* chunk = chunks + kChunk * P;
        // Lane r: the int16 pair (scale of sub-block 2P, scale of 2P+1) of row 8h+r.
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 32 * P + 16 * h));
        const __m256i sc16 = kQ3 ? _mm256_cvtepi8_epi16(sc8)
                                 : _mm256_and_si256(_mm256_cvtepu8_epi16(sc8), _mm256_set1_epi16(0x0f));
        __m256i sc_of[2];
        if constexpr (kVnni) {
          sc_of[0] = _mm256_and_si256(sc16, _mm256_set1_epi32(0xffff));
          sc_of[1] = _mm256_srli_epi32(sc16, 16);
        } else {
          sc_of[0] = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(sc16, 0xa0), 0xa0);
          sc_of[1] = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(sc16, 0xf5), 0xf5);
        }
        for (int s = 0; s < 2; ++s) {  // sub-block 2P + s
          const __m256i c = load(chunk + 64 * s + 32 * h);
          __m256i w[4];
#pragma GCC unroll 4
          for (int j = 0; j < 4; ++j) w[j] = _mm256_and_si256(j ? _mm256_srli_epi16(c, 2 * j) : c, three);
          if constexpr (kQ3) {
            // Mask word 4s + j (elements 32P + 16s + 4j + i); this half's bits from byte 4h.
#pragma GCC unroll 4
            for (int j = 0; j < 4; ++j)
              w[j] = _mm256_or_si256(w[j], _mm256_and_si256(bytes_from_bits(chunk + 128 + 8 * (4 * s + j) + 4 * h), four));
          }
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j) {
            const int8_t* xq = xr[j].q + 256 * sb + 32 * P + 16 * s;
            if constexpr (kVnni)
              sumi[j] = dpwssd(sumi[j], dpbusd_sum<4>(_mm256_setzero_si256(), w, xq), sc_of[s]);
            else
              sumi[j] = _mm256_add_epi32(sumi[j], maddubs_sum<kBits, 4>(w, xq, sc_of[s]));
          }
        }
        if constexpr (kQ3) {
          // The stored q + 4: (-4 sc_a, -4 sc_b) against (sum_a(x_q), sum_b(x_q)).
          const __m256i off16 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc16, 2));
#pragma GCC unroll 8
          for (int j = 0; j < RB; ++j) sumi[j] = madd_acc(sumi[j], off16, bcast4(xr[j].s16 + 16 * sb + 2 * P));
        }
      }
      const __m256 d = load_fp16x8(rec + 16 * h);
      if constexpr (kQ3) {
#pragma GCC unroll 8
        for (int j = 0; j < RB; ++j)
          acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j]), _mm256_mul_ps(d, _mm256_set1_ps(xr[j].d[sb])), acc[j][h]);
      } else {
        const __m256 dmin = load_fp16x8(rec + 32 + 16 * h);
        __m256i mpairs[8];  // int16 pairs (m of sub-block 2P, m of 2P+1)
#pragma GCC unroll 8
        for (int P = 0; P < 8; ++P)
          mpairs[P] = _mm256_srli_epi16(
              _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 32 * P + 16 * h))), 4);
#pragma GCC unroll 8
        for (int j = 0; j < RB; ++j) {
          __m256i msum = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int P = 0; P < 8; ++P) msum = madd_acc(msum, mpairs[P], bcast4(xr[j].s16 + 16 * sb + 2 * P));
          const __m256 dx = _mm256_set1_ps(xr[j].d[sb]);
          acc[j][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j]), _mm256_mul_ps(d, dx), acc[j][h]);
          acc[j][h] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(msum), _mm256_mul_ps(dmin, dx), acc[j][h]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < RB; ++j)
    for (int h = H0; h < H1; ++h) store_half(y + j * ldy, acc[j][h], h, lanes);
}

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
