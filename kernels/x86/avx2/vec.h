#pragma once
// The AVX2 vector traits (interface: kernels/x86/vec_traits.h): 8 float lanes in 16
// registers. Float tails are maskload/maskstore (zeros in the lanes past the end, so a
// tail element sees the same instructions as the others); AVX2 has no 16-bit masked
// loads, so half tails go through a small buffer.
//
// Include only from files compiled with the AVX2 flags. Everything is in an anonymous
// namespace: no out-of-line AVX2 copy of these can be picked by the linker elsewhere.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "kernels/packed.h"
#include "kernels/x86/exp_taylor.h"

namespace kiln::kernels::avx2 {
namespace {

struct Vec {
  using F = __m256;   // 8 floats
  using H = __m128i;  // 8 halves (fp16 or bf16)
  static constexpr size_t kLanes = 8;

  using I = __m256i;
  static I load_i(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static I set1_i8(char c) { return _mm256_set1_epi8(c); }
  template <int N>
  static I shl16(I v) { return _mm256_slli_epi16(v, N); }
  template <int N>
  static I shr16(I v) { return _mm256_srli_epi16(v, N); }
  static I set1_i32(uint32_t v) { return _mm256_set1_epi32(int(v)); }
  static bool bf16_dot_instruction() { return false; }
  // The even (low) and odd (high) bf16 of each 32-bit lane, as floats.
  static F bf16_even(I v) { return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)); }
  static F bf16_odd(I v) { return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(int(0xffff0000u)))); }

  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F set1(float a) { return _mm256_set1_ps(a); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fmsub(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }

  // Lanes [0, n) for n <= 8: maskload and maskstore never touch the others' memory.
  static __m256i mask(size_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static F load_tail(const float* p, size_t n) { return _mm256_maskload_ps(p, mask(n)); }
  static void store_tail(float* p, F v, size_t n) { _mm256_maskstore_ps(p, mask(n), v); }
  static F keep(F v, size_t n) { return _mm256_and_ps(v, _mm256_castsi256_ps(mask(n))); }

  // Fixed tree: 8 -> 4 -> 2 -> 1 lanes, identical for every caller.
  static float hsum(F v) {
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
  template <int N>
  static void hsums(const F* v, float* out) {
#pragma GCC unroll 8
    for (int i = 0; i < N; ++i) out[i] = hsum(v[i]);
  }
  static float hmax(F v) {
    const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    return _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
  }
  // The largest of v's lanes and the n (< 8) floats at tail (those by comparison, so a
  // NaN among them is passed over as the scalar reference does).
  static float max_with_tail(F v, const float* tail, size_t n) {
    float m = hmax(v);
    for (size_t i = 0; i < n; ++i) m = tail[i] > m ? tail[i] : m;
    return m;
  }

  // exp(x): x = n ln2 + r, |r| <= ln2/2, degree-7 Taylor for e^r, 2^n applied in two
  // halves so n = 128 (x near ln FLT_MAX) stays representable. Results below FLT_MIN
  // flush to 0, above FLT_MAX go to inf.
  static F exp(F x) {
    constexpr float kLo = -87.33654475f, kHi = 88.72283906f;
    const F xc = _mm256_max_ps(_mm256_min_ps(x, set1(kHi)), set1(kLo));
    const F n = _mm256_round_ps(xc * set1(1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F r = _mm256_fnmadd_ps(n, set1(1.428606765330187e-06f), _mm256_fnmadd_ps(n, set1(0.693145751953125f), xc));
    const F p = x86::exp_taylor7<Vec>(r);
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const F s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const F s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    const F e = _mm256_andnot_ps(_mm256_cmp_ps(x, set1(kLo), _CMP_LT_OQ), p * s1 * s2);
    return _mm256_blendv_ps(e, set1(__builtin_inff()), _mm256_cmp_ps(x, set1(kHi), _CMP_GT_OQ));
  }

  static F rotate_pairs(F x, F cs) {
    return _mm256_fmaddsub_ps(x, _mm256_moveldup_ps(cs), _mm256_permute_ps(x, 0xB1) * _mm256_movehdup_ps(cs));
  }
  // 16 interleaved (cos, sin) from lo, hi into 8 cosines and 8 sines: shuffle within
  // 128-bit lanes, then a lane permute.
  static void split_cos_sin(F lo, F hi, F* c, F* s) {
    *c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
    *s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
  }

  static F i8_to_f32(const int8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static void nibbles_to_f32(const uint8_t* p, F* lo, F* hi) {
    const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i eight = _mm256_set1_epi32(8);
    *lo = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(q, _mm256_set1_epi32(15)), eight));
    *hi = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(q, 4), eight));
  }

  static H load_h(const uint16_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
  static void store_h(uint16_t* p, H h) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h); }
  // The first n (<= 8) halves at p, the other lanes 0 (AVX2 has no 16-bit masked loads
  // or stores); and back.
  static H load_h_tail(const uint16_t* p, size_t n) {
    if (n == 8) return load_h(p);
    alignas(16) uint16_t l[8] = {};
    __builtin_memcpy(l, p, n * sizeof(uint16_t));
    return _mm_load_si128(reinterpret_cast<const __m128i*>(l));
  }
  static void store_h_tail(uint16_t* p, H h, size_t n) {
    alignas(16) uint16_t l[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(l), h);
    __builtin_memcpy(p, l, n * sizeof(uint16_t));
  }
  static F from_fp16(H h) { return _mm256_cvtph_ps(h); }
  static H to_fp16(F v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F from_bf16(H h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
  // Round to nearest even by integer add, NaNs quieted with their payload kept.
  static H to_bf16(F f) {
    const __m256i x = _mm256_castps_si256(f);
    const __m256i hi = _mm256_srli_epi32(x, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i quiet = _mm256_or_si256(hi, _mm256_set1_epi32(0x40));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i v = _mm256_blendv_epi8(rounded, quiet, nan);
    // packus works per 128-bit lane; values fit in 16 bits, so it only narrows.
    return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08));
  }

  // ---- 8-bit activations (layouts: kernels/packed.h)

  static int32_t hsum_epi32(__m256i v) {
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    const __m128i s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)));
  }
  static F abs_ps(F v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

  // 32 int32 (each in -127..127) to 32 bytes in order: the packs work per 128-bit lane,
  // so the dwords come out lane-interleaved and one permute puts them back.
  static __m256i narrow32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
    const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }

  // n_blocks blocks of 32 as ggml's Q8_0 activations (fp16 scale, q rounded half away from
  // zero, s = sum(q)); the same arithmetic as the AVX-512 version, so both give the same bytes.
  static void quantize_q8_32(const float* x, size_t n_blocks, int8_t* q, float* d, int32_t* s) {
    const __m256 half = _mm256_set1_ps(0.5f), sign_bit = _mm256_set1_ps(-0.0f);
    for (size_t b = 0; b < n_blocks; ++b) {
      __m256 v[4];
      for (int i = 0; i < 4; ++i) v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
      const float amax = hmax(_mm256_max_ps(_mm256_max_ps(abs_ps(v[0]), abs_ps(v[1])), _mm256_max_ps(abs_ps(v[2]), abs_ps(v[3]))));
      const float scale = amax / 127.0f;
      d[b] = _cvtsh_ss(_cvtss_sh(scale, _MM_FROUND_TO_NEAREST_INT));
      // Divided by the unrounded scale, so |q| <= 127 (the vpmaddubsw bounds rely on it).
      const __m256 inv = _mm256_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
      __m256i qi[4];
      for (int i = 0; i < 4; ++i) {
        const __m256 t = _mm256_mul_ps(v[i], inv);
        qi[i] = _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_or_ps(_mm256_and_ps(t, sign_bit), half)));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), narrow32(qi[0], qi[1], qi[2], qi[3]));
      s[b] = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3])));
    }
  }

  // One scale per 256 elements (as ggml's Q8_K): K-quant sub-block scales are integers, so
  // a super-block's sum stays in int32 until its single float multiply.
  static void prepare_q8_256(const float* x, size_t k, void* out_row) {
    const auto [q, d, s16, s32] = packed::act_row256_out(out_row, k);
    for (size_t sb = 0; sb < k / 256; ++sb) {
      const float* xs = x + 256 * sb;
      __m256 m = _mm256_setzero_ps();
      for (int i = 0; i < 32; ++i) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(xs + 8 * i)));
      const float amax = hmax(m);
      d[sb] = amax / 127.0f;
      const __m256 inv = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
      for (int c = 0; c < 8; ++c) {  // 32 elements: two sums of 16
        __m256i qi[4];
        for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + 32 * c + 8 * i), inv));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 256 * sb + 32 * c), narrow32(qi[0], qi[1], qi[2], qi[3]));
        const int32_t lo = hsum_epi32(_mm256_add_epi32(qi[0], qi[1])), hi = hsum_epi32(_mm256_add_epi32(qi[2], qi[3]));
        s16[16 * sb + 2 * c] = int16_t(lo);
        s16[16 * sb + 2 * c + 1] = int16_t(hi);
        s32[8 * sb + c] = int16_t(lo + hi);
      }
    }
  }
};

}  // namespace
}  // namespace kiln::kernels::avx2
