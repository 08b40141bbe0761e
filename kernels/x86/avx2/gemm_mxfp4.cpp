// MXFP4 weights in the file's layout (a mixture of experts' matrices, read in place)
// against 8-bit activations, with plain AVX2 integer dots (vpmaddubsw + vpmaddwd); the
// avx2 and avxvnni tables both use it.
//
// Each 32-element block's codes become their doubled E2M1 values (-12..12, one vpshufb),
// so a block's dot product with the activations' q is exact in int32 and is scaled once
// by half the block's E8M0 scale times the activation block's d. vpmaddubsw wants one
// unsigned operand: |w| against x carrying w's sign; pairs stay within 2 * 12 * 127, far
// from int16 saturation. The activations are ggml's Q8_0 (Vec::quantize_q8_32), so the
// error bound is the one kernels/packed.h states for q8_32.
#include <immintrin.h>

#include "kernels/quant.h"
#include "kernels/tables.h"
#include "kernels/x86/avx2/gemm_packed.h"
#include "kernels/x86/avx2/vec.h"
#include "kernels/x86/prefetch.h"

namespace kiln::kernels::avx2 {
namespace {

constexpr size_t kMaxK = 16384;  // activations quantized on the stack
constexpr int kRows = 4;         // activation rows per pass over a weight row

// Elements 0..31 of one block as signed doubled E2M1 values.
inline __m256i block_values(const block_mxfp4& b) {
  const __m128i table = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(bytes, mask));
  const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), mask));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// One weight row against NB activation rows. Even and odd blocks feed two accumulators
// (added at the end), the same for every NB, so an output does not depend on the batch.
template <int NB>
inline void row_dot(const block_mxfp4* w, size_t n_blocks, const int8_t* const* xq, const float* const* xd,
                    float* const* out, const uint8_t* end) {
  __m256 acc[NB][2];
  for (int j = 0; j < NB; ++j) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (size_t blk = 0; blk < n_blocks; ++blk) {
    x86::prefetch_ahead(reinterpret_cast<const uint8_t*>(w + blk), sizeof(block_mxfp4), end);
    const __m256i v = block_values(w[blk]);
    const __m256i v_abs = _mm256_sign_epi8(v, v);
    const float dw = mxfp4_half_scale(w[blk].e);
    for (int j = 0; j < NB; ++j) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[j] + 32 * blk));
      const __m256i pairs = _mm256_maddubs_epi16(v_abs, _mm256_sign_epi8(x, v));
      const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
      acc[j][blk & 1] = _mm256_fmadd_ps(sum, _mm256_set1_ps(dw * xd[j][blk]), acc[j][blk & 1]);
    }
  }
  for (int j = 0; j < NB; ++j) *out[j] = Vec::hsum(_mm256_add_ps(acc[j][0], acc[j][1]));
}

}  // namespace

bool gemm_mxfp4(const GemmArgs& a) {
  if (a.w_type != TensorType::MXFP4 || a.w_packed || a.k > kMaxK) return false;
  const size_t n_blocks = a.k / 32;
  alignas(32) int8_t xq[kRows][kMaxK];
  float xd[kRows][kMaxK / 32];
  int32_t xs[kMaxK / 32];  // the sums quantize_q8_32 also gives; unused here
  const uint8_t* end = static_cast<const uint8_t*>(a.w) + a.r1 * a.w_row_bytes;
  for (size_t b0 = 0; b0 < a.n_batch; b0 += kRows) {
    const size_t nb = a.n_batch - b0 < kRows ? a.n_batch - b0 : kRows;
    for (size_t b = 0; b < nb; ++b) Vec::quantize_q8_32(a.x + (b0 + b) * a.ldx, n_blocks, xq[b], xd[b], xs);
    for (size_t r = a.r0; r < a.r1; ++r) {
      const auto* w = reinterpret_cast<const block_mxfp4*>(static_cast<const uint8_t*>(a.w) + r * a.w_row_bytes);
      float* out[kRows];
      for (size_t b = 0; b < nb; ++b) out[b] = &a.y[(b0 + b) * a.ldy + r];
      const int8_t* q[kRows] = {xq[0], xq[1], xq[2], xq[3]};
      const float* d[kRows] = {xd[0], xd[1], xd[2], xd[3]};
      size_t b = 0;
      if (nb == kRows) {
        row_dot<kRows>(w, n_blocks, q, d, out, end);
        b = kRows;
      }
      for (; b < nb; ++b) row_dot<1>(w, n_blocks, q + b, d + b, out + b, end);
    }
  }
  return true;
}

}  // namespace kiln::kernels::avx2
