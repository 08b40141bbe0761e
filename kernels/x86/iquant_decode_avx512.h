#pragma once
// Internal to kernels/x86/avx512/gemm_iquant.cpp (AVX-512 flags; include inside an
// anonymous namespace only): one 256-element block of an i-quant or ternary type (file
// layout, kernels/quant_iq.h) -> its elements as signed integers q (|q| <= 62) in four
// vectors of 64, and per sub-block of 16 a float scale so that the weight is scale * q.
// Element order: types with a scale per 16 give theirs in order (vector n: elements
// 64n..64n+63); types with a scale per 32 give the "qword interleave" their codebook
// gathers can fetch directly, qword s of vector c = the 8 elements 32s + 8c .. + 7, so
// that lanes 2s, 2s+1 of every vector belong to sub-block s; TQ1_0/TQ2_0 (one scale) in
// order. Codebook rows are fetched by vpgather (8 qwords or 16 dwords per
// instruction), sign bits become byte masks, and no element is handled alone.
//
// The integer forms (exact; ggml's float forms in kernels/scalar/quant_iq_dequant.cpp):
//   IQ2_XXS/XS/S: q = +-grid byte (8, 25, 43),  scale = d * (0.5 + ls) * 0.25
//   IQ3_XXS:      q = +-grid byte (4..62),      scale = d * (0.5 + ls) * 0.5
//   IQ3_S:        q = +-grid byte,              scale = d * (1 + 2 s)
//   IQ1_S/M:      q = 8 grid +- 1 (grid -1, 0, 1; delta +-1/8), scale = d * (2 s + 1) / 8
//   TQ1_0/TQ2_0:  q = trit - 1,                 scale = d   (given as the trit, q + 1)
// The scales round differently from ggml's products in the last bit, which the gemm's
// error bound (8-bit activations) dwarfs.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/quant_iq.h"

namespace kiln::kernels::avx512 {
namespace {

struct IqBlock {
  __m512i q[4];
  __m512 scale;  // lane s: sub-block s (elements 16s..16s+15)
};

inline float iq_fp16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Bytes 8n..8n+7 of v as eight qword indices.
inline __m512i iq_index8(__m256i v, int n) {
  const __m128i half = n < 2 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1);
  return _mm512_cvtepu8_epi64(n % 2 ? _mm_srli_si128(half, 8) : half);
}
// Words 8n..8n+7 of v (32 words) as eight qword indices.
template <int N>
inline __m512i iq_word_index8(__m512i v) { return _mm512_cvtepu16_epi64(_mm512_extracti32x4_epi32(v, N)); }
// The 32 codebook rows of 32 word indices, 8 per gather (template: the lane is an immediate).
inline void iq_gather_words(__m512i idx, const long long* grid, __m512i q[4]) {
  q[0] = _mm512_i64gather_epi64(iq_word_index8<0>(idx), grid, 8);
  q[1] = _mm512_i64gather_epi64(iq_word_index8<1>(idx), grid, 8);
  q[2] = _mm512_i64gather_epi64(iq_word_index8<2>(idx), grid, 8);
  q[3] = _mm512_i64gather_epi64(iq_word_index8<3>(idx), grid, 8);
}

// Sign bytes of 7 bits completed by their parity (bit 7: the quantizer keeps the count of
// negatives even): a nibble-parity lookup of each half.
inline __m256i iq_add_parity(__m256i s) {
  const __m256i parity = _mm256_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,  //
                                          0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i lo = _mm256_shuffle_epi8(parity, _mm256_and_si256(s, low4));
  const __m256i hi = _mm256_shuffle_epi8(parity, _mm256_and_si256(_mm256_srli_epi16(s, 4), low4));
  return _mm256_or_si256(s, _mm256_xor_si256(lo, hi));
}
// Eight dwords holding four 7-bit sign fields each (bits 7l..7l+6) -> 32 sign bytes, byte
// 4g + l of dword g's field l.
inline __m256i iq_signs_of_fields(__m256i a) {
  const __m256i m7 = _mm256_set1_epi32(127);
  __m256i s = _mm256_and_si256(a, m7);
  s = _mm256_or_si256(s, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a, 7), m7), 8));
  s = _mm256_or_si256(s, _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a, 14), m7), 16));
  s = _mm256_or_si256(s, _mm256_slli_epi32(_mm256_srli_epi32(a, 21), 24));  // bits 28.. go too
  return iq_add_parity(_mm256_and_si256(s, _mm256_set1_epi32(0x7f7f7f7f)));
}
// Negates element e of g where bit e of the 256-bit sign string is set.
inline void iq_apply_signs(__m512i g[4], __m256i signs) {
  alignas(32) uint64_t m[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(m), signs);
  for (int n = 0; n < 4; ++n) g[n] = _mm512_mask_sub_epi8(g[n], (__mmask64)m[n], _mm512_setzero_si512(), g[n]);
}
// The same for the qword interleave: byte s of mask c = sign byte 4s + c (one vpshufb
// transposes each half's 4 x 4 bytes, a dword permute joins the halves).
inline void iq_apply_signs32(__m512i g[4], __m256i signs) {
  const __m256i tr = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,  //
                                      0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i t =
      _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(signs, tr), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  iq_apply_signs(g, t);
}
// Eight per-32 scales -> 16 per-16 lanes.
inline __m512 iq_spread8(__m256 v) {
  return _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
                               _mm512_castps256_ps512(v));
}
// d * (0.5 + ls) * f, as ggml associates it.
inline __m256 iq_half_scales(float d, __m256i ls, float f) {
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_add_ps(_mm256_set1_ps(0.5f), _mm256_cvtepi32_ps(ls))),
                       _mm256_set1_ps(f));
}
// 8 bytes of nibble pairs -> 16 dwords: lane s the nibble s % 2 of byte s / 2.
inline __m512i iq_nibbles16(const uint8_t* p) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  const __m512i dup = _mm512_permutexvar_epi32(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0), b);
  return _mm512_and_si512(_mm512_srlv_epi32(dup, _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0)),
                          _mm512_set1_epi32(15));
}

// IQ2_XXS: qword g of qs = four grid indices | signs and scale.
inline void iq_decode_iq2_xxs(const uint8_t* blk, IqBlock& out) {
  const float d = iq_fp16(blk);
  const __m512i qs = _mm512_loadu_si512(blk + 2);  // qword s: index bytes of group s, then aux
  const __m256i aux = _mm512_cvtepi64_epi32(_mm512_srli_epi64(qs, 32));
  const auto* grid = reinterpret_cast<const long long*>(kIq2xxsGrid);
  for (int c = 0; c < 4; ++c)
    out.q[c] = _mm512_i64gather_epi64(_mm512_and_si512(_mm512_srli_epi64(qs, 8 * c), _mm512_set1_epi64(255)), grid, 8);
  iq_apply_signs32(out.q, iq_signs_of_fields(aux));
  out.scale = iq_spread8(iq_half_scales(d, _mm256_srli_epi32(aux, 28), 0.25f));
}

// IQ2_XS: 32 words = 9-bit index | 7 sign bits; nibble scales per 16.
inline void iq_decode_iq2_xs(const uint8_t* blk, IqBlock& out) {
  const float d = iq_fp16(blk);
  const __m512i qs = _mm512_loadu_si512(blk + 2);
  const __m512i idx = _mm512_and_si512(qs, _mm512_set1_epi16(511));
  const auto* grid = reinterpret_cast<const long long*>(kIq2xsGrid);
  iq_gather_words(idx, grid, out.q);
  iq_apply_signs(out.q, iq_add_parity(_mm512_cvtepi16_epi8(_mm512_srli_epi16(qs, 9))));
  const __m512i ls = iq_nibbles16(blk + 66);
  out.scale =
      _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d), _mm512_add_ps(_mm512_set1_ps(0.5f), _mm512_cvtepi32_ps(ls))),
                    _mm512_set1_ps(0.25f));
}

// IQ2_S: index byte k | bits 2(k%4).. of qh[k/4] as bits 8..9; explicit sign bytes.
inline void iq_decode_iq2_s(const uint8_t* blk, IqBlock& out) {
  const float d = iq_fp16(blk);
  const __m512i low = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
  const __m512i qh =
      _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 66))));
  const __m512i qh4 = _mm512_permutexvar_epi16(
      _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
                                         11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                        2),
      qh);
  const __m512i shift =
      _mm512_set_epi16(6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0);
  const __m512i hi = _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh4, shift), _mm512_set1_epi16(3)), 8);
  const __m512i idx = _mm512_or_si512(low, hi);
  const auto* grid = reinterpret_cast<const long long*>(kIq2sGrid);
  iq_gather_words(idx, grid, out.q);
  iq_apply_signs(out.q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 34)));
  const __m512i ls = iq_nibbles16(blk + 74);
  out.scale =
      _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d), _mm512_add_ps(_mm512_set1_ps(0.5f), _mm512_cvtepi32_ps(ls))),
                    _mm512_set1_ps(0.25f));
}

// IQ3_XXS: 64 index bytes of 4-element rows, then 8 dwords of sign fields and scales.
inline void iq_decode_iq3_xxs(const uint8_t* blk, IqBlock& out) {
  const float d = iq_fp16(blk);
  const auto* grid = reinterpret_cast<const int*>(kIq3xxsGrid);
  const __m512i qs = _mm512_loadu_si512(blk + 2);  // qword s: the 8 rows of group s
  for (int c = 0; c < 4; ++c)                      // rows 8s + 2c, 8s + 2c + 1
    out.q[c] =
        _mm512_i32gather_epi32(_mm512_cvtepu8_epi32(_mm512_cvtepi64_epi16(_mm512_srli_epi64(qs, 16 * c))), grid, 4);
  const __m256i aux = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 66));
  iq_apply_signs32(out.q, iq_signs_of_fields(aux));
  out.scale = iq_spread8(iq_half_scales(d, _mm256_srli_epi32(aux, 28), 0.5f));
}

// IQ3_S: index byte k | bit k%8 of qh[k/8] as bit 8; explicit sign bytes; nibble scales per 32.
inline void iq_decode_iq3_s(const uint8_t* blk, IqBlock& out) {
  const float d = iq_fp16(blk);
  const auto* grid = reinterpret_cast<const int*>(kIq3sGrid);
  const __m512i qs = _mm512_loadu_si512(blk + 2);
  // qh[s] in both dwords of qword s; row 8s + 2c + h takes its bit 2c + h.
  const __m512i qh = _mm512_shuffle_epi32(
      _mm512_cvtepu8_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk + 66))), _MM_PERM_CCAA);
  for (int c = 0; c < 4; ++c) {
    const __m512i shift = _mm512_set1_epi64((long long)(uint64_t(2 * c + 1) << 32 | uint64_t(2 * c)));
    const __m512i hi = _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(qh, shift), _mm512_set1_epi32(1)), 8);
    const __m512i low = _mm512_cvtepu8_epi32(_mm512_cvtepi64_epi16(_mm512_srli_epi64(qs, 16 * c)));
    out.q[c] = _mm512_i32gather_epi32(_mm512_or_si512(low, hi), grid, 4);
  }
  iq_apply_signs32(out.q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 74)));
  uint32_t sc4;
  std::memcpy(&sc4, blk + 106, 4);
  const __m256i sc =
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(sc4)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                       _mm256_set1_epi32(15));
  const __m256i odd = _mm256_add_epi32(_mm256_add_epi32(sc, sc), _mm256_set1_epi32(1));
  out.scale = iq_spread8(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(odd)));
}

// IQ1: rows of -1/0/1 bytes times 8 (three doublings: no byte crosses into the next),
// then +1, or -1 in the qwords (groups of 8) whose delta is negative.
inline void iq1_finish(__m512i q[4], const __mmask8 negative[4]) {
  const __m512i one = _mm512_set1_epi8(1);
  for (int n = 0; n < 4; ++n) {
    __m512i g = _mm512_add_epi8(q[n], q[n]);
    g = _mm512_add_epi8(g, g);
    g = _mm512_add_epi8(g, g);
    q[n] = _mm512_mask_blend_epi64(negative[n], _mm512_add_epi8(g, one), _mm512_sub_epi8(g, one));
  }
}

// IQ1_S: index byte k | bits 3(k%4).. of qh[k/4] as bits 8..10; qh[g] bits 12..14 the
// scale, bit 15 the delta's sign, per group of 32.
inline void iq_decode_iq1_s(const uint8_t* blk, IqBlock& out) {
  const float d = iq_fp16(blk);
  const __m128i qh8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 34));
  const __m512i qs = _mm512_cvtepu32_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)));
  const __m512i qh = _mm512_cvtepu16_epi64(qh8);  // qword s: qh[s]
  const auto* grid = reinterpret_cast<const long long*>(kIq1sGrid);
  for (int c = 0; c < 4; ++c) {  // row 4s + c: byte c of qs's dword s, bits 3c.. of qh[s]
    const __m512i low = _mm512_and_si512(_mm512_srli_epi64(qs, 8 * c), _mm512_set1_epi64(255));
    const __m512i hi = _mm512_slli_epi64(_mm512_and_si512(_mm512_srli_epi64(qh, 3 * c), _mm512_set1_epi64(7)), 8);
    out.q[c] = _mm512_i64gather_epi64(_mm512_or_si512(low, hi), grid, 8);
  }
  const __mmask8 negative = _mm512_test_epi64_mask(qh, _mm512_set1_epi64(0x8000));
  const __mmask8 all[4] = {negative, negative, negative, negative};
  iq1_finish(out.q, all);
  const __m256i sc = _mm256_and_si256(_mm256_srli_epi32(_mm256_cvtepu16_epi32(qh8), 12), _mm256_set1_epi32(7));
  const __m256i odd = _mm256_add_epi32(_mm256_slli_epi32(sc, 1), _mm256_set1_epi32(1));
  out.scale =
      iq_spread8(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(odd)), _mm256_set1_ps(0.125f)));
}

// IQ1_M: index byte k | nibble k%2 of qh[k/2] (bits 0..2; bit 3 the delta's sign per
// group of 8); 3-bit scales per 16 and the fp16 d in the four scale words.
inline void iq_decode_iq1_m(const uint8_t* blk, IqBlock& out) {
  uint16_t sc[4];
  std::memcpy(sc, blk + 48, 8);
  const uint16_t d_bits = uint16_t((sc[0] >> 12) | (sc[1] >> 12) << 4 | (sc[2] >> 12) << 8 | (sc[3] >> 12) << 12);
  const float d = _cvtsh_ss(d_bits);
  const __m512i low = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
  const __m512i qh =
      _mm512_castsi256_si512(_mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32))));
  const __m512i qh2 = _mm512_permutexvar_epi16(
      _mm512_srli_epi16(_mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12,
                                         11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                        1),
      qh);
  const __m512i nib =
      _mm512_and_si512(_mm512_srlv_epi16(qh2, _mm512_set_epi16(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4,
                                                               0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0)),
                       _mm512_set1_epi16(15));
  const __m512i idx = _mm512_or_si512(low, _mm512_slli_epi16(_mm512_and_si512(nib, _mm512_set1_epi16(7)), 8));
  const auto* grid = reinterpret_cast<const long long*>(kIq1sGrid);
  iq_gather_words(idx, grid, out.q);
  const __mmask32 neg = _mm512_test_epi16_mask(nib, _mm512_set1_epi16(8));
  __mmask8 negative[4];
  for (int n = 0; n < 4; ++n) negative[n] = __mmask8(neg >> (8 * n));
  iq1_finish(out.q, negative);
  uint64_t all;
  std::memcpy(&all, sc, 8);
  // Lane s: bits 16(s / 4) + 3(s % 4).. of the 64-bit scale string, in two halves of 8.
  const __m512i str = _mm512_set1_epi64((long long)all);
  const __m512i lo = _mm512_srlv_epi64(str, _mm512_set_epi64(25, 22, 19, 16, 9, 6, 3, 0));
  const __m512i hi = _mm512_srlv_epi64(str, _mm512_set_epi64(57, 54, 51, 48, 41, 38, 35, 32));
  const __m512i s = _mm512_and_si512(
      _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi64_epi32(lo)), _mm512_cvtepi64_epi32(hi), 1),
      _mm512_set1_epi32(7));
  const __m512i odd = _mm512_add_epi32(_mm512_slli_epi32(s, 1), _mm512_set1_epi32(1));
  out.scale = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(odd)), _mm512_set1_ps(0.125f));
}

// IQ4_XS (for weights left in the file's layout; packed ones have their own tiles):
// 4-bit codes into kIq4nlValues (|q| <= 127), 6-bit scales per 32, in the qword
// interleave and given as q + 128 (the lookup table's). Qword c of sub-block s is the low
// (c < 2) or high nibbles of qword 2s + c % 2 of qs.
inline void iq_decode_iq4_xs(const uint8_t* blk, IqBlock& out) {
  const float d = iq_fp16(blk);
  alignas(16) uint8_t t[16];
  for (int i = 0; i < 16; ++i) t[i] = uint8_t(kIq4nlValues[i] + 128);
  const __m512i values = _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t)));
  const __m512i q0 = _mm512_loadu_si512(blk + 8), q1 = _mm512_loadu_si512(blk + 72), low4 = _mm512_set1_epi8(0x0f);
  const __m512i even = _mm512_permutex2var_epi64(q0, _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0), q1);
  const __m512i odd = _mm512_permutex2var_epi64(q0, _mm512_set_epi64(15, 13, 11, 9, 7, 5, 3, 1), q1);
  out.q[0] = _mm512_shuffle_epi8(values, _mm512_and_si512(even, low4));
  out.q[1] = _mm512_shuffle_epi8(values, _mm512_and_si512(odd, low4));
  out.q[2] = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16(even, 4), low4));
  out.q[3] = _mm512_shuffle_epi8(values, _mm512_and_si512(_mm512_srli_epi16(odd, 4), low4));
  uint16_t high;
  uint32_t low;
  std::memcpy(&high, blk + 2, 2);
  std::memcpy(&low, blk + 4, 4);
  const __m256i g = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i ls_low =
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int(low)), _mm256_slli_epi32(g, 2)), _mm256_set1_epi32(15));
  const __m256i ls_high =
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(high), _mm256_add_epi32(g, g)), _mm256_set1_epi32(3));
  const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(ls_low, _mm256_slli_epi32(ls_high, 4)), _mm256_set1_epi32(32));
  out.scale = iq_spread8(_mm256_mul_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(ls)));
}

// Ternary digits of bytes holding the fraction value / 3^5 rounded up: multiplying by 3
// (mod 256, three byte adds) drops the leading digit, and the leading digit of m is
// (3m) >> 8, i.e. (m > 85) + (m > 170). TQ1_0/TQ2_0 decoders give the digit t, q + 1.
inline __m512i tq_digit(__m512i m) {
  const __m512i one = _mm512_set1_epi8(1);
  const __m512i t = _mm512_maskz_mov_epi8(_mm512_cmpgt_epu8_mask(m, _mm512_set1_epi8(85)), one);
  return _mm512_mask_add_epi8(t, _mm512_cmpgt_epu8_mask(m, _mm512_set1_epi8(char(170))), t, one);
}

// TQ1_0: digit t of qs[m] (m < 32) is element 32t + m, of qs[32 + m] (m < 16) element
// 160 + 16t + m, of qh[m] element 240 + 4t + m. The 52 bytes in one vector give five
// vectors of digits Z[t]; 128-bit lanes and dwords of them then make the element order.
inline void iq_decode_tq1_0(const uint8_t* blk, IqBlock& out) {
  __m512i m = _mm512_maskz_loadu_epi8((__mmask64)0x000fffffffffffffull, blk);
  __m512i z[5];
  for (int t = 0; t < 5; ++t) {
    z[t] = tq_digit(m);
    m = _mm512_add_epi8(m, _mm512_add_epi8(m, m));
  }
  out.q[0] = _mm512_shuffle_i64x2(z[0], z[1], _MM_SHUFFLE(1, 0, 1, 0));
  out.q[1] = _mm512_shuffle_i64x2(z[2], z[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i x = _mm512_shuffle_i64x2(z[0], z[1], _MM_SHUFFLE(2, 2, 2, 2));
  out.q[2] = _mm512_shuffle_i64x2(z[4], x, _MM_SHUFFLE(2, 0, 1, 0));
  // Elements 192..255: lane 2 of Z[2], Z[3], Z[4], then dword 12 (qh's digits) of Z[0..3].
  const __m512i y = _mm512_shuffle_i64x2(z[2], z[3], _MM_SHUFFLE(3, 2, 3, 2));
  __m512i c3 =
      _mm512_permutex2var_epi32(y, _mm512_set_epi32(12, 4, 0, 0, 27, 26, 25, 24, 11, 10, 9, 8, 3, 2, 1, 0), z[4]);
  const __m512i h01 =
      _mm512_permutex2var_epi32(z[0], _mm512_set_epi32(0, 0, 28, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), z[1]);
  out.q[3] = _mm512_mask_mov_epi32(c3, 0x3000, h01);
  out.scale = _mm512_set1_ps(iq_fp16(blk + 52));
}

// TQ2_0: element 128h + 32l + m is bits 2l.. of qs[32h + m] (the digit t).
inline void iq_decode_tq2_0(const uint8_t* blk, IqBlock& out) {
  const __m512i three = _mm512_set1_epi8(3);
  for (int h = 0; h < 2; ++h) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32 * h));
    const __m512i bb = _mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 2), 1);
    out.q[2 * h] = _mm512_and_si512(bb, three);
    out.q[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(bb, 4), three);
  }
  out.scale = _mm512_set1_ps(iq_fp16(blk + 64));
}

}  // namespace
}  // namespace kiln::kernels::avx512
