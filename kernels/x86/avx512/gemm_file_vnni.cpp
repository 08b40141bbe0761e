// AVX-512 VNNI gemm on Q8_0 / Q4_0 / Q4_K / Q6_K / MXFP4 weights in the file's layout
// (MoE experts, which stay in the file mapping, and --no-repack), for the avx512 table's
// gemm (gemm.cpp). Everything else is in an anonymous namespace: no out-of-line AVX-512
// copy of a shared inline function can leak to other translation units.
//
// Integer dot products: each activation row is quantized to 8 bits per 32-block (d =
// amax / 127, q = round(x / d)) and multiplied with vpdpbusd, which wants unsigned
// weights, so they are taken shifted (Q4_0 is already q + 8; Q8_0 gets q + 128, MXFP4's
// doubled values + 12) and offset * sum(x_q) is subtracted from each block's integer sum:
// every block's dot product is exact in int32 before its scale is applied. The 8-bit
// activations move each x by at most (1/2 + 127/2048) / 127 of its block's largest |x|
// (rounding, plus the fp16 scale; kernels_test states the bound).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/kernels.h"
#include "kernels/quant.h"
#include "kernels/tables.h"
#include "kernels/x86/avx512/gemm_packed.h"
#include "kernels/x86/avx512/vec.h"
#include "kernels/x86/prefetch.h"

namespace kiln::kernels::avx512 {
namespace {

constexpr size_t kMaxQuantK = 16384;

inline size_t min_size(size_t a, size_t b) { return a < b ? a : b; }

// The 32-element types these kernels read in the file's layout: block bytes and the offset
// that makes their integer weights unsigned. MXFP4 blocks hold E2M1 codes; their doubled values (-12..12, kMxfp4Values) are the
// integers, and half the E8M0 scale the block's scale.
template <TensorType T>
inline constexpr size_t kBlockBytes = T == TensorType::Q8_0 ? 34 : T == TensorType::MXFP4 ? 17 : 18;
template <TensorType T>
inline constexpr int32_t kOffset = T == TensorType::Q8_0 ? 128 : T == TensorType::MXFP4 ? 12 : 8;

template <TensorType T>
inline float block_scale(const uint8_t* blk) {
  if constexpr (T == TensorType::MXFP4) {
    return mxfp4_half_scale(blk[0]);
  } else {
    uint16_t dh;
    __builtin_memcpy(&dh, blk, 2);
    return _cvtsh_ss(dh);
  }
}

// The scales of a run of 8 blocks spread over 16 lanes (block s in lanes 2s, 2s+1, as the
// interleaved sums lie), picked out of the run's first bytes by 16-bit permutes: every
// scale starts at an even offset but MXFP4's odd blocks (17 bytes), whose byte is the
// high half of its word. Measured no faster here than a vpgatherdd of the 8 words (nor
// than building them in 64-bit integer registers); kept for CPUs with slow gathers.
template <TensorType T>
inline __m512 run_scales16(const uint8_t* w8) {
  const __m512i bytes0 = _mm512_loadu_si512(w8), bytes64 = _mm512_loadu_si512(w8 + 64);
  if constexpr (T == TensorType::MXFP4) {
    // Word 17s/2 into the low half of lanes 2s, 2s+1; odd blocks shift their byte down.
    const __m512i word = _mm512_set_epi16(0, 59, 0, 59, 0, 51, 0, 51, 0, 42, 0, 42, 0, 34, 0, 34,  //
                                          0, 25, 0, 25, 0, 17, 0, 17, 0, 8, 0, 8, 0, 0, 0, 0);
    const __m512i shift = _mm512_set_epi32(8, 8, 0, 0, 8, 8, 0, 0, 8, 8, 0, 0, 8, 8, 0, 0);
    const __m512i picked = _mm512_maskz_permutex2var_epi16(0x55555555, bytes0, word, bytes64);
    const __m512i e = _mm512_and_si512(_mm512_srlv_epi32(picked, shift), _mm512_set1_epi32(0xff));
    // mxfp4_half_scale in lanes: 2^(e-128) = bits (e-1) << 23 for e >= 2, subnormal below.
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    const __mmask16 is_normal = _mm512_cmpgt_epi32_mask(e, _mm512_set1_epi32(1));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(is_normal, subnormal, normal));
  } else {
    // fp16 scales at word 9s (Q4_0, 18 bytes) or 17s (Q8_0, 34 bytes: blocks 4..7 lie in
    // the run's third and fourth 64 bytes), gathered as 16 consecutive halves.
    __m512i halves;
    if constexpr (T == TensorType::Q4_0) {
      const __m512i word = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                            63, 63, 54, 54, 45, 45, 36, 36, 27, 27, 18, 18, 9, 9, 0, 0);
      halves = _mm512_permutex2var_epi16(bytes0, word, bytes64);
    } else {
      const __m512i bytes128 = _mm512_loadu_si512(w8 + 128), bytes192 = _mm512_loadu_si512(w8 + 192);
      const __m512i word = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,  //
                                            55, 55, 38, 38, 21, 21, 4, 4, 51, 51, 34, 34, 17, 17, 0, 0);
      halves = _mm512_mask_blend_epi16(0xff00, _mm512_permutex2var_epi16(bytes0, word, bytes64),
                                       _mm512_permutex2var_epi16(bytes128, word, bytes192));
    }
    return _mm512_cvtph_ps(_mm512_castsi512_si256(halves));
  }
}

using x86::prefetch_ahead;

// MXFP4 code -> doubled E2M1 value (kMxfp4Values) + 12, in 0..24: a vpshufb table.
inline __m128i mxfp4_unsigned_values() { return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0); }

// The unsigned weights of blocks A and B (B may be absent: zeros), 32 bytes each.
template <TensorType T>
inline __m512i weight_pair(const uint8_t* a, const uint8_t* b) {
  if constexpr (T == TensorType::Q8_0) {
    const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2));
    const __m256i qb = b ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)) : _mm256_set1_epi8(-128);
    return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1), _mm512_set1_epi8(-128));
  } else {
    constexpr int kQs = T == TensorType::MXFP4 ? 1 : 2;
    const __m128i qa = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + kQs));
    const __m128i qb = b ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + kQs)) : _mm_setzero_si128();
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(qa), qb, 1);
    const __m256i mask = _mm256_set1_epi8(0x0f);
    __m256i lo = _mm256_and_si256(both, mask), hi = _mm256_and_si256(_mm256_srli_epi16(both, 4), mask);
    if constexpr (T == TensorType::MXFP4) {
      // An absent block's zeros become 12s against zero activations: nothing.
      const __m256i table = _mm256_broadcastsi128_si256(mxfp4_unsigned_values());
      lo = _mm256_shuffle_epi8(table, lo);
      hi = _mm256_shuffle_epi8(table, hi);
    }
    // [A_lo, B_lo, A_hi, B_hi] -> [A_lo, A_hi, B_lo, B_hi]: elements 0..15 then 16..31 per block.
    const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    return _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(3, 1, 2, 0));
  }
}

// Every type here but Q6_K reads its activations block-interleaved: in every run of 8
// whole blocks (256 elements) 64-byte vector v holds elements 8v..8v+7 of each block in
// turn, so lanes 2s and 2s+1 of all four vectors belong to block s. A run's four vpdpbusd
// then chain into one integer sum per block (exact) and take one scale multiply for 8
// blocks, where blocks in pairs took one each (their cost, not the reads, bounded the
// experts' decode); the weights get the same order from a few qword shuffles. Blocks past
// the last whole run stay in order (the pair loop reads them).
template <TensorType T>
inline constexpr bool kInterleaved = T != TensorType::Q6_K;

inline void interleave_blocks8(int8_t* q, size_t n_blocks) {
  for (size_t run = 0; run + 8 <= n_blocks; run += 8) {
    uint64_t in[32], out[32];
    __builtin_memcpy(in, q + 32 * run, sizeof in);
    for (int v = 0; v < 4; ++v)
      for (int s = 0; s < 8; ++s) out[8 * v + s] = in[4 * s + v];
    __builtin_memcpy(q + 32 * run, out, sizeof out);
  }
}

// Lane l of a 16-lane vector takes value l / 2 of 8: block s's scale in lanes 2s, 2s+1.
inline __m512i block_of_lane() { return _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0); }

// The interleaved sums of one run against activation row x (256 bytes): lanes 2s, 2s+1
// hold block s's integer dot product, split in two.
inline __m512i run_dot(const __m512i* wv, const int8_t* x) {
  __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv[0], _mm512_loadu_si512(x));
  for (int v = 1; v < 4; ++v) sum = _mm512_dpbusd_epi32(sum, wv[v], _mm512_loadu_si512(x + 64 * v));
  return sum;
}

// The unsigned weights of a run of 8 blocks in the interleaved order.
template <TensorType T>
inline void weight_run(const uint8_t* w8, __m512i* wv) {
  constexpr int B = int(kBlockBytes<T>);
  if constexpr (T == TensorType::Q8_0) {
    // Blocks s, s+1 as the halves of a vector: qword 4h + q is qword q of block s + h.
    const auto two = [](const uint8_t* blk) {
      const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
      const __m256i second = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + B + 2));
      return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(first), second, 1), _mm512_set1_epi8(-128));
    };
    const __m512i b01 = two(w8), b23 = two(w8 + 2 * B), b45 = two(w8 + 4 * B), b67 = two(w8 + 6 * B);
    // Qwords 0 then 1 (or 2 then 3) of four blocks, then the two halves of the run.
    const __m512i q01 = _mm512_set_epi64(13, 9, 5, 1, 12, 8, 4, 0), q23 = _mm512_set_epi64(15, 11, 7, 3, 14, 10, 6, 2);
    const __m512i lo01 = _mm512_permutex2var_epi64(b01, q01, b23), hi01 = _mm512_permutex2var_epi64(b45, q01, b67);
    const __m512i lo23 = _mm512_permutex2var_epi64(b01, q23, b23), hi23 = _mm512_permutex2var_epi64(b45, q23, b67);
    wv[0] = _mm512_shuffle_i64x2(lo01, hi01, _MM_SHUFFLE(1, 0, 1, 0));
    wv[1] = _mm512_shuffle_i64x2(lo01, hi01, _MM_SHUFFLE(3, 2, 3, 2));
    wv[2] = _mm512_shuffle_i64x2(lo23, hi23, _MM_SHUFFLE(1, 0, 1, 0));
    wv[3] = _mm512_shuffle_i64x2(lo23, hi23, _MM_SHUFFLE(3, 2, 3, 2));
  } else {
    // Q4_0 and MXFP4: 16 code bytes per block, low nibbles elements 0..15, high 16..31.
    constexpr int kQs = T == TensorType::MXFP4 ? 1 : 2;
    const auto four = [](const uint8_t* blk) {  // 4 blocks' code bytes as 128-bit lanes
      __m512i z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + kQs)));
      z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + B + kQs)), 1);
      z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2 * B + kQs)), 2);
      return _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 3 * B + kQs)), 3);
    };
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i z0 = four(w8), z1 = four(w8 + 4 * B);
    __m512i lo0 = _mm512_and_si512(z0, low4), hi0 = _mm512_and_si512(_mm512_srli_epi16(z0, 4), low4);
    __m512i lo1 = _mm512_and_si512(z1, low4), hi1 = _mm512_and_si512(_mm512_srli_epi16(z1, 4), low4);
    if constexpr (T == TensorType::MXFP4) {
      const __m512i table = _mm512_broadcast_i32x4(mxfp4_unsigned_values());
      lo0 = _mm512_shuffle_epi8(table, lo0), hi0 = _mm512_shuffle_epi8(table, hi0);
      lo1 = _mm512_shuffle_epi8(table, lo1), hi1 = _mm512_shuffle_epi8(table, hi1);
    }
    const __m512i first8 = _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0), second8 = _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1);
    wv[0] = _mm512_permutex2var_epi64(lo0, first8, lo1);
    wv[1] = _mm512_permutex2var_epi64(lo0, second8, lo1);
    wv[2] = _mm512_permutex2var_epi64(hi0, first8, hi1);
    wv[3] = _mm512_permutex2var_epi64(hi0, second8, hi1);
  }
}

// One activation row as the kernels read it: the 8-bit values (block-interleaved for
// kInterleaved types), per block of 32 the scale d and sum s of the values, and per run
// of 8 blocks what every weight row would otherwise recompute: d spread over each
// block's two lanes (d16), the offset correction of the int8 types in each block's first
// lane (corr16), and for Q4_K d * s (for the mins).
struct ActRow {
  const int8_t* q;
  const float* d;
  const int32_t* s;
  const float* d16;
  const int32_t* corr16;
  const float* ds;
};

// One weight row against NB quantized activation rows: each run of weights is unpacked once
// and used NB times; every output keeps its own accumulator and sequence of operations,
// identical for any NB.
template <TensorType T, int NB>
inline void row_acc_int8(const uint8_t* w, const ActRow* x, size_t n_blocks, __m512* acc, const uint8_t* end) {
  constexpr size_t kBytes = kBlockBytes<T>;
  constexpr int32_t kOff = kOffset<T>;
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) acc[j] = _mm512_setzero_ps();
  // Runs of eight blocks: their scales and offset corrections as vectors, spread over
  // each block's two lanes.
  size_t blk = 0;
  for (; blk + 8 <= n_blocks; blk += 8) {
    const uint8_t* w8 = w + blk * kBytes;
    prefetch_ahead(w8, 8 * kBytes, end);
    const __m512 dw = run_scales16<T>(w8);
    __m512i wv[4];
    weight_run<T>(w8, wv);
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const __m512 scale = _mm512_mul_ps(dw, _mm512_loadu_ps(x[j].d16 + 2 * blk));
      const __m512i corr = _mm512_loadu_si512(x[j].corr16 + 2 * blk);
      const __m512i sum = _mm512_sub_epi32(run_dot(wv, x[j].q + 32 * blk), corr);
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[j]);
    }
  }
  for (; blk < n_blocks; blk += 2) {
    const bool pair = blk + 1 < n_blocks;
    const uint8_t* wa = w + blk * kBytes;
    const uint8_t* wb = pair ? wa + kBytes : nullptr;
    const __m512i wv = weight_pair<T>(wa, wb);
    const float sa = block_scale<T>(wa), sb = pair ? block_scale<T>(wb) : 0.0f;
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      const int8_t* xb = x[j].q + 32 * blk;
      const __m512i xv = pair ? _mm512_loadu_si512(xb) : _mm512_maskz_loadu_epi8(0xffffffffull, xb);
      __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wv, xv);
      // The offset correction goes into the first lane of each block: exact integers.
      __m512i corr = _mm512_maskz_set1_epi32(0x0001, kOff * x[j].s[blk]);
      if (pair) corr = _mm512_mask_set1_epi32(corr, 0x0100, kOff * x[j].s[blk + 1]);
      sum = _mm512_sub_epi32(sum, corr);
      const float da = sa * x[j].d[blk], db = pair ? sb * x[j].d[blk + 1] : 0.0f;
      const __m512 scale = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(da), _mm512_set1_ps(db));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[j]);
    }
  }
}

// Q4_K against the same 8-bit activations: a 256-element super-block holds 8 sub-blocks
// of 32 with 6-bit scales sc and mins m, w = d * sc * q - dmin * m with q in 0..15, so
// each sub-block contributes d * sc * dx * sum(q * xq) - dmin * m * dx * sum(xq). The
// 32 bytes qs[32p..32p+31] hold sub-block 2p in their low nibbles and 2p+1 in their high
// ones: qword v of them is elements 8v..8v+7 of both, which the interleaved order wants
// in qwords 2p, 2p+1 of weight vector v.
template <int NB>
inline void row_acc_q4_k(const uint8_t* w, const ActRow* x, size_t n_blocks, __m512* acc, const uint8_t* end) {
  constexpr size_t kSuperBytes = sizeof(block_q4_K);
  __m256 mins[NB];
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) acc[j] = _mm512_setzero_ps(), mins[j] = _mm256_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i lane_block = block_of_lane();
  const auto widen = [](uint64_t bytes8) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(bytes8))));
  };
  for (size_t sb = 0; sb < n_blocks / 8; ++sb) {
    const block_q4_K* blk = reinterpret_cast<const block_q4_K*>(w + sb * kSuperBytes);
    prefetch_ahead(w + sb * kSuperBytes, kSuperBytes, end);
    const ref::ScalesMinsK4 sm = ref::unpack_scales_mins_k4(blk->scales);
    const __m512 d_sc = _mm512_permutexvar_ps(
        lane_block, _mm512_castps256_ps512(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(blk->d)), widen(sm.sc))));
    const __m256 dmin_m = _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(blk->dmin)), widen(sm.m));
    // Raw qwords 4p + v (v = 0..3) of sub-blocks 0..3 and 4..7, split into nibbles; the
    // unpacks pair each low qword with its high one, the lane shuffles pick v.
    const __m512i z0 = _mm512_loadu_si512(blk->qs), z1 = _mm512_loadu_si512(blk->qs + 64);
    const __m512i l0 = _mm512_and_si512(z0, low4), h0 = _mm512_and_si512(_mm512_srli_epi16(z0, 4), low4);
    const __m512i l1 = _mm512_and_si512(z1, low4), h1 = _mm512_and_si512(_mm512_srli_epi16(z1, 4), low4);
    const __m512i even0 = _mm512_unpacklo_epi64(l0, h0), odd0 = _mm512_unpackhi_epi64(l0, h0);
    const __m512i even1 = _mm512_unpacklo_epi64(l1, h1), odd1 = _mm512_unpackhi_epi64(l1, h1);
    const __m512i wv[4] = {_mm512_shuffle_i64x2(even0, even1, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_i64x2(odd0, odd1, _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_i64x2(even0, even1, _MM_SHUFFLE(3, 1, 3, 1)),
                           _mm512_shuffle_i64x2(odd0, odd1, _MM_SHUFFLE(3, 1, 3, 1))};
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      mins[j] = _mm256_fmadd_ps(dmin_m, _mm256_loadu_ps(x[j].ds + sb * 8), mins[j]);
      const __m512 scale = _mm512_mul_ps(d_sc, _mm512_loadu_ps(x[j].d16 + sb * 16));
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(run_dot(wv, x[j].q + 256 * sb)), scale, acc[j]);
    }
  }
  // The mins' lanes join the sum's lower half, so one horizontal sum finishes the row
  // (several rows' sums are taken together by the caller).
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) acc[j] = _mm512_sub_ps(acc[j], _mm512_zextps256_ps512(mins[j]));
}

// Q6_K against the same 8-bit activations: a 256-element super-block holds q in 0..63
// (low 4 bits in ql, top 2 in qh) with w = d * scales[e / 16] * (q - 32). Unpacked, each
// 64-element vector v is elements 64v..64v+63 in order, so vpdpbusd's lane l covers
// elements 64v + 4l..+3: sub-block 4v + l / 4 (its scale) and activation block 2v + l / 8
// (its dx). The -32 is taken off in integers: 32 * sum(xq) per lane by a second vpdpbusd.
template <int NB>
inline void row_acc_q6_k(const uint8_t* w, const ActRow* x, size_t n_blocks, __m512* acc, const uint8_t* end) {
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) acc[j] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0f), low2 = _mm512_set1_epi8(0x03), k32 = _mm512_set1_epi8(32);
  // qh's 2-bit field for the vector's lower and upper 32 elements (64-bit lane shifts).
  const __m512i shift_01 = _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0), shift_23 = _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4);
  const __m512i sub_pick[4] = {
      _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
      _mm512_set_epi32(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4),
      _mm512_set_epi32(11, 11, 11, 11, 10, 10, 10, 10, 9, 9, 9, 9, 8, 8, 8, 8),
      _mm512_set_epi32(15, 15, 15, 15, 14, 14, 14, 14, 13, 13, 13, 13, 12, 12, 12, 12)};
  for (size_t sb = 0; sb < n_blocks / 8; ++sb) {
    const block_q6_K* blk = reinterpret_cast<const block_q6_K*>(w + sb * sizeof(block_q6_K));
    prefetch_ahead(w + sb * sizeof(block_q6_K), sizeof(block_q6_K), end);
    const __m512 d_sc = _mm512_mul_ps(
        _mm512_set1_ps(_cvtsh_ss(blk->d)),
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales)))));
    __m512i qv[4];
    for (int half = 0; half < 2; ++half) {
      // ql bytes 0..31 hold elements 128h + 0..31 (low nibble) and +64..95 (high), bytes
      // 32..63 elements +32..63 and +96..127; qh byte l holds bits 4-5 of elements
      // 128h + l + 32c in its bits 2c..2c+1.
      const __m512i ql = _mm512_loadu_si512(blk->ql + 64 * half);
      const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * half)));
      const __m512i hi01 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, shift_01), low2), 4);
      const __m512i hi23 = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi64(qh, shift_23), low2), 4);
      qv[2 * half] = _mm512_or_si512(_mm512_and_si512(ql, low4), hi01);
      qv[2 * half + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4), hi23);
    }
#pragma GCC unroll 4
    for (int j = 0; j < NB; ++j) {
      for (int v = 0; v < 4; ++v) {
        const __m512i xv = _mm512_loadu_si512(x[j].q + 256 * sb + 64 * v);
        const __m512i sum = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), qv[v], xv),
                                             _mm512_dpbusd_epi32(_mm512_setzero_si512(), k32, xv));
        const float* dx = x[j].d + 8 * sb + 2 * v;
        const __m512 dx2 = _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(dx[0]), _mm512_set1_ps(dx[1]));
        const __m512 scale = _mm512_mul_ps(_mm512_permutexvar_ps(sub_pick[v], d_sc), dx2);
        acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), scale, acc[j]);
      }
    }
  }
}

// One weight row of any VNNI type against NB activation rows, left as NB accumulators
// whose horizontal sums are the dot products.
template <TensorType T, int NB>
inline void row_acc(const uint8_t* w, const ActRow* x, size_t n_blocks, __m512* acc, const uint8_t* end) {
  if constexpr (T == TensorType::Q4_K) row_acc_q4_k<NB>(w, x, n_blocks, acc, end);
  else if constexpr (T == TensorType::Q6_K) row_acc_q6_k<NB>(w, x, n_blocks, acc, end);
  else row_acc_int8<T, NB>(w, x, n_blocks, acc, end);
}

template <TensorType T, int NB>
inline void row_dot(const uint8_t* w, const ActRow* x, size_t n_blocks, float* const* out, const uint8_t* end) {
  __m512 acc[NB];
  row_acc<T, NB>(w, x, n_blocks, acc, end);
#pragma GCC unroll 4
  for (int j = 0; j < NB; ++j) *out[j] = Vec::hsum(acc[j]);
}

// Batches are taken a few activation rows at a time (their 8-bit copies live on the stack)
// and every weight row is dotted with all of them while it is hot in L1. Each output is
// computed exactly as in decode, so results do not depend on the batch size either.
template <TensorType T>
void gemm_quant_vnni(const GemmArgs& a) {
  constexpr size_t kRows = 8;
  const size_t n_blocks = a.k / 32;
  alignas(64) int8_t xq[kRows][kMaxQuantK];
  float xd[kRows][kMaxQuantK / 32];
  int32_t xs[kRows][kMaxQuantK / 32];
  // Per run of 8 blocks: 16 lanes of d (and of corrections); Q4_K's d * s per block.
  alignas(64) float xd16[kRows][kMaxQuantK / 16];
  alignas(64) int32_t xcorr16[kRows][kInterleaved<T> && T != TensorType::Q4_K ? kMaxQuantK / 16 : 1];
  alignas(64) float xds[kRows][T == TensorType::Q4_K ? kMaxQuantK / 32 : 1];
  ActRow x[kRows];
  const size_t w_row_bytes = a.w_row_bytes;
  const uint8_t* end = static_cast<const uint8_t*>(a.w) + a.r1 * w_row_bytes;
  for (size_t b0 = 0; b0 < a.n_batch; b0 += kRows) {
    const size_t nb = min_size(kRows, a.n_batch - b0);
    for (size_t b = 0; b < nb; ++b) {
      Vec::quantize_q8_32(a.x + (b0 + b) * a.ldx, n_blocks, xq[b], xd[b], xs[b]);
      x[b] = {xq[b], xd[b], xs[b], xd16[b], xcorr16[b], xds[b]};
      if constexpr (kInterleaved<T>) {
        interleave_blocks8(xq[b], n_blocks);
        for (size_t i = 0; i < n_blocks / 8 * 16; ++i) xd16[b][i] = xd[b][i / 2];
        if constexpr (T == TensorType::Q4_K)
          for (size_t i = 0; i < n_blocks; ++i) xds[b][i] = xd[b][i] * float(xs[b][i]);
        else
          for (size_t i = 0; i < n_blocks / 8 * 16; ++i) xcorr16[b][i] = i % 2 ? 0 : kOffset<T> * xs[b][i / 2];
      }
    }
    const auto dot1 = [&](const uint8_t* w, size_t b, size_t r) {
      float* o1[1] = {&a.y[(b0 + b) * a.ldy + r]};
      row_dot<T, 1>(w, &x[b], n_blocks, o1, end);
    };
    size_t r = a.r0;
    // Four weight rows x four activation rows: 16 accumulators, summed together
    // (hsum_many: the same sums as one by one, at a third of the cost), which is
    // what short rows (attention's keys, k = head_dim; a MoE expert's down
    // projection, one Q4_K/Q6_K super-block per row) are dominated by otherwise.
    for (; r + 4 <= a.r1; r += 4) {
      const uint8_t* w = static_cast<const uint8_t*>(a.w) + r * w_row_bytes;
      size_t b = 0;
      for (; b + 4 <= nb; b += 4) {
        __m512 acc[16];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) row_acc<T, 4>(w + i * w_row_bytes, &x[b], n_blocks, acc + 4 * i, end);
        float sums[16];
        Vec::hsums<16>(acc, sums);
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j) a.y[(b0 + b + j) * a.ldy + r + i] = sums[4 * i + j];
      }
      // Fewer than four activation rows left (decode: one): four weight rows against
      // each, so a token's matvec also sums four rows' accumulators together.
      for (; b < nb; ++b) {
        __m512 acc[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) row_acc<T, 1>(w + i * w_row_bytes, &x[b], n_blocks, acc + i, end);
        float sums[4];
        Vec::hsums<4>(acc, sums);
        for (int i = 0; i < 4; ++i) a.y[(b0 + b) * a.ldy + r + i] = sums[i];
      }
    }
    for (; r < a.r1; ++r) {
      const uint8_t* w = static_cast<const uint8_t*>(a.w) + r * w_row_bytes;
      size_t b = 0;
      for (; b + 4 <= nb; b += 4) {
        float* o4[4] = {&a.y[(b0 + b) * a.ldy + r], &a.y[(b0 + b + 1) * a.ldy + r], &a.y[(b0 + b + 2) * a.ldy + r],
                        &a.y[(b0 + b + 3) * a.ldy + r]};
        row_dot<T, 4>(w, &x[b], n_blocks, o4, end);
      }
      for (; b < nb; ++b) dot1(w, b, r);
    }
  }
}

}  // namespace

bool gemm_file_vnni(const GemmArgs& a) {
  if (a.k > kMaxQuantK) return false;
  switch (a.w_type) {
    case TensorType::Q8_0: gemm_quant_vnni<TensorType::Q8_0>(a); return true;
    case TensorType::Q4_0: gemm_quant_vnni<TensorType::Q4_0>(a); return true;
    case TensorType::Q4_K: gemm_quant_vnni<TensorType::Q4_K>(a); return true;
    case TensorType::Q6_K: gemm_quant_vnni<TensorType::Q6_K>(a); return true;
    case TensorType::MXFP4: gemm_quant_vnni<TensorType::MXFP4>(a); return true;
    default: return false;
  }
}

}  // namespace kiln::kernels::avx512
