#pragma once
// Internal to kernels/x86/iquant_gemm_avx2.h (AVX2 flags): one 256-element block of an
// i-quant or ternary type (file layout, kernels/quant_iq.h) -> its elements as signed
// integers q in eight 32-byte vectors and the float scales of their 8 lanes, so that each
// lane of vectors 0..3 belongs to one sub-block throughout (scale[0]) and so does each
// lane of vectors 4..7 (scale[1]). Orders (kernels/x86/iquant_gemm_avx2.h transposes the
// first, the activations follow each):
//  * element order (vector v: elements 32v..32v+31) for scales per 16 (IQ2_XS, IQ2_S,
//    IQ1_M): lane v of scale[0] / scale[1] is the scale of 32v's first / second 16;
//  * the qword interleave for scales per 32 (IQ2_XXS, IQ3_XXS, IQ3_S, IQ1_S), fetched so
//    by the codebook gathers: qword j of vector c = elements 32g + 8(c % 4) .. + 7 of
//    group g = j + 4(c / 4), so scale[h] holds groups 4h..4h+3 in lane pairs;
//  * element order for TQ1_0/TQ2_0 (one scale), given as digits (q + 1).
// The integer forms and scales are those of kernels/x86/iquant_decode_avx512.h; codebook
// rows come by vpgather (4 qwords or 8 dwords at a time).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/quant_iq.h"

namespace kiln::kernels::avx2 {
namespace {

// A 7-bit sign field (bit 7 its parity, as kernels/scalar/quant_iq_dequant.cpp's
// expand_signs) -> 8 bytes for vpsignb: 0xff (-1) negates the element, 1 keeps it.
// Gathering these per group of 8 costs fewer instructions than spreading sign bits.
constexpr uint64_t iq2_sign_word(uint32_t f) {
  uint32_t parity = 0;
  for (int b = 0; b < 7; ++b) parity ^= (f >> b) & 1;
  const uint32_t e = f | parity << 7;
  uint64_t w = 0;
  for (int j = 0; j < 8; ++j) w |= uint64_t((e >> j) & 1 ? 0xff : 0x01) << (8 * j);
  return w;
}
struct Iq2SignTable {
  alignas(64) uint64_t w[128];
  constexpr Iq2SignTable() : w{} {
    for (uint32_t f = 0; f < 128; ++f) w[f] = iq2_sign_word(f);
  }
};
constexpr Iq2SignTable kIq2Signs;
inline __m256i iq2_sign_words(__m128i fields) {
  return _mm256_i32gather_epi64(reinterpret_cast<const long long*>(kIq2Signs.w), fields, 8);
}

struct IqBlock2 {
  __m256i q[8];
  __m256 scale[2];
};

inline float iq2_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}
inline uint32_t iq2_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline __m128i iq2_bytes4(const uint8_t* p) { return _mm_cvtepu8_epi32(_mm_cvtsi32_si128(int(iq2_u32(p)))); }

// 0xff in byte i where bit i of `bits` is set.
inline __m256i iq2_mask(uint32_t bits) {
  const __m256i which = _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
  return _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), which), bit), bit);
}
// Negates the elements whose bit is set in the 256-bit sign string (32 bytes at s).
inline void iq2_apply_signs(__m256i q[8], const uint8_t* s) {
  const __m256i one = _mm256_set1_epi8(1);
  for (int v = 0; v < 8; ++v) q[v] = _mm256_sign_epi8(q[v], _mm256_or_si256(iq2_mask(iq2_u32(s + 4 * v)), one));
}
inline __m256 iq2_half_scales(float d, __m256i ls, float f) {
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_add_ps(_mm256_set1_ps(0.5f), _mm256_cvtepi32_ps(ls))),
                       _mm256_set1_ps(f));
}
// The qword interleave's signs: byte g of qword l of the transposed string is the sign
// byte of group g's 8 elements 8l.., and vector c takes groups 4(c / 4).. of l = c % 4.
inline void iq2_apply_signs32(__m256i q[8], __m256i signs) {
  const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                      0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i t =
      _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(signs, tr), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  alignas(32) uint32_t w[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(w), t);
  const __m256i one = _mm256_set1_epi8(1);
  for (int c = 0; c < 8; ++c) q[c] = _mm256_sign_epi8(q[c], _mm256_or_si256(iq2_mask(w[2 * (c % 4) + c / 4]), one));
}
// Eight per-32 scales -> lane pairs of groups 0..3 and 4..7.
inline void iq2_split8(__m256 v, __m256 scale[2]) {
  scale[0] = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3));
  scale[1] = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7));
}
inline __m128i iq2_half(__m256i v, int c) { return c < 4 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1); }

// IQ2_XS / IQ2_S scales: byte g's low nibble for the first 16 of group g, high for the rest.
inline void iq2_nibble_scales(float d, const uint8_t* sc, __m256 scale[2]) {
  const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
  scale[0] = iq2_half_scales(d, _mm256_and_si256(b, _mm256_set1_epi32(15)), 0.25f);
  scale[1] = iq2_half_scales(d, _mm256_srli_epi32(b, 4), 0.25f);
}

inline void iq_decode2_iq2_xxs(const uint8_t* blk, IqBlock2& out) {
  const float d = iq2_fp16(blk);
  const __m256 q0 = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
  const __m256 q1 = _mm256_castsi256_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 34)));
  const __m256i idx = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(q0, q1, 0x88)), 0xd8);
  const __m256i aux = _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(q0, q1, 0xdd)), 0xd8);
  const auto* grid = reinterpret_cast<const long long*>(kIq2xxsGrid);
  for (int c = 0; c < 8; ++c)  // index byte c % 4 of groups 4(c / 4)..
    out.q[c] = _mm256_i32gather_epi64(
        grid, _mm_and_si128(_mm_srli_epi32(iq2_half(idx, c), 8 * (c % 4)), _mm_set1_epi32(255)), 8);
  for (int c = 0; c < 8; ++c)  // sign field c % 4 of groups 4(c / 4)..
    out.q[c] = _mm256_sign_epi8(
        out.q[c], iq2_sign_words(_mm_and_si128(_mm_srli_epi32(iq2_half(aux, c), 7 * (c % 4)), _mm_set1_epi32(127))));
  iq2_split8(iq2_half_scales(d, _mm256_srli_epi32(aux, 28), 0.25f), out.scale);
}

inline void iq_decode2_iq2_xs(const uint8_t* blk, IqBlock2& out) {
  const float d = iq2_fp16(blk);
  const auto* grid = reinterpret_cast<const long long*>(kIq2xsGrid);
  for (int v = 0; v < 8; ++v) {  // words 4v..4v+3: 9-bit index | 7 sign bits
    const __m128i w = _mm_cvtepu16_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 2 + 8 * v)));
    const __m256i g = _mm256_i32gather_epi64(grid, _mm_and_si128(w, _mm_set1_epi32(511)), 8);
    out.q[v] = _mm256_sign_epi8(g, iq2_sign_words(_mm_srli_epi32(w, 9)));
  }
  iq2_nibble_scales(d, blk + 66, out.scale);
}

inline void iq_decode2_iq2_s(const uint8_t* blk, IqBlock2& out) {
  const float d = iq2_fp16(blk);
  const auto* grid = reinterpret_cast<const long long*>(kIq2sGrid);
  const __m128i shift = _mm_setr_epi32(0, 2, 4, 6), three = _mm_set1_epi32(3);
  for (int v = 0; v < 8; ++v) {
    const __m128i hi = _mm_slli_epi32(_mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(blk[66 + v]), shift), three), 8);
    out.q[v] = _mm256_i32gather_epi64(grid, _mm_or_si128(iq2_bytes4(blk + 2 + 4 * v), hi), 8);
  }
  iq2_apply_signs(out.q, blk + 34);
  iq2_nibble_scales(d, blk + 74, out.scale);
}

// IQ3: the index bytes 8g + 2l, 8g + 2l + 1 of the four groups of vector c (l = c % 4).
inline __m256i iq2_row_pairs(const uint8_t* qs, int c) {
  const int l = c % 4;
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * (c / 4)));
  const __m256i pick =
      _mm256_setr_epi8(2 * l, 2 * l + 1, 8 + 2 * l, 9 + 2 * l, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 2 * l,
                       2 * l + 1, 8 + 2 * l, 9 + 2 * l, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i b =
      _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(q, pick), _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
  return _mm256_cvtepu8_epi32(_mm256_castsi256_si128(b));
}

inline void iq_decode2_iq3_xxs(const uint8_t* blk, IqBlock2& out) {
  const float d = iq2_fp16(blk);
  const auto* grid = reinterpret_cast<const int*>(kIq3xxsGrid);
  for (int c = 0; c < 8; ++c) out.q[c] = _mm256_i32gather_epi32(grid, iq2_row_pairs(blk + 2, c), 4);
  const __m256i aux = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 66));
  for (int c = 0; c < 8; ++c)
    out.q[c] = _mm256_sign_epi8(
        out.q[c], iq2_sign_words(_mm_and_si128(_mm_srli_epi32(iq2_half(aux, c), 7 * (c % 4)), _mm_set1_epi32(127))));
  iq2_split8(iq2_half_scales(d, _mm256_srli_epi32(aux, 28), 0.5f), out.scale);
}

inline void iq_decode2_iq3_s(const uint8_t* blk, IqBlock2& out) {
  const float d = iq2_fp16(blk);
  const auto* grid = reinterpret_cast<const int*>(kIq3sGrid);
  const __m256i one = _mm256_set1_epi32(1);
  for (int c = 0; c < 8; ++c) {
    const int l = c % 4;
    // qh[g] in both dwords of qword j; row 8g + 2l + h takes its bit 2l + h.
    const __m256i qh = _mm256_shuffle_epi32(_mm256_cvtepu32_epi64(iq2_bytes4(blk + 66 + 4 * (c / 4))), 0xa0);
    const __m256i shift = _mm256_setr_epi32(2 * l, 2 * l + 1, 2 * l, 2 * l + 1, 2 * l, 2 * l + 1, 2 * l, 2 * l + 1);
    const __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(qh, shift), one), 8);
    out.q[c] = _mm256_i32gather_epi32(grid, _mm256_or_si256(iq2_row_pairs(blk + 2, c), hi), 4);
  }
  iq2_apply_signs32(out.q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 74)));
  const __m256i s = _mm256_and_si256(
      _mm256_srlv_epi32(_mm256_set1_epi32(int(iq2_u32(blk + 106))), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
      _mm256_set1_epi32(15));
  iq2_split8(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_add_epi32(s, s), one))),
             out.scale);
}

// IQ1 rows of -1/0/1 bytes times 8, plus the delta's +-1 (delta: 4 qword values).
inline __m256i iq2_eight_plus(__m256i g, __m256i delta) {
  g = _mm256_add_epi8(g, g);
  g = _mm256_add_epi8(g, g);
  return _mm256_add_epi8(_mm256_add_epi8(g, g), delta);
}
constexpr long long kPlusOnes = 0x0101010101010101ll, kMinusOnes = -1ll;

inline void iq_decode2_iq1_s(const uint8_t* blk, IqBlock2& out) {
  const float d = iq2_fp16(blk);
  const auto* grid = reinterpret_cast<const long long*>(kIq1sGrid);
  const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));  // dword g: group g's 4 bytes
  const __m256i qh = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 34)));
  const __m256i negative =
      _mm256_cmpeq_epi32(_mm256_and_si256(qh, _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x8000));
  for (int c = 0; c < 8; ++c) {  // row 4g + l: byte l of qs's dword g, bits 3l.. of qh[g]
    const int l = c % 4;
    const __m128i low = _mm_and_si128(_mm_srli_epi32(iq2_half(qs, c), 8 * l), _mm_set1_epi32(255));
    const __m128i hi = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(iq2_half(qh, c), 3 * l), _mm_set1_epi32(7)), 8);
    const __m256i g = _mm256_i32gather_epi64(grid, _mm_or_si128(low, hi), 8);
    const __m256i neg = _mm256_cvtepi32_epi64(iq2_half(negative, c));
    out.q[c] =
        iq2_eight_plus(g, _mm256_blendv_epi8(_mm256_set1_epi64x(kPlusOnes), _mm256_set1_epi64x(kMinusOnes), neg));
  }
  const __m256i s = _mm256_and_si256(_mm256_srli_epi32(qh, 12), _mm256_set1_epi32(7));
  const __m256i odd = _mm256_add_epi32(_mm256_add_epi32(s, s), _mm256_set1_epi32(1));
  iq2_split8(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(odd)), _mm256_set1_ps(0.125f)),
             out.scale);
}

inline void iq_decode2_iq1_m(const uint8_t* blk, IqBlock2& out) {
  uint64_t all;
  std::memcpy(&all, blk + 48, 8);
  const uint16_t d_bits =
      uint16_t(((all >> 12) & 0xf) | ((all >> 24) & 0xf0) | ((all >> 36) & 0xf00) | ((all >> 48) & 0xf000));
  const float d = _cvtsh_ss(d_bits);
  const auto* grid = reinterpret_cast<const long long*>(kIq1sGrid);
  const __m128i nib_shift = _mm_setr_epi32(0, 4, 8, 12);
  for (int v = 0; v < 8; ++v) {  // groups of 8 k = 4v + l: nibble l of the word qh[2v] | qh[2v + 1] << 8
    uint16_t w;
    std::memcpy(&w, blk + 32 + 2 * v, 2);
    const __m128i nib = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(w), nib_shift), _mm_set1_epi32(15));
    const __m128i idx = _mm_or_si128(iq2_bytes4(blk + 4 * v), _mm_slli_epi32(_mm_and_si128(nib, _mm_set1_epi32(7)), 8));
    const __m256i g = _mm256_i32gather_epi64(grid, idx, 8);
    const __m256i neg =
        _mm256_cvtepi32_epi64(_mm_cmpeq_epi32(_mm_and_si128(nib, _mm_set1_epi32(8)), _mm_set1_epi32(8)));
    out.q[v] =
        iq2_eight_plus(g, _mm256_blendv_epi8(_mm256_set1_epi64x(kPlusOnes), _mm256_set1_epi64x(kMinusOnes), neg));
  }
  // Sub-block 2v + h: bits 16(v / 2) + 6(v % 2) + 3h.. of the 64-bit scale string.
  for (int h = 0; h < 2; ++h) {
    const __m256i str = _mm256_set1_epi64x((long long)all);
    const __m256i a = _mm256_srlv_epi64(str, _mm256_setr_epi64x(3 * h, 6 + 3 * h, 16 + 3 * h, 22 + 3 * h));
    const __m256i b = _mm256_srlv_epi64(str, _mm256_setr_epi64x(32 + 3 * h, 38 + 3 * h, 48 + 3 * h, 54 + 3 * h));
    const __m256i lows =
        _mm256_blend_epi32(_mm256_permutevar8x32_epi32(a, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0)),
                           _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 0, 0, 0, 0, 2, 4, 6)), 0xf0);
    const __m256i s = _mm256_and_si256(lows, _mm256_set1_epi32(7));
    const __m256i odd = _mm256_add_epi32(_mm256_add_epi32(s, s), _mm256_set1_epi32(1));
    out.scale[h] = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(odd)), _mm256_set1_ps(0.125f));
  }
}

// The leading ternary digit of bytes m holding fractions of 3^5 (see
// kernels/x86/iquant_decode_avx512.h): (m > 85) + (m > 170), unsigned, by max and compare.
inline __m256i iq2_trit(__m256i m) {
  const __m256i gt85 = _mm256_cmpeq_epi8(_mm256_max_epu8(m, _mm256_set1_epi8(86)), m);
  const __m256i gt170 = _mm256_cmpeq_epi8(_mm256_max_epu8(m, _mm256_set1_epi8(char(171))), m);
  return _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(gt85, gt170));
}

// Digit t of qs[0..32) is elements 32t..; of qs[32..48) elements 160 + 16t..; of qh
// elements 240 + 4t.. (t < 4). Digits of the next position: the bytes times 3, mod 256.
inline void iq_decode2_tq1_0(const uint8_t* blk, IqBlock2& out) {
  __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
  __m256i b =
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32))),
                              _mm_cvtsi32_si128(int(iq2_u32(blk + 48))), 1);
  __m256i bd[5];
  for (int t = 0; t < 5; ++t) {
    out.q[t] = iq2_trit(a);
    bd[t] = iq2_trit(b);
    a = _mm256_add_epi8(a, _mm256_add_epi8(a, a));
    b = _mm256_add_epi8(b, _mm256_add_epi8(b, b));
  }
  out.q[5] = _mm256_permute2x128_si256(bd[0], bd[1], 0x20);
  out.q[6] = _mm256_permute2x128_si256(bd[2], bd[3], 0x20);
  // qh's digits: dword 4 of bd[0..3].
  const __m256i h = _mm256_permutevar8x32_epi32(
      _mm256_blend_epi32(_mm256_blend_epi32(bd[0], _mm256_slli_si256(bd[1], 4), 0x20),
                         _mm256_blend_epi32(_mm256_slli_si256(bd[2], 8), _mm256_slli_si256(bd[3], 12), 0x80), 0xc0),
      _mm256_setr_epi32(0, 0, 0, 0, 4, 5, 6, 7));
  out.q[7] = _mm256_blend_epi32(bd[4], h, 0xf0);
  out.scale[0] = out.scale[1] = _mm256_set1_ps(iq2_fp16(blk + 52));
}

inline void iq_decode2_tq2_0(const uint8_t* blk, IqBlock2& out) {
  const __m256i three = _mm256_set1_epi8(3);
  for (int v = 0; v < 8; ++v) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * (v / 4)));
    out.q[v] = _mm256_and_si256(_mm256_srli_epi16(b, 2 * (v % 4)), three);
  }
  out.scale[0] = out.scale[1] = _mm256_set1_ps(iq2_fp16(blk + 64));
}

}  // namespace
}  // namespace kiln::kernels::avx2
