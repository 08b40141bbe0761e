// AVX-512 gemm: float weights by kernels/x86/gemm_float.h over 16 lanes and 32
// registers (packed ones by gemm_float_packed.cpp), packed quantized weights by
// gemm_packed.cpp, and Q8_0 / Q4_0 / Q4_K / Q6_K / MXFP4 weights in the file's layout by
// the VNNI paths of gemm_file_vnni.cpp.
//
// Everything is in an anonymous namespace: no out-of-line AVX-512 copy of a shared
// inline function can leak to other translation units.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/kernels.h"
#include "kernels/tables.h"
#include "kernels/x86/avx512/gemm_packed.h"
#include "kernels/x86/avx512/vec.h"
#include "kernels/x86/gemm_float.h"

namespace kiln::kernels::avx512 {
namespace {

// Prefill tile: 24 accumulators + 4 activations + 1 weight of the 32 registers. Measured
// on Zen 5 against 4x6, 5x5, 3x8, 8x3, 7x3, 6x3: more activation rows per tile lose
// (they stream from L2), more weight rows gain nothing.
// Batches of up to 3 rows are bandwidth bound like decode: one pass of 8-row tiles.
constexpr x86::FloatGemmShape kShape{
    .max_rb = 4, .small_batch = 3, .x_budget = 512 * 1024, .prefill_rw = 6, .prefill_rb = 4};
using FloatGemm = x86::FloatGemm<Vec, kShape>;

// Quantized decode: one weight row at a time, each 32-element block turned into two
// vectors of floats (q * d) and multiplied into the activations; even and odd blocks
// feed separate accumulators. Batches stay on the scalar reference for now.
template <TensorType T>
inline void quant_block(const uint8_t* blk, __m512& lo, __m512& hi) {
  uint16_t dh;
  __builtin_memcpy(&dh, blk, 2);
  const __m512 d = _mm512_set1_ps(_cvtsh_ss(dh));
  const uint8_t* qs = blk + 2;
  if constexpr (T == TensorType::Q8_0) {
    lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))));
    hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16))));
  } else {  // Q4_0: low nibbles are elements 0..15, high nibbles 16..31, stored with +8
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    const __m128i q_lo = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);
    const __m128i q_hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);
    lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q_lo));
    hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q_hi));
  }
  lo = _mm512_mul_ps(lo, d);
  hi = _mm512_mul_ps(hi, d);
}

template <TensorType T>
void matvec_quant(const GemmArgs& a) {
  constexpr size_t kBlockBytes = T == TensorType::Q8_0 ? 34 : 18;
  const size_t n_blocks = a.k / 32;
  for (size_t r = a.r0; r < a.r1; ++r) {
    const uint8_t* w = static_cast<const uint8_t*>(a.w) + r * a.w_row_bytes;
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (size_t blk = 0; blk < n_blocks; ++blk) {
      __m512 lo, hi;
      quant_block<T>(w + blk * kBlockBytes, lo, hi);
      const float* x = a.x + blk * 32;
      const size_t p = (blk & 1) * 2;
      acc[p] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(x), acc[p]);
      acc[p + 1] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), acc[p + 1]);
    }
    a.y[r] = Vec::hsum(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
  }
}

}  // namespace

// Quantized weights run on the scalar reference until they get SIMD paths here.
void gemm(const GemmArgs& a) {
  if (a.r0 >= a.r1 || a.n_batch == 0) return;
  if (a.w_packed) return is_float_type(a.w_type) ? gemm_float_packed(a) : gemm_packed(a);
  if (gemm_file_vnni(a) || gemm_iquant(a)) return;
  if (a.n_batch == 1 && a.w_type == TensorType::Q8_0) return matvec_quant<TensorType::Q8_0>(a);
  if (a.n_batch == 1 && a.w_type == TensorType::Q4_0) return matvec_quant<TensorType::Q4_0>(a);
  if (!FloatGemm::run(a)) scalar_ops().gemm(a);
}

}  // namespace kiln::kernels::avx512
