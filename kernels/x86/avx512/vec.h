#pragma once
// The AVX-512 vector traits (interface: kernels/x86/vec_traits.h): 16 float lanes in 32
// registers; tails are masked loads and stores, which never touch memory past the end
// (no fault, no uninitialised lanes).
//
// Include only from files compiled with the AVX-512 flags. Everything is in an anonymous
// namespace: no out-of-line AVX-512 copy of these can be picked by the linker elsewhere.
// GCC 12 flags the deliberately undefined upper lanes inside its own 512->256 extract
// intrinsics as uninitialized; a false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "kernels/packed.h"
#include "kernels/x86/avx512bf16/gemm_bf16.h"
#include "kernels/x86/exp_taylor.h"

namespace kiln::kernels::avx512 {
namespace {

struct Vec {
  using F = __m512;   // 16 floats
  using H = __m256i;  // 16 halves (fp16 or bf16)
  static constexpr size_t kLanes = 16;

  // Lanes [0, n) for n <= 16.
  static __mmask16 mask(size_t n) { return (__mmask16)((1u << n) - 1); }

  using I = __m512i;
  static I load_i(const void* p) { return _mm512_loadu_si512(p); }
  static I set1_i8(char c) { return _mm512_set1_epi8(c); }
  template <int N>
  static I shl16(I v) { return _mm512_slli_epi16(v, N); }
  template <int N>
  static I shr16(I v) { return _mm512_srli_epi16(v, N); }
  static I set1_i32(uint32_t v) { return _mm512_set1_epi32(int(v)); }
  static bool bf16_dot_instruction() {
#ifdef KILN_HAVE_AVX512BF16
    return avx512bf16::g_enabled;
#else
    return false;
#endif
  }
  // The even (low) and odd (high) bf16 of each 32-bit lane, as floats.
  static F bf16_even(I v) { return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)); }
  static F bf16_odd(I v) { return _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(int(0xffff0000u)))); }

  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F set1(float a) { return _mm512_set1_ps(a); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fmsub(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }

  static F load_tail(const float* p, size_t n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static void store_tail(float* p, F v, size_t n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static F keep(F v, size_t n) { return _mm512_maskz_mov_ps(mask(n), v); }

  // Fixed tree: 16 -> 8 -> 4 -> 2 -> 1 lanes, identical for every caller.
  static float hsum(F v) {
    const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
  }
  // The horizontal sums of n <= 16 vectors at once, each by exactly hsum's tree (so the
  // results are bit-identical to n calls of hsum), in 45 shuffles and adds instead of 16 x 8:
  // with head_dim 64 (attention's Q K^T) the sums cost more than the products otherwise.
  // Each step adds the two halves of every vector's live lanes, packing two vectors' results
  // into one: 16 -> 8 lanes (256-bit halves), 8 -> 4 (128-bit quarters), 4 -> 2, 2 -> 1.
  // The packing leaves lane 4q + m holding vector 4m + q, so the inputs go in transposed.
  template <int N>
  __attribute__((always_inline)) static void hsum_many(const __m512* v, float* out) {
    static_assert(N >= 1 && N <= 16);
    __m512 in[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) {
      const int src = 4 * (i % 4) + i / 4;
      in[i] = src < N ? v[src] : _mm512_setzero_ps();
    }
    __m512 t[8], x[4], p[2];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k)
      t[k] = _mm512_add_ps(_mm512_shuffle_f32x4(in[2 * k], in[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_f32x4(in[2 * k], in[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
      x[k] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * k], t[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                           _mm512_shuffle_f32x4(t[2 * k], t[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
    for (int k = 0; k < 2; ++k)
      p[k] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                           _mm512_shuffle_ps(x[2 * k], x[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 s = _mm512_add_ps(_mm512_shuffle_ps(p[0], p[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm512_shuffle_ps(p[0], p[1], _MM_SHUFFLE(3, 1, 3, 1)));
    if constexpr (N == 16) _mm512_storeu_ps(out, s);
    else _mm512_mask_storeu_ps(out, (__mmask16)((1u << N) - 1), s);
  }

  // hsum of N vectors into out[0, N): batched where that is cheaper (from 6 vectors on).
  template <int N>
  __attribute__((always_inline)) static void hsums(const __m512* v, float* out) {
    if constexpr (N >= 16) {
      hsum_many<16>(v, out);
      hsums<N - 16>(v + 16, out + 16);
    } else if constexpr (N >= 6) {
      hsum_many<N>(v, out);
    } else {
#pragma GCC unroll 8
      for (int i = 0; i < N; ++i) out[i] = hsum(v[i]);
    }
  }

  static float max_with_tail(F v, const float* tail, size_t n) {
    if (n) v = _mm512_mask_max_ps(v, mask(n), v, _mm512_maskz_loadu_ps(mask(n), tail));
    return _mm512_reduce_max_ps(v);
  }

  // exp(x) to ~2 ulp: x = n ln2 + r with |r| <= ln2/2 (ln2 split in two so n*ln2 is exact
  // enough), degree-7 Taylor for e^r (truncation error < 6e-9 relative), then scalef
  // applies 2^n and handles overflow to inf and underflow through subnormals to 0.
  static F exp(F x) {
    x = _mm512_max_ps(_mm512_min_ps(x, set1(89.0f)), set1(-104.0f));
    const F n = _mm512_roundscale_ps(x * set1(1.44269504088896341f), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const F r = _mm512_fnmadd_ps(n, set1(1.428606765330187e-06f), _mm512_fnmadd_ps(n, set1(0.693145751953125f), x));
    const F p = x86::exp_taylor7<Vec>(r);
    return _mm512_scalef_ps(p, n);
  }

  static F rotate_pairs(F x, F cs) {
    return _mm512_fmaddsub_ps(x, _mm512_moveldup_ps(cs), _mm512_permute_ps(x, 0xB1) * _mm512_movehdup_ps(cs));
  }
  // 32 interleaved (cos, sin) from lo, hi into 16 cosines and 16 sines: one permute each.
  static void split_cos_sin(F lo, F hi, F* c, F* s) {
    const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
    *c = _mm512_permutex2var_ps(lo, even, hi);
    *s = _mm512_permutex2var_ps(lo, _mm512_add_epi32(even, _mm512_set1_epi32(1)), hi);
  }

  static F i8_to_f32(const int8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static void nibbles_to_f32(const uint8_t* p, F* lo, F* hi) {
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m512i eight = _mm512_set1_epi32(8);
    *lo = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_and_si512(q, _mm512_set1_epi32(15)), eight));
    *hi = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight));
  }

  static H load_h(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static void store_h(uint16_t* p, H h) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h); }
  static H load_h_tail(const uint16_t* p, size_t n) { return _mm256_maskz_loadu_epi16(mask(n), p); }
  static void store_h_tail(uint16_t* p, H h, size_t n) { _mm256_mask_storeu_epi16(p, mask(n), h); }
  static F from_fp16(H h) { return _mm512_cvtph_ps(h); }
  static H to_fp16(F v) { return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F from_bf16(H h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  // Round to nearest even by integer add (as the scalar version); NaNs keep their payload
  // and get the quiet bit so rounding can never turn them into infinities.
  static H to_bf16(F f) {
    const __m512i x = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
  }

  // ---- 8-bit activations (layouts: kernels/packed.h)

  // n_blocks blocks of 32 as ggml's Q8_0 activations (fp16 scale, q rounded half away from
  // zero, s = sum(q)), so products match what llama.cpp computes for the same file.
  static void quantize_q8_32(const float* x, size_t n_blocks, int8_t* q, float* d, int32_t* s) {
    const __m512 half = _mm512_set1_ps(0.5f);
    const __m512i sign_bit = _mm512_set1_epi32(INT32_MIN);
    for (size_t b = 0; b < n_blocks; ++b) {
      const __m512 v0 = _mm512_loadu_ps(x + 32 * b), v1 = _mm512_loadu_ps(x + 32 * b + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
      const float scale = amax / 127.0f;
      d[b] = _cvtsh_ss(_cvtss_sh(scale, _MM_FROUND_TO_NEAREST_INT));
      const __m512 inv = _mm512_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
      const auto round_away = [&](__m512 v) {
        const __m512 t = _mm512_mul_ps(v, inv);
        const __m512 h = _mm512_castsi512_ps(
            _mm512_or_si512(_mm512_and_si512(_mm512_castps_si512(t), sign_bit), _mm512_castps_si512(half)));
        return _mm512_cvttps_epi32(_mm512_add_ps(t, h));
      };
      const __m512i i0 = round_away(v0), i1 = round_away(v1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b), _mm512_cvtsepi32_epi8(i0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 32 * b + 16), _mm512_cvtsepi32_epi8(i1));
      s[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
  }

  // One scale per 256 elements (as ggml's Q8_K): K-quant sub-block scales are integers, so
  // a super-block's sum stays in int32 until its single float multiply.
  static void prepare_q8_256(const float* x, size_t k, void* out_row) {
    const auto [q, d, s16, s32] = packed::act_row256_out(out_row, k);
    for (size_t sb = 0; sb < k / 256; ++sb) {
      const float* xs = x + 256 * sb;
      __m512 m = _mm512_setzero_ps();
      for (int i = 0; i < 16; ++i) m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xs + 16 * i)));
      const float amax = _mm512_reduce_max_ps(m);
      d[sb] = amax / 127.0f;
      const __m512 inv = _mm512_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
      for (int i = 0; i < 16; ++i) {
        const __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xs + 16 * i), inv));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 256 * sb + 16 * i), _mm512_cvtsepi32_epi8(qi));
        s16[16 * sb + i] = (int16_t)_mm512_reduce_add_epi32(qi);
      }
      for (int j = 0; j < 8; ++j) s32[8 * sb + j] = int16_t(s16[16 * sb + 2 * j] + s16[16 * sb + 2 * j + 1]);
    }
  }
};

}  // namespace
}  // namespace kiln::kernels::avx512
